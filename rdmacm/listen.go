package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmago/rdmago/verbs"
)

// Listener takes connect requests on an address and port.
type Listener struct {
	opts Options
	id   *ID
	addr netip.AddrPort
	reqs chan *ConnRequest

	closeOnce sync.Once
	closed    chan struct{}
}

// Listen binds to address ("10.0.0.1:7471", "0.0.0.0:7471", "[::]:0") and
// listens for connect requests in the port space of opts.QPType.
func Listen(address string, opts *Options) (*Listener, error) {
	o := opts.withDefaults()
	if err := o.check(); err != nil {
		return nil, err
	}
	ap, err := parseAddr(address)
	if err != nil {
		return nil, err
	}
	id, err := newID(o.portSpace())
	if err != nil {
		return nil, &OpError{Op: "listen", Local: ap, Err: err}
	}
	e := &endpoint{op: "listen", o: &o, id: id, local: ap}
	fail := func(err error) (*Listener, error) {
		id.Close()
		return nil, err
	}
	if err := e.setOptions(); err != nil {
		return fail(err)
	}
	if err := id.Bind(ap); err != nil {
		oe := e.fail("bind", nil, err)
		oe.Hint = "is the address local and on a netdev with an RDMA device (or a wildcard), and the port free?"
		if errors.Is(err, syscall.EADDRINUSE) {
			oe.Hint = "another rdma_cm id (a listener, or a connection bound to this port) holds it: close it or use another port"
		}
		return fail(oe)
	}
	// The kernel's backlog counts only the requests our dispatcher has not
	// read yet; Options.Backlog is enforced on the queue behind it, where a
	// refusal can say why. A small Backlog must not let the kernel refuse,
	// without a reason, a request that arrives just after another.
	if err := id.Listen(max(o.Backlog, defaultBacklog)); err != nil {
		oe := e.fail("listen", nil, err)
		if errors.Is(err, syscall.EADDRINUSE) {
			// Past the bind: another ReuseAddr id bound the port and
			// listened first, or a wildcard listen hit the siw collision
			// (see the package docs on iWARP).
			oe.Hint = "another id with ReuseAddr listened on this port first; or, on a wildcard address, siw devices whose netdevs" +
				" have the same ifindex (in different network namespaces) collide: listen on a specific address"
		}
		return fail(oe)
	}
	l := &Listener{opts: o, id: id, addr: id.LocalAddr(), reqs: make(chan *ConnRequest, o.Backlog), closed: make(chan struct{})}
	cm := cmUnknown
	if e.id.DeviceName() != "" {
		// Bound to one device: refuse now what it cannot do.
		if dev, err := id.Device(); err == nil {
			cm = cmKindOf(dev.Info.Transport)
			if dev.Info.Transport == verbs.TransportIWARP {
				e.iwarp = true
				if err := e.checkMode(); err != nil {
					return fail(err)
				}
			}
		}
	}
	// Accept sends Options.PrivateData: refuse now what fits no accept (on
	// a wildcard address, what fits no transport's; each request's own is
	// checked as it is accepted).
	if err := checkPrivateData(cm, o.portSpace(), msgAccept, o.RawPrivateData, o.PrivateData); err != nil {
		oe := e.fail("listen", nil, err)
		oe.Hint = "Options.PrivateData is what Listener.Accept sends with every accept: shorten it"
		return fail(oe)
	}
	id.setHandler(l.onEvent)
	return l, nil
}

// Addr is the address and port the listener is bound to.
func (l *Listener) Addr() netip.AddrPort { return l.addr }

func (l *Listener) onEvent(ev *Event) {
	if ev.Type != EventConnectRequest || ev.ID == nil {
		return // DEVICE_REMOVAL or ADDR_CHANGE on a bound listener: requests simply stop
	}
	iwarp := false
	if dev, err := ev.ID.Device(); err == nil {
		iwarp = dev.Info.Transport == verbs.TransportIWARP
	}
	data, mtu := receivedData(ev.PrivateData, l.opts.RawPrivateData, iwarp)
	r := &ConnRequest{Param: ev.Param, PrivateData: data, Local: ev.ID.LocalAddr(), Remote: ev.ID.RemoteAddr(),
		Device: ev.ID.DeviceName(), Port: ev.ID.Port(), peerMTU: mtu, id: ev.ID, l: l}
	select {
	case l.reqs <- r:
	default:
		// Backlog full: refuse now rather than let the peer time out. The
		// dispatcher must not wait, and destroying an iWARP id can.
		go r.refuse(RefusalBacklogFull)
	}
}

