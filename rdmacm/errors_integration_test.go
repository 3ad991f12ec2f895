//go:build integration

package rdmacm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

func TestPrivateDataBothWays(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 20*time.Second)
		connectData := bytes.Repeat([]byte{0xc1}, 52) // 56 on the wire less our header
		acceptData := bytes.Repeat([]byte{0xa2}, 192) // 196 less the header
		l, addr := listen(t, d, nil)
		served := make(chan *rdmacm.Conn, 1)
		go func() {
			defer close(served)
			r, err := l.Request(ctx)
			if !assert.NoError(t, err) {
				return
			}
			assert.Equal(t, connectData, r.PrivateData, "the request carries exactly what was sent")
			assert.Equal(t, d.name, r.Device)
			c, err := r.Accept(ctx, acceptData)
			if assert.NoError(t, err) {
				served <- c
			}
		}()
		c, err := (&rdmacm.Dialer{PrivateData: connectData}).Dial(ctx, addr)
		require.NoError(t, err)
		defer c.Close()
		assert.Equal(t, acceptData, c.PeerPrivateData())
		s := <-served
		require.NotNil(t, s)
		defer s.Close()
		assert.Equal(t, connectData, s.PeerPrivateData())
	})
}

func TestOversizePrivateDataRefusedBeforeTheWire(t *testing.T) {
	checkNoLeaks(t)
	d := rxe(t)
	ctx := ctxFor(t, 20*time.Second)
	_, err := (&rdmacm.Dialer{PrivateData: make([]byte, 53)}).Dial(ctx, d.at(port()))
	require.ErrorIs(t, err, rdmacm.ErrPrivateDataTooLong)
	assert.Contains(t, err.Error(), "at most 52")

	raw := rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{RawPrivateData: true}, PrivateData: make([]byte, 57)}
	_, err = raw.Dial(ctx, d.at(port()))
	require.ErrorIs(t, err, rdmacm.ErrPrivateDataTooLong)
	assert.Contains(t, err.Error(), "at most 56")

	// Accept with too much: refused locally, and the request is still
	// pending, for the application to reject.
	l, addr := listen(t, d, nil)
	go func() {
		r, err := l.Request(ctx)
		if assert.NoError(t, err) {
			_, err = r.Accept(ctx, make([]byte, 193))
			assert.ErrorIs(t, err, rdmacm.ErrPrivateDataTooLong)
			assert.NoError(t, r.Reject(nil))
		}
	}()
	_, err = rdmacm.Dial(ctx, addr)
	assert.ErrorIs(t, err, rdmacm.ErrRejected)
}

func TestRejectWithPrivateData(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 20*time.Second)
		l, addr := listen(t, d, nil)
		reason := []byte("server full, try 10.0.0.9")
		go func() {
			r, err := l.Request(ctx)
			if assert.NoError(t, err) {
				assert.NoError(t, r.Reject(reason))
			}
		}()
		start := time.Now()
		_, err := rdmacm.Dial(ctx, addr)
		require.ErrorIs(t, err, rdmacm.ErrRejected)
		var rej *rdmacm.RejectedError
		require.ErrorAs(t, err, &rej)
		if d.iwarp {
			assert.Equal(t, -int(syscall.ECONNRESET), rej.Status, "siw answers an MPA reject with ECONNRESET")
		} else {
			assert.Equal(t, 28, rej.Status)
		}
		assert.True(t, rej.ConsumerReject())
		assert.Equal(t, reason, rej.PrivateData, "the reject's private data reaches the dialer")
		assert.Less(t, time.Since(start), 2*time.Second)
		assert.Contains(t, err.Error(), addr)
		assert.Contains(t, err.Error(), d.name)
	})
}

func TestDialNoListener(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		start := time.Now()
		_, err := rdmacm.Dial(ctxFor(t, 20*time.Second), d.at(port()))
		require.ErrorIs(t, err, rdmacm.ErrRejected)
		var rej *rdmacm.RejectedError
		require.ErrorAs(t, err, &rej)
		if d.iwarp {
			assert.Equal(t, -int(syscall.ECONNREFUSED), rej.Status)
		} else {
			assert.Equal(t, 8, rej.Status)
			assert.Contains(t, err.Error(), "no listener")
		}
		assert.Less(t, time.Since(start), 2*time.Second, "refused at once, not timed out")
	})
}

