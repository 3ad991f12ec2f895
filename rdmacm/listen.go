package rdmacm

import (
	"context"
	"errors"
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
	if e.id.DeviceName() != "" {
		// Bound to one device: refuse now what it cannot do.
		if dev, err := id.Device(); err == nil && dev.Info.Transport == verbs.TransportIWARP {
			e.iwarp = true
			if err := e.checkMode(); err != nil {
				return fail(err)
			}
		}
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
	data, mtu := decodePrivateData(ev.PrivateData, l.opts.RawPrivateData)
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
		return nil, &OpError{Op: "accept", Local: l.addr, Kind: ErrEventChannel, Err: l.id.ch.failure()}
	case <-ctx.Done():
		return nil, &OpError{Op: "accept", Local: l.addr, Err: ctx.Err()}
	}
}

// Accept waits for the next connect request and accepts it with the
// listener's Options.PrivateData. A request that fails during the
// handshake is returned as an error; the listener keeps listening.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	r, err := l.Request(ctx)
	if err != nil {
		return nil, err
	}
	return r.Accept(ctx, l.opts.PrivateData)
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

// Reject refuses the request, sending privateData with the reject (at most
// 192 bytes on PS_TCP). The dialer's error is a *RejectedError with status
// 28 and this data (iWARP: status -104, the MPA reject).
func (r *ConnRequest) Reject(privateData []byte) error {
	if !r.claim() {
		return &OpError{Op: "reject", Local: r.Local, Remote: r.Remote, Err: ErrClosed}
	}
	defer r.id.Close()
	data, err := encodePrivateData(r.id.ps, msgReject, r.l.opts.RawPrivateData, 0, privateData)
	if err != nil {
		r.id.Reject(nil)
		return &OpError{Op: "reject", Local: r.Local, Remote: r.Remote, Device: r.Device, Err: cause(err)}
	}
	if err := r.id.Reject(data); err != nil {
		return &OpError{Op: "reject", Local: r.Local, Remote: r.Remote, Device: r.Device, Err: cause(err)}
	}
	return nil
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
	r.id.Reject(data) // nothing to do if it fails: the dialer times out
}

// Accept accepts the request with privateData (at most 192 bytes on
// PS_TCP) and waits for the connection to be established (RC; UD needs no
// third message). On failure the request's resources are released.
func (r *ConnRequest) Accept(ctx context.Context, privateData []byte) (*Conn, error) {
	if !r.claim() {
		return nil, &OpError{Op: "accept", Local: r.Local, Remote: r.Remote, Err: ErrClosed}
	}
	o := r.l.opts
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
	if _, err := encodePrivateData(e.id.ps, msgAccept, o.RawPrivateData, 0, privateData); err != nil {
		e.id.Reject(nil)
		return nil, e.fail("accept", nil, err)
	}
	// The dialer may have given up while the request waited.
	if ev := e.id.poll(); ev != nil {
		return nil, e.failEvent("accept", peerGone(ev.Type), ev)
	}
	if err := e.prepare(); err != nil {
		e.id.Reject(nil)
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
		e.id.Reject(nil)
		return nil, err
	}
	p := ConnParam{RNRRetryCount: orSeven(o.RNRRetryCount)}
	if err := e.rdAtomic(&p, &r.Param); err != nil {
		e.id.Reject(nil)
		return nil, err
	}
	if o.Mode == ModeManual {
		p.QPNum = e.res.qp.QPN
		if o.QPType != verbs.QPTypeUD {
			if err := e.move(verbs.QPStateRTR, r.peerMTU); err != nil {
				e.id.Reject(nil)
				return nil, err
			}
			if err := e.move(verbs.QPStateRTS, 0); err != nil {
				e.id.Reject(nil)
				return nil, err
			}
		}
	}
	if err := e.beforeConnect(); err != nil {
		e.id.Reject(nil)
		return nil, err
	}
	data, _ := encodePrivateData(e.id.ps, msgAccept, o.RawPrivateData, e.localMTU(), privateData)
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
