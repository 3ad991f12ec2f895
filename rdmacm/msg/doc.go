// Package msg is a message transport over an RC connection of package
// rdmacm: whole messages up to a size both sides agree on, delivered in
// order, with credit-based flow control so that a sender never sends to a
// receive queue without a posted buffer (no receiver-not-ready, on RoCE or
// on iWARP). It uses SEND and RECV only, which every RDMA device has
// (siw has no RDMA WRITE WITH IMMEDIATE).
//
//	l, _ := msg.Listen(ctx, nil, "10.0.0.1:7471", nil)
//	c, _ := l.Accept(ctx)          // one side
//	d, _ := msg.Dial(ctx, nil, "10.0.0.1:7471", nil) // the other
//	d.Send(ctx, []byte("hello"))
//	m, _ := c.Recv(ctx)
//	use(m.Bytes())                 // in the registered buffer: no copy
//	m.Release()                    // the buffer goes back, the credit to the peer
//
// # Handshake
//
// Each side states what it can take in a 16-byte hello, carried in the
// connect request's and the accept's private data: the protocol version,
// its credits (receive buffers for messages and FIN), its reply slots (receive
// buffers kept for CREDIT frames) and the largest message it receives.
// Both use the smaller maximum. The receive buffers are registered and
// posted before the request or the accept goes out (rdmacm's BeforeConnect
// and AcceptWith). The dialer then sends a HELLO frame first, as iWARP
// requires; the accepting side sends nothing before it has arrived.
//
// # Frames
//
// Every SEND is one frame: a 12-byte header, big-endian, then for DATA the
// message:
//
//	byte 0      magic 0x6d
//	byte 1      version (1)
//	byte 2      type: 1 HELLO, 2 DATA, 3 CREDIT, 4 FIN
//	byte 3      flags: bit 0 gives the receiver a reply slot; others zero
//	bytes 4-7   grant (see below)
//	bytes 8-11  length of the message that follows (0 but for DATA)
//
// FIN says no more messages follow (CloseSend, Close): the peer's Recv
// returns io.EOF after the messages before it. The hello (bytes 0-3
// "rmsg", 4 version, 5 flags, 6-7 reply slots, 8-11 credits, 12-15 largest
// message) is laid out the same way.
//
// # Flow control
//
// A grant, the running total of receive buffers a side has made available
// to its peer, travels in every header; a side sends a HELLO, DATA or FIN
// frame only while it has sent fewer than the peer's grant, and DATA only
// while one more credit is left: the last is kept for FIN, for which each
// side posts a buffer beyond Config.Credits, so that a reader slow to
// release messages cannot hold back the end of the stream. Released
// buffers are posted again in batches and only then granted. When no frame
// is going the other way to carry a grant, a CREDIT frame does; CREDIT
// frames use reply slots, which the other side hands out with its frames
// and keeps receive buffers for, so they never need credits themselves: a
// side hands out at most 4 at a time and keeps 4 receive buffers beyond its
// credits for them, posting a CREDIT frame's buffer again as soon as it is
// read. A CREDIT frame is sent only to pass on released buffers (a batch of
// half the credits, or any when the peer is down to a quarter),
// never to answer one, so CREDIT frames do not answer each other. Neither
// side waits for ever: a sender out of credits gave reply slots with its
// last frames, so its peer can send the grant as soon as its application
// releases a message. A side waits for credit only while the peer's
// application holds that many messages.
//
// # Goroutines and waiting
//
// Recv takes the receive completions itself when nothing is queued,
// waiting on Go's runtime poller (no busy polling), checks every frame and
// queues the messages; no other goroutine hands them over. One goroutine
// per connection does the rest: it sends the credit grants that must wait
// for a buffer, ends the connection after a failure, and takes the receive
// completions while a Send waits for credit and no Recv is taking them
// (and before the first Recv). Send copies the message into a registered send buffer
// and posts it from the caller's goroutine, so many messages are in flight;
// when the credits or the send buffers run out it waits (backpressure, never
// an error), and then it polls the send completions itself. A Listener has
// one goroutine too, from the first Accept to Close, which takes the
// connect requests and runs their handshakes in parallel.
//
// # Faults
//
// A peer that breaks the protocol (a frame that is not one, another
// version, a frame larger than agreed, a frame without credit or without a
// reply slot) ends the connection: the error matches ErrProtocol and says
// what the peer sent. A peer that goes away ends it too, and the calls
// waiting and the next ones fail with an error that matches rdmacm.ErrEnded
// (or ErrTransport, when a transfer failed first). A post or receive the
// device refused or flushed because the QP was torn down is not such a
// failure: the end that follows is awaited, up to CloseTimeout, and
// reported instead. Either way, Recv first
// returns the messages that had arrived before the end. A peer that vanishes
// without its kernel disconnecting (a host that dies, a cut link) is
// noticed, by default, only when a send fails, after the QP's retries (on
// iWARP, TCP's: minutes). Config.KeepAlive turns on probes: an 8-byte
// RDMA READ of memory the peer named in its hello, after a silent period,
// which the peer's device answers; a probe
// left unanswered fails the connection with ErrPeerUnresponsive within
// 2 × KeepAlive + KeepAliveTimeout, on RoCE and on iWARP.
//
// # Memory
//
// All memory the device touches is registered through the connection's
// own PD (a shared ConnConfig.PD is refused), outside the Go heap, without
// remote rights: a peer's RDMA READ or WRITE with another connection's keys
// fails and moves no data. (siw, in Linux 6.1, does not check remote read
// rights within a PD, so there a peer can RDMA READ its own connection's
// buffers: the messages it sent and was sent, nothing else.) It takes
// (Credits+5) receive buffers and (SendBuffers+4) send buffers, each the
// largest message plus the header, rounded up to 64 bytes. A Message
// points into its receive buffer until Release, also after its
// connection's Close: Close keeps the buffers, and the connection
// underneath, while messages are held, and the last Release (or the
// garbage collector, for messages dropped unreleased) frees them.
package msg