// A port that another listener holds is refused at the bind, even with
// ReuseAddr (the kernel never shares a listening port), and the error
// says so.
func TestListenOnAPortInUse(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		for _, reuse := range []bool{false, true} {
			lc := &rdmacm.ListenConfig{ReuseAddr: reuse}
			_, addr := listen(t, d, lc)
			_, err := lc.Listen(context.Background(), addr)
			requireAddrInUse(t, err, "bind", "another rdma_cm id")
		}
	})
}

// A wildcard listen makes siw bind one TCP socket per siw device, in the
// caller's namespace, pinned to the ifindex of the device's netdev: two
// siw devices on netdevs with the same ifindex (in two namespaces) collide,
// and the listen step says why.
func TestWildcardListenOnCollidingSIWDevices(t *testing.T) {
	checkNoLeaks(t)
	const index = "300"
	for _, side := range []string{"a", "b"} {
		ns, dev := "rdmago-clash-"+side, "siwclash"+side
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() {
			for _, args := range [][]string{{"rdma", "link", "delete", dev}, {"ip", "netns", "delete", ns}} {
				if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
					t.Logf("cleaning up: %v: %v: %s", args, err, out)
				}
			}
		})
		run(t, "ip", "-n", ns, "link", "add", "clash", "index", index, "type", "dummy")
		run(t, "ip", "-n", ns, "link", "set", "clash", "up")
		run(t, "ip", "netns", "exec", ns, "rdma", "link", "add", dev, "type", "siw", "netdev", "clash")
	}
	l, err := rdmacm.Listen(fmt.Sprintf("0.0.0.0:%d", port()))
	if err == nil {
		l.Close()
	}
	requireAddrInUse(t, err, "listen", "siw devices whose netdevs have the same ifindex")
}

// requireAddrInUse checks that a Listen failed with EADDRINUSE at step op,
// and that its error explains it with hint.
func requireAddrInUse(t *testing.T, err error, op, hint string) {
	t.Helper()
	require.ErrorIs(t, err, syscall.EADDRINUSE)
	var oe *rdmacm.OpError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, op, oe.Op)
	assert.Contains(t, err.Error(), hint)
}

func TestDialAddressWithoutRDMADevice(t *testing.T) {
	checkNoLeaks(t)
	// A netdev no RDMA device is bound to, and a route through it.
	run(t, "ip", "link", "add", "nordma0", "type", "dummy")
	t.Cleanup(func() { exec.Command("ip", "link", "del", "nordma0").Run() })
	run(t, "ip", "link", "set", "nordma0", "up")
	run(t, "ip", "addr", "add", "10.61.0.1/24", "dev", "nordma0")
	dl := &rdmacm.Dialer{ResolveAddrTimeout: 500 * time.Millisecond}
	start := time.Now()
	_, err := dl.Dial(ctxFor(t, 20*time.Second), "10.61.0.2:7000")
	require.ErrorIs(t, err, rdmacm.ErrAddrResolution)
	t.Log(err)
	assert.Less(t, time.Since(start), 5*time.Second)
	var oe *rdmacm.OpError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "resolve address", oe.Op)

	// A source address on that netdev: no RDMA device there either.
	_, err = (&rdmacm.Dialer{Source: mustAddr("10.61.0.1")}).Dial(ctxFor(t, 20*time.Second), rxe(t).at(port()))
	require.ErrorIs(t, err, rdmacm.ErrAddrResolution)
	assert.ErrorIs(t, err, syscall.ENODEV)
	assert.Contains(t, err.Error(), "not on an RDMA netdev")
}

func TestDialUnroutable(t *testing.T) {
	checkNoLeaks(t)
	start := time.Now()
	_, err := rdmacm.Dial(ctxFor(t, 20*time.Second), "198.51.100.7:7000")
	require.ErrorIs(t, err, rdmacm.ErrAddrResolution)
	assert.ErrorIs(t, err, syscall.ENETUNREACH)
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.Contains(t, err.Error(), "198.51.100.7:7000")
}

