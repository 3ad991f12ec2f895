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

// listener is what Listener and UDListener are made of: a listening CM
// id and the requests it has queued.
type listener struct {
	opts   settings
	id     *ID
	addr   netip.AddrPort
	device string // when bound to one
	reqs   chan *request

	closeOnce sync.Once
	closed    chan struct{}

	// broken is closed when the listener can take no more requests
	// (its device was removed); brokenErr says why.
	breakOnce sync.Once
	broken    chan struct{}
	brokenErr error
}

// Listener takes requests for reliable connections on an address and
// port: what [ListenConfig.Listen] makes.
type Listener struct {
	*listener
}

// UDListener takes requests from UD dialers ([Dialer.DialUD]) in the
// CM's UDP port space: what [ListenConfig.ListenUD] makes.
type UDListener struct {
	*listener
}

// Listen listens at address with the zero ListenConfig: see
// [ListenConfig.Listen].
func Listen(address string) (*Listener, error) {
	var lc ListenConfig
	return lc.Listen(context.Background(), address)
}

// ListenUD listens for UD dialers at address with the zero ListenConfig:
// see [ListenConfig.ListenUD].
func ListenUD(address string) (*UDListener, error) {
	var lc ListenConfig
	return lc.ListenUD(context.Background(), address)
}

// Listen binds to address ("10.0.0.1:7471", "0.0.0.0:7471", "[::]:0")
// and listens for reliable connections (the CM's TCP port space). ctx
// only bounds the call: binding and listening do not wait.
func (lc *ListenConfig) Listen(ctx context.Context, address string) (*Listener, error) {
	l, err := lc.listen(ctx, verbs.QPTypeRC, address)
	if err != nil {
		return nil, err
	}
	return &Listener{l}, nil
}

// ListenUD binds to address and listens for UD dialers (the CM's UDP port
// space). InfiniBand and RoCE only: iWARP has no UD.
func (lc *ListenConfig) ListenUD(ctx context.Context, address string) (*UDListener, error) {
	l, err := lc.listen(ctx, verbs.QPTypeUD, address)
	if err != nil {
		return nil, err
	}
	return &UDListener{l}, nil
}

