package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"github.com/rdmago/rdmago/internal/vbridge"
	"github.com/rdmago/rdmago/verbs"
)

// contextKey identifies a device's context (0 if closed): librdmacm makes
// QPs only on its own contexts.
func contextKey(d *verbs.Device) uintptr {
	if c := vbridge.Context(d); c != nil {
		return c.Key()
	}
	return 0
}

// errnoOf is err's errno, EIO if it has none.
func errnoOf(err error) syscall.Errno {
	var en syscall.Errno
	if errors.As(err, &en) && en != 0 {
		return en
	}
	return syscall.EIO
}

// endpoint is one side of a connection while it is being set up.
type endpoint struct {
	op     string // "dial", "accept", "join multicast"
	o      *settings
	id     *ID
	local  netip.AddrPort
	remote netip.AddrPort
	res    resources
	port   verbs.PortAttr
	iwarp  bool
	// connecting: a connect request is out and not yet answered.
	connecting bool
	// inFlight, once a dial gave up on an rdma_connect still blocked in
	// the kernel (iWARP), is closed when that call returns.
	inFlight <-chan struct{}
	// issuedAt is when the current step's request went out, for its trace.
	issuedAt time.Time
	// c is the connection being made, once BeforeConnect has seen it.
	c *conn
	// accepted is what a manual accept grants: its QP moves with these
	// reads in flight.
	accepted *ConnParam
}

func (e *endpoint) fail(step string, kind, err error) *OpError {
	err = cause(err)
	oe := &OpError{Op: step, Local: e.local, Remote: e.remote, Device: e.id.DeviceName(), Port: e.id.Port(), Kind: kind, Err: err}
	if e.res.qp != nil {
		oe.QPN = e.res.qp.QPN
	}
	return oe
}

func (e *endpoint) failEvent(step string, kind error, ev *Event) *OpError {
	var cause error
	if ev.Status < 0 {
		cause = syscall.Errno(-ev.Status)
	}
	oe := e.fail(step, kind, cause)
	oe.Event, oe.Status, oe.Hint = ev.Type.String(), ev.Status, hintFor(ev.Type, ev.Status, e.iwarp && e.op == "dial")
	return oe
}

// await waits for the next event of the id, for at most d.
func (e *endpoint) await(ctx context.Context, step string, d time.Duration) (*Event, error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	ev, err := e.id.next(wctx)
	switch {
	case err == nil:
		return ev, nil
	case ctx.Err() != nil:
		return nil, e.fail(step, nil, ctx.Err())
	case errors.Is(err, context.DeadlineExceeded):
		oe := e.fail(step, ErrTimeout, fmt.Errorf("no CM event within %v", d))
		oe.Hint = timeoutHint(step)
		return nil, oe
	}
	return nil, e.fail(step, nil, err)
}

func timeoutHint(step string) string {
	switch step {
	case "connect":
		return "the peer did not answer: is it up, reachable, and is the port right? (a missing listener is rejected quickly on RoCE, but a dead or unreachable host only times out); " +
			"a listener flooded with requests can also lose them or its answers: retry later"
	case "accept":
		return "the peer did not complete the handshake (it may have given up or gone away, or be too loaded to answer " +
			"within ConnectTimeout)"
	}
	return "raise the step's timeout in the Dialer or ConnConfig if the network is slow"
}

// setOptions applies the id options that must precede resolution.
func (e *endpoint) setOptions() error {
	o := e.o
	if o.TOS != 0 {
		if err := e.id.SetOption(OptionTOS, int(o.TOS)); err != nil {
			return e.fail("set RDMA_OPTION_ID_TOS", nil, err)
		}
	}
	if o.ReuseAddr {
		if err := e.id.SetOption(OptionReuseAddr, 1); err != nil {
			return e.fail("set RDMA_OPTION_ID_REUSEADDR", nil, err)
		}
	}
	if o.AFOnly {
		if err := e.id.SetOption(OptionAFOnly, 1); err != nil {
			return e.fail("set RDMA_OPTION_ID_AFONLY", nil, err)
		}
	}
	if o.ACKTimeout != 0 {
		if err := e.id.SetOption(OptionACKTimeout, int(o.ACKTimeout)); err != nil {
			return e.fail("set RDMA_OPTION_ID_ACK_TIMEOUT", nil, err)
		}
	}
	return nil
}

