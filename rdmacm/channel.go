package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmago/rdmago/internal/cma"
	"github.com/rdmago/rdmago/internal/fdwait"
	"github.com/rdmago/rdmago/internal/ibv"
	"github.com/rdmago/rdmago/internal/vbridge"
	"github.com/rdmago/rdmago/verbs"
)

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
	Transport() (int, bool)
	ContextKey() uintptr
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
	CreateQP(pd *ibv.PD, scq, rcq *ibv.CQ, qpType int, cp ibv.QPCap, signalAll bool) (*ibv.QP, error)
	JoinMulticast(group netip.Addr, scope uint32) error
	LeaveMulticast(group netip.Addr, scope uint32) error
}

// rawEvent is an event as the source reads it, before routing.
type rawEvent struct {
	ev *Event
	// token is the context of the id it belongs to (for a connect
	// request, the listener's).
	token uint64
	// child is a connect request's new id.
	child cmHandle
}

// eventSource is an event channel as the dispatcher sees it: librdmacm's
// (cmaSource), or a test's fake.
type eventSource interface {
	// newID creates c's id under c.token; its handle may live in c.raw,
	// so that an id is one allocation.
	newID(c *ID, ps PortSpace) (cmHandle, error)
	// read waits for the next event, which it has already acked; an error
	// means that none will come again.
	read() (rawEvent, error)
	// close releases the channel once read has failed and no id is left
	// on it.
	close()
}

// cmaSource is librdmacm's event channel, waited for in Go's poller.
type cmaSource struct {
	ch *cma.Channel
	w  *fdwait.Waiter

	// Only the dispatcher reads: the events of the last crossing into C
	// not yet handed out. One at a time: reading every queued event per
	// crossing (up to cma.EventBatch) made resolve route 2 % slower in
	// cmtime, as most wake-ups find one event, and the read that then
	// finds none is paid twice (in the batch, and again before the next
	// wait: Go's poller forgets a readiness it saw before a wait began).
	// One at a time is also what routes a request's later events: its new
	// id carries the listener's token until the request's handling in Go
	// gives it its own, so an event for it read in the same crossing
	// would go to the listener. A larger batch must end at a request.
	batch   [1]cma.Event
	next, n int
	fill    func() bool // fills batch; made once, not per wait
	err     error       // fill's failed read, other than "none queued"
	// getEvents reads events: the channel's GetEvents, or a test's.
	getEvents func([]cma.Event) (int, bool, error)
}

// maxReadPause bounds the pause between two reads of the channel that
// ran out of memory (rdma_get_cm_event's malloc). A failed read leaves its
// event queued, and Go's poller, which reports a readiness once, would not
// wake for it again until another event came: the read is made again, as
// long as memory is short, since giving up the channel would end every
// connection of the process.
const maxReadPause = time.Second

func (s *cmaSource) newID(c *ID, ps PortSpace) (cmHandle, error) {
	if err := s.ch.NewID(&c.raw, c.token, int(ps)); err != nil {
		return nil, err
	}
	return &c.raw, nil
}

func (s *cmaSource) close() {
	s.w.Close()
	s.ch.Destroy()
}

