package verbs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/rdmago/rdmago/internal/fdwait"
	"github.com/rdmago/rdmago/internal/ibv"
)

// CQ is a completion queue, with a completion channel whose fd waits in Go's
// runtime poller: a goroutine waiting for completions parks no OS thread.
type CQ struct {
	dev *Device

	mu   sync.Mutex
	cq   *ibv.CQ        // nil once closed
	wait *fdwait.Waiter // the channel fd in Go's poller, from the first wait on
	// users counts the QPs made on the CQ and not destroyed yet (twice a
	// QP that uses it both ways). Close refuses while there are any: the
	// kernel would refuse too, but libsiw unmaps the CQ's ring before it
	// asks, so a CQ it refused would crash at its next poll.
	users int
	// waiting is held for reading by a goroutine waiting on the channel,
	// which reads it outside mu; Close takes it for writing, after waking
	// the waiter, before it destroys the channel.
	waiting sync.RWMutex
	// inWait: a Wait or PollWait is in progress. One at a time may be: the
	// wait steps share the CQ's state (the event count, PollWait's buffer),
	// and a second waiter is refused rather than let corrupt it.
	inWait atomic.Bool
	// armed: the CQ was armed and the event that arming brings has not
	// been read yet. A wait then needs no new arming: it reads the event if
	// it came, and otherwise the event's arrival wakes it. The CQ is never
	// armed again before its event was read, so at most one is ever queued
	// on the channel.
	armed atomic.Bool
	// tryEvent reads one event for the poller's wait; made once, as a
	// closure per wait would be allocated per wait.
	tryEvent func() bool
	// pw is the PollWait in progress, and tryPoll its step, made once.
	// The completions land in pwBuf, not in the caller's slice, which
	// kept by the CQ would move to the heap on every call.
	pw      pollWait
	pwBuf   []WorkCompletion
	tryPoll func() bool

	yield yielder // Poll yields through it
}

// Device is the device the CQ was created on.
func (c *CQ) Device() *Device { return c.dev }

// CreateCQ creates a completion queue of at least entries entries.
func (d *Device) CreateCQ(entries int) (*CQ, error) {
	if entries < 1 || entries > math.MaxInt32 {
		// libibverbs takes a C int: more would wrap, to a CQ of another size.
		return nil, &OpError{Op: "ibv_create_cq", Device: d.Info.Name, Detail: fmt.Sprintf("%d entries", entries), Err: syscall.EINVAL,
			Hint: "entries must be positive, and at most the device's MaxCQE (Device.Query)"}
	}
	ctx, err := d.enter()
	if err != nil {
		return nil, err
	}
	cq, op, err := ctx.CreateCQ(entries)
	if err == nil {
		d.cqs.Add(1)
	}
	d.leave()
	if err != nil {
		e := &OpError{Op: op, Device: d.Info.Name, Err: noCgo(err)}
		if op == "ibv_create_cq" {
			e.Detail = fmt.Sprintf("%d entries", entries)
			if a, qerr := d.Query(); qerr == nil && entries > a.MaxCQE {
				e.Hint = fmt.Sprintf("the device holds at most %d entries per CQ (MaxCQE)", a.MaxCQE)
			}
		}
		return nil, e
	}
	c := &CQ{dev: d, cq: cq}
	c.tryPoll = c.tryPollStep
	c.tryEvent = func() bool {
		if !cq.GetEvent() {
			return false // none queued: wait in the poller
		}
		c.armed.Store(false)
		return true
	}
	return c, nil
}

// The completions of ibv.CQ.Poll land in the caller's []WorkCompletion
// directly: the two types are laid out alike (TestWorkCompletionLayout).
var _ [unsafe.Sizeof(WorkCompletion{}) - unsafe.Sizeof(ibv.WC{})]struct{}
var _ [unsafe.Sizeof(ibv.WC{}) - unsafe.Sizeof(WorkCompletion{})]struct{}

