package msg

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"

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
	dd.PrivateData = local.marshalProbe()
	dd.Cap = o.qpCap()
	dd.CQEntries = 0
	var pool, probe *verbs.MR
	user := dd.BeforeConnect
	hello := dd.PrivateData
	dd.BeforeConnect = func(s rdmacm.Setup) error {
		if user != nil {
			if err := user(s); err != nil {
				return err
			}
		}
		var err error
		if probe, err = registerProbe(s, hello); err != nil {
			return err
		}
		pool, err = postPool(s, &o)
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
	c, err := newConn(rc, &o, local, peer, pool, probe, false)
	if err != nil {
		rc.Close()
		return fail(err)
	}
	if err := c.sendFrame(ctx, nil, "dial", frameHello, nil, false); err != nil {
		c.close()
		return nil, err
	}
	return wrap(c), nil
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

// Listener accepts message connections: what Listen makes. One dropped
// without Close is closed once the garbage collector finds it unreachable,
// as a net.Listener's descriptor is; a blocked Accept keeps it.
type Listener struct {
	*listener
	cleanup runtime.Cleanup
}

// listener is a Listener's state: what its goroutines refer to, so that
// the handle alone decides when a dropped one is closed.
type listener struct {
	l     *rdmacm.Listener
	o     Config
	local hello

	// ctx bounds the handshakes; Close ends it.
	ctx    context.Context
	cancel context.CancelFunc
	// Each handshake under way, and each connection Accept has not taken
	// yet, holds one of the pending slots; results are those connections,
	// or the failures of single requests.
	pending chan struct{}
	results chan accepted
	wg      sync.WaitGroup // the goroutine taking requests
	mu      sync.Mutex
	started bool
	closed  bool
	err     error         // why requests no longer come, once they do not
	ended   chan struct{} // closed once err is set and the handshakes are over
}

// accepted is a handshake's outcome.
type accepted struct {
	c   *conn
	err error
}

// handle is what Accept returns for the outcome: the connection's handle,
// or the failure.
func (r accepted) handle() (*Conn, error) {
	if r.err != nil {
		return nil, r.err
	}
	return wrap(r.c), nil
}

// maxPending bounds the handshakes under way and the connections not yet
// taken by Accept, together; rdmacm's backlog holds the requests beyond.
const maxPending = 16

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
	ml := &listener{l: l, o: o, local: o.hello(), pending: make(chan struct{}, maxPending),
		results: make(chan accepted, maxPending), ended: make(chan struct{})}
	ml.ctx, ml.cancel = context.WithCancel(context.Background())
	h := &Listener{listener: ml}
	h.cleanup = runtime.AddCleanup(h, closeDroppedListener, ml)
	return h, nil
}

// closeDroppedListener closes a Listener dropped without Close, on a
// goroutine of its own (closing waits for the handshakes under way).
func closeDroppedListener(l *listener) { go l.close() }

// Addr is the address and port the listener is bound to.
func (l *Listener) Addr() netip.AddrPort { return l.l.Addr() }

// Close stops listening, ends the handshakes under way, and closes the
// connections that Accept has not returned yet. A blocked Accept returns
// an error matching ErrClosed.
func (l *Listener) Close() error {
	l.cleanup.Stop()
	return l.close()
}

// close is Close's work, also for a Listener dropped without Close.
func (l *listener) close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	err := l.l.Close()
	l.wg.Wait()
	// In parallel: each Close may wait its CloseTimeout for a peer that
	// never finished its handshake.
	var closing sync.WaitGroup
	defer closing.Wait()
	for {
		select {
		case r := <-l.results:
			<-l.pending
			if r.c != nil {
				closing.Add(1)
				go func() { defer closing.Done(); r.c.close() }()
			}
		default:
			return err
		}
	}
}

// Accept waits for the next dialer and returns its connection, with the
// receive buffers posted before the accept went out. From the first call
// of Accept on, the listener takes requests and runs their handshakes in
// parallel, so that a dialer that stalls in its handshake (until the
// ListenConfig's ConnectTimeout) holds up no other: up to 16 handshakes
// under way and connections not yet returned, together, while rdmacm's
// backlog holds the requests beyond. A request without an acceptable hello
// is rejected with the reason (which the dialer's error shows) and passed
// over. Other failures of one request are returned: the listener keeps
// listening. Sends on the returned connection wait for the dialer's HELLO
// frame. After Close, Accept fails with an error matching ErrClosed.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	c, err := l.accept(ctx)
	runtime.KeepAlive(l) // an Accept waiting for a dialer keeps its Listener
	return c, err
}

// accept is Accept's work.
func (l *listener) accept(ctx context.Context) (*Conn, error) {
	fail := func(err error) (*Conn, error) { return nil, &OpError{Op: "accept", Local: l.l.Addr(), Err: err} }
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return fail(ErrClosed)
	}
	if !l.started {
		l.started = true
		l.wg.Add(1)
		go l.run()
	}
	l.mu.Unlock()
	select {
	case r := <-l.results:
		<-l.pending
		return r.handle()
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-l.ctx.Done():
		return fail(ErrClosed)
	case <-l.ended:
		select {
		case r := <-l.results:
			<-l.pending
			return r.handle()
		default:
			return nil, l.err
		}
	}
}

// run takes the requests and starts their handshakes, while fewer than
// maxPending are under way or waiting for Accept.
func (l *listener) run() {
	defer l.wg.Done()
	var handshakes sync.WaitGroup
	defer handshakes.Wait()
	for {
		select {
		case l.pending <- struct{}{}:
		case <-l.ctx.Done():
			return
		}
		req, err := l.l.Request(l.ctx)
		if err != nil {
			<-l.pending
			if l.ctx.Err() != nil {
				return
			}
			handshakes.Wait()
			l.err = &OpError{Op: "accept", Local: l.l.Addr(), Err: err}
			close(l.ended)
			return
		}
		peer, err := parseHello(req.PrivateData)
		if err != nil {
			reason := err.Error()
			if len(reason) > 140 {
				reason = reason[:140]
			}
			req.Reject([]byte(reason))
			<-l.pending
			continue
		}
		handshakes.Add(1)
		go func() {
			defer handshakes.Done()
			c, err := l.handshake(req, peer)
			l.results <- accepted{c, err}
		}()
	}
}

// handshake accepts one request whose hello was acceptable.
func (l *listener) handshake(req *rdmacm.ConnRequest, peer hello) (*conn, error) {
	var pool, probe *verbs.MR
	hello := l.local.marshalProbe()
	rc, err := req.AcceptWith(l.ctx, hello, func(s rdmacm.Setup) error {
		var err error
		if probe, err = registerProbe(s, hello); err != nil {
			return err
		}
		pool, err = postPool(s, &l.o)
		return err
	})
	if err != nil {
		return nil, &OpError{Op: "accept", Local: req.Local, Remote: req.Remote, Err: err}
	}
	c, err := newConn(rc, &l.o, l.local, peer, pool, probe, true)
	if err != nil {
		rc.Close()
		return nil, &OpError{Op: "accept", Local: req.Local, Remote: req.Remote, Err: err}
	}
	return c, nil
}