func (lc *ListenConfig) listen(ctx context.Context, t verbs.QPType, address string) (*listener, error) {
	ap, perr := parseAddr(address)
	o, err := lc.settings(t)
	if err != nil {
		return nil, &OpError{Op: "listen", Local: ap, Err: err}
	}
	if perr != nil {
		return nil, &OpError{Op: "listen", Err: perr}
	}
	if err := ctx.Err(); err != nil {
		return nil, &OpError{Op: "listen", Local: ap, Err: err}
	}
	id, err := newID(o.portSpace())
	if err != nil {
		return nil, &OpError{Op: "listen", Local: ap, Err: err}
	}
	e := &endpoint{op: "listen", o: &o, id: id, local: ap}
	fail := func(err error) (*listener, error) {
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
	// Accept sends ListenConfig.PrivateData: refuse now what fits no
	// accept (on a wildcard address, what fits no transport's; each
	// request's own is checked as it is accepted).
	if err := checkPrivateData(cm, o.portSpace(), msgAccept, o.RawPrivateData, o.PrivateData); err != nil {
		oe := e.fail("listen", nil, err)
		oe.Hint = "ListenConfig.PrivateData is what Listener.Accept sends with every accept: shorten it"
		return fail(oe)
	}
	// The kernel's backlog counts only the requests our dispatcher has not
	// read yet; ListenConfig.Backlog is enforced on the queue behind it,
	// where a refusal can say why. A small Backlog must not let the kernel
	// refuse, without a reason, a request that arrives just after another.
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
	l := &listener{opts: o, id: id, addr: id.LocalAddr(), device: id.DeviceName(), reqs: make(chan *request, o.Backlog),
		closed: make(chan struct{}), broken: make(chan struct{})}
	id.setHandler(l.onEvent)
	return l, nil
}

// Addr is the address and port the listener is bound to.
func (l *listener) Addr() netip.AddrPort { return l.addr }

func (l *listener) onEvent(ev *Event) {
	if ev.Type == EventDeviceRemoval {
		// A listener bound to the device: no request comes any more, and
		// its id holds the device until it is closed, which only the
		// caller can do. Its waits end, saying so.
		l.breakOnce.Do(func() {
			l.brokenErr = &OpError{Op: "accept", Local: l.addr, Device: l.device, Kind: ErrDeviceRemoved,
				Err:  errors.New("the listener's RDMA device was removed"),
				Hint: "close this listener (its CM id holds the device until then) and listen again once the device is back"}
			close(l.broken)
		})
		return
	}
	if ev.Type != EventConnectRequest || ev.ID == nil {
		return // ADDR_CHANGE on a bound listener: it still listens
	}
	iwarp := false
	if dev, err := ev.ID.Device(); err == nil {
		iwarp = dev.Info.Transport == verbs.TransportIWARP
	}
	data, mtu := receivedData(ev.PrivateData, l.opts.RawPrivateData, iwarp)
	r := &request{param: ev.Param, data: data, local: ev.ID.LocalAddr(), remote: ev.ID.RemoteAddr(),
		device: ev.ID.DeviceName(), port: ev.ID.Port(), peerMTU: mtu, id: ev.ID, l: l}
	select {
	case l.reqs <- r:
	default:
		// Backlog full: refuse now rather than let the peer time out. The
		// dispatcher must not wait, and destroying an iWARP id can.
		go r.refuse(RefusalBacklogFull)
	}
}

// next waits for the next connect request.
func (l *listener) next(ctx context.Context) (*request, error) {
	// A context that has ended takes no request (select would pick one
	// at random when both are ready): the request waits for the next call.
	if err := ctx.Err(); err != nil {
		return nil, &OpError{Op: "accept", Local: l.addr, Err: err}
	}
	// Nor does a closed or broken listener (Close refuses what is queued).
	select {
	case <-l.closed:
		return nil, &OpError{Op: "accept", Local: l.addr, Err: ErrClosed}
	case <-l.broken:
		return nil, l.brokenErr
	default:
	}
	select {
	case r := <-l.reqs:
		select {
		case <-l.closed: // Close ran meanwhile: the request is refused as it would have been
			r.refuse(RefusalListenerClosed)
			return nil, &OpError{Op: "accept", Local: l.addr, Err: ErrClosed}
		default:
		}
		return r, nil
	case <-l.closed:
		return nil, &OpError{Op: "accept", Local: l.addr, Err: ErrClosed}
	case <-l.broken:
		return nil, l.brokenErr
	case <-l.id.ch.failed:
		return nil, &OpError{Op: "accept", Local: l.addr, Err: l.id.ch.failure()}
	case <-ctx.Done():
		return nil, &OpError{Op: "accept", Local: l.addr, Err: ctx.Err()}
	}
}

// acceptNext waits for the next connect request and accepts it with the
// listener's PrivateData.
func (l *listener) acceptNext(ctx context.Context) (*conn, error) {
	r, err := l.next(ctx)
	if err != nil {
		return nil, err
	}
	c, err := r.accept(ctx, l.opts.PrivateData, nil)
	var oe *OpError
	if errors.Is(err, ErrPrivateDataTooLong) && errors.As(err, &oe) {
		// ListenConfig.PrivateData fits some transport but not this
		// request's, and the caller never saw the request: answer it.
		r.reject(nil)
		oe.Hint = "the request was rejected: ListenConfig.PrivateData is what Listener.Accept sends, and it must fit every transport " +
			"the listener takes requests on (shorten it, or take requests with Request and accept each with data that fits)"
	}
	return c, err
}

// Request waits for the next connect request, which the caller must
// Accept or Reject.
func (l *Listener) Request(ctx context.Context) (*ConnRequest, error) {
	r, err := l.next(ctx)
	if err != nil {
		return nil, err
	}
	return &ConnRequest{Local: r.local, Remote: r.remote, Device: r.device, Port: r.port, Param: r.param, PrivateData: r.data, r: r}, nil
}

// Accept waits for the next connect request and accepts it with the
// ListenConfig's PrivateData. A request that fails during the handshake
// is returned as an error (and rejected, if it was not); the listener
// keeps listening. Such an error names the dialer (OpError.Remote is
// set), where one that ends the listener (closed, its device removed,
// the event channel failed) does not. The handshake runs in the call: a
// server that must not wait on one slow dialer takes requests with
// Request and accepts each on a goroutine of its own.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	c, err := l.acceptNext(ctx)
	if err != nil {
		return nil, err
	}
	return &Conn{c}, nil
}