// Poll moves up to len(wcs) completions into wcs, from Go on rxe and siw and
// otherwise in one crossing into C, and returns how many there were (0 when
// the queue is empty).
//
// A goroutine that busy-polls passes through the Go scheduler every few
// milliseconds from inside Poll (see yieldEvery), so that it never needs
// the runtime's forced preemption.
func (c *CQ) Poll(wcs []WorkCompletion) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	c.yield.maybeYield()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cq == nil {
		return 0, &OpError{Op: "ibv_poll_cq", Device: c.dev.Info.Name, Err: syscall.EBADF, Hint: "the CQ is closed"}
	}
	n, err := c.cq.Poll(unsafe.Slice((*ibv.WC)(unsafe.Pointer(&wcs[0])), len(wcs)))
	if err != nil {
		return 0, &OpError{Op: "ibv_poll_cq", Device: c.dev.Info.Name, Err: err}
	}
	return n, nil
}

// Wait arms the CQ's notification and blocks until a completion arrives
// after that, or ctx ends. A completion that landed between the caller's
// last empty poll and the arming wakes nobody: to wait for completions,
// use [CQ.PollWait], which polls again after arming. After a PollWait, the
// arming it left may stand, and Wait may then return for a completion that
// PollWait already returned (one that landed as PollWait armed): poll
// after Wait, expecting none. One goroutine at a time may wait on a CQ.
func (c *CQ) Wait(ctx context.Context) error {
	if err := c.enterWait("wait for completions"); err != nil {
		return err
	}
	defer c.inWait.Store(false)
	if err := c.arm(); err != nil {
		return err
	}
	return c.waitEvent(ctx, c.tryEvent)
}

// enterWait admits one waiter; the caller clears inWait when done.
func (c *CQ) enterWait(op string) error {
	if !c.inWait.CompareAndSwap(false, true) {
		return &OpError{Op: op, Device: c.dev.Info.Name, Err: syscall.EBUSY,
			Hint: "another goroutine is waiting on this CQ (Wait or PollWait): one at a time may; Poll may run beside it"}
	}
	return nil
}

// PollWait polls into wcs, and if the CQ is empty waits for completions
// until at least one arrives or ctx ends. It arms the notification between
// two polls, so a completion that lands just before arming is not missed.
// A wake-up's completions are returned before the event that woke it is
// read: that read comes with the next empty poll, before the arming, so a
// caller answers a message first. Each step runs on rxe and siw from Go with
// raw system calls, elsewhere in one crossing into C. As with Wait, one
// goroutine at a time may wait on a CQ; Poll may run beside it.
func (c *CQ) PollWait(ctx context.Context, wcs []WorkCompletion) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	if err := ctx.Err(); err != nil {
		// What is there, without waiting; none is ctx's error.
		if n, perr := c.Poll(wcs); n > 0 || perr != nil {
			return n, perr
		}
		return 0, err
	}
	c.yield.maybeYield()
	if err := c.enterWait("wait for completions"); err != nil {
		return 0, err
	}
	defer c.inWait.Store(false)
	if len(c.pwBuf) < len(wcs) {
		c.pwBuf = make([]WorkCompletion, len(wcs))
	}
	c.pw = pollWait{max: len(wcs)}
	err := c.waitEvent(ctx, c.tryPoll)
	n, perr := c.pw.n, c.pw.err
	c.pw = pollWait{}
	switch {
	case perr != nil:
		return 0, perr
	case err == nil:
		return copy(wcs, c.pwBuf[:n]), nil
	}
	// The wait ended before the first step (ctx, or Close): what is
	// there is still taken.
	if n, perr := c.Poll(wcs); n > 0 {
		return n, perr
	}
	return 0, err
}

// pollWait is the state of the PollWait in progress (one at a time).
type pollWait struct {
	max int // how many completions to take
	n   int
	err error
}

