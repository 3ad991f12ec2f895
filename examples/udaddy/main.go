// Command udaddy is rdma-core's udaddy written with rdmago: unreliable
// datagrams (UD) set up through the CM's UDP port space, speaking udaddy's
// protocol so that either side can be the C tool.
//
//	udaddy [-b bind_address] [-c connections] [-C count] [-S size]             server
//	udaddy -s server_address [-b bind_address] [-c connections] [-C count] [-S size]  client
//
// As in C udaddy, -p and -P name the port space (UDP is the only one here)
// and the port is 7174; -port changes it.
//
// The client resolves the server, which answers with its QP number and
// qkey; the client sends count datagrams of size bytes (SEND with
// immediate data: its own QP number), and the server answers each with a
// datagram of its own, addressed from the first one's GRH. A datagram
// must fit the path MTU: -S larger than it is refused before anything is
// sent.
package main

import "github.com/rdmago/rdmago/examples/internal/command"

func main() { command.Main("udaddy", run) }
