//go:build integration

package rdmacm_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
)

// silentHost is an address on d's subnet that resolves and answers
// nothing (testbed.SilentHost), with a port.
func silentHost(t *testing.T, d device) string {
	ip := testbed.SilentHost(t, testbed.Require(t).MustDevice(t, d.name), 77)
	return fmt.Sprintf("%s:%d", ip, port())
}

// A dial to a host that answers nothing returns as soon as its context
// ends, with the context's error: on iWARP the kernel's rdma_connect
// blocks while it connects the TCP stream (siw_connect), for as long as
// TCP retries its SYNs, and the dial must not wait for it. Everything the
// attempt held is released once that call returns on its own.
func TestDialSilentHostHonoursContext(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		addr := silentHost(t, d)
		released := releasedLater(t)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		dl := &rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{ConnectTimeout: time.Minute}}
		_, err := dl.Dial(ctx, addr)
		took := time.Since(start)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		t.Logf("after %v: %v", took.Round(time.Millisecond), err)
		assert.Less(t, took, 2*time.Second, "the dial returns when its context ends")
		var oe *rdmacm.OpError
		require.ErrorAs(t, err, &oe)
		assert.Equal(t, "connect", oe.Op)
		released()
	})
}

// ConnectTimeout bounds the same wait.
func TestDialSilentHostConnectTimeout(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		addr := silentHost(t, d)
		released := releasedLater(t)
		start := time.Now()
		dl := &rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{ConnectTimeout: 500 * time.Millisecond}}
		_, err := dl.Dial(ctxFor(t, time.Minute), addr)
		took := time.Since(start)
		require.ErrorIs(t, err, rdmacm.ErrTimeout)
		t.Logf("after %v: %v", took.Round(time.Millisecond), err)
		assert.Less(t, took, 3*time.Second, "the dial gives up after ConnectTimeout")
		released()
	})
}

// releasedLater counts the goroutines now; the function it returns makes
// the end of the test wait until no more remain (up to 30 s), so that the
// leak check counts after the background release of an abandoned connect
// (the kernel gives up on the SYNs within a few seconds).
func releasedLater(t *testing.T) func() {
	before := len(testbed.Goroutines())
	return func() {
		t.Cleanup(func() {
			for start := time.Now(); time.Since(start) < 30*time.Second; time.Sleep(100 * time.Millisecond) {
				if len(testbed.Goroutines()) <= before {
					return
				}
			}
		})
	}
}