// read hands out the next event.
func (s *cmaSource) read() (rawEvent, error) {
	for failed := 0; s.next == s.n; {
		if s.fill == nil {
			if s.getEvents == nil {
				s.getEvents = s.ch.GetEvents
			}
			s.fill = func() bool {
				s.n, _, s.err = s.getEvents(s.batch[:])
				s.next = 0
				return s.n > 0 || s.err != nil // none: wait in the poller
			}
		}
		if err := s.w.Wait(context.Background(), s.fill); err != nil {
			return rawEvent{}, fmt.Errorf("waiting for the rdma_cm event channel in Go's poller: %w", err)
		}
		if s.n > 0 || s.err == nil {
			continue
		}
		if !errors.Is(s.err, syscall.ENOMEM) {
			// The descriptor itself refuses (an ABI mismatch, a changed
			// process credential): no read will do better.
			return rawEvent{}, fmt.Errorf("reading the rdma_cm event channel (rdma_get_cm_event): %w", s.err)
		}
		failed++
		time.Sleep(min(time.Millisecond<<min(failed, 10), maxReadPause)) // then read again, without waiting
	}
	got := &s.batch[s.next]
	s.next++
	ev := &Event{Type: EventType(got.Type), Status: got.Status, UD: got.UD, PrivateData: got.PrivateData,
		Param: ConnParam(got.Param)}
	if ev.UD {
		ev.QKey = got.QKey
		ev.AH = vbridge.AHAttr(&got.AH).(verbs.AHAttr)
	}
	re := rawEvent{ev: ev, token: got.Token}
	if ev.Type == EventConnectRequest {
		re.child = got.ID
	}
	*got = cma.Event{} // hold no private data or id past its delivery
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

	mu sync.Mutex
	// ids is every id on the channel, by slot: a token is the slot's
	// index in its low 32 bits and a generation above, so that an event
	// for a destroyed id, read late, never reaches the slot's next id.
	// (A table, not a map: no hashing or map growth per id.)
	ids   []*ID
	free  []uint32 // slots of destroyed ids
	count int      // ids in use
	gen   uint64

	failed chan struct{} // closed when the source failed; err says why
	err    error
	dead   atomic.Bool // set with failed closed, for the lock-free checks
	// released: the failed source was closed, its last id gone.
	released bool
}

func newChannel(src eventSource) *channel {
	ch := &channel{src: src, failed: make(chan struct{})}
	go ch.dispatch()
	return ch
}

var shared struct {
	mu sync.Mutex
	c  *channel
	// ok is c while it has not failed: every NewID reads it without a lock.
	ok atomic.Pointer[channel]
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

// openIDs counts the ids of every channel, for OpenIDs.
var openIDs atomic.Int64

// OpenIDs is how many CM ids the process holds open through this package:
// every ID not closed yet, whether a Conn, a Listener, a request waiting
// in a listener's queue or the thin layer holds it. A leak check can count
// them; the kernel's resource list shows an id only once it is bound to a
// device, so an id that never resolved an address is missing there.
func OpenIDs() int { return int(openIDs.Load()) }

// OpenDevice returns librdmacm's context for the named RDMA device: the one
// the QPs of its connections are created on, so that a PD allocated on it
// can be ConnConfig.PD. The first call has librdmacm open every device on the
// host (a descriptor or two each), which it keeps for the life of the
// process, or, once a device was removed, until ReleaseRemovedDevices;
// Close on the Device does nothing.
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
	if c := shared.ok.Load(); c != nil && !c.dead.Load() {
		return c, nil
	}
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
	shared.ok.Store(shared.c)
	return shared.c, nil
}

// add registers a new id under a fresh token.
func (ch *channel) add(ps PortSpace) *ID {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.addLocked(ps)
}

// addLocked is add with mu held.
func (ch *channel) addLocked(ps PortSpace) *ID {
	var slot uint32
	if n := len(ch.free); n > 0 {
		slot = ch.free[n-1]
		ch.free = ch.free[:n-1]
	} else {
		slot = uint32(len(ch.ids))
		ch.ids = append(ch.ids, nil)
	}
	ch.gen++
	c := &ID{ch: ch, token: ch.gen<<32 | uint64(slot), ps: ps}
	ch.ids[slot] = c
	ch.count++
	openIDs.Add(1)
	return c
}

func (ch *channel) remove(c *ID) {
	ch.mu.Lock()
	if slot := uint32(c.token); int(slot) < len(ch.ids) && ch.ids[slot] == c {
		ch.ids[slot] = nil
		ch.free = append(ch.free, slot)
		ch.count--
		openIDs.Add(-1)
	}
	release := ch.releasable()
	ch.mu.Unlock()
	if release {
		ch.src.close()
	}
}