// Request waits for the next connect request, which the caller must Accept
// or Reject.
func (l *Listener) Request(ctx context.Context) (*ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.closed:
		return nil, &OpError{Op: "accept", Local: l.addr, Err: ErrClosed}
	case <-l.id.ch.failed:
		return nil, &OpError{Op: "accept", Local: l.addr, Err: l.id.ch.failure()}
	case <-ctx.Done():
		return nil, &OpError{Op: "accept", Local: l.addr, Err: ctx.Err()}
	}
}

// Accept waits for the next connect request and accepts it with the
// listener's Options.PrivateData. A request that fails during the
// handshake is returned as an error (and rejected, if it was not); the
// listener keeps listening.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	r, err := l.Request(ctx)
	if err != nil {
		return nil, err
	}
	c, err := r.Accept(ctx, l.opts.PrivateData)
	var oe *OpError
	if errors.Is(err, ErrPrivateDataTooLong) && errors.As(err, &oe) {
		// Options.PrivateData fits some transport but not this request's,
		// and the caller never saw the request: answer it.
		r.Reject(nil)
		oe.Hint = "the request was rejected: Options.PrivateData is what Listener.Accept sends, and it must fit every transport " +
			"the listener takes requests on (shorten it, or take requests with Request and accept each with data that fits)"
	}
	return c, err
}

// Close stops listening and refuses requests not yet accepted.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		l.id.Close()
		for {
			select {
			case r := <-l.reqs:
				r.refuse(RefusalListenerClosed)
			default:
				return
			}
		}
	})
	return nil
}

// ConnRequest is a peer's connect request, waiting for Accept or Reject.
type ConnRequest struct {
	Local, Remote netip.AddrPort
	Device        string
	Port          int
	// Param is what the peer offered: its responder resources, initiator
	// depth and retry counts.
	Param ConnParam
	// PrivateData the peer sent with the request (rdmago's header removed).
	PrivateData []byte

	peerMTU verbs.MTU
	id      *ID
	l       *Listener
	used    atomic.Bool
}

func (r *ConnRequest) claim() bool { return r.used.CompareAndSwap(false, true) }

// Reject refuses the request, sending privateData with the reject: at most
// 144 bytes on InfiniBand and RoCE (a REJ carries 148, less rdmago's
// header), 247 on iWARP, 132 on PS_UDP; 4 more with
// Options.RawPrivateData. The dialer's error is a *RejectedError with this
// data (status 28; iWARP: -104, the MPA reject; PS_UDP: 2, the SIDR
// reject). Longer data is refused with a *PrivateDataError before anything
// is sent, and the request stays pending: Reject it again with less, or
// Accept it.
func (r *ConnRequest) Reject(privateData []byte) error {
	if r.used.Load() {
		return r.closedError("reject")
	}
	if err := r.checkData("reject", msgReject, privateData); err != nil {
		return err
	}
	if !r.claim() {
		return r.closedError("reject")
	}
	defer r.id.Close()
	if err := r.id.reject(encodePrivateData(r.l.opts.RawPrivateData, 0, privateData)); err != nil {
		return &OpError{Op: "reject", Local: r.Local, Remote: r.Remote, Device: r.Device, Port: r.Port, Err: cause(err)}
	}
	return nil
}

func (r *ConnRequest) closedError(op string) error {
	return &OpError{Op: op, Local: r.Local, Remote: r.Remote, Err: ErrClosed}
}

// checkData refuses privateData that does not fit message k of this
// request's transport and port space. Nothing is sent: the request stays
// pending.
func (r *ConnRequest) checkData(op string, k messageKind, privateData []byte) error {
	cm := cmIB // the smaller limits, should the device be unknown
	if dev, err := r.id.Device(); err == nil {
		cm = cmKindOf(dev.Info.Transport)
	}
	pe := checkPrivateData(cm, r.id.ps, k, r.l.opts.RawPrivateData, privateData)
	if pe == nil {
		return nil
	}
	raw := r.l.opts.RawPrivateData
	return &OpError{Op: op, Local: r.Local, Remote: r.Remote, Device: r.Device, Port: r.Port, Err: pe,
		Hint: fmt.Sprintf("nothing was sent and the request is still pending: Accept it with at most %d bytes of private data, or Reject it with at most %d",
			privateDataLimit(cm, r.id.ps, msgAccept, raw), privateDataLimit(cm, r.id.ps, msgReject, raw))}
}

// refuse rejects the request on the listener's own account. The dialer's
// RejectedError says why, unless the listener's private data is raw.
func (r *ConnRequest) refuse(why Refusal) {
	if !r.claim() {
		return
	}
	defer r.id.Close()
	var data []byte
	if !r.l.opts.RawPrivateData {
		data = encodeRefusal(why)
	}
	r.id.reject(data) // nothing to do if it fails: the dialer times out
}