// resolveAddr runs address resolution with bounded retries and learns the
// device it leads to.
func (e *endpoint) resolveAddr(ctx context.Context, src netip.Addr) error {
	o := e.o
	var start time.Time
	for attempt := 0; ; attempt++ {
		if err := e.issueResolveAddr(src); err != nil {
			return err
		}
		if attempt == 0 {
			start = e.issuedAt
		}
		ev, err := e.await(ctx, "resolve address", o.ResolveAddrTimeout+time.Second)
		if err != nil {
			return err
		}
		if ev.Type == EventAddrResolved {
			o.trace(StepResolveAddr, start)
			break
		}
		if ev.Type != EventAddrError || attempt >= o.ResolveRetries || !retryable(ev.Status) {
			return e.failEvent("resolve address", stepKind(ev, ErrAddrResolution), ev)
		}
	}
	e.local = e.id.LocalAddr()
	dev, err := e.id.Device()
	if err != nil {
		return e.fail("resolve address", ErrAddrResolution, err)
	}
	e.res.dev = dev
	e.iwarp = dev.Info.Transport == verbs.TransportIWARP
	return e.checkMode()
}

// issueResolveAddr sends the address resolution request.
func (e *endpoint) issueResolveAddr(src netip.Addr) error {
	e.issuedAt = time.Now()
	if err := e.id.ResolveAddr(src, e.remote, e.o.ResolveAddrTimeout); err != nil {
		oe := e.fail("resolve address", ErrAddrResolution, err)
		oe.Hint = hintFor(EventAddrError, -int(errnoOf(err)), false)
		return oe
	}
	return nil
}

// resolveRoute runs route resolution with bounded retries.
func (e *endpoint) resolveRoute(ctx context.Context) error {
	o := e.o
	var start time.Time
	for attempt := 0; ; attempt++ {
		if err := e.issueResolveRoute(); err != nil {
			return err
		}
		if attempt == 0 {
			start = e.issuedAt
		}
		ev, err := e.await(ctx, "resolve route", o.ResolveRouteTimeout+time.Second)
		if err != nil {
			return err
		}
		if ev.Type == EventRouteResolved {
			o.trace(StepResolveRoute, start)
			return nil
		}
		if ev.Type != EventRouteError || attempt >= o.ResolveRetries || !retryable(ev.Status) {
			return e.failEvent("resolve route", stepKind(ev, ErrRouteResolution), ev)
		}
	}
}

// stepKind is the kind of error an event other than the one awaited ends a
// step with: the step's own, unless the event says more (the device went,
// which every step reports alike).
func stepKind(ev *Event, step error) error {
	if ev.Type == EventDeviceRemoval {
		return ErrDeviceRemoved
	}
	return step
}

// issueResolveRoute sends the route resolution request.
func (e *endpoint) issueResolveRoute() error {
	e.issuedAt = time.Now()
	if err := e.id.ResolveRoute(e.o.ResolveRouteTimeout); err != nil {
		return e.fail("resolve route", ErrRouteResolution, err)
	}
	return nil
}

// checkMode refuses what the device cannot do: iWARP has neither UD nor
// user-driven QP transitions.
func (e *endpoint) checkMode() error {
	if e.o.QPType == verbs.QPTypeUD && e.iwarp {
		oe := e.fail(e.op, nil, errors.New("iWARP devices have no UD QPs"))
		oe.Hint = "use an RC connection, or a RoCE or InfiniBand device for UD"
		return oe
	}
	if e.o.Mode == ModeManual && e.iwarp {
		oe := e.fail(e.op, nil, verbs.ErrIWARPManual)
		oe.Hint = "on iWARP the CM and the provider move the QP to RTS themselves (siw fails a user RTS with EINVAL); use ModeCM"
		return oe
	}
	return nil
}

