package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rdmago/rdmago/internal/cma"
	"github.com/rdmago/rdmago/internal/fdwait"
	"github.com/rdmago/rdmago/internal/ibv"
	"github.com/rdmago/rdmago/internal/vbridge"
	"github.com/rdmago/rdmago/verbs"
)

// event is one CM event as the library delivers it.
type event struct {
	Type        EventType
	Status      int
	PrivateData []byte
	Param       ConnParam
	// UD (PS_UDP) events: the peer's QP number and qkey, and the address
	// vector to reach it.
	UD    bool
	QKey  uint32
	AH    verbs.AHAttr
	child *cmID // CONNECT_REQUEST: the new id
	err   error // eventChannelFailed: why
}

// eventChannelFailed is not librdmacm's: the dispatcher hands it to every
// id with a handler when the event channel fails, so that no connection
// waits for an event that cannot come.
const eventChannelFailed EventType = -1

// cmHandle is an rdma_cm_id as this package uses it: internal/cma's, or a
// test's fake.
type cmHandle interface {
	SetToken(token uint64)
	Destroy() error
	LocalAddr() cma.SockAddr
	PeerAddr() cma.SockAddr
	DeviceName() string
	PortNum() int
	Context() *ibv.Context
	SetOption(name int, v []byte) error
	Bind(sa cma.SockAddr) error
	ResolveAddr(src, dst cma.SockAddr, timeoutMS int) error
	ResolveRoute(timeoutMS int) error
	Listen(backlog int) error
	Connect(accept bool, p cma.ConnParam, data []byte) error
	Reject(data []byte) error
	Disconnect() error
	Establish() error
	InitQPAttr(state int) (ibv.QPAttr, uint32, error)
	CreateQP(pd *ibv.PD, scq, rcq *ibv.CQ, qpType int, cp ibv.QPCap) (*ibv.QP, error)
	JoinMulticast(group netip.Addr, scope uint32) error
	LeaveMulticast(group netip.Addr, scope uint32) error
}

// rawEvent is an event as the source reads it, before routing.
type rawEvent struct {
	ev *event
	// token is the context of the id it belongs to (for a connect
	// request, the listener's).
	token uint64
	// child is a connect request's new id.
	child cmHandle
}

// eventSource is an event channel as the dispatcher sees it: librdmacm's
// (cmaSource), or a test's fake.
type eventSource interface {
	newID(token uint64, ps PortSpace) (cmHandle, error)
	// read waits for the next event, which it has already acked; an error
	// means that none will come again.
	read() (rawEvent, error)
}

// cmaSource is librdmacm's event channel, waited for in Go's poller.
type cmaSource struct {
	ch *cma.Channel
	w  *fdwait.Waiter
}

func (s *cmaSource) newID(token uint64, ps PortSpace) (cmHandle, error) {
	id, err := s.ch.NewID(token, int(ps))
	if err != nil {
		return nil, err
	}
	return id, nil
}

func (s *cmaSource) read() (rawEvent, error) {
	var got cma.Event
	err := s.w.Wait(context.Background(), func() bool {
		var ok bool
		got, ok = s.ch.GetEvent()
		return ok // false: none queued, wait in the poller
	})
	if err != nil {
		return rawEvent{}, fmt.Errorf("waiting for the rdma_cm event channel in Go's poller: %w", err)
	}
	ev := &event{Type: EventType(got.Type), Status: got.Status, UD: got.UD, PrivateData: got.PrivateData,
		Param: ConnParam(got.Param)}
	if ev.UD {
		ev.QKey = got.QKey
		ev.AH = vbridge.AHAttr(&got.AH).(verbs.AHAttr)
	}
	re := rawEvent{ev: ev, token: got.Token}
	if ev.Type == EventConnectRequest {
		re.child = got.ID
	}
	return re, nil
}

// channel is an event channel and its dispatcher: one goroutine, waiting in
// Go's runtime poller, that takes each event (copied and acked at once) and
// routes it by the id's context token. Every id of the process shares one
// channel, as C programs do: creating an id is then one rdma_create_id, not
// a channel, a descriptor, a poller registration and a goroutine of its
// own. Queues are per id, so a slow consumer holds up no other connection.
type channel struct {
	src eventSource

	mu   sync.Mutex
	ids  map[uint64]*cmID
	next uint64

	failed chan struct{} // closed when the source failed; err says why
	err    error
}