// Request waits for the next request from a UD dialer, which the caller
// must Accept or Reject.
func (l *UDListener) Request(ctx context.Context) (*UDRequest, error) {
	r, err := l.next(ctx)
	if err != nil {
		return nil, err
	}
	return &UDRequest{Local: r.local, Remote: r.remote, Device: r.device, Port: r.port, PrivateData: r.data, r: r}, nil
}

// Accept waits for the next request from a UD dialer and answers it with
// a new UD endpoint and the ListenConfig's PrivateData.
func (l *UDListener) Accept(ctx context.Context) (*UDConn, error) {
	c, err := l.acceptNext(ctx)
	if err != nil {
		return nil, err
	}
	return &UDConn{c}, nil
}

// Close stops listening and refuses the requests queued, not yet taken
// by Request or Accept. A request that Request returned is the caller's
// to Accept or Reject, after Close too: until then it holds its CM id and
// its dialer waits.
func (l *listener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.closed)
		err = l.id.Close()
		for {
			select {
			case r := <-l.reqs:
				r.refuse(RefusalListenerClosed)
			default:
				return
			}
		}
	})
	return err
}

// request is a connect request waiting for an answer: what ConnRequest
// and UDRequest are made of.
type request struct {
	local, remote netip.AddrPort
	device        string
	port          int
	param         ConnParam
	data          []byte

	peerMTU verbs.MTU
	id      *ID
	l       *listener
	used    atomic.Bool
}

// ConnRequest is a peer's request for a reliable connection, waiting for
// Accept or Reject.
type ConnRequest struct {
	Local, Remote netip.AddrPort
	Device        string
	Port          int
	// Param is what the peer offered, from this side's view:
	// ResponderResources is the peer's initiator depth (how many reads
	// this side may have to answer at once), InitiatorDepth its responder
	// resources; and its retry counts.
	Param ConnParam
	// PrivateData the peer sent with the request (rdmago's header removed).
	PrivateData []byte

	r *request
}

// UDRequest is a UD dialer's request (a SIDR REQ on InfiniBand and RoCE),
// waiting for Accept or Reject.
type UDRequest struct {
	Local, Remote netip.AddrPort
	Device        string
	Port          int
	// PrivateData the dialer sent with the request (rdmago's header
	// removed).
	PrivateData []byte

	r *request
}

// Reject refuses the request, sending privateData with the reject: at most
// 144 bytes on InfiniBand and RoCE (a REJ carries 148, less rdmago's
// header), 247 on iWARP; 4 more with ConnConfig.RawPrivateData. The
// dialer's error is a *RejectedError with this data (status 28; iWARP:
// -104, the MPA reject). Longer data is refused with a *PrivateDataError
// before anything is sent, and the request stays pending: Reject it again
// with less, or Accept it.
func (r *ConnRequest) Reject(privateData []byte) error { return r.r.reject(privateData) }

// Accept accepts the request with privateData and waits for the
// connection to be established. At most 192 bytes of private data fit on
// InfiniBand and RoCE (a REP carries 196, less rdmago's header), 247 on
// iWARP; 4 more with ConnConfig.RawPrivateData. Longer data is refused
// with a *PrivateDataError before anything is sent, and the request stays
// pending: Accept it again with less, or Reject it. On any other failure
// the request is rejected and its resources are released.
func (r *ConnRequest) Accept(ctx context.Context, privateData []byte) (*Conn, error) {
	return r.AcceptWith(ctx, privateData, nil)
}

