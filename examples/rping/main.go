// Command rping is rdma-core's rping written with rdmago: an RC ping over
// RDMA READ and WRITE that speaks rping's protocol on the wire, so either
// side can be the C tool.
//
// Each ping: the client fills a buffer with "rdma-ping-N: " and a rotating
// alphabet, sends its address, rkey and length (16 bytes, big-endian); the
// server RDMA READs it and answers with a 16-byte "go ahead"; the client
// sends the description of a second, empty buffer; the server RDMA WRITEs
// the data into it and says "go ahead" again. With -V the client checks
// that what came back is what it sent. The server serves one client and
// ends when that client disconnects.
//
//	rping -s [-v] [-S size] [-a addr] [-p port] [-q]
//	rping -c [-v] [-V] [-S size] [-C count] [-I source] -a addr [-p port] [-q]
//
// -q moves the QP with rdmago's manual mode (rdma_init_qp_attr and a
// validated ibv_modify_qp) instead of letting librdmacm do it, like C rping's
// self-created QP. It exists on InfiniBand and RoCE only: on iWARP it is
// refused at once, with the reason.
package main

import "github.com/rdmago/rdmago/examples/internal/command"

func main() { command.Main("rping", run) }