// releasable reports, once, whether the source should be closed now: it
// has failed and its last id is gone (librdmacm destroys an id through
// its channel's descriptor, so the channel outlives its ids). The caller
// holds mu.
func (ch *channel) releasable() bool {
	if !ch.dead.Load() || ch.released || ch.count > 0 {
		return false
	}
	ch.released = true
	return true
}

func (ch *channel) lookup(token uint64) *ID {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if slot := uint32(token); int(slot) < len(ch.ids) {
		if c := ch.ids[slot]; c != nil && c.token == token {
			return c
		}
	}
	return nil
}

// newID creates an id on the channel.
func (ch *channel) newID(ps PortSpace) (*ID, error) {
	// Checked and registered under one lock: a channel failing meanwhile
	// then sees the id and is not released under rdma_create_id.
	ch.mu.Lock()
	if ch.dead.Load() {
		ch.mu.Unlock()
		return nil, ch.failure()
	}
	c := ch.addLocked(ps)
	ch.mu.Unlock()
	h, err := ch.src.newID(c, ps)
	if err != nil {
		ch.remove(c)
		return nil, fmt.Errorf("rdma_create_id %v: %w", ps, noCgo(err))
	}
	c.h = h
	return c, nil
}

// newID creates an id on the process's channel.
func newID(ps PortSpace) (*ID, error) {
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

// dispatch runs until the source fails: a working channel is never
// closed, like librdmacm's own per-process state; a failed one is
// released with its last id.
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
			ev.ID = child
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
	ch.dead.Store(true)
	close(ch.failed)
	ids := make([]*ID, 0, ch.count)
	for _, c := range ch.ids {
		if c != nil {
			ids = append(ids, c)
		}
	}
	release := ch.releasable()
	ch.mu.Unlock()
	if release {
		ch.src.close()
	}
	for _, c := range ids {
		c.mu.Lock()
		tell := c.handler != nil && !c.toldFailure
		c.toldFailure = c.toldFailure || tell
		c.mu.Unlock()
		if tell {
			c.deliver(&Event{Type: eventChannelFailed, err: ch.failure()})
		}
	}
}

// dropped releases what an event that no one will see holds: a connect
// request's new id is refused and destroyed.
func (ev *Event) dropped() {
	if ev.ID != nil {
		ev.ID.reject(nil)
		ev.ID.destroy()
	}
}

// dropLater is dropped for the dispatcher, which must never wait:
// destroying an iWARP id can wait on the peer, so a refusal runs on a
// goroutine of its own.
func (ev *Event) dropLater() {
	if ev.ID != nil {
		go ev.dropped()
	}
}

