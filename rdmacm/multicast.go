package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/rdmago/rdmago/verbs"
)

// MulticastConn is a multicast group membership: a UD QP attached to the
// group, made by [Dialer.JoinMulticast]. Send sends to the group; receives
// carry a GRH like any UD receive, and a member receives its own
// datagrams only if the device loops them back. Close leaves the group.
//
// What Conn says about calls from several goroutines holds here too.
type MulticastConn struct {
	*conn
}

// Group is the multicast address joined.
func (c *MulticastConn) Group() netip.Addr { return c.group }

// Peer is the group's address as a UD destination (the address handle,
// QP number and qkey the join returned), for sends posted on QP directly.
func (c *MulticastConn) Peer() UDPeer { return c.peer }

// Send sends n bytes of mr from off to the group and waits for the
// completion. A datagram must fit the path MTU (Route().MTU).
func (c *MulticastConn) Send(ctx context.Context, mr *verbs.MR, off, n int) error {
	return c.sendTo(ctx, mr, off, n, c.peer)
}

// SendTo sends n bytes of mr from off as one datagram to peer (a member
// that sent to the group: see ReplyTo) and waits for the completion.
func (c *MulticastConn) SendTo(ctx context.Context, mr *verbs.MR, off, n int, peer UDPeer) error {
	return c.sendTo(ctx, mr, off, n, peer)
}

// ReplyTo addresses the sender of a receive, for a unicast answer with
// SendTo: wc is its completion and mr at off the receive buffer, whose
// first verbs.GRHSize bytes hold the GRH. The address handle is released
// with the membership.
func (c *MulticastConn) ReplyTo(wc verbs.WorkCompletion, mr *verbs.MR, off int) (UDPeer, error) {
	return c.replyTo(wc, mr, off)
}

// JoinMulticast joins the multicast group with the zero Dialer: see
// [Dialer.JoinMulticast].
func JoinMulticast(ctx context.Context, group netip.Addr) (*MulticastConn, error) {
	var d Dialer
	return d.JoinMulticast(ctx, group)
}

// JoinMulticast joins the multicast group (an IPv4 or IPv6 multicast
// address) from d.Source, or from the address the kernel picks, with a
// UD QP attached to it. InfiniBand and RoCE only (iWARP has no UD); the
// CM attaches the QP, so ModeManual is refused. d.PrivateData is not
// used: a join carries none.
func (d *Dialer) JoinMulticast(ctx context.Context, group netip.Addr) (*MulticastConn, error) {
	o, err := d.settings(verbs.QPTypeUD)
	if err != nil {
		return nil, &OpError{Op: "join multicast", Remote: netip.AddrPortFrom(group.Unmap(), 0), Err: err}
	}
	group = group.Unmap() // an IPv4 group written as ::ffff:a.b.c.d is the IPv4 group
	if !group.IsMulticast() {
		return nil, &OpError{Op: "join multicast", Remote: netip.AddrPortFrom(group, 0), Err: errors.New("not a multicast address")}
	}
	if o.Mode != ModeCM {
		return nil, &OpError{Op: "join multicast", Remote: netip.AddrPortFrom(group, 0),
			Err: errors.New("multicast needs ModeCM: librdmacm attaches the QP to the group")}
	}
	id, err := newID(PortSpaceUDP)
	if err != nil {
		return nil, &OpError{Op: "join multicast", Remote: netip.AddrPortFrom(group, 0), Err: err}
	}
	e := &endpoint{op: "join multicast", o: &o, id: id, local: addrPort(o.Source), remote: netip.AddrPortFrom(group, 0)}
	c, err := e.join(ctx, group)
	if err != nil {
		e.abort()
		return nil, err
	}
	return &MulticastConn{c}, nil
}

func (e *endpoint) join(ctx context.Context, group netip.Addr) (*conn, error) {
	if err := e.setOptions(); err != nil {
		return nil, err
	}
	// Resolving the group binds the id to a local device, as mckey does.
	o := *e.o
	o.ResolveRetries = 0
	e.o = &o
	if err := e.id.ResolveAddr(o.Source, e.remote, o.ResolveAddrTimeout); err != nil {
		return nil, e.fail("resolve address", ErrAddrResolution, err)
	}
	// A second more than the kernel's own timer, so that its ADDR_ERROR,
	// which says why, comes first.
	ev, err := e.await(ctx, "resolve address", o.ResolveAddrTimeout+time.Second)
	if err != nil {
		return nil, err
	}
	if ev.Type != EventAddrResolved {
		return nil, e.failEvent("resolve address", ErrAddrResolution, ev)
	}
	if e.local.Addr().IsUnspecified() || !e.local.IsValid() {
		e.local = e.id.LocalAddr() // the source the kernel picked, for the errors
	}
	if dev, err := e.id.Device(); err == nil && dev.Info.Transport == verbs.TransportIWARP {
		// Before prepare, whose UD QP siw refuses with a bare EOPNOTSUPP.
		oe := e.fail("join multicast", nil, errors.New("iWARP has no UD and no multicast"))
		oe.Hint = "join the group from a RoCE or InfiniBand device (Dialer.Source picks it)"
		return nil, oe
	}
	if err := e.prepare(); err != nil {
		return nil, err
	}
	if err := e.id.JoinMulticast(group); err != nil {
		return nil, e.fail("join multicast", nil, err)
	}
	ev, err = e.await(ctx, "join multicast", o.ConnectTimeout)
	if err != nil {
		e.id.LeaveMulticast(group)
		return nil, err
	}
	if ev.Type != EventMulticastJoin {
		e.id.LeaveMulticast(group)
		return nil, e.joinError(ev)
	}
	ah, err := e.res.pd.CreateAH(ev.AH)
	if err != nil {
		e.id.LeaveMulticast(group)
		return nil, e.fail("create AH", nil, err)
	}
	e.res.ahs = append(e.res.ahs, ah)
	return e.conn(nil, ModeCM, func(c *conn) {
		c.peer = UDPeer{AH: ah, QPN: ev.Param.QPNum, QKey: ev.QKey}
		c.group = group
		c.path.GIDIndex = int(ev.AH.GRH.SGIDIndex)
	}), nil
}

// joinError is a join's MULTICAST_ERROR (or another event in its place).
// Status -1 is librdmacm's own: it made the event when it could not attach
// the QP to the group (ibv_attach_mcast), and "see errno" is not EPERM.
func (e *endpoint) joinError(ev *Event) *OpError {
	oe := e.failEvent("join multicast", ErrConnect, ev)
	if ev.Type == EventMulticastError && ev.Status == -1 {
		oe.Err = errors.New("librdmacm could not attach the QP to the group (ibv_attach_mcast)")
		oe.Hint = "the device's groups (Device.Query: MaxMcastGrp) or QPs per group (MaxMcastQPAttach) may be used up"
	}
	return oe
}
