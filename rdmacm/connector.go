package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/rdmago/rdmago/verbs"
)

// A connector takes a dial through its steps, in Dial's order:
// newConnector (rdma_create_id), ResolveAddr, ResolveRoute, CreateQP and
// Connect. Close releases what it holds unless Connect handed it to a Conn.
type connector struct {
	e *endpoint
	// background: a failed iWARP connect may still be pending in the
	// kernel, and destroying the id waits for it; Close releases in the
	// background so that the caller is not held up.
	background bool
	done       bool // Connect returned a Conn, which owns everything, or Close ran
}

// newConnector parses address ("10.0.0.2:7471", "[fe80::2%eth0]:7471")
// and creates the CM id: Dial's first step.
func newConnector(address string, o *settings) (*connector, error) {
	dst, err := parseAddr(address)
	if err != nil {
		return nil, &OpError{Op: "dial", Local: addrPort(o.Source), Err: err}
	}
	ps := o.portSpace()
	// Data that no transport's connect request carries is refused now;
	// the device's own limit is checked once the address is resolved.
	if err := checkPrivateData(cmUnknown, ps, msgConnect, o.RawPrivateData, o.PrivateData); err != nil {
		return nil, &OpError{Op: "dial", Local: addrPort(o.Source), Remote: dst, Err: err}
	}
	start := time.Now()
	id, err := newID(ps)
	if err != nil {
		return nil, &OpError{Op: "dial", Local: addrPort(o.Source), Remote: dst, Err: err}
	}
	o.trace(StepCreateID, start)
	e := &endpoint{op: "dial", o: o, id: id, local: addrPort(o.Source), remote: dst}
	return &connector{e: e}, nil
}

// ResolveAddr applies the id's options (TOS, reuse, ACK timeout) and
// resolves the destination to a local RDMA device and port, with
// Dialer.ResolveAddrTimeout and ResolveRetries. It refuses a mode the
// device cannot do (UD or ModeManual on iWARP).
func (c *connector) ResolveAddr(ctx context.Context) error {
	if err := c.e.setOptions(); err != nil {
		return err
	}
	return c.e.resolveAddr(ctx, c.e.o.Source)
}

// ResolveRoute resolves the route to the destination, with
// Dialer.ResolveRouteTimeout and ResolveRetries.
func (c *connector) ResolveRoute(ctx context.Context) error { return c.e.resolveRoute(ctx) }

// CreateQP makes the PD (unless ConnConfig.PD), the CQs and the QP; in
// ModeManual the QP is taken to INIT. It waits for nothing.
func (c *connector) CreateQP() error { return c.e.prepare() }

// Connect sends the connect request with Dialer.PrivateData, waits up to
// ConnConfig.ConnectTimeout for the peer's answer and returns the connection,
// which from then on owns every resource. Its errors are Dial's.
func (c *connector) Connect(ctx context.Context) (*conn, error) {
	conn, err := c.e.connect(ctx)
	if err != nil {
		e := c.e
		c.background = e.inFlight != nil ||
			e.iwarp && e.connecting && (ctx.Err() != nil || errors.Is(err, ErrTimeout))
		return nil, err
	}
	c.done = true
	return conn, nil
}

// Close releases the QP, CQs, PD and CM id, unless Connect returned a Conn
// (close that instead). It returns what releasing the verbs objects
// reported, or nil when the release goes on in the background: an iWARP
// connect that was cancelled or timed out may still be pending in the
// kernel, which holds up destroying the id for up to about 10 s, and an
// rdma_connect that Connect gave up on may still be blocked (see
// connectCall): the release waits for it to return.
func (c *connector) Close() error {
	if c.done {
		return nil
	}
	c.done = true
	if c.background || (c.e.iwarp && c.e.connecting) {
		go func() {
			if c.e.inFlight != nil {
				<-c.e.inFlight
			}
			c.e.abort()
		}()
		return nil
	}
	return c.e.abort()
}

// connect is Dial's last step: the request, the answer and, in
// ModeManual, the QP's moves and the RTU.
func (e *endpoint) connect(ctx context.Context) (*conn, error) {
	if err := e.issueConnect(ctx); err != nil {
		return nil, err
	}
	return e.answer(ctx)
}

// answer waits for the peer's answer to the connect request, and in
// ModeManual moves the QP and sends the RTU.
func (e *endpoint) answer(ctx context.Context) (*conn, error) {
	o := e.o
	start := e.issuedAt
	ev, err := e.await(ctx, "connect", o.ConnectTimeout)
	if err != nil {
		return nil, err
	}
	e.connecting = false
	peerData, peerMTU := receivedData(ev.PrivateData, o.RawPrivateData, e.iwarp)
	switch ev.Type {
	case EventEstablished:
		o.trace(StepConnect, start)
		if o.QPType == verbs.QPTypeUD {
			return e.udConn(ev, peerData, peerMTU)
		}
		return e.conn(peerData, o.Mode, nil), nil
	case EventConnectResponse:
		// Manual mode: the QP is ours to move, then the RTU tells the peer.
		// INIT again first, as librdmacm does for its own QPs: only now
		// does the CM grant remote read and atomic access (the INIT
		// attributes before the reply have remote write alone), and without
		// it the peer's RDMA READs fail with a remote invalid request.
		o.trace(StepConnect, start)
		for _, to := range []verbs.QPState{verbs.QPStateInit, verbs.QPStateRTR, verbs.QPStateRTS} {
			if err := e.move(to, peerMTU); err != nil {
				e.id.reject(nil)
				return nil, err
			}
		}
		start := time.Now()
		if err := e.id.Establish(); err != nil {
			return nil, e.fail("rdma_establish", ErrConnect, err)
		}
		o.trace(StepEstablish, start)
		return e.conn(peerData, o.Mode, nil), nil
	case EventRejected:
		return nil, e.rejected(ev)
	case EventUnreachable:
		if ev.UD && ev.Status > 0 {
			// PS_UDP: the peer answered without a QP (its SIDR REP's
			// status says why: no listener, a reject, ...).
			return nil, e.rejected(ev)
		}
		return nil, e.failEvent("connect", ErrUnreachable, ev)
	case EventConnectError:
		return nil, e.connectError(ev)
	case EventDeviceRemoval:
		return nil, e.failEvent("connect", ErrDeviceRemoved, ev)
	}
	return nil, e.failEvent("connect", ErrConnect, ev)
}

