package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/internal/cma"
	"github.com/rdmago/rdmago/internal/ibv"
)

// fakeSource is an event channel the test feeds by hand.
type fakeSource struct {
	events chan rawEvent
	fail   chan error
	closed atomic.Int32
}

func newFakeSource() *fakeSource {
	return &fakeSource{events: make(chan rawEvent, 64), fail: make(chan error, 1)}
}

func (s *fakeSource) newID(c *ID, ps PortSpace) (cmHandle, error) {
	return &fakeHandle{token: c.token, src: s}, nil
}

func (s *fakeSource) read() (rawEvent, error) {
	select {
	case re := <-s.events:
		return re, nil
	case err := <-s.fail:
		return rawEvent{}, err
	}
}

func (s *fakeSource) close() { s.closed.Add(1) }

func (s *fakeSource) send(token uint64, t EventType, child cmHandle) {
	s.events <- rawEvent{ev: &Event{Type: t}, token: token, child: child}
}

// fakeHandle records what the dispatcher did to an id. Methods the
// dispatcher must not call are left to the nil embedded interface, so
// that a call panics.
type fakeHandle struct {
	cmHandle
	mu        sync.Mutex
	token     uint64
	destroyed int
	rejected  int
	// src is the source the handle is on; destroyedAfterClose records an
	// rdma_destroy_id after rdma_destroy_event_channel, which reads the
	// freed channel in librdmacm.
	src                 *fakeSource
	destroyedAfterClose bool
}

func (h *fakeHandle) SetToken(t uint64) { h.mu.Lock(); h.token = t; h.mu.Unlock() }
func (h *fakeHandle) Destroy() error {
	h.mu.Lock()
	h.destroyed++
	if h.src != nil && h.src.closed.Load() != 0 {
		h.destroyedAfterClose = true
	}
	h.mu.Unlock()
	return nil
}
func (h *fakeHandle) Reject([]byte) error {
	h.mu.Lock()
	h.rejected++
	h.mu.Unlock()
	return nil
}
func (h *fakeHandle) Listen(int) error { return nil }
func (h *fakeHandle) LocalAddr() cma.SockAddr {
	return cma.SockAddr{AP: netip.MustParseAddrPort("10.0.0.1:1")}
}
func (h *fakeHandle) PeerAddr() cma.SockAddr {
	return cma.SockAddr{AP: netip.MustParseAddrPort("10.0.0.2:2")}
}
func (h *fakeHandle) DeviceName() string { return "fake0" }
func (h *fakeHandle) PortNum() int       { return 1 }

func (h *fakeHandle) counts() (destroyed, rejected int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.destroyed, h.rejected
}

// settle waits until the goroutines a test started are gone. (Not with
// assert.Eventually, whose own goroutine would count.)
func settle(t *testing.T, before int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > before; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines left behind:\n%s", buf[:runtime.Stack(buf, true)])
		}
	}
}

func nextWithin(t *testing.T, id *ID) *Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ev, err := id.next(ctx)
	require.NoError(t, err)
	return ev
}

func TestDispatcherKeepsEachIDsEventsInOrder(t *testing.T) {
	before := runtime.NumGoroutine()
	src := newFakeSource()
	ch := newChannel(src)
	a, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)
	b, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)
	order := []EventType{EventAddrResolved, EventRouteResolved, EventConnectResponse, EventEstablished}
	for _, typ := range order {
		src.send(a.token, typ, nil)
		src.send(b.token, typ, nil)
	}
	// b's consumer is slow: a's events still arrive, all of them, in order.
	for _, want := range order {
		assert.Equal(t, want, nextWithin(t, a).Type)
	}
	for _, want := range order {
		assert.Equal(t, want, nextWithin(t, b).Type)
	}
	a.Close()
	b.Close()
	src.fail <- errors.New("test over")
	settle(t, before)
}

func TestConnectRequestGetsAnIDOfItsOwn(t *testing.T) {
	src := newFakeSource()
	ch := newChannel(src)
	l, err := ch.newID(PortSpaceUDP)
	require.NoError(t, err)
	child := &fakeHandle{token: l.token} // librdmacm gives it the listener's context
	src.send(l.token, EventConnectRequest, child)
	ev := nextWithin(t, l)
	require.Equal(t, EventConnectRequest, ev.Type)
	require.NotNil(t, ev.ID)
	assert.Equal(t, PortSpaceUDP, ev.ID.ps, "the request's id takes the listener's port space")
	assert.NotEqual(t, l.token, ev.ID.token)
	child.mu.Lock()
	assert.Equal(t, ev.ID.token, child.token, "the C id's context must route its events to the new id")
	child.mu.Unlock()

	// The new id's own events reach it, not the listener.
	src.send(ev.ID.token, EventEstablished, nil)
	assert.Equal(t, EventEstablished, nextWithin(t, ev.ID).Type)
	assert.Nil(t, l.poll())
	ev.ID.Close()
	l.Close()
	src.fail <- errors.New("test over")
}

