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
	return &Waiter{file: file, raw: raw}, nil
}

// Wait calls try whenever the descriptor may be readable until it returns
// true (try does the library's non-blocking read and reports whether it got
// something). It returns ctx's error when ctx ends first, and ErrClosed once
// Close was called. One goroutine at a time may wait.
func (w *Waiter) Wait(ctx context.Context, try func() bool) error {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		w.file.SetReadDeadline(time.Unix(1, 0)) // wakes the poller wait
		close(fired)
	})
	defer func() {
		if !stop() {
			// The context ended, maybe just as try succeeded: remove the
			// past deadline before anyone waits again.
			<-fired
			w.file.SetReadDeadline(time.Time{})
		}
	}()
	err := w.raw.Read(func(uintptr) bool { return try() })
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
	return w.file.Close()
}