// connectError is the dialer's error for CONNECT_ERROR. On InfiniBand and
// RoCE librdmacm makes that event itself when it cannot act on the peer's
// reply (move the QP to RTR and RTS, or send the RTU), with status -1:
// "see errno", which an event cannot carry. It is not EPERM.
func (e *endpoint) connectError(ev *Event) *OpError {
	oe := e.failEvent("connect", ErrConnect, ev)
	if !e.iwarp && ev.Status == -1 {
		oe.Err = nil
		oe.Hint = connectErrorHint
	}
	return oe
}

// connectErrorHint explains librdmacm's own CONNECT_ERROR (status -1).
const connectErrorHint = "librdmacm could not act on the peer's reply (move the QP to RTR and RTS, or send the RTU); " +
	"most often the peer gave up on the request first: its accept timed out (its ConnectTimeout), " +
	"as happens under load, and its CM rejected the connection"

// rejected is the dialer's error for a reject: a *RejectedError carrying
// exactly the private data the peer application sent (see rejectData).
func (e *endpoint) rejected(ev *Event) *OpError {
	oe := e.failEvent("connect", nil, ev)
	rej := &RejectedError{Status: ev.Status, ud: ev.UD}
	rej.PrivateData, rej.Refusal = rejectData(ev.PrivateData, rej, e.iwarp, e.o.RawPrivateData)
	oe.Err = rej
	switch {
	case rej.Refusal != RefusalNone:
		oe.Hint = rej.Refusal.hint()
	case ev.UD:
		oe.Hint = rej.meaning() // not UNREACHABLE's
	}
	return oe
}

// issueConnect runs BeforeConnect and sends the connect request with
// Dialer.PrivateData, once it is known to fit the device's transport.
func (e *endpoint) issueConnect(ctx context.Context) error {
	o := e.o
	if pe := checkPrivateData(e.cm(), e.id.ps, msgConnect, o.RawPrivateData, o.PrivateData); pe != nil {
		oe := e.fail("connect", nil, pe)
		oe.Hint = "nothing was sent: dial with less Dialer.PrivateData"
		return oe
	}
	return e.sendConnect(ctx, o.PrivateData)
}

// sendConnect runs BeforeConnect and sends the connect request with
// privateData, which must fit.
func (e *endpoint) sendConnect(ctx context.Context, privateData []byte) error {
	o := e.o
	var p ConnParam
	if err := e.rdAtomic(&p, nil); err != nil {
		return err
	}
	p.RetryCount, p.RNRRetryCount = o.RetryCount, o.RNRRetryCount
	if o.Mode == ModeManual {
		p.QPNum = e.res.qp.QPN
	}
	// After BeforeConnect, which may write into the private data (a key
	// of memory it registered), as it may for an accept.
	if err := e.beforeConnect(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		// Cancelled before the request went: send none, rather than one
		// the peer would accept for a connection already abandoned.
		return e.fail("connect", nil, err)
	}
	data := encodePrivateData(o.RawPrivateData, e.localMTU(), privateData)
	e.issuedAt = time.Now()
	if err := e.connectCall(ctx, p, data); err != nil {
		if e.inFlight != nil {
			return err
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			// iWARP connects its TCP stream in rdma_connect: a refusal is immediate.
			oe := e.fail("connect", nil, &RejectedError{Status: rejectIWARP})
			oe.Hint = rejectMeaning(rejectIWARP)
			return oe
		}
		return e.fail("connect", ErrConnect, err)
	}
	e.connecting = true
	return nil
}

// connectCall makes the rdma_connect call. On iWARP the call itself can
// block for minutes: the kernel connects the TCP stream before it returns
// (siw_connect's kernel_connect is a blocking one), and a host that does
// not answer holds it until TCP gives up on its SYNs (net.ipv4.
// tcp_syn_retries; about 2 minutes by default). There the call runs on a
// goroutine of its own: when ctx ends or ConnectTimeout passes first, the
// dial fails at once, and e.inFlight says when the call is over, so that
// the release (connector.Close) waits for it.
func (e *endpoint) connectCall(ctx context.Context, p ConnParam, data []byte) error {
	if !e.iwarp {
		return e.id.connectOrAccept(false, p, data)
	}
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		err = e.id.connectOrAccept(false, p, data)
	}()
	timer := time.NewTimer(e.o.ConnectTimeout)
	defer timer.Stop()
	select {
	case <-done:
		return err
	case <-ctx.Done():
		e.inFlight = done
		oe := e.fail("connect", nil, ctx.Err())
		oe.Hint = "the kernel was still connecting the iWARP TCP stream; that goes on in the background and its " +
			"resources are released when it ends"
		return oe
	case <-timer.C:
		e.inFlight = done
		oe := e.fail("connect", ErrTimeout, fmt.Errorf("rdma_connect still connecting the iWARP TCP stream after %v",
			e.o.ConnectTimeout))
		oe.Hint = "the peer's host did not answer the TCP connection: is it up, reachable, and the address right? " +
			"(the attempt is released in the background)"
		return oe
	}
}