func TestRequestsNoOneWillSeeAreRefusedAndDestroyed(t *testing.T) {
	src := newFakeSource()
	ch := newChannel(src)

	// Queued on an id that is then closed.
	l, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)
	queued := &fakeHandle{}
	src.send(l.token, EventConnectRequest, queued)
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.queue) == 1
	}, 5*time.Second, time.Millisecond)
	l.Close()
	d, r := queued.counts()
	assert.Equal(t, 1, r, "a queued request of a closed id is rejected")
	assert.Equal(t, 1, d, "and its id destroyed")

	// Arriving for an id that is gone.
	late := &fakeHandle{}
	src.send(l.token, EventConnectRequest, late)
	assert.Eventually(t, func() bool { d, r := late.counts(); return d == 1 && r == 1 }, 5*time.Second, time.Millisecond,
		"a request for a closed listener is rejected and destroyed")
	src.fail <- errors.New("test over")
}

// As the kernel does with requests not read from the channel, a listening
// id without a handler holds at most its backlog of requests not yet
// taken: the next one is rejected and destroyed at once, and a request
// taken makes room again.
func TestListenBacklogBoundsTheRequestsNotTaken(t *testing.T) {
	src := newFakeSource()
	ch := newChannel(src)
	l, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)
	require.NoError(t, l.Listen(2))
	queued := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.queue)
	}
	a, b, over := &fakeHandle{}, &fakeHandle{}, &fakeHandle{}
	for _, h := range []*fakeHandle{a, b, over} {
		src.send(l.token, EventConnectRequest, h)
	}
	assert.Eventually(t, func() bool { d, r := over.counts(); return d == 1 && r == 1 }, 5*time.Second, time.Millisecond,
		"the request beyond the backlog is rejected and destroyed")
	assert.Equal(t, 2, queued())

	first := nextWithin(t, l)
	room := &fakeHandle{}
	src.send(l.token, EventConnectRequest, room)
	assert.Eventually(t, func() bool { return queued() == 2 }, 5*time.Second, time.Millisecond, "a request taken makes room")
	d, r := room.counts()
	assert.Zero(t, d+r)
	for _, ev := range []*Event{first, nextWithin(t, l), nextWithin(t, l)} {
		ev.ID.Close()
	}
	l.Close()
	src.fail <- errors.New("test over")
}

func TestHandlerGetsQueuedEventsFirst(t *testing.T) {
	src := newFakeSource()
	ch := newChannel(src)
	id, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)
	src.send(id.token, EventEstablished, nil)
	require.Eventually(t, func() bool {
		id.mu.Lock()
		defer id.mu.Unlock()
		return len(id.queue) == 1
	}, 5*time.Second, time.Millisecond)
	var mu sync.Mutex
	var got []EventType
	id.setHandler(func(ev *Event) { mu.Lock(); got = append(got, ev.Type); mu.Unlock() })
	src.send(id.token, EventDisconnected, nil)
	src.send(id.token, EventTimewaitExit, nil)
	assert.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprint(got) == fmt.Sprint([]EventType{EventEstablished, EventDisconnected, EventTimewaitExit})
	}, 5*time.Second, time.Millisecond)
	id.Close()
	src.fail <- errors.New("test over")
}

func TestWaitForEventEndsWithItsContextOrClose(t *testing.T) {
	before := runtime.NumGoroutine()
	src := newFakeSource()
	ch := newChannel(src)
	id, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = id.next(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	done := make(chan error)
	go func() {
		_, err := id.next(context.Background())
		done <- err
	}()
	blockedIn(t, "rdmacm.(*ID).next(")
	id.Close()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("a wait outlived its id's close")
	}
	src.fail <- errors.New("test over")
	settle(t, before)
}

