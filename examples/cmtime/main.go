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
// create QP, connect, disconnect, destroy), with rdmacm.Connector's
// step-wise dial and Conn.Disconnect: the local calls (create id, create
// QP, destroy) in a loop; the address, route, connect and disconnect
// requests sent in one loop (Connector.Start, Conn.StartDisconnect) and
// their answers awaited in another. Each row is the wall time of one
// step for all connections. Destroy has two rows: "destroy qp" (QP, memory
// and CQs) and "destroy id", each the sum of the connections' times, as one
// Close per connection does both. The C client destroys each QP right
// after its rdma_disconnect, inside its "disconnect" row, and its
// "destroy" is rdma_destroy_id alone.
// All connections share one PD (Options.PD), as the C client's QPs share
// librdmacm's PD of the device; it is allocated before the clock starts.
// With -q the QPs are moved by rdmago's manual mode: the INIT, RTR and RTS
// modifies and the RTU follow each reply inside the connect step, and get
// rows of their own that sum the connections' times. The client can talk
// to the C server ("cmtime" with no -s) and the C client to ours.
//
// After the table the client prints what the run cost the Go process: OS
// threads created and peak resident memory.
package main

import "github.com/rdmago/rdmago/examples/internal/command"

func main() { command.Main("cmtime", run) }
