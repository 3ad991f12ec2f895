//go:build linux

package fdwait

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// eventfdWaiter is a Waiter on an eventfd, which stands in for a library's
// descriptor (readable when non-zero): read takes its count, post adds one.
func eventfdWaiter(t *testing.T) (w *Waiter, read func() bool, post func()) {
	t.Helper()
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	w, err = New(fd, "eventfd")
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() }) // a second Close is harmless
	var b [8]byte                   // outside the closure: a read allocates nothing
	read = func() bool {
		n, err := unix.Read(fd, b[:])
		return err == nil && n == 8
	}
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	post = func() { unix.Write(fd, one) }
	return w, read, post
}

// A wait ends when the descriptor is ready, when its context ends, or with Close.
func TestWaiter(t *testing.T) {
	w, read, post := eventfdWaiter(t)
	go func() { time.Sleep(50 * time.Millisecond); post() }()
	require.NoError(t, w.Wait(context.Background(), read))

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	assert.ErrorIs(t, w.Wait(ctx, read), context.DeadlineExceeded)
	assert.Less(t, time.Since(start), time.Second)

	// A wait after a cancelled one blocks until the descriptor is ready.
	go func() { time.Sleep(100 * time.Millisecond); post() }()
	start = time.Now()
	require.NoError(t, w.Wait(context.Background(), read))
	assert.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)

	// Close ends a wait in progress.
	done := make(chan error)
	go func() { done <- w.Wait(context.Background(), read) }()
	require.Eventually(t, w.Busy, 2*time.Second, time.Millisecond, "the wait is in progress before Close")
	require.NoError(t, w.Close())
	select {
	case err := <-done:
		assert.True(t, errors.Is(err, ErrClosed), "%v", err)
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not end the wait")
	}
}

// A loop waiting with one context keeps one watch of it: waits allocate
// nothing, a context that ends still interrupts the wait, and the waits
// after it, with another context or none, block until the descriptor is
// ready again.
func TestWaiterKeepsWatch(t *testing.T) {
	w, read, post := eventfdWaiter(t)

	ctx, cancel := context.WithCancel(context.Background())
	post()
	require.NoError(t, w.Wait(ctx, read)) // sets the watch up
	allocs := testing.AllocsPerRun(100, func() {
		post()
		if err := w.Wait(ctx, read); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs, "allocations per wait with the same context")

	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	assert.ErrorIs(t, w.Wait(ctx, read), context.Canceled)
	assert.ErrorIs(t, w.Wait(ctx, read), context.Canceled, "the ended context, again")

	for _, c := range []context.Context{context.Background(), t.Context()} {
		go func() { time.Sleep(100 * time.Millisecond); post() }()
		start := time.Now()
		require.NoError(t, w.Wait(c, read))
		assert.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond, "the ended context's deadline is gone")
	}
}

// taggedContext is a context whose type holds a slice: its values cannot
// be compared with ==, which panics at run time on such interface values.
type taggedContext struct {
	context.Context
	tags []string
}

// Any context works, also one that cannot be compared: the kept watch is
// known by its context's Done channel.
func TestWaiterTakesContextsThatDoNotCompare(t *testing.T) {
	w, read, post := eventfdWaiter(t)
	parent, cancel := context.WithCancel(context.Background())
	for i := range 3 {
		post()
		require.NoError(t, w.Wait(taggedContext{parent, []string{"wait", string(rune('a' + i))}}, read))
	}
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	assert.ErrorIs(t, w.Wait(taggedContext{parent, nil}, read), context.Canceled, "the kept watch still interrupts")
}

// Two goroutines waiting at once take turns: the second one's context,
// ending, neither wakes the first with a spurious error (both would move
// the descriptor's one read deadline) nor leaves it woken for good; the
// first still ends when the descriptor is ready.
func TestWaitsTakeTurns(t *testing.T) {
	w, read, post := eventfdWaiter(t)
	first := make(chan error, 1)
	go func() { first <- w.Wait(context.Background(), read) }()
	require.Eventually(t, w.Busy, 2*time.Second, time.Millisecond, "the first wait is in progress")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, w.Wait(ctx, read), context.DeadlineExceeded, "the second wait ends with its context")
	select {
	case err := <-first:
		t.Fatalf("the first wait ended with the second's context: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	post()
	select {
	case err := <-first:
		assert.NoError(t, err)
	case <-time.After(2 * time.Second):
		t.Fatal("the first wait did not end when the descriptor became ready")
	}

	// A wait queued behind another ends with Close.
	go func() { first <- w.Wait(context.Background(), read) }()
	require.Eventually(t, w.Busy, 2*time.Second, time.Millisecond)
	second := make(chan error, 1)
	go func() { second <- w.Wait(context.Background(), read) }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, w.Close())
	for _, c := range []chan error{first, second} {
		select {
		case err := <-c:
			assert.ErrorIs(t, err, ErrClosed)
		case <-time.After(2 * time.Second):
			t.Fatal("Close did not end the waits")
		}
	}
}