// tryPollStep is PollWait's step, which the poller's wait calls first
// (after it reset the descriptor's readiness: an event that comes after
// the arming below wakes the wait) and after every wake-up: it polls, and
// only on an empty CQ reads the event if the CQ is armed, and arms it again
// when it is not. A wake-up's completions are thus returned before the
// event's read, which waits for the next empty poll.
func (c *CQ) tryPollStep() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cq == nil {
		c.pw.err = &OpError{Op: "ibv_poll_cq", Device: c.dev.Info.Name, Err: syscall.EBADF, Hint: "the CQ is closed"}
		return true
	}
	wcs := c.pwBuf[:c.pw.max]
	n, armed, err := c.cq.EventPollArm(unsafe.Slice((*ibv.WC)(unsafe.Pointer(&wcs[0])), len(wcs)), c.armed.Load())
	c.armed.Store(armed)
	if err != nil {
		var ne *ibv.NotifyError
		if errors.As(err, &ne) {
			c.pw.err = &OpError{Op: "ibv_req_notify_cq", Device: c.dev.Info.Name, Err: ne.Err}
		} else {
			c.pw.err = &OpError{Op: "ibv_poll_cq", Device: c.dev.Info.Name, Err: err}
		}
		return true
	}
	c.pw.n = n
	return n > 0
}

func (c *CQ) arm() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cq == nil {
		return &OpError{Op: "ibv_req_notify_cq", Device: c.dev.Info.Name, Err: syscall.EBADF, Hint: "the CQ is closed"}
	}
	if c.armed.Load() {
		// A PollWait left the CQ armed. Without its event queued, it
		// still is: arming again could queue a second event. With it,
		// the event is read now, or Wait would return on a completion
		// from before it.
		if !c.cq.GetEvent() {
			return nil
		}
		c.armed.Store(false)
	}
	if err := c.cq.ReqNotify(); err != nil {
		return &OpError{Op: "ibv_req_notify_cq", Device: c.dev.Info.Name, Err: err}
	}
	c.armed.Store(true)
	return nil
}

// waiter registers the channel with the poller on the first wait: a CQ
// that is only ever busy-polled costs no duplicate descriptor.
func (c *CQ) waiter() (*fdwait.Waiter, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cq == nil {
		return nil, &OpError{Op: "wait for completions", Device: c.dev.Info.Name, Err: syscall.EBADF, Hint: "the CQ is closed"}
	}
	if c.wait == nil {
		w, err := fdwait.New(c.cq.ChannelFD(), "completion channel")
		if err != nil {
			return nil, &OpError{Op: "wait for completions", Device: c.dev.Info.Name, Err: err}
		}
		c.wait = w
	}
	return c.wait, nil
}

func (c *CQ) waitEvent(ctx context.Context, try func() bool) error {
	c.waiting.RLock()
	defer c.waiting.RUnlock()
	w, err := c.waiter()
	if err != nil {
		return err
	}
	err = w.Wait(ctx, try)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return &OpError{Op: "wait for completion event", Device: c.dev.Info.Name, Err: err}
}

// Close destroys the CQ and its channel. QPs using it must be closed
// first: while one is open, Close refuses with EBUSY and the CQ stays as
// it was.
// A goroutine waiting on the CQ is woken first (its wait fails) and has
// left before the channel goes.
func (c *CQ) Close() error {
	c.mu.Lock()
	cq, w, users := c.cq, c.wait, c.users
	if cq != nil && users > 0 {
		c.mu.Unlock()
		return &OpError{Op: "ibv_destroy_cq", Device: c.dev.Info.Name, Err: syscall.EBUSY,
			Detail: fmt.Sprintf("QPs still complete to it (%d of their send and receive queues)", users),
			Hint:   "close the QPs that use it first"}
	}
	c.cq, c.wait = nil, nil // refuse new polls and waits meanwhile
	c.mu.Unlock()
	if cq == nil {
		return nil
	}
	if w != nil {
		w.Close()
	}
	c.waiting.Lock()
	defer c.waiting.Unlock()
	if err := cq.Destroy(); err != nil {
		oe := &OpError{Op: "ibv_destroy_cq", Device: c.dev.Info.Name, Err: err, Hint: "close the QPs that use it first"}
		if !cq.KeptOnFailedDestroy() {
			// libsiw unmapped the ring before the kernel refused: the
			// CQ stays closed here, as any use of it would fault, and
			// does not hold its device open (closing the device frees
			// its kernel object).
			c.dev.cqs.Add(-1)
			oe.Hint = "the provider released the CQ's queue before the kernel refused; the CQ cannot be used again"
			return oe
		}
		c.mu.Lock()
		c.cq = cq // still in use: the CQ stays, and its next wait registers anew
		c.mu.Unlock()
		return oe
	}
	c.dev.cqs.Add(-1)
	return nil
}
