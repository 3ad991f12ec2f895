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
// its credits (receive buffers for messages), its reply slots (receive
// buffers kept for CREDIT frames) and the largest message it receives.
// Both use the smaller maximum. The receive buffers are registered and
// posted before the request or the accept goes out (rdmacm's BeforeConnect
// and AcceptWith). The dialer then sends a HELLO frame first, as iWARP
// requires; the accepting side sends nothing before it has arrived.
//
// # Frames
//
// Every SEND is one frame: a 12-byte header (magic 0x6d, version, type,
// flags, grant, length; see header) and, for DATA, the message. Types are
// HELLO, DATA, CREDIT and FIN (no more messages: Recv returns io.EOF).
//
// # Flow control
//
// A grant, the running total of receive buffers a side has made available
// to its peer, travels in every header; a side sends a HELLO, DATA or FIN
// frame only while it has sent fewer than the peer's grant. Released
// buffers are posted again in batches and only then granted. When no frame
// is going the other way to carry a grant, a CREDIT frame does; CREDIT
// frames use reply slots, which the other side hands out with its frames
// and keeps receive buffers for, so they never need credits themselves.
// The argument that neither side can wait for ever is in the ledger type's
// documentation.
//
// # Goroutines and waiting
//
// One goroutine per connection takes the receive completions, waiting on
// Go's runtime poller (no busy polling), checks every frame and queues the
// messages for Recv. Send copies the message into a registered send buffer
// and posts it from the caller's goroutine, so many messages are in flight;
// when the credits or the send buffers run out it waits (backpressure, never
// an error), and then it polls the send completions itself.
//
// # Faults
//
// A peer that breaks the protocol (a frame that is not one, another
// version, a frame larger than agreed, a frame without credit or without a
// reply slot) ends the connection: the error matches ErrProtocol and says
// what the peer sent. A peer that goes away ends it too, and the calls
// waiting and the next ones fail with an error that matches rdmacm.ErrEnded
// (or ErrTransport, when a transfer failed first).
package msg
