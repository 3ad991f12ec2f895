package rdmacm

import (
	"context"
	"errors"
	"syscall"

	"github.com/rdmago/rdmago/verbs"
)

// Dial connects to the listener at address with the zero Dialer: see
// [Dialer.Dial].
func Dial(ctx context.Context, address string) (*Conn, error) {
	var d Dialer
	return d.Dial(ctx, address)
}

// DialUD reaches the UD listener at address with the zero Dialer: see
// [Dialer.DialUD].
func DialUD(ctx context.Context, address string) (*UDConn, error) {
	var d Dialer
	return d.DialUD(ctx, address)
}

// Dial connects to a listener at address ("10.0.0.2:7471",
// "[fe80::2%eth0]:7471") with a reliable connection: it resolves the
// address and the route, makes the PD, CQs and QP, sends the connect
// request with d.PrivateData and waits for the peer's answer. Each step
// has its own timeout; ctx cancels the whole dial, and nothing is left
// behind on any failure.
//
// Errors are *OpError and match ErrAddrResolution, ErrRouteResolution,
// ErrUnreachable, ErrRejected (with a *RejectedError carrying the peer's
// status and private data), ErrConnect, ErrTimeout, ErrPrivateDataTooLong,
// ErrNoResources (this host could not make the connection's CQ, QP or PD)
// or the context's error.
func (d *Dialer) Dial(ctx context.Context, address string) (*Conn, error) {
	c, err := d.dial(ctx, verbs.QPTypeRC, address)
	if err != nil {
		return nil, err
	}
	return &Conn{c}, nil
}

// DialUD reaches a UD listener (see [ListenConfig.ListenUD]) at address
// through the CM's UDP port space: the answer carries the listener's QP
// number and qkey, and the returned endpoint's Peer addresses it. Its
// errors are Dial's; a listener that rejects the request, and a port with
// no UD listener (the peer's CM answers at once), give ErrRejected, whose
// *RejectedError says which.
func (d *Dialer) DialUD(ctx context.Context, address string) (*UDConn, error) {
	c, err := d.dial(ctx, verbs.QPTypeUD, address)
	if err != nil {
		return nil, err
	}
	return &UDConn{c}, nil
}

func (d *Dialer) dial(ctx context.Context, t verbs.QPType, address string) (*conn, error) {
	o, err := d.settings(t)
	if err != nil {
		dst, _ := parseAddr(address)
		return nil, &OpError{Op: "dial", Remote: dst, Err: err}
	}
	// On iWARP the connect call binds a TCP socket to the port the CM
	// chose for the id, from the same range as the kernel's own TCP ports
	// but without looking at them: a port held by a TCP socket (one in
	// TIME_WAIT after an ordinary TCP client closed, say) makes it fail
	// with EADDRINUSE, and one whose connection to the same peer address
	// and port is still in TIME_WAIT (an earlier iWARP connection on the
	// same port pair) with EADDRNOTAVAIL at the TCP connect. The dial then
	// tries again on a new id, keeping the failed ones until it is over so
	// that the CM picks another port.
	var failed []*connector
	defer func() {
		for _, f := range failed {
			f.Close()
		}
	}()
	for {
		c, err := newConnector(address, &o)
		if err != nil {
			return nil, err
		}
		conn, err := c.dial(ctx)
		if err == nil {
			return conn, nil
		}
		var oe *OpError
		taken := errors.Is(err, syscall.EADDRINUSE) ||
			errors.Is(err, syscall.EADDRNOTAVAIL) && errors.As(err, &oe) && oe.Op == "connect"
		if !c.e.iwarp || !taken || len(failed) == iwarpPortTries-1 || ctx.Err() != nil {
			c.Close()
			return nil, err
		}
		failed = append(failed, c)
	}
}

// iwarpPortTries is how many ports an iWARP dial tries when the TCP socket
// cannot have the port the CM chose.
const iwarpPortTries = 4

// dial takes a new connector through the remaining steps.
func (c *connector) dial(ctx context.Context) (*conn, error) {
	if err := c.ResolveAddr(ctx); err != nil {
		return nil, err
	}
	if err := c.ResolveRoute(ctx); err != nil {
		return nil, err
	}
	if err := c.CreateQP(); err != nil {
		return nil, err
	}
	return c.Connect(ctx)
}

// udConn finishes a UD dial: the answer carries the peer's QP number, qkey
// and the address vector to reach it.
func (e *endpoint) udConn(ev *Event, peerData []byte, peerMTU verbs.MTU) (*conn, error) {
	ah, err := e.res.pd.CreateAH(ev.AH)
	if err != nil {
		return nil, e.fail("create AH", nil, err)
	}
	e.res.ahs = append(e.res.ahs, ah)
	return e.conn(peerData, e.o.Mode, func(c *conn) {
		c.peer = UDPeer{AH: ah, QPN: ev.Param.QPNum, QKey: ev.QKey}
		c.path.GIDIndex = int(ev.AH.GRH.SGIDIndex)
		c.path.MTU = udPathMTU(c.path.MTU, peerMTU)
	}), nil
}
