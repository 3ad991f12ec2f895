package msg

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// Dial connects to a message listener at address ("10.0.0.2:7471") through
// d (nil: the zero rdmacm.Dialer), with buffers as cfg says (nil: the
// defaults). The hello goes in the connect request's private data, so
// d.PrivateData must be empty; d's queue sizes are replaced by what cfg
// needs, and its BeforeConnect, if any, runs before the receive buffers are
// posted. The receive buffers are registered and posted before the connect
// request goes out, and the dialer's HELLO frame is sent before Dial
// returns (on iWARP the dialing side must send first).
//
// Errors are *OpError; a listener that refused the hello gives one that
// matches ErrHandshake and rdmacm.ErrRejected, and says why.
func Dial(ctx context.Context, d *rdmacm.Dialer, address string, cfg *Config) (*Conn, error) {
	fail := func(err error) (*Conn, error) { return nil, &OpError{Op: "dial", Remote: parseAddr(address), Err: err} }
	o, err := cfg.resolve()
	if err != nil {
		return fail(err)
	}
	var dd rdmacm.Dialer
	if d != nil {
		dd = *d
	}
	if err := checkConnConfig(&dd.ConnConfig); err != nil {
		return fail(err)
	}
	if err := checkKeepalive(&o, &dd.ConnConfig); err != nil {
		return fail(err)
	}
	if len(dd.PrivateData) > 0 {
		return fail(errors.New("the Dialer's PrivateData must be empty: the connect request carries the message hello"))
	}
	local := o.hello()
	dd.PrivateData = local.marshal()
	dd.Cap = o.qpCap()
	dd.CQEntries = 0
	var pool *verbs.MR
	user := dd.BeforeConnect
	dd.BeforeConnect = func(s rdmacm.Setup) error {
		if user != nil {
			if err := user(s); err != nil {
				return err
			}
		}
		mr, err := postPool(s, &o)
		pool = mr
		return err
	}
	rc, err := dd.Dial(ctx, address)
	if err != nil {
		var rej *rdmacm.RejectedError
		if errors.As(err, &rej) && len(rej.PrivateData) > 0 && rej.Refusal == rdmacm.RefusalNone {
			err = &kindError{ErrHandshake, fmt.Errorf("the listener refused the hello (%q): %w", rej.PrivateData, err)}
		}
		return fail(err)
	}
	peer, err := parseHello(rc.PeerPrivateData())
	if err != nil {
		rc.Close()
		return fail(&kindError{ErrHandshake, fmt.Errorf("the accept's hello: %w", err)})
	}
	c, err := newConn(rc, &o, local, peer, pool, false)
	if err != nil {
		rc.Close()
		return fail(err)
	}
	if err := c.sendFrame(ctx, "dial", frameHello, nil, false); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// checkConnConfig refuses what the transport cannot work with.
func checkConnConfig(cc *rdmacm.ConnConfig) error {
	switch {
	case cc.SendCQ != nil || cc.RecvCQ != nil:
		return errors.New("shared CQs (ConnConfig.SendCQ, RecvCQ) are not supported: the connection waits on its own")
	case cc.PD != nil:
		return errors.New("a shared protection domain (ConnConfig.PD) is not supported: a peer could reach other " +
			"connections' buffers with their keys (siw does not even check remote read rights)")
	case cc.RawPrivateData:
		return errors.New("ConnConfig.RawPrivateData is not supported: the hello relies on rdmago's private data framing")
	}
	return nil
}

func parseAddr(s string) netip.AddrPort {
	a, _ := netip.ParseAddrPort(s)
	return a
}

// Listener accepts message connections: what Listen makes.
type Listener struct {
	l     *rdmacm.Listener
	o     Config
	local hello
}

// Listen listens for message connections at address through lc (nil: the
// zero rdmacm.ListenConfig), with buffers as cfg says (nil: the defaults).
// lc's queue sizes are replaced by what cfg needs and its PrivateData is
// not used: the accept carries the hello.
func Listen(ctx context.Context, lc *rdmacm.ListenConfig, address string, cfg *Config) (*Listener, error) {
	fail := func(err error) (*Listener, error) {
		return nil, &OpError{Op: "listen", Local: parseAddr(address), Err: err}
	}
	o, err := cfg.resolve()
	if err != nil {
		return fail(err)
	}
	var c rdmacm.ListenConfig
	if lc != nil {
		c = *lc
	}
	if err := checkConnConfig(&c.ConnConfig); err != nil {
		return fail(err)
	}
	if err := checkKeepalive(&o, &c.ConnConfig); err != nil {
		return fail(err)
	}
	c.Cap = o.qpCap()
	c.CQEntries = 0
	c.PrivateData = nil
	l, err := c.Listen(ctx, address)
	if err != nil {
		return fail(err)
	}
	return &Listener{l: l, o: o, local: o.hello()}, nil
}

// Addr is the address and port the listener is bound to.
func (l *Listener) Addr() netip.AddrPort { return l.l.Addr() }

// Close stops listening.
func (l *Listener) Close() error { return l.l.Close() }

// Accept waits for the next dialer and returns its connection, with the
// receive buffers posted before the accept went out. A request without an
// acceptable hello is rejected with the reason (which the dialer's error
// shows) and Accept waits for the next. Other failures of one request are
// returned: the listener keeps listening. Sends on the returned connection
// wait for the dialer's HELLO frame.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	for {
		req, err := l.l.Request(ctx)
		if err != nil {
			return nil, &OpError{Op: "accept", Local: l.l.Addr(), Err: err}
		}
		peer, err := parseHello(req.PrivateData)
		if err != nil {
			reason := err.Error()
			if len(reason) > 140 {
				reason = reason[:140]
			}
			req.Reject([]byte(reason))
			continue
		}
		var pool *verbs.MR
		rc, err := req.AcceptWith(ctx, l.local.marshal(), func(s rdmacm.Setup) error {
			mr, err := postPool(s, &l.o)
			pool = mr
			return err
		})
		if err != nil {
			return nil, &OpError{Op: "accept", Local: req.Local, Remote: req.Remote, Err: err}
		}
		c, err := newConn(rc, &l.o, l.local, peer, pool, true)
		if err != nil {
			rc.Close()
			return nil, &OpError{Op: "accept", Local: req.Local, Remote: req.Remote, Err: err}
		}
		return c, nil
	}
}
