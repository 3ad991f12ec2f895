//go:build integration

package verbs_test

import (
	"context"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

func ip(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %v: %s", args, out)
}

// nextEvent waits for an event of the given type, skipping others.
func nextEvent(t *testing.T, events <-chan verbs.AsyncEvent, want verbs.EventType) verbs.AsyncEvent {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-events:
			require.True(t, ok, "event channel closed while waiting for %v", want)
			if ev.Type == want {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %v event within 10 s", want)
		}
	}
}

func TestAsyncEventsOnRXE(t *testing.T) {
	rxe := testbed.Require(t).MustDevice(t, "rxe0")
	checkNoLeaks(t) // the event reader's goroutine and descriptors too
	dev, err := verbs.Open(rxe.Name)
	require.NoError(t, err)
	defer func() { require.NoError(t, dev.Close()) }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := dev.Events(ctx)
	require.NoError(t, err)
	_, err = dev.Events(ctx)
	assert.ErrorContains(t, err, "already has an event reader")

	// The port follows its netdev.
	ip(t, "link", "set", rxe.Netdev, "down")
	t.Cleanup(func() { exec.Command("ip", "link", "set", rxe.Netdev, "up").Run() })
	ev := nextEvent(t, events, verbs.EventPortErr)
	assert.Equal(t, 1, ev.Port)
	assert.Equal(t, "rxe0 port 1: PORT_ERR", ev.String())
	ip(t, "link", "set", rxe.Netdev, "up")
	nextEvent(t, events, verbs.EventPortActive)

	// A new address adds a GID entry: indices move, so cached ones go stale.
	ip(t, "addr", "add", "10.10.0.77/24", "dev", rxe.Netdev)
	t.Cleanup(func() { exec.Command("ip", "addr", "del", "10.10.0.77/24", "dev", rxe.Netdev).Run() })
	assert.Equal(t, 1, nextEvent(t, events, verbs.EventGIDChange).Port)

	// Cancelling ends the reader and closes the channel; no goroutine stays.
	before := runtime.NumGoroutine()
	cancel()
	for range events {
	}
	// (Polled by hand: assert.Eventually runs goroutines of its own.)
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() >= before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.Less(t, runtime.NumGoroutine(), before, "the event reader goroutine has ended")
	again, err := dev.Events(context.Background())
	require.NoError(t, err, "a new reader may start once the old one ended")
	require.NoError(t, dev.Close())
	_, open := <-again
	assert.False(t, open, "Close ends the reader")

	// Wait for the port to be ACTIVE again before other tests use it.
	require.Eventually(t, func() bool {
		d, err := verbs.Open(rxe.Name)
		if err != nil {
			return false
		}
		defer d.Close()
		p, err := d.QueryPort(1)
		return err == nil && p.State == verbs.PortActive
	}, 10*time.Second, 100*time.Millisecond)
}