// prepare makes the PD, CQs and QP. In ModeCM librdmacm creates the QP
// (and moves it); in ModeManual it is ours, taken to INIT here.
func (e *endpoint) prepare() error {
	o := e.o
	if e.res.dev == nil {
		dev, err := e.id.Device()
		if err != nil {
			return e.fail("create QP", nil, err)
		}
		e.res.dev = dev
		e.iwarp = dev.Info.Transport == verbs.TransportIWARP
	}
	dev := e.res.dev
	start := time.Now()
	var err error
	if e.needsPort() {
		if e.port, err = dev.QueryPort(e.id.Port()); err != nil {
			return e.fail("query port", nil, err)
		}
	}
	for _, s := range o.shared() {
		if why, hint := s.mismatch(dev.Info.Name, contextKey(dev)); why != "" {
			oe := e.fail("use ConnConfig."+s.field, nil, errors.New(why))
			oe.Hint = hint
			return oe
		}
	}
	if err := e.checkCap(dev); err != nil {
		return err
	}
	if o.PD != nil {
		e.res.pd, e.res.sharedPD = o.PD, true
	} else if e.res.pd, err = dev.AllocPD(); err != nil {
		return e.resourceError("allocate PD", err)
	}
	if err := e.res.makeCQs(o, dev); err != nil {
		return e.resourceError("create CQ", err)
	}
	if o.Mode == ModeCM {
		if e.res.qp, err = e.id.CreateQP(e.res.pd, verbs.QPInit{Type: o.QPType, SendCQ: e.res.scq, RecvCQ: e.res.rcq, Cap: o.Cap}); err != nil {
			return e.resourceError(fmt.Sprintf("rdma_create_qp %v %+v", o.QPType, o.Cap), err)
		}
		o.trace(StepCreateQP, start)
		return nil
	}
	if e.res.qp, err = e.res.pd.CreateQP(verbs.QPInit{Type: o.QPType, SendCQ: e.res.scq, RecvCQ: e.res.rcq, Cap: o.Cap}); err != nil {
		return e.resourceError("create QP", err)
	}
	o.trace(StepCreateQP, start)
	if err := e.move(verbs.QPStateInit, 0); err != nil {
		return err
	}
	if o.QPType == verbs.QPTypeUD {
		// A UD QP needs no peer: straight on to RTS, as librdmacm does with its own.
		if err := e.res.qp.Modify(&verbs.QPAttr{State: verbs.QPStateRTR}, verbs.AttrState); err != nil {
			return e.fail("modify QP INIT→RTR", nil, err)
		}
		if err := e.res.qp.Modify(&verbs.QPAttr{State: verbs.QPStateRTS}, verbs.AttrState|verbs.AttrSQPSN); err != nil {
			return e.fail("modify QP RTR→RTS", nil, err)
		}
	}
	return nil
}

// checkCap refuses queue sizes the device cannot make, naming the field:
// the driver would refuse them with a bare EINVAL (and a CQ size past a C
// int would wrap).
func (e *endpoint) checkCap(dev *verbs.Device) error {
	a, err := queryDevice(dev)
	if err != nil {
		return e.fail("query device", nil, err)
	}
	o := e.o
	checks := []struct {
		field    string
		v, limit int
		attr     string
	}{
		{"Cap.MaxSendWR", int(o.Cap.MaxSendWR), a.MaxQPWR, "MaxQPWR"},
		{"Cap.MaxRecvWR", int(o.Cap.MaxRecvWR), a.MaxQPWR, "MaxQPWR"},
		{"Cap.MaxSendSGE", int(o.Cap.MaxSendSGE), a.MaxSGE, "MaxSGE"},
		{"Cap.MaxRecvSGE", int(o.Cap.MaxRecvSGE), a.MaxSGE, "MaxSGE"},
	}
	if o.CQEntries > 0 && (o.SendCQ == nil || o.RecvCQ == nil) {
		checks = append(checks, struct {
			field    string
			v, limit int
			attr     string
		}{"CQEntries", o.CQEntries, a.MaxCQE, "MaxCQE"})
	}
	for _, c := range checks {
		if c.limit > 0 && c.v > c.limit {
			oe := e.fail("create QP", nil, fmt.Errorf("%w: ConnConfig.%s is %d, more than %s's %s of %d",
				syscall.EINVAL, c.field, c.v, dev.Info.Name, c.attr, c.limit))
			oe.Hint = "Device.Query gives the device's limits"
			return oe
		}
	}
	return nil
}

// sharedObject is a verbs object the caller lends the connection
// (ConnConfig.PD, SendCQ, RecvCQ).
type sharedObject struct {
	field  string // the ConnConfig field
	noun   string // "PD", "CQ"
	verb   string // "allocate", "create"
	users  string // what must be closed before it
	closed bool
	owner  *verbs.Device
}

// shared lists the objects o lends.
func (o *settings) shared() []sharedObject {
	var s []sharedObject
	if o.PD != nil {
		s = append(s, sharedObject{"PD", "PD", "allocate", "connection and MR", vbridge.PD(o.PD) == nil, o.PD.Device()})
	}
	for _, cq := range []struct {
		field string
		cq    *verbs.CQ
	}{{"SendCQ", o.SendCQ}, {"RecvCQ", o.RecvCQ}} {
		if cq.cq != nil {
			s = append(s, sharedObject{cq.field, "CQ", "create", "connection", vbridge.CQ(cq.cq) == nil, cq.cq.Device()})
		}
	}
	return s
}