// Accept accepts the request with privateData and waits for the
// connection to be established (RC; UD needs no third message). At most
// 192 bytes of private data fit on InfiniBand and RoCE (a REP carries 196,
// less rdmago's header), 247 on iWARP, 132 on PS_UDP; 4 more with
// Options.RawPrivateData. Longer data is refused with a *PrivateDataError
// before anything is sent, and the request stays pending: Accept it again
// with less, or Reject it. On any other failure the request is rejected
// and its resources are released.
func (r *ConnRequest) Accept(ctx context.Context, privateData []byte) (*Conn, error) {
	return r.AcceptWith(ctx, privateData, nil)
}

// AcceptWith is Accept that first runs setup on the connection, once its QP
// exists and before the accept goes out (after Options.BeforeConnect):
// register memory and post receives there, so that the peer's first SEND
// finds one (on iWARP a SEND that finds none ends the connection). What
// setup makes stays with the code that accepted, in its own variables; an
// error from setup rejects the request and releases the memory registered.
func (r *ConnRequest) AcceptWith(ctx context.Context, privateData []byte, setup func(*Conn) error) (*Conn, error) {
	if r.used.Load() {
		return nil, r.closedError("accept")
	}
	if err := r.checkData("accept", msgAccept, privateData); err != nil {
		return nil, err
	}
	if !r.claim() {
		return nil, r.closedError("accept")
	}
	o := r.l.opts
	if setup != nil {
		listenerSetup := o.BeforeConnect
		o.BeforeConnect = func(c *Conn) error {
			if listenerSetup != nil {
				if err := listenerSetup(c); err != nil {
					return err
				}
			}
			return setup(c)
		}
	}
	e := &endpoint{op: "accept", o: &o, id: r.id, local: r.Local, remote: r.Remote}
	c, err := e.accept(ctx, r, privateData)
	if err != nil {
		e.abort()
		return nil, err
	}
	return c, nil
}

func (e *endpoint) accept(ctx context.Context, r *ConnRequest, privateData []byte) (*Conn, error) {
	o := e.o
	// ConnRequest.Accept has checked privateData's length, so that a
	// refusal leaves the request pending.

	// The dialer may have given up while the request waited.
	if ev := e.id.poll(); ev != nil {
		return nil, e.failEvent("accept", peerGone(ev.Type), ev)
	}
	if err := e.prepare(); err != nil {
		e.id.reject(nil)
		if ev := e.id.poll(); ev != nil { // the reason the CM refused
			return nil, e.failEvent("accept", peerGone(ev.Type), ev)
		}
		var oe *OpError
		if errors.As(err, &oe) && errors.Is(err, syscall.EINVAL) {
			oe.Hint = "the CM no longer takes this request: the dialer probably gave up (cancelled or timed out) while it waited"
		}
		return nil, err
	}
	if err := e.checkMode(); err != nil {
		e.id.reject(nil)
		return nil, err
	}
	p := ConnParam{RNRRetryCount: orSeven(o.RNRRetryCount)}
	if err := e.rdAtomic(&p, &r.Param); err != nil {
		e.id.reject(nil)
		return nil, err
	}
	if o.Mode == ModeManual {
		p.QPNum = e.res.qp.QPN
		if o.QPType != verbs.QPTypeUD {
			if err := e.move(verbs.QPStateRTR, r.peerMTU); err != nil {
				e.id.reject(nil)
				return nil, err
			}
			if err := e.move(verbs.QPStateRTS, 0); err != nil {
				e.id.reject(nil)
				return nil, err
			}
		}
	}
	if err := e.beforeConnect(); err != nil {
		e.id.reject(nil)
		return nil, err
	}
	data := encodePrivateData(o.RawPrivateData, e.localMTU(), privateData)
	start := time.Now()
	if err := e.id.connectOrAccept(true, p, data); err != nil {
		return nil, e.fail("accept", ErrConnect, err)
	}
	if o.QPType == verbs.QPTypeUD {
		o.trace(StepConnect, start)
		return e.conn(r.PrivateData, o.Mode), nil
	}
	ev, err := e.await(ctx, "accept", o.ConnectTimeout)
	if err != nil {
		return nil, err
	}
	switch ev.Type {
	case EventEstablished:
		o.trace(StepConnect, start)
		return e.conn(r.PrivateData, o.Mode), nil
	case EventUnreachable:
		return nil, e.failEvent("accept", ErrUnreachable, ev)
	case EventRejected:
		oe := e.failEvent("accept", nil, ev)
		oe.Err = &RejectedError{Status: ev.Status}
		return nil, oe
	}
	return nil, e.failEvent("accept", peerGone(ev.Type), ev)
}

func peerGone(t EventType) error {
	switch t {
	case EventDisconnected:
		return ErrDisconnected
	case EventDeviceRemoval:
		return ErrDeviceRemoved
	case EventUnreachable:
		return ErrUnreachable
	}
	return ErrConnect
}