// deliver hands ev to the handler, or queues it. The handler runs under
// c.mu, which keeps events in order; it must not block.
func (c *ID) deliver(ev *Event) {
	ev.id = c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		ev.dropLater()
		return
	}
	if c.handler != nil {
		c.handler(ev)
		return
	}
	if ev.Type == EventConnectRequest && ev.ID != nil && c.backlog > 0 && len(c.queue) >= int(c.backlog) &&
		c.requestsQueued() >= int(c.backlog) {
		ev.dropLater() // the backlog is full (see Listen)
		return
	}
	c.queue = append(c.queue, ev)
	if c.wake != nil {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// requestsQueued counts the connect requests waiting for Event; c.mu is
// held.
func (c *ID) requestsQueued() int {
	n := 0
	for _, ev := range c.queue {
		if ev.Type == EventConnectRequest {
			n++
		}
	}
	return n
}

// setHandler routes this id's events to h from now on, queued ones first.
func (c *ID) setHandler(h func(*Event)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handler = h
	for _, ev := range c.queue {
		h(ev)
	}
	c.queue = nil
	// A new handler hears of a failure too, once: fail() tells only the
	// handlers that have not heard yet.
	c.toldFailure = false
	select {
	case <-c.ch.failed:
		c.toldFailure = true
		h(&Event{Type: eventChannelFailed, err: c.ch.failure(), id: c})
	default:
	}
}

// poll returns a queued event, or nil.
func (c *ID) poll() *Event {
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
func (c *ID) next(ctx context.Context) (*Event, error) {
	for {
		c.mu.Lock()
		if len(c.queue) > 0 {
			ev := c.queue[0]
			c.queue = c.queue[1:]
			if len(c.queue) > 0 && c.wake != nil {
				// deliver signals once while a token is pending: another
				// waiter may have missed the next event's.
				select {
				case c.wake <- struct{}{}:
				default:
				}
			}
			c.mu.Unlock()
			return ev, nil
		}
		if c.closed.Load() {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if c.wake == nil {
			c.wake = make(chan struct{}, 1)
		}
		wake := c.wake
		c.mu.Unlock()
		select {
		case <-wake: // an event, or closed: look again
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.ch.failed:
			if ev := c.poll(); ev != nil {
				return ev, nil // delivered before the failure
			}
			return nil, c.ch.failure()
		}
	}
}

// destroy destroys the id. Every event read was acked at once, so
// rdma_destroy_id cannot wait on us; events still queued in the kernel are
// dropped with the id, and queued connect requests' ids are refused and
// destroyed. The QP, if the CM made one, must be gone.
func (c *ID) destroy() error {
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return nil
	}
	c.closed.Store(true)
	if c.wake != nil {
		close(c.wake) // every waiter in next looks again, and sees closed
	}
	queued := c.queue
	c.queue = nil
	c.mu.Unlock()
	c.life.Lock() // the calls in progress end first
	c.qpMu.Lock()
	qp, joined := c.qp, c.joined
	c.qp, c.joined = nil, nil
	c.qpMu.Unlock()
	for _, group := range joined {
		// Detaches the QP, which could not be destroyed attached.
		if sa, err := sockaddrOf(netip.AddrPortFrom(group, 0)); err == nil {
			c.h.LeaveMulticast(sa.AP.Addr(), sa.Scope)
		}
	}
	var qerr *OpError
	if qp != nil {
		// librdmacm destroys it through the id. A failure (EBUSY: attached
		// to a group joined some other way) is the caller's to know, the
		// QP outliving the id: described now, while the id can be read.
		if e := qp.Close(); e != nil {
			qerr = c.fail("rdma_destroy_id", fmt.Errorf("destroying its QP first: %w", e))
			if errors.Is(e, syscall.EBUSY) {
				qerr.Hint = "a QP still attached to a multicast group cannot be destroyed"
			}
		}
	}
	err := c.h.Destroy()
	if err != nil {
		// The id is still there: Close describes the failure.
		if qerr != nil {
			err = errors.Join(qerr.Err, err)
		}
	} else if qerr != nil {
		err = qerr
	}
	// Only now: the last id off a failed channel releases it, and
	// rdma_destroy_id reads the channel. Events for the id are dropped
	// meanwhile (closed).
	c.ch.remove(c)
	c.life.Unlock()
	for _, ev := range queued {
		ev.dropped()
	}
	return err
}

// ReleaseRemovedDevices has librdmacm close its context of every RDMA
// device that was removed (DEVICE_REMOVAL) and that no id uses any more.
// Until then the kernel's deletion of the device waits for this process,
// and a device of the same kind cannot be added on that netdev again ("File
// exists"). Call it once every Conn, Listener and ID on the removed device
// is closed, and every PD, CQ and MR made on it, and no *verbs.Device of it
// (from OpenDevice or a connection's Device) is used again: librdmacm counts
// only its ids, and closing a removed device's context under objects still
// made on it would free memory they use. It does nothing for devices
// still present.
func ReleaseRemovedDevices() error {
	if err := Init(); err != nil {
		return err
	}
	cma.ReleaseDeadDevices()
	// A device added again under the same name may differ.
	deviceAttrs.Clear()
	return nil
}