func newChannel(src eventSource) *channel {
	ch := &channel{src: src, ids: map[uint64]*cmID{}, failed: make(chan struct{})}
	go ch.dispatch()
	return ch
}

var shared struct {
	mu sync.Mutex
	c  *channel
}

// Init opens librdmacm and the process's CM event channel, which Dial,
// Listen and JoinMulticast otherwise do on first use. On the first call
// librdmacm opens every RDMA device and reads its attributes, which takes
// milliseconds (more on a slow or emulated CPU): a program that times its
// first connection, or wants to learn at start-up that rdma_cm is missing,
// calls Init first. Calling it again does nothing; after a failure it
// tries again.
func Init() error {
	_, err := sharedChannel()
	return err
}

// OpenDevice returns librdmacm's context for the named RDMA device: the one
// the QPs of its connections are created on, so that a PD allocated on it
// can be Options.PD. The first call has librdmacm open every device on the
// host (a descriptor or two each), which it keeps for the life of the
// process; Close on the Device does nothing.
func OpenDevice(name string) (*verbs.Device, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	list, err := cma.Devices()
	if err != nil {
		return nil, &OpError{Op: "rdma_get_devices", Device: name, Err: noCgo(err)}
	}
	var names []string
	for _, ctx := range list {
		if ctx.Info.Name == name {
			return vbridge.Device(ctx).(*verbs.Device), nil
		}
		names = append(names, ctx.Info.Name)
	}
	return nil, &OpError{Op: "open device", Device: name, Err: syscall.ENODEV,
		Hint: fmt.Sprintf("librdmacm has %d device(s): %s", len(names), strings.Join(names, ", "))}
}

// noCgo turns the wall's ErrNoCgo into ours.
func noCgo(err error) error {
	if errors.Is(err, ibv.ErrNoCgo) {
		return ErrNoCgo
	}
	return err
}

// sharedChannel is the process's channel, made on first use, and again
// after a channel failed.
func sharedChannel() (*channel, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		select {
		case <-shared.c.failed:
		default:
			return shared.c, nil
		}
	}
	ch, err := cma.NewChannel()
	if err != nil {
		if errors.Is(err, ibv.ErrNoCgo) {
			return nil, ErrNoCgo
		}
		return nil, fmt.Errorf("rdma_create_event_channel: %w (is /dev/infiniband/rdma_cm there, and is rdma_ucm loaded?)", err)
	}
	w, err := fdwait.New(ch.FD(), "rdma_cm event channel")
	if err != nil {
		ch.Destroy()
		return nil, err
	}
	shared.c = newChannel(&cmaSource{ch: ch, w: w})
	return shared.c, nil
}

// add registers a new id under a fresh token.
func (ch *channel) add(ps PortSpace) *cmID {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.next++
	c := &cmID{ch: ch, token: ch.next, ps: ps, notify: make(chan struct{}, 1), closed: make(chan struct{})}
	ch.ids[c.token] = c
	return c
}

func (ch *channel) remove(c *cmID) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	delete(ch.ids, c.token)
}

func (ch *channel) lookup(token uint64) *cmID {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.ids[token]
}

// newID creates an id on the channel.
func (ch *channel) newID(ps PortSpace) (*cmID, error) {
	select {
	case <-ch.failed:
		return nil, ch.failure()
	default:
	}
	c := ch.add(ps)
	h, err := ch.src.newID(c.token, ps)
	if err != nil {
		ch.remove(c)
		return nil, fmt.Errorf("rdma_create_id %v: %w", ps, noCgo(err))
	}
	c.h = h
	return c, nil
}

// newID creates an id on the process's channel.
func newID(ps PortSpace) (*cmID, error) {
	ch, err := sharedChannel()
	if err != nil {
		return nil, err
	}
	return ch.newID(ps)
}

// failure is the error of every wait once the channel has failed.
func (ch *channel) failure() error {
	return fmt.Errorf("%w: %v", ErrEventChannel, ch.err)
}

// dispatch runs until the source fails: the process's channel is never
// closed, like librdmacm's own per-process state.
func (ch *channel) dispatch() {
	for {
		re, err := ch.src.read()
		if err != nil {
			ch.fail(err)
			return
		}
		ev := re.ev
		c := ch.lookup(re.token)
		if ev.Type == EventConnectRequest && re.child != nil {
			// The request's id is new: it inherited the listener's token
			// and port space (a request whose listener is gone is refused).
			ps := PortSpaceTCP
			if c != nil {
				ps = c.ps
			}
			child := ch.add(ps)
			child.h = re.child
			re.child.SetToken(child.token)
			ev.child = child
		}
		if c == nil {
			// The id was closed after the event was read.
			ev.dropLater()
			continue
		}
		c.deliver(ev)
	}
}

