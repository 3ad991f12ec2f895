package verbs

import (
	"context"
	"fmt"
	"sync"
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

	yield yielder // Poll yields through it
}

// Device is the device the CQ was created on.
func (c *CQ) Device() *Device { return c.dev }

// CreateCQ creates a completion queue of at least entries entries.
func (d *Device) CreateCQ(entries int) (*CQ, error) {
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
	return &CQ{dev: d, cq: cq}, nil
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
// two polls, so a completion that lands just before arming is not missed.
func (c *CQ) PollWait(ctx context.Context, wcs []WorkCompletion) (int, error) {
	for {
		if n, err := c.Poll(wcs); n > 0 || err != nil {
			return n, err
		}
		if err := c.arm(); err != nil {
			return 0, err
		}
		if n, err := c.Poll(wcs); n > 0 || err != nil {
			return n, err // the armed event fires later and costs one spurious wake
		}
		if err := c.waitEvent(ctx); err != nil {
			return 0, err
		}
	}
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
	return nil
}

// waiter registers the channel with the poller on the first wait: a CQ
// that is only ever busy-polled costs no duplicate descriptor.
func (c *CQ) waiter() (*fdwait.Waiter, *ibv.CQ, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cq == nil {
		return nil, nil, &OpError{Op: "wait for completions", Device: c.dev.Info.Name, Err: syscall.EBADF, Hint: "the CQ is closed"}
	}
	if c.wait == nil {
		w, err := fdwait.New(c.cq.ChannelFD(), "completion channel")
		if err != nil {
			return nil, nil, &OpError{Op: "wait for completions", Device: c.dev.Info.Name, Err: err}
		}
		c.wait = w
	}
	return c.wait, c.cq, nil
}

func (c *CQ) waitEvent(ctx context.Context) error {
	c.waiting.RLock()
	defer c.waiting.RUnlock()
	w, cq, err := c.waiter()
	if err != nil {
		return err
	}
	var got bool
	err = w.Wait(ctx, func() bool {
		got = cq.GetEvent() // false: none queued, wait in the poller
		return got
	})
	if got {
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