// mismatch says why the object cannot serve a connection through device
// dev, and what to do; it says nothing if it can. ctx, unless 0, is the
// device context the QP will be created on, which must be the object's own.
func (s sharedObject) mismatch(dev string, ctx uintptr) (why, hint string) {
	switch d := s.owner; {
	case s.closed || d == nil:
		return fmt.Sprintf("ConnConfig.%s is closed", s.field),
			fmt.Sprintf("close the %s only after the last %s using it", s.noun, s.users)
	case d.Info.Name != dev:
		return fmt.Sprintf("ConnConfig.%s belongs to %s, but the connection goes through %s", s.field, d.Info.Name, dev),
			fmt.Sprintf("use a %s per device, this one %sd on rdmacm.OpenDevice(%q)", s.noun, s.verb, dev)
	case ctx != 0 && contextKey(d) != ctx:
		return fmt.Sprintf("ConnConfig.%s was %sd on a context of %s other than librdmacm's", s.field, s.verb, dev),
			fmt.Sprintf("librdmacm creates the QP on its own context (a context from verbs.Open is another one): "+
				"%s the %s on rdmacm.OpenDevice(%q)", s.verb, s.noun, dev)
	}
	return "", ""
}

// resourceError explains a failed CQ or QP creation where the cause is
// known, and marks one that every connection would meet with
// ErrNoResources.
func (e *endpoint) resourceError(step string, err error) error {
	oe := e.fail(step, nil, err)
	switch {
	case e.iwarp && errors.Is(err, syscall.EIO) && strings.HasPrefix(e.res.dev.Info.Name, "siw"):
		oe.Kind = ErrNoResources
		oe.Hint = "siw: this process's device context has used up its queue mappings: rdma-core 44's libsiw " +
			"takes the kernel's mmap offset 0x90000 for SIW_INVAL_UOBJ_KEY, so about 143 pages of CQs and " +
			"QP queues fit in one process: some 35 connection ends with two CQs each, about 70 sharing their CQs " +
			"(ConnConfig.SendCQ and RecvCQ)"
	case errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE):
		oe.Kind = ErrNoResources
		oe.Hint = "out of file descriptors: each connection holds two (its CQs' completion channels) and, once it waits, " +
			"two more (their registrations with Go's poller); " +
			"raise the limit (ulimit -n, or RLIMIT_NOFILE)"
	case errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ENOSPC):
		oe.Kind = ErrNoResources
		oe.Hint = "the device, or the locked-memory limit (ulimit -l), has no room for another queue"
	}
	return oe
}

// move takes a manual QP to state with the CM's attributes for it, after
// BeforeModify; the path MTU is at most both sides' active MTU.
func (e *endpoint) move(to verbs.QPState, peerMTU verbs.MTU) error {
	qp := e.res.qp
	start := time.Now()
	from := qp.State()
	step := fmt.Sprintf("modify QP %v", verbs.Transition{From: from, To: to})
	attr, mask, err := e.id.InitQPAttr(to)
	if err != nil {
		oe := e.fail(step, nil, fmt.Errorf("rdma_init_qp_attr: %w", err))
		if to == verbs.QPStateRTR && e.op == "dial" {
			oe.Hint = "the CM has no RTR attributes before the peer's reply"
		}
		return oe
	}
	if e.accepted != nil {
		// rdma_init_qp_attr gives the request's reads in flight; the
		// accept grants what rdAtomic settled on, and librdmacm moves its
		// own QPs with those.
		if mask&verbs.AttrMaxDestRdAtomic != 0 {
			attr.MaxDestRdAtomic = e.accepted.ResponderResources
		}
		if mask&verbs.AttrMaxQPRdAtomic != 0 {
			attr.MaxRdAtomic = e.accepted.InitiatorDepth
		}
	}
	if mask&verbs.AttrPathMTU != 0 {
		if m := e.port.ActiveMTU; m.Valid() && m < attr.PathMTU {
			attr.PathMTU = m
		}
		if peerMTU.Valid() && peerMTU < attr.PathMTU {
			attr.PathMTU = peerMTU
		}
	}
	if h := e.o.BeforeModify; h != nil {
		if err := h(verbs.Transition{From: from, To: to}, &attr, &mask); err != nil {
			return e.fail(step, nil, fmt.Errorf("BeforeModify: %w", err))
		}
	}
	if err := qp.Modify(&attr, mask); err != nil {
		return e.fail(step, nil, err)
	}
	switch to {
	case verbs.QPStateInit:
		e.o.trace(StepInitQP, start)
	case verbs.QPStateRTR:
		e.o.trace(StepRTRQP, start)
	case verbs.QPStateRTS:
		e.o.trace(StepRTSQP, start)
	}
	return nil
}