// An on-link address nobody answers ARP for: resolution times out after
// ResolveAddrTimeout, and the retries are bounded.
func TestDialSilentNeighbourTimesOut(t *testing.T) {
	checkNoLeaks(t)
	dl := &rdmacm.Dialer{ResolveAddrTimeout: 300 * time.Millisecond, ResolveRetries: 1}
	start := time.Now()
	_, err := dl.Dial(ctxFor(t, 20*time.Second), "10.10.0.77:7000")
	elapsed := time.Since(start)
	require.ErrorIs(t, err, rdmacm.ErrAddrResolution)
	assert.ErrorIs(t, err, syscall.ETIMEDOUT)
	var oe *rdmacm.OpError
	require.ErrorAs(t, err, &oe)
	assert.True(t, oe.Timeout())
	assert.Contains(t, err.Error(), "ADDR_ERROR")
	assert.Less(t, elapsed, 3*time.Second, "two attempts of 300 ms, not more")
}

func TestCancelDuringResolve(t *testing.T) {
	checkNoLeaks(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	_, err := (&rdmacm.Dialer{ResolveAddrTimeout: 10 * time.Second}).Dial(ctx, "10.10.0.77:7000")
	assert.ErrorIs(t, err, context.Canceled)
	assert.Less(t, time.Since(start), time.Second, "returns promptly")
}

// The listener never answers (its request waits in the backlog): the
// dialer's cancel ends the connect step.
func TestCancelDuringConnect(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		_, addr := listen(t, d, nil)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(300*time.Millisecond, cancel)
		start := time.Now()
		dl := &rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{ConnectTimeout: 10 * time.Second}}
		_, err := dl.Dial(ctx, addr)
		assert.ErrorIs(t, err, context.Canceled)
		assert.Less(t, time.Since(start), time.Second)
		var oe *rdmacm.OpError
		require.ErrorAs(t, err, &oe)
		assert.Equal(t, "connect", oe.Op)
	})
}

func TestConnectTimeout(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		_, addr := listen(t, d, nil)
		start := time.Now()
		dl := &rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{ConnectTimeout: 500 * time.Millisecond}}
		_, err := dl.Dial(ctxFor(t, 20*time.Second), addr)
		require.ErrorIs(t, err, rdmacm.ErrTimeout)
		assert.Less(t, time.Since(start), 2*time.Second)
	})
}

func TestCancelDuringAccept(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		l, err := rdmacm.Listen(d.at(port()))
		require.NoError(t, err)
		defer l.Close()
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(200*time.Millisecond, cancel)
		start := time.Now()
		_, err = l.Accept(ctx)
		assert.ErrorIs(t, err, context.Canceled)
		assert.Less(t, time.Since(start), time.Second)

		// Closing the listener wakes an Accept too.
		done := make(chan error, 1)
		go func() {
			_, err := l.Accept(context.Background())
			done <- err
		}()
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, l.Close())
		select {
		case err := <-done:
			assert.ErrorIs(t, err, rdmacm.ErrClosed)
		case <-time.After(2 * time.Second):
			t.Fatal("Close did not wake Accept")
		}
	})
}

// The accepting side waits for the RTU; a dialer that goes away meanwhile
// leaves it with an error, not a hang.
func TestAcceptWhenDialerGivesUp(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		l, addr := listen(t, d, &rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{ConnectTimeout: 3 * time.Second}})
		dialCtx, cancel := context.WithCancel(context.Background())
		dialed := make(chan error, 1)
		go func() {
			dl := &rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{ConnectTimeout: 10 * time.Second}}
			_, err := dl.Dial(dialCtx, addr)
			dialed <- err
		}()
		r, err := l.Request(ctxFor(t, 10*time.Second))
		require.NoError(t, err)
		cancel()
		assert.ErrorIs(t, <-dialed, context.Canceled)
		c, err := r.Accept(ctxFor(t, 10*time.Second), nil)
		if err == nil {
			// iWARP: the dialer's TCP stream may complete the handshake
			// before its close tears the connection down.
			require.True(t, d.iwarp, "RoCE: the request of a dialer that left cannot be accepted")
			defer c.Close()
			select {
			case <-c.Done():
				assert.ErrorIs(t, c.Err(), rdmacm.ErrDisconnected)
			case <-time.After(15 * time.Second):
				t.Fatal("the accepted connection of a dialer that left never ended")
			}
			return
		}
		t.Log(err)
		// That request's failure, not the listener's: found before the
		// accept (the CM dropped the request), or after it (no answer).
		assert.True(t, errors.Is(err, rdmacm.ErrConnect) || errors.Is(err, rdmacm.ErrUnreachable),
			"the request of a dialer that left is that request's failure: %v", err)
	})
}