// AcceptWith is Accept that first runs setup on the connection, once its
// QP exists and before the accept goes out (after
// ConnConfig.BeforeConnect): register memory and post receives there, so
// that the peer's first SEND finds one (on iWARP a SEND that finds none
// ends the connection). What setup makes stays with the code that
// accepted, in its own variables; an error from setup rejects the request
// and releases the memory registered.
func (r *ConnRequest) AcceptWith(ctx context.Context, privateData []byte, setup func(Setup) error) (*Conn, error) {
	c, err := r.r.accept(ctx, privateData, setup)
	if err != nil {
		return nil, err
	}
	return &Conn{c}, nil
}

// Reject refuses the request, sending privateData with the SIDR reply:
// at most 132 bytes (136 with ConnConfig.RawPrivateData). The dialer's
// error is a *RejectedError with this data (status 2, the SIDR reject).
// Longer data is refused with a *PrivateDataError before anything is
// sent, and the request stays pending.
func (r *UDRequest) Reject(privateData []byte) error { return r.r.reject(privateData) }

// Accept answers the request with a new UD endpoint and privateData (at
// most 132 bytes; 136 with ConnConfig.RawPrivateData). Longer data is
// refused before anything is sent, and the request stays pending.
func (r *UDRequest) Accept(ctx context.Context, privateData []byte) (*UDConn, error) {
	return r.AcceptWith(ctx, privateData, nil)
}

// AcceptWith is Accept that first runs setup on the endpoint, once its QP
// exists and before the answer goes out: see [ConnRequest.AcceptWith].
func (r *UDRequest) AcceptWith(ctx context.Context, privateData []byte, setup func(Setup) error) (*UDConn, error) {
	c, err := r.r.accept(ctx, privateData, setup)
	if err != nil {
		return nil, err
	}
	return &UDConn{c}, nil
}

func (r *request) claim() bool { return r.used.CompareAndSwap(false, true) }

func (r *request) reject(privateData []byte) error {
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
		return &OpError{Op: "reject", Local: r.local, Remote: r.remote, Device: r.device, Port: r.port, Err: cause(err)}
	}
	return nil
}

func (r *request) closedError(op string) error {
	return &OpError{Op: op, Local: r.local, Remote: r.remote, Err: ErrClosed}
}

// checkData refuses privateData that does not fit message k of this
// request's transport and port space. Nothing is sent: the request stays
// pending.
func (r *request) checkData(op string, k messageKind, privateData []byte) error {
	cm := cmIB // the smaller limits, should the device be unknown
	if dev, err := r.id.Device(); err == nil {
		cm = cmKindOf(dev.Info.Transport)
	}
	pe := checkPrivateData(cm, r.id.ps, k, r.l.opts.RawPrivateData, privateData)
	if pe == nil {
		return nil
	}
	raw := r.l.opts.RawPrivateData
	return &OpError{Op: op, Local: r.local, Remote: r.remote, Device: r.device, Port: r.port, Err: pe,
		Hint: fmt.Sprintf("nothing was sent and the request is still pending: Accept it with at most %d bytes of private data, or Reject it with at most %d",
			privateDataLimit(cm, r.id.ps, msgAccept, raw), privateDataLimit(cm, r.id.ps, msgReject, raw))}
}

// refuse rejects the request on the listener's own account. The dialer's
// RejectedError says why, unless the listener's private data is raw.
func (r *request) refuse(why Refusal) {
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

// accept accepts the request with privateData, after setup (if any) has
// seen the connection.
func (r *request) accept(ctx context.Context, privateData []byte, setup func(Setup) error) (*conn, error) {
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
		o.BeforeConnect = func(s Setup) error {
			if listenerSetup != nil {
				if err := listenerSetup(s); err != nil {
					return err
				}
			}
			return setup(s)
		}
	}
	e := &endpoint{op: "accept", o: &o, id: r.id, local: r.local, remote: r.remote}
	c, err := e.accept(ctx, r, privateData)
	if err != nil {
		e.abort()
		return nil, err
	}
	return c, nil
}

// requestDropped reports whether the CM no longer takes the request: it
// refuses to say how the request's QP would move to INIT, as it does for
// rdma_create_qp's own move.
func (e *endpoint) requestDropped() bool {
	_, _, err := e.id.InitQPAttr(verbs.QPStateInit)
	return errors.Is(err, syscall.EINVAL)
}

