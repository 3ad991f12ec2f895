package rdmacm

import (
	"bufio"
	"context"

	"github.com/rdmago/rdmago/internal/cmbridge"
	"github.com/rdmago/rdmago/verbs"
)

func init() {
	cmbridge.AdoptRC = adoptRC
	cmbridge.StartRC = func(c any, r *bufio.Reader) {
		cc := c.(*Conn).conn
		cc.tcpDone = make(chan struct{})
		go cc.watchTCP(r)
	}
	cmbridge.AbortRC = func(c any) {
		cc := c.(*Conn).conn
		cc.keepTCP = true // the caller's again: Close ends the connection without it
		cc.Close()
	}
	cmbridge.SetupOf = func(c any) any { return setup{c.(*Conn).conn} }
	cmbridge.EndContext = func(c any) context.Context { return c.(*Conn).endContext() }
}

// adoptRC makes a Conn of an RC QP that package oob connected over a TCP
// socket: the socket is its liveness signal, watched once StartRC runs.
func adoptRC(rc cmbridge.RC) any {
	c := &conn{qp: rc.QP, scq: rc.SendCQ, rcq: rc.RecvCQ, pd: rc.PD, dev: rc.Dev,
		done: make(chan struct{}), tcp: rc.TCP}
	c.opts.Cap = rc.Cap
	c.opts.CloseTimeout = defaultStepTimeout
	if rc.SharedSendCQ {
		c.opts.SendCQ = rc.SendCQ
	}
	if rc.SharedRecvCQ {
		c.opts.RecvCQ = rc.RecvCQ
	}
	c.res = &resources{dev: rc.Dev, pd: rc.PD, sharedPD: rc.SharedPD, scq: rc.SendCQ, rcq: rc.RecvCQ, qp: rc.QP,
		sharedSCQ: rc.SharedSendCQ, sharedRCQ: rc.SharedRecvCQ}
	c.path = Route{Local: rc.Local, Remote: rc.Remote, Device: rc.Dev.Info.Name, Port: rc.Port, Transport: rc.Dev.Info.Transport,
		Kind: rc.Kind, GIDIndex: rc.GIDIndex, GIDType: rc.GIDType, Mode: ModeManual}
	c.pathKnown = true // the resolver's path has it all
	if a, err := c.qp.Query(verbs.AttrPathMTU); err == nil {
		c.path.MTU = a.PathMTU
	}
	return &Conn{c}
}

// watchTCP ends the connection when the peer closes the socket.
func (c *conn) watchTCP(r *bufio.Reader) {
	defer close(c.tcpDone)
	var b [1]byte
	for {
		if _, err := r.Read(b[:]); err != nil {
			c.end(ErrDisconnected, nil)
			return
		}
	}
}