// A request the listener cannot take for its own settings (a capacity
// above the device's) is not reported as the request's failure: EINVAL
// as from a request the CM dropped, but the listener's fault, which every
// other request would meet too.
func TestAcceptBeyondTheDevicesLimitsIsNotTheRequestsFailure(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		l, addr := listen(t, d, &rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{Cap: verbs.QPCap{MaxSendWR: 1 << 24}}})
		dialed := make(chan error, 1)
		go func() {
			_, err := rdmacm.Dial(ctxFor(t, 10*time.Second), addr)
			dialed <- err
		}()
		r, err := l.Request(ctxFor(t, 10*time.Second))
		require.NoError(t, err)
		_, err = r.Accept(ctxFor(t, 10*time.Second), nil)
		require.Error(t, err)
		t.Log(err)
		assert.NotErrorIs(t, err, rdmacm.ErrConnect)
		assert.ErrorIs(t, err, syscall.EINVAL)
		assert.ErrorContains(t, err, "MaxSendWR")
		assert.ErrorContains(t, err, "Device.Query")
		assert.ErrorIs(t, <-dialed, rdmacm.ErrRejected)
	})
}

func TestDoubleUseOfRequest(t *testing.T) {
	checkNoLeaks(t)
	d := rxe(t)
	l, addr := listen(t, d, nil)
	ctx := ctxFor(t, 10*time.Second)
	go func() {
		r, err := l.Request(ctx)
		if assert.NoError(t, err) {
			assert.NoError(t, r.Reject(nil))
			assert.ErrorIs(t, r.Reject(nil), rdmacm.ErrClosed)
			_, err := r.Accept(ctx, nil)
			assert.ErrorIs(t, err, rdmacm.ErrClosed)
		}
	}()
	_, err := rdmacm.Dial(ctx, addr)
	assert.True(t, errors.Is(err, rdmacm.ErrRejected), "%v", err)
}

func TestFullBacklogAndClosingListenerRefuseWithAReason(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 30*time.Second)
		l, addr := listen(t, d, &rdmacm.ListenConfig{Backlog: 1})
		// Nobody takes requests: the first waits in the backlog, the
		// second finds it full.
		errs := make(chan error, 2)
		for range 2 {
			go func() {
				c, err := rdmacm.Dial(ctx, addr)
				if c != nil {
					c.Close()
				}
				errs <- err
			}()
		}
		start := time.Now()
		err := <-errs
		require.ErrorIs(t, err, rdmacm.ErrBacklogFull)
		assert.ErrorIs(t, err, rdmacm.ErrRejected)
		var rej *rdmacm.RejectedError
		require.ErrorAs(t, err, &rej)
		assert.Equal(t, rdmacm.RefusalBacklogFull, rej.Refusal)
		assert.True(t, rej.ConsumerReject())
		assert.Empty(t, rej.PrivateData, "the refusal is not the application's data")
		for _, want := range []string{"backlog was full", "ListenConfig.Backlog", addr, d.name} {
			assert.Contains(t, err.Error(), want)
		}
		assert.Less(t, time.Since(start), 10*time.Second, "refused at once, not left to time out")

		// Closing the listener refuses the request still waiting, saying so.
		require.NoError(t, l.Close())
		select {
		case err = <-errs:
		case <-ctx.Done():
			t.Fatal("the waiting dialer got no answer when the listener closed")
		}
		require.ErrorIs(t, err, rdmacm.ErrRejected)
		assert.NotErrorIs(t, err, rdmacm.ErrBacklogFull)
		require.ErrorAs(t, err, &rej)
		assert.Equal(t, rdmacm.RefusalListenerClosed, rej.Refusal)
		assert.Contains(t, err.Error(), "listener closed before taking the request")

		// Code written for package net tells a close by net.ErrClosed.
		_, err = l.Accept(ctx)
		assert.ErrorIs(t, err, rdmacm.ErrClosed)
		assert.ErrorIs(t, err, net.ErrClosed)
	})
}
