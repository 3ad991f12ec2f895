// Command cmtime is rdma-core's cmtime written with rdmago: it times each
// step of setting up and tearing down many RC connections and prints the
// same table as the C tool, so that the two can be run side by side.
//
//	cmtime [-b bind_address] [-p port]                        server
//	cmtime -s server_address [-b bind_address] [-c connections] [-p port]
//	       [-r retries] [-t timeout_ms] [-q]                   client
//
// Like the C client, the Go client takes all connections through one step
// before any starts the next (create id, resolve address, resolve route,
// create QP, connect, disconnect, destroy), from one goroutine, on rdmacm's
// thin layer (rdmacm.ID): the local calls (create id, create QP, destroy)
// in a loop; the address, route, connect and disconnect requests sent in
// one loop and their answers taken in another. Each row is the wall time
// of one step for all connections; as in C, each QP is destroyed right
// after its rdma_disconnect, inside "disconnect", and "destroy" is
// rdma_destroy_id. All connections share one PD and one pair of CQs, as
// the C client's QPs do; they are made before the clock starts, and the
// CQs' creation is charged to "create qp", where C pays it.
// With -q the QPs are rdmago's own, moved with rdma_init_qp_attr's
// attributes through verbs' checked Modify: the INIT, RTR and RTS modifies
// and the RTU follow each reply inside the connect step, and get rows of
// their own that sum the connections' times. The client can talk to the C
// server ("cmtime" with no -s) and the C client to ours: rdma-core's
// cmtime before release 59 (tested with Debian 12's 44). From 59 on it
// meets its peers through a TCP mesh of its own (-C, -L, -P), which this
// tool does not speak. Each connection's own times (the max and min columns)
// are taken when the one loop gets to its event, where C's event thread
// stamps them on arrival: compare the rows' totals, not those columns.
//
// After the table the client prints what the run cost the Go process: OS
// threads created and peak resident memory.
package main

import "github.com/rdmago/rdmago/examples/internal/command"

func main() { command.Main("cmtime", run) }
