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
	// waiting is held for reading by a goroutine waiting on the channel,
	// which reads it outside mu; Close takes it for writing, after waking
	// the waiter, before it destroys the channel.
	waiting sync.RWMutex
	// armed: the CQ was armed and the event that arming brings has not
	// been read yet. A wait then needs no new arming: the pending event
	// wakes it, and at most one event is ever queued on the channel.
	armed atomic.Bool
	// tryEvent reads one event for the poller's wait; made once, as a
	// closure per wait would be allocated per wait.
	tryEvent func() bool

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
	ctx, err := d.context()
	if err != nil {
		return nil, err
	}
	cq, op, err := ctx.CreateCQ(entries)
	if err != nil {
		e := &OpError{Op: op, Device: d.Info.Name, Err: noCgo(err)}
		if op == "ibv_create_cq" {
			e.Detail = fmt.Sprintf("%d entries", entries)
		}
		return nil, e
	}
	c := &CQ{dev: d, cq: cq}
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

// Poll moves up to len(wcs) completions into wcs, crossing into C once, and
// returns how many there were (0 when the queue is empty).
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
// use [CQ.PollWait], which polls again after arming. One goroutine at a time
// may wait on a CQ.
func (c *CQ) Wait(ctx context.Context) error {
	if err := c.arm(); err != nil {
		return err
	}
	return c.waitEvent(ctx)
}

// PollWait polls into wcs, and if the CQ is empty waits for completions
// until at least one arrives or ctx ends. It arms the notification between
// two polls, so a completion that lands just before arming is not missed;
// poll, arming and second poll cost one crossing into C.
func (c *CQ) PollWait(ctx context.Context, wcs []WorkCompletion) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	for {
		if n, err := c.pollArm(wcs); n > 0 || err != nil {
			return n, err // an arming's event fires later and costs one spurious wake
		}
		if err := c.waitEvent(ctx); err != nil {
			return 0, err
		}
	}
}

// pollArm polls, and when the CQ is empty and not armed yet, arms it and
// polls again.
func (c *CQ) pollArm(wcs []WorkCompletion) (int, error) {
	c.yield.maybeYield()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cq == nil {
		return 0, &OpError{Op: "ibv_poll_cq", Device: c.dev.Info.Name, Err: syscall.EBADF, Hint: "the CQ is closed"}
	}
	arm := !c.armed.Load()
	n, err := c.cq.PollArm(unsafe.Slice((*ibv.WC)(unsafe.Pointer(&wcs[0])), len(wcs)), arm)
	if err != nil {
		// Declared here: errors.As moves it to the heap, which every
		// wait paid for when it was declared outside.
		var ne *ibv.NotifyError
		if errors.As(err, &ne) {
			return 0, &OpError{Op: "ibv_req_notify_cq", Device: c.dev.Info.Name, Err: ne.Err}
		}
		return 0, &OpError{Op: "ibv_poll_cq", Device: c.dev.Info.Name, Err: err}
	}
	if arm && n == 0 {
		c.armed.Store(true)
	}
	return n, nil
}

func (c *CQ) arm() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cq == nil {
		return &OpError{Op: "ibv_req_notify_cq", Device: c.dev.Info.Name, Err: syscall.EBADF, Hint: "the CQ is closed"}
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

func (c *CQ) waitEvent(ctx context.Context) error {
	c.waiting.RLock()
	defer c.waiting.RUnlock()
	w, err := c.waiter()
	if err != nil {
		return err
	}
	err = w.Wait(ctx, c.tryEvent)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return &OpError{Op: "wait for completion event", Device: c.dev.Info.Name, Err: err}
}

// Close destroys the CQ and its channel; QPs using it must be closed first.
// A goroutine waiting on the CQ is woken first (its wait fails) and has
// left before the channel goes.
func (c *CQ) Close() error {
	c.mu.Lock()
	cq, w := c.cq, c.wait
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
		c.mu.Lock()
		c.cq = cq // still in use: the CQ stays, and its next wait registers anew
		c.mu.Unlock()
		return &OpError{Op: "ibv_destroy_cq", Device: c.dev.Info.Name, Err: err, Hint: "close the QPs that use it first"}
	}
	return nil
}
