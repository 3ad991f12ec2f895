package rdmacm

import "context"

// Dial connects to a listener at address ("10.0.0.2:7471",
// "[fe80::2%eth0]:7471"): it resolves the address and the route, makes the
// PD, CQs and QP, sends the connect request with opts.PrivateData and
// waits for the peer's answer. Each step has its own timeout (Options);
// ctx cancels the whole dial, and nothing is left behind on any failure.
//
// Errors are *OpError and match ErrAddrResolution, ErrRouteResolution,
// ErrUnreachable, ErrRejected (with a *RejectedError carrying the peer's
// status and private data), ErrConnect, ErrTimeout or the context's error.
func Dial(ctx context.Context, address string, opts *Options) (*Conn, error) {
	c, err := newConnector(address, opts)
	if err != nil {
		return nil, err
	}
	conn, err := c.dial(ctx)
	if err != nil {
		c.Close()
		return nil, err
	}
	return conn, nil
}

// dial takes a new connector through the remaining steps.
func (c *connector) dial(ctx context.Context) (*Conn, error) {
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
func (e *endpoint) udConn(ev *Event, peerData []byte) (*Conn, error) {
	ah, err := e.res.pd.CreateAH(ev.AH)
	if err != nil {
		return nil, e.fail("create AH", nil, err)
	}
	e.res.ahs = append(e.res.ahs, ah)
	c := e.conn(peerData, e.o.Mode)
	c.peer = UDPeer{AH: ah, QPN: ev.Param.QPNum, QKey: ev.QKey}
	c.path.GIDIndex = int(ev.AH.GRH.SGIDIndex)
	return c, nil
}
