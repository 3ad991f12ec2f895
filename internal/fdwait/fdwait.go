// Package fdwait waits for C libraries' file descriptors (a completion
// channel, a device's async fd, an rdma_cm event channel) in Go's runtime
// poller, so that a goroutine waiting on one parks no OS thread, and a
// context can interrupt the wait.
package fdwait

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Waiter waits on one descriptor. The library keeps its descriptor; the
// Waiter registers a duplicate (the poller needs its own, and the library
// closes the original itself).
type Waiter struct {
	file   *os.File
	raw    syscall.RawConn
	closed atomic.Bool

	// A loop that waits again and again with one context (a connection's
	// goroutine) keeps one watch of it instead of setting one up per wait:
	// the watch is what interrupts the poller's wait when the context ends.
	mu    sync.Mutex
	watch *watch // the kept watch, or nil
	busy  bool   // a wait is using the kept watch and read below
	// freed, when made, is closed as the wait holding busy lets go: the
	// waits queued behind it then try again.
	freed chan struct{}
	// read calls try; made once, as a closure handed to the poller per
	// wait would be allocated per wait. Only the wait holding busy uses it.
	read func(uintptr) bool
	try  func() bool
}

// watch interrupts the poller's wait once its context ends, by moving the
// read deadline into the past. It is kept for a context with the same Done
// channel: contexts are not comparable values in general (a context type
// may hold a slice), and two with one Done channel end together.
type watch struct {
	done  <-chan struct{}
	stop  func() bool
	fired chan struct{} // closed once the deadline was moved
}

func (w *Waiter) newWatch(ctx context.Context) *watch {
	wt := &watch{done: ctx.Done(), fired: make(chan struct{})}
	wt.stop = context.AfterFunc(ctx, func() {
		w.file.SetReadDeadline(time.Unix(1, 0)) // wakes the poller wait
		close(wt.fired)
	})
	return wt
}

// end stops the watch; if it fired, the past deadline is removed (after
// the function that set it has returned) so that later waits block again.
func (wt *watch) end(w *Waiter) {
	if !wt.stop() {
		<-wt.fired
		w.file.SetReadDeadline(time.Time{})
	}
}

// acquire readies one wait with ctx: the wait has the kept watch and read
// to itself until releaseKept. Waits take turns: every watch moves the one
// read deadline of the descriptor, so a second wait at once would be woken
// by the first one's context, or have its own end undone by the first's
// clearing. A wait that finds another in progress queues behind it, until
// it ends or ctx does (ctx's error), or the Waiter is closed (ErrClosed).
func (w *Waiter) acquire(ctx context.Context) error {
	for {
		w.mu.Lock()
		if w.closed.Load() {
			w.mu.Unlock()
			return ErrClosed
		}
		if !w.busy {
			break
		}
		if w.freed == nil {
			w.freed = make(chan struct{})
		}
		freed := w.freed
		w.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	defer w.mu.Unlock()
	if w.watch != nil && w.watch.done != ctx.Done() {
		w.watch.end(w)
		w.watch = nil
	}
	if w.watch == nil && ctx.Done() != nil {
		w.watch = w.newWatch(ctx)
	}
	w.busy = true
	return nil
}

// Busy reports whether a wait holds the kept watch: for a descriptor with
// one waiter at a time, whether a wait is in progress (tests use it to
// know that a waiting goroutine got that far).
func (w *Waiter) Busy() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.busy
}

func (w *Waiter) releaseKept() {
	w.mu.Lock()
	w.busy = false
	w.try = nil
	if w.freed != nil {
		close(w.freed)
		w.freed = nil
	}
	w.mu.Unlock()
}

// New makes fd non-blocking (the library's reads then fail with EAGAIN
// instead of blocking) and registers a duplicate with the poller.
func New(fd int, name string) (*Waiter, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("making %s non-blocking: %w", name, err)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicating %s: %w", name, err)
	}
	file := os.NewFile(uintptr(dup), name)
	raw, err := file.SyscallConn()
	if err != nil {
		file.Close()
		return nil, fmt.Errorf("registering %s with the poller: %w", name, err)
	}
	w := &Waiter{file: file, raw: raw}
	w.read = func(uintptr) bool { return w.try() }
	return w, nil
}

// Wait calls try whenever the descriptor may be readable until it returns
// true (try does the library's non-blocking read and reports whether it got
// something). It returns ctx's error when ctx ends first, and ErrClosed once
// Close was called. Waits from several goroutines take turns.
func (w *Waiter) Wait(ctx context.Context, try func() bool) error {
	if err := w.acquire(ctx); err != nil {
		return err
	}
	w.try = try
	err := w.raw.Read(w.read)
	w.releaseKept()
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case w.closed.Load():
		return ErrClosed
	}
	return err
}

// ErrClosed is returned by Wait after Close.
var ErrClosed = errors.New("fdwait: closed")

// Close unregisters and closes the duplicate; a Wait in progress returns ErrClosed.
func (w *Waiter) Close() error {
	w.closed.Store(true)
	w.mu.Lock()
	if w.watch != nil {
		w.watch.stop()
		w.watch = nil
	}
	if w.freed != nil {
		close(w.freed) // the queued waits see closed
		w.freed = nil
	}
	w.mu.Unlock()
	return w.file.Close()
}