// fail ends the channel: every waiter, and every id with a handler, learns
// why at once rather than waiting for its timeout. The next new id opens a
// new channel.
func (ch *channel) fail(err error) {
	ch.mu.Lock()
	ch.err = err
	close(ch.failed)
	ids := make([]*cmID, 0, len(ch.ids))
	for _, c := range ch.ids {
		ids = append(ids, c)
	}
	ch.mu.Unlock()
	for _, c := range ids {
		c.mu.Lock()
		h := c.handler
		c.mu.Unlock()
		if h != nil {
			c.deliver(&event{Type: eventChannelFailed, err: ch.failure()})
		}
	}
}

// cmID is an rdma_cm_id on a channel. Until a handler is set its events
// queue for next and poll; then the handler gets them as they come.
type cmID struct {
	h     cmHandle
	ch    *channel
	token uint64 // the id's context: how the dispatcher finds it
	ps    PortSpace

	mu      sync.Mutex
	queue   []*event
	handler func(*event)
	notify  chan struct{} // one token when queue grows
	closed  chan struct{} // closed by close
}

// dropped releases what an event that no one will see holds: a connect
// request's new id is refused and destroyed.
func (ev *event) dropped() {
	if ev.child != nil {
		ev.child.reject(nil)
		ev.child.close()
	}
}

// dropLater is dropped for the dispatcher, which must never wait:
// destroying an iWARP id can wait on the peer, so a refusal runs on a
// goroutine of its own.
func (ev *event) dropLater() {
	if ev.child != nil {
		go ev.dropped()
	}
}

// deliver hands ev to the handler, or queues it. The handler runs under
// c.mu, which keeps events in order; it must not block.
func (c *cmID) deliver(ev *event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.closed:
		ev.dropLater()
		return
	default:
	}
	if c.handler != nil {
		c.handler(ev)
		return
	}
	c.queue = append(c.queue, ev)
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// setHandler routes this id's events to h from now on, queued ones first.
func (c *cmID) setHandler(h func(*event)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handler = h
	for _, ev := range c.queue {
		h(ev)
	}
	c.queue = nil
	select {
	case <-c.ch.failed:
		h(&event{Type: eventChannelFailed, err: c.ch.failure()})
	default:
	}
}

// poll returns a queued event, or nil.
func (c *cmID) poll() *event {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		return nil
	}
	ev := c.queue[0]
	c.queue = c.queue[1:]
	return ev
}

// next waits for the next queued event.
func (c *cmID) next(ctx context.Context) (*event, error) {
	for {
		if ev := c.poll(); ev != nil {
			return ev, nil
		}
		select {
		case <-c.notify:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.closed:
			return nil, ErrClosed
		case <-c.ch.failed:
			if ev := c.poll(); ev != nil {
				return ev, nil // delivered before the failure
			}
			return nil, c.ch.failure()
		}
	}
}

// close destroys the id. Every event read was acked at once, so
// rdma_destroy_id cannot wait on us; events still queued in the kernel are
// dropped with the id, and queued connect requests' ids are refused and
// destroyed. The QP, if the CM made one, must be gone.
func (c *cmID) close() {
	c.mu.Lock()
	select {
	case <-c.closed:
		c.mu.Unlock()
		return
	default:
	}
	close(c.closed)
	queued := c.queue
	c.queue = nil
	c.mu.Unlock()
	c.ch.remove(c)
	c.h.Destroy()
	for _, ev := range queued {
		ev.dropped()
	}
}

func sockaddrOf(ap netip.AddrPort) (cma.SockAddr, error) {
	a := ap.Addr()
	if !a.IsValid() {
		return cma.SockAddr{}, errors.New("no address")
	}
	var scope uint32
	if z := a.Zone(); z != "" {
		idx, err := zoneIndex(z)
		if err != nil {
			return cma.SockAddr{}, err
		}
		scope = idx
	}
	return cma.SockAddr{AP: netip.AddrPortFrom(a.WithZone(""), ap.Port()), Scope: scope}, nil
}