func TestFailingChannelReachesEveryWaiter(t *testing.T) {
	before := runtime.NumGoroutine()
	src := newFakeSource()
	ch := newChannel(src)
	waiting, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)
	handled, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)
	got := make(chan *Event, 1)
	handled.setHandler(func(ev *Event) { got <- ev })
	l := &Listener{&listener{id: waiting, addr: netip.MustParseAddrPort("10.0.0.1:7471"), reqs: make(chan *request), closed: make(chan struct{})}}

	errs := make(chan error, 2)
	go func() {
		_, err := waiting.next(context.Background())
		errs <- err
	}()
	go func() {
		_, err := l.Request(context.Background())
		errs <- err
	}()
	blockedIn(t, "rdmacm.(*ID).next(")
	blockedIn(t, "rdmacm.(*Listener).Request(")
	src.fail <- errors.New("epoll broke")

	for range 2 {
		select {
		case err := <-errs:
			assert.ErrorIs(t, err, ErrEventChannel)
			assert.ErrorContains(t, err, "epoll broke", "the cause is kept")
		case <-time.After(5 * time.Second):
			t.Fatal("a waiter did not learn that the channel failed")
		}
	}
	select {
	case ev := <-got:
		assert.Equal(t, eventChannelFailed, ev.Type)
		assert.ErrorIs(t, ev.err, ErrEventChannel)
	case <-time.After(5 * time.Second):
		t.Fatal("an id with a handler did not learn that the channel failed")
	}
	// A handler set afterwards learns at once too.
	late, err := ch.newID(PortSpaceTCP)
	require.ErrorIs(t, err, ErrEventChannel, "no new id on a dead channel")
	require.Nil(t, late)
	again := make(chan *Event, 1)
	handled.setHandler(func(ev *Event) { again <- ev })
	assert.Equal(t, eventChannelFailed, (<-again).Type)

	// The failed channel is released once its last id is gone, not
	// before: librdmacm destroys an id through its channel.
	waiting.Close()
	assert.Zero(t, src.closed.Load(), "released while an id is still on it")
	handled.Close()
	assert.EqualValues(t, 1, src.closed.Load(), "the failed channel was not released after its last id")
	for _, id := range []*ID{waiting, handled} {
		h := id.h.(*fakeHandle)
		assert.False(t, h.destroyedAfterClose, "rdma_destroy_id ran after rdma_destroy_event_channel")
	}
	settle(t, before)
}

// A channel that fails with no id on it is released at once; one that
// works is never released.
func TestFailedChannelWithoutIDsIsReleased(t *testing.T) {
	src := newFakeSource()
	ch := newChannel(src)
	id, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)
	id.Close()
	assert.Zero(t, src.closed.Load(), "a working channel outlives its ids")
	src.fail <- errors.New("epoll broke")
	<-ch.failed
	assert.Eventually(t, func() bool { return src.closed.Load() == 1 }, 5*time.Second, time.Millisecond)
}

// strictHandle fails the test when the C id would be touched after
// rdma_destroy_id freed it.
type strictHandle struct {
	fakeHandle
	t    *testing.T
	life sync.Mutex
	dead bool
	// entered, if set, is closed when Disconnect begins.
	entered     chan struct{}
	enteredOnce sync.Once
}

func (h *strictHandle) Destroy() error {
	h.life.Lock()
	h.dead = true
	h.life.Unlock()
	return nil
}

func (h *strictHandle) check(call string) {
	h.life.Lock()
	defer h.life.Unlock()
	if h.dead {
		h.t.Errorf("%s on a destroyed rdma_cm_id (a use after free in C)", call)
	}
}

func (h *strictHandle) Context() *ibv.Context  { h.check("Context"); return nil }
func (h *strictHandle) Transport() (int, bool) { h.check("Transport"); return 0, false }
func (h *strictHandle) Disconnect() error {
	if h.entered != nil {
		h.enteredOnce.Do(func() { close(h.entered) })
	}
	time.Sleep(20 * time.Millisecond) // a slow call, for Close to race
	h.check("Disconnect")
	return nil
}
func (h *strictHandle) LocalAddr() cma.SockAddr {
	h.check("LocalAddr")
	return h.fakeHandle.LocalAddr()
}
func (h *strictHandle) PeerAddr() cma.SockAddr { h.check("PeerAddr"); return h.fakeHandle.PeerAddr() }

type strictSource struct {
	*fakeSource
	t *testing.T
}

func (s *strictSource) newID(c *ID, ps PortSpace) (cmHandle, error) {
	return &strictHandle{fakeHandle: fakeHandle{token: c.token}, t: s.t}, nil
}

// blockedIn waits until a goroutine is parked inside fn (its stack names
// it, in a wait), so that what the test does next meets a waiter.
func blockedIn(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, fn) && (strings.Contains(g, "[select") || strings.Contains(g, "[chan receive")) {
				return
			}
		}
	}
	t.Fatalf("no goroutine waits in %s", fn)
}

// Close waits for a call in progress on another goroutine, and an event
// examined after its id was closed reads nothing of the freed id.
func TestCloseNeverFreesTheIDUnderACall(t *testing.T) {
	src := &strictSource{newFakeSource(), t}
	ch := newChannel(src)
	id, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)

	h := id.h.(*strictHandle)
	h.entered = make(chan struct{})
	done := make(chan error)
	go func() { done <- id.Disconnect() }()
	<-h.entered // the call is under way in C when Close comes
	require.NoError(t, id.Close())
	require.NoError(t, <-done, "the call that began before Close completes")
	assert.ErrorIs(t, id.Disconnect(), ErrClosed, "and one after it is refused")
	assert.Equal(t, netip.AddrPort{}, id.LocalAddr())

	id, err = ch.newID(PortSpaceTCP)
	require.NoError(t, err)
	src.send(id.token, EventRejected, nil)
	ev := nextWithin(t, id)
	require.NoError(t, id.Close())
	assert.ErrorIs(t, ev.Err(), ErrRejected)
	src.fail <- errors.New("test over")
}

