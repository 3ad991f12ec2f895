package rdmacm

import (
	"context"
	"net/netip"

	"github.com/rdmago/rdmago/verbs"
)

// Conn is a reliable connection (an RC QP) set up by the CM: what
// [Dialer.Dial] and [Listener.Accept] return. Its QP, CQs and PD are there
// for direct use with package verbs; Send, Recv, RDMAWrite and RDMARead
// cover the simple cases.
//
// Every method may be called from several goroutines at once. Send,
// RDMAWrite and RDMARead post one request and wait for its completion on
// the send CQ, which one of them at a time does: concurrent calls take
// turns, each returning when its own request has completed (for requests
// in flight together, post on QP and poll SendCQ yourself). Recv likewise
// hands each receive completion to one caller. PostRecv, RegisterMemory
// and the accessors do not wait, and a sender, a receiver and PostRecv
// run side by side: the usual server has one goroutine in Recv (posting
// the next receive) while others Send. Close, from any goroutine, first
// wakes the calls still waiting (they fail with ErrEnded) and then
// releases what they used.
//
// The helpers own the connection's CQs: while one waits, do not poll the
// same CQ yourself, or the completions are split between you. Receives
// you post on QP directly, with IDs of your own, complete through Recv
// too. Which buffer a receive completion belongs to: see PostRecv.
type Conn struct {
	*conn
}

// RemoteAddr is the peer's IP address and port.
func (c *Conn) RemoteAddr() netip.AddrPort { return c.path.Remote }

// PeerPrivateData is what the peer sent with its connect request (on the
// accepting side) or its accept (on the dialing side).
func (c *Conn) PeerPrivateData() []byte { return c.peerData }

// Disconnect ends the connection without releasing it: it sends a
// disconnect and waits until the CM reports the end, up to
// ConnConfig.CloseTimeout or ctx. The QP is then in the error state, its
// posted work requests flushed, and Done is closed. It returns nil if the
// connection had ended already. Close, which disconnects too, is still
// needed.
func (c *Conn) Disconnect(ctx context.Context) error { return c.disconnectWait(ctx) }

// Send sends n bytes of mr from off and waits for the completion.
func (c *Conn) Send(ctx context.Context, mr *verbs.MR, off, n int) error {
	return c.send(ctx, mr, off, n)
}

// RDMAWrite copies n bytes of mr from off into the peer's memory (RDMA
// WRITE) and waits for the completion.
func (c *Conn) RDMAWrite(ctx context.Context, mr *verbs.MR, off, n int, to RemoteBuffer) error {
	return c.rdmaWrite(ctx, mr, off, n, to)
}

// RDMARead copies n bytes of the peer's memory into mr at off (RDMA READ)
// and waits for the completion. mr needs verbs.AccessLocalWrite.
func (c *Conn) RDMARead(ctx context.Context, mr *verbs.MR, off, n int, from RemoteBuffer) error {
	return c.rdmaRead(ctx, mr, off, n, from)
}
