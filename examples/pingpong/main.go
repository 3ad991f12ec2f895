// Command pingpong is rdmago's demo: it connects with Dial and Listen,
// measures how long a message takes to go out and come back, and how fast
// RDMA WRITE moves data, and prints it on one screen.
//
//	pingpong ADDRESS...                  both ends in this process, over each address's RDMA device
//	pingpong -listen ADDRESS:PORT        the server end: echoes until the client leaves
//	pingpong -connect ADDRESS:PORT       the client end: measures and prints
//
// With -json the client prints its results as JSON, for make bench.
package main

import "github.com/rdmago/rdmago/examples/internal/command"

func main() { command.Main("pingpong", run) }