func (e *endpoint) accept(ctx context.Context, r *request, privateData []byte) (*conn, error) {
	o := e.o
	// ConnRequest.Accept has checked privateData's length, so that a
	// refusal leaves the request pending.

	// The dialer may have given up while the request waited.
	if ev := e.id.poll(); ev != nil {
		return nil, e.dialerGone(ev, false)
	}
	if err := e.prepare(); err != nil {
		var oe *OpError
		// EINVAL is also what a request the CM dropped meanwhile (its
		// dialer gave up) gets from rdma_create_qp; this side's own
		// settings (a capacity above the device's) give it too, and
		// are no failure of the request. Asked before the reject, the
		// CM tells them apart.
		gone := errors.As(err, &oe) && errors.Is(err, syscall.EINVAL) && e.requestDropped()
		e.id.reject(nil)
		if ev := e.id.poll(); ev != nil { // the reason the CM refused
			return nil, e.dialerGone(ev, false)
		}
		if gone {
			// A failure of this request, as peerGone's are: the
			// listener goes on.
			oe.Kind = ErrConnect
			oe.Hint = "the CM no longer takes this request: the dialer probably gave up (cancelled or timed out) while it waited"
		}
		return nil, err
	}
	if err := e.checkMode(); err != nil {
		e.id.reject(nil)
		return nil, err
	}
	p := ConnParam{RNRRetryCount: o.RNRRetryCount}
	if err := e.rdAtomic(&p, &r.param); err != nil {
		e.id.reject(nil)
		return nil, err
	}
	if o.Mode == ModeManual {
		p.QPNum = e.res.qp.QPN
		e.accepted = &p
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
	if err := ctx.Err(); err != nil {
		// Ended while the connection was made ready: refuse rather than
		// accept and then abandon the peer.
		e.id.reject(nil)
		return nil, e.fail("accept", nil, err)
	}
	data := encodePrivateData(o.RawPrivateData, e.localMTU(), privateData)
	start := time.Now()
	if err := e.id.connectOrAccept(true, p, data); err != nil {
		if ev := e.id.poll(); ev != nil { // the dialer's end came first
			return nil, e.dialerGone(ev, false)
		}
		oe := e.fail("accept", ErrConnect, err)
		if errors.Is(err, syscall.EINVAL) {
			oe.Hint = "the CM no longer takes this request: the dialer probably gave up (cancelled or timed out) while it waited"
		}
		return nil, oe
	}
	if o.QPType == verbs.QPTypeUD {
		o.trace(StepConnect, start)
		return e.conn(r.data, o.Mode, func(c *conn) { c.path.MTU = udPathMTU(c.path.MTU, r.peerMTU) }), nil
	}
	ev, err := e.await(ctx, "accept", o.ConnectTimeout)
	if err != nil {
		return nil, err
	}
	switch ev.Type {
	case EventEstablished:
		o.trace(StepConnect, start)
		return e.conn(r.data, o.Mode, nil), nil
	case EventUnreachable:
		return nil, e.failEvent("accept", ErrUnreachable, ev)
	case EventRejected:
		return nil, e.dialerGone(ev, true)
	}
	return nil, e.failEvent("accept", peerGone(ev.Type), ev)
}

// dialerGone is an accept that the dialer's end overtook: a REJECTED
// (the dialer gave up, or refused this side's reply) or another event
// that ends the request. It is that request's failure (ErrConnect, or
// what ended it), and the listener goes on.
func (e *endpoint) dialerGone(ev *Event, accepted bool) *OpError {
	if ev.Type != EventRejected {
		return e.failEvent("accept", peerGone(ev.Type), ev)
	}
	oe := e.failEvent("accept", ErrConnect, ev)
	oe.Err = &RejectedError{Status: ev.Status}
	oe.Hint = "the dialer gave up on the request (cancelled, timed out or closed) while it waited here: " +
		"accept sooner, or lower ListenConfig.Backlog so that dialers are refused rather than kept waiting"
	if accepted {
		oe.Hint = "the dialer refused this side's accept: it gave up meanwhile, or could not take the reply " +
			"(its QP could not be moved with the attributes the reply carried)"
	}
	return oe
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
