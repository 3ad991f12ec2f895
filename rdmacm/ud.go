package rdmacm

import (
	"context"
	"net/netip"

	"github.com/rdmago/rdmago/verbs"
)

// UDConn is a UD endpoint set up by the CM (its UDP port space, SIDR on
// InfiniBand and RoCE): what [Dialer.DialUD] and [UDListener.Accept]
// return. It sends datagrams with SendTo; each arrives after a
// verbs.GRHSize-byte area at the start of the receiver's buffer. The
// dialing side learns the listener's endpoint (Peer); the accepting side
// answers a datagram's sender with ReplyTo. InfiniBand and RoCE only:
// iWARP has no UD.
//
// What Conn says about calls from several goroutines holds here too.
type UDConn struct {
	*conn
}

// RemoteAddr is the IP address and port of the other side of the CM
// exchange: the listener (dialing side) or the dialer (accepting side).
func (c *UDConn) RemoteAddr() netip.AddrPort { return c.path.Remote }

// PeerPrivateData is what the other side sent with its request (accepting
// side) or its reply (dialing side).
func (c *UDConn) PeerPrivateData() []byte { return c.peerData }

// Peer is the listener's endpoint, which the dialing side resolved: where
// its SendTo sends. Zero on the accepting side, which answers each
// sender with ReplyTo.
func (c *UDConn) Peer() UDPeer { return c.peer }

// SendTo sends n bytes of mr from off as one datagram to peer and waits
// for the completion. A datagram must fit the path MTU (Route().MTU).
func (c *UDConn) SendTo(ctx context.Context, mr *verbs.MR, off, n int, peer UDPeer) error {
	return c.sendTo(ctx, mr, off, n, peer)
}

// ReplyTo addresses the sender of a receive: wc is its completion and mr
// at off the receive buffer, whose first verbs.GRHSize bytes hold the GRH.
// The address handle is released with the connection. One is kept per
// sender, reused for its later datagrams: a connection that hears from
// more senders over its life than the device has address handles for
// (DeviceAttr.MaxAH) fails ReplyTo, as ibv_create_ah refuses, until it is
// closed.
func (c *UDConn) ReplyTo(wc verbs.WorkCompletion, mr *verbs.MR, off int) (UDPeer, error) {
	return c.replyTo(wc, mr, off)
}