// librdmacm's own CONNECT_ERROR on InfiniBand and RoCE has status -1
// ("see errno"): the dialer's error must not read it as EPERM.
func TestConnectErrorOfLibrdmacmIsNotEPERM(t *testing.T) {
	src := newFakeSource()
	ch := newChannel(src)
	id, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)
	defer func() { id.Close(); src.fail <- errors.New("test over") }()
	e := &endpoint{op: "dial", o: &settings{}, id: id, remote: netip.MustParseAddrPort("10.0.0.2:2")}
	oe := e.connectError(&Event{Type: EventConnectError, Status: -1})
	assert.ErrorIs(t, oe, ErrConnect)
	assert.NotContains(t, oe.Error(), "not permitted")
	assert.Contains(t, oe.Error(), "RTU")
	assert.Contains(t, oe.Error(), "10.0.0.2:2")

	// siw's own statuses are errnos.
	e.iwarp = true
	oe = e.connectError(&Event{Type: EventConnectError, Status: -22})
	assert.ErrorIs(t, oe, ErrConnect)
	assert.ErrorIs(t, oe, syscall.EINVAL)
}

// A destroyed id's slot is reused, but an event for it read late reaches
// neither the slot's next id nor anyone else; a wait in progress ends when
// its id is closed.
func TestLateEventForDestroyedIDReachesNoOne(t *testing.T) {
	src := newFakeSource()
	ch := newChannel(src)
	a, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)
	old := a.token
	require.NoError(t, a.destroy())
	b, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)
	assert.Equal(t, uint32(old), uint32(b.token), "the slot is reused")
	assert.NotEqual(t, old, b.token)

	src.send(old, EventDisconnected, nil)
	src.send(b.token, EventEstablished, nil)
	assert.Equal(t, EventEstablished, nextWithin(t, b).Type, "the destroyed id's event reached its slot's next id")

	waiting := make(chan error, 1)
	go func() { _, err := b.next(context.Background()); waiting <- err }()
	blockedIn(t, "rdmacm.(*ID).next(")
	require.NoError(t, b.destroy())
	select {
	case err := <-waiting:
		assert.ErrorIs(t, err, ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("closing the id did not end the wait for its next event")
	}
	assert.Nil(t, ch.lookup(b.token))
}

// Two waiters on one id's events: deliver signals once while a token is
// pending, so a waiter that takes an event with more queued passes the
// signal on. Without that, a second waiter already parked would sleep
// with an event queued (the first took the one token and the first event).
func TestEventWaitersPassTheSignalOn(t *testing.T) {
	before := runtime.NumGoroutine()
	src := newFakeSource()
	ch := newChannel(src)
	id, err := ch.newID(PortSpaceTCP)
	require.NoError(t, err)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = id.next(ended) // a wait sets up the wake channel
	require.ErrorIs(t, err, context.Canceled)

	first, second := &Event{Type: EventAddrResolved}, &Event{Type: EventRouteResolved}
	id.deliver(first)
	id.deliver(second)
	<-id.wake // the first waiter wakes, looks again, and takes the first event
	assert.Same(t, first, nextWithin(t, id))
	select {
	case <-id.wake: // the second waiter wakes
	default:
		t.Fatal("an event is queued and no waiter will hear of it")
	}
	assert.Same(t, second, nextWithin(t, id))

	id.Close()
	src.fail <- errors.New("test over")
	settle(t, before)
}

// taggedContext is a context whose type holds a slice: comparing two such
// interface values with == panics.
type taggedContext struct {
	context.Context
	tags []string
}

// A connection's kept wait context is known by its caller's context's Done
// channel: any context works, also one that cannot be compared.
func TestMergedContextTakesContextsThatDoNotCompare(t *testing.T) {
	end, endCancel := context.WithCancel(context.Background())
	defer endCancel()
	parent, cancel := context.WithCancel(context.Background())
	var m mergedContext
	defer m.release()
	first := m.get(taggedContext{parent, []string{"a"}}, end)
	assert.Equal(t, first, m.get(taggedContext{parent, []string{"b"}}, end), "kept for a context with the same Done channel")
	other := m.get(context.WithoutCancel(parent), end)
	assert.NotEqual(t, first, other, "another Done channel, another merged context")
	got := m.get(taggedContext{parent, nil}, end)
	cancel()
	<-got.Done()
}