func addrPortOf(sa cma.SockAddr) netip.AddrPort {
	if sa.Scope != 0 && sa.AP.Addr().Is6() {
		return netip.AddrPortFrom(sa.AP.Addr().WithZone(zoneName(sa.Scope)), sa.AP.Port())
	}
	return sa.AP
}

func (c *cmID) localAddr() netip.AddrPort { return addrPortOf(c.h.LocalAddr()) }
func (c *cmID) peerAddr() netip.AddrPort  { return addrPortOf(c.h.PeerAddr()) }

// deviceName is the RDMA device the id is bound to, once it is.
func (c *cmID) deviceName() string { return c.h.DeviceName() }

func (c *cmID) portNum() int { return c.h.PortNum() }

// device wraps the id's verbs context, which librdmacm owns.
func (c *cmID) device() (*verbs.Device, error) {
	ctx := c.h.Context()
	if ctx == nil {
		return nil, errors.New("the id is bound to no RDMA device yet")
	}
	return vbridge.Device(ctx).(*verbs.Device), nil
}

func (c *cmID) setOption(name int, v []byte) error { return c.h.SetOption(name, v) }

const (
	optTOS        = cma.OptTOS
	optReuseAddr  = cma.OptReuseAddr
	optAFOnly     = cma.OptAFOnly
	optACKTimeout = cma.OptACKTimeout
)

func (c *cmID) bind(ap netip.AddrPort) error {
	sa, err := sockaddrOf(ap)
	if err != nil {
		return err
	}
	return c.h.Bind(sa)
}

func (c *cmID) resolveAddr(src netip.Addr, dst netip.AddrPort, timeout time.Duration) error {
	var s cma.SockAddr
	if src.IsValid() {
		var err error
		if s, err = sockaddrOf(netip.AddrPortFrom(src, 0)); err != nil {
			return err
		}
	}
	d, err := sockaddrOf(dst)
	if err != nil {
		return err
	}
	return c.h.ResolveAddr(s, d, int(timeout.Milliseconds()))
}

func (c *cmID) resolveRoute(timeout time.Duration) error {
	return c.h.ResolveRoute(int(timeout.Milliseconds()))
}

func (c *cmID) listen(backlog int) error { return c.h.Listen(backlog) }

func (c *cmID) connectOrAccept(accept bool, p ConnParam, data []byte) error {
	return c.h.Connect(accept, cma.ConnParam(p), data)
}

func (c *cmID) reject(data []byte) error { return c.h.Reject(data) }

func (c *cmID) disconnect() error { return c.h.Disconnect() }

func (c *cmID) establish() error { return c.h.Establish() }

// initQPAttr asks the CM for the attributes of the transition to state.
func (c *cmID) initQPAttr(state verbs.QPState) (verbs.QPAttr, verbs.AttrMask, error) {
	a, mask, err := c.h.InitQPAttr(int(state))
	if err != nil {
		return verbs.QPAttr{}, 0, err
	}
	return vbridge.QPAttr(&a).(verbs.QPAttr), verbs.AttrMask(mask), nil
}

// createQP has librdmacm create the QP (rdma_create_qp), which it then
// moves itself; it is destroyed with rdma_destroy_qp.
func (c *cmID) createQP(pd *verbs.PD, scq, rcq *verbs.CQ, t verbs.QPType, cp verbs.QPCap) (*verbs.QP, error) {
	p, s, r := vbridge.PD(pd), vbridge.CQ(scq), vbridge.CQ(rcq)
	if p == nil || s == nil || r == nil {
		return nil, fmt.Errorf("%w: the PD or a CQ is closed", syscall.EBADF)
	}
	qp, err := c.h.CreateQP(p, s, r, int(t), vbridge.QPCap(cp))
	if err != nil {
		return nil, err
	}
	return vbridge.AdoptQP(pd, qp, int(t)).(*verbs.QP), nil
}

func (c *cmID) joinMulticast(group netip.Addr) error {
	sa, err := sockaddrOf(netip.AddrPortFrom(group, 0))
	if err != nil {
		return err
	}
	return c.h.JoinMulticast(sa.AP.Addr(), sa.Scope)
}

func (c *cmID) leaveMulticast(group netip.Addr) error {
	sa, err := sockaddrOf(netip.AddrPortFrom(group, 0))
	if err != nil {
		return err
	}
	return c.h.LeaveMulticast(sa.AP.Addr(), sa.Scope)
}