// needsPort says whether the port's attributes are of use: its active MTU
// goes into the private data header, caps the manual path's MTU and is a
// UD connection's MTU. Where none applies (iWARP, or a CM-moved RC or UC
// QP with raw private data, as in cmtime) the query, a system call per
// connection, is skipped.
func (e *endpoint) needsPort() bool {
	o := e.o
	return !e.iwarp && (o.Mode == ModeManual || !o.RawPrivateData || o.QPType == verbs.QPTypeUD)
}

// cm is the connection manager of the id's device, once it has one.
func (e *endpoint) cm() cmKind {
	if e.res.dev == nil {
		return cmUnknown
	}
	return cmKindOf(e.res.dev.Info.Transport)
}

// localMTU is what this side tells the peer in the private data header.
func (e *endpoint) localMTU() verbs.MTU {
	if e.iwarp {
		return 0
	}
	return e.port.ActiveMTU
}

// rdAtomic fills in responder resources and initiator depth: the device's
// maxima, capped by the config and (passive side) by what the peer offered.
func (e *endpoint) rdAtomic(p *ConnParam, peer *ConnParam) error {
	a, err := queryDevice(e.res.dev)
	if err != nil {
		return e.fail("query device", nil, err)
	}
	rr, depth := a.MaxQPRdAtom, a.MaxQPInitRdAtom
	if e.o.ResponderResources >= 0 {
		rr = min(rr, e.o.ResponderResources)
	}
	if e.o.InitiatorDepth >= 0 {
		depth = min(depth, e.o.InitiatorDepth)
	}
	if peer != nil {
		// The CM hands over the request's values from this side's view
		// (the peer's initiator depth as our responder resources), as
		// rdma_accept takes them.
		rr = min(rr, int(peer.ResponderResources))
		depth = min(depth, int(peer.InitiatorDepth))
	}
	p.ResponderResources, p.InitiatorDepth = uint8(min(rr, 255)), uint8(min(depth, 255))
	return nil
}

// early is the connection being made, before it is up: what
// BeforeConnect sees. Its memory goes into the endpoint's resources, so
// that abort releases it.
func (e *endpoint) early() *conn {
	if e.c == nil {
		e.c = &conn{qp: e.res.qp, scq: e.res.scq, rcq: e.res.rcq, pd: e.res.pd, dev: e.res.dev,
			opts: *e.o, id: e.id, done: make(chan struct{}), res: &e.res}
		e.c.path = Route{Local: e.local, Remote: e.remote, Device: e.id.DeviceName(), Port: e.id.Port(),
			GIDIndex: -1, Mode: e.o.Mode}
	}
	return e.c
}

// beforeConnect runs ConnConfig.BeforeConnect, if any.
func (e *endpoint) beforeConnect() error {
	if e.o.BeforeConnect == nil {
		return nil
	}
	if err := e.o.BeforeConnect(setup{e.early()}); err != nil {
		step := "set up before connecting" // ConnConfig.BeforeConnect
		if e.op == "accept" {
			step = "set up before accepting" // and ConnRequest.AcceptWith's setup
		}
		return e.fail(step, nil, err)
	}
	return nil
}

// conn assembles the connection once the connection is up and routes the id's
// later events to it.
func (e *endpoint) conn(peerData []byte, mode Mode, set func(*conn)) *conn {
	c := e.early()
	c.peerData = peerData
	res := e.res
	c.res = &res
	e.res = resources{}
	c.path = Route{Local: e.id.LocalAddr(), Remote: e.id.RemoteAddr(), Device: e.id.DeviceName(), Port: e.id.Port(),
		Transport: c.dev.Info.Transport, GIDIndex: -1, Mode: mode}
	if !c.path.Remote.IsValid() {
		c.path.Remote = e.remote
	}
	switch {
	case c.path.Transport == verbs.TransportIWARP:
		c.path.Kind = verbs.KindIWARP
	case c.qp.Type == verbs.QPTypeUD:
		// The port was queried for its MTU; a dialer's GID index comes
		// with the peer's AH.
		c.path.Kind, c.path.MTU = verbs.KindOf(c.path.Transport, e.port.LinkLayer), e.port.ActiveMTU
	default:
		if a, err := c.qp.Query(verbs.AttrAV | verbs.AttrPathMTU); err == nil {
			c.path.GIDIndex, c.path.MTU = int(a.AH.GRH.SGIDIndex), a.PathMTU
		}
	}
	if set != nil {
		set(c) // before the handler: events read the connection's fields
	}
	e.id.setHandler(c.onEvent)
	return c
}

// abort releases whatever was made, after a failure or cancellation, and
// says what releasing the verbs objects reported.
func (e *endpoint) abort() error {
	err := e.res.close()
	e.id.Close()
	return err
}
