//go:build integration

package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

// These tests go around rdmago's own private data checks to show what the
// kernel does at each limit of privdata.go and one byte past it: the
// evidence for the table, and why the checks run before anything is sent.
// A kernel that changes a limit fails them.
//
// On InfiniBand and RoCE (rxe) the IB CM refuses one byte more with
// EINVAL: a reject is then still pending, but a failed accept has the
// kernel reject the request without data. On iWARP (siw) nothing refuses
// it: the frame goes out with a wrapped length and the connection fails
// at the other end, the data lost.

var kernelPort = 20000 + os.Getpid()%1000*10

type kernelCase struct {
	dev string
	cm  cmKind
	ps  PortSpace
}

var kernelCases = []kernelCase{{"rxe0", cmIB, PortSpaceTCP}, {"rxe0", cmIB, PortSpaceUDP}, {"siw0", cmIWARP, PortSpaceTCP}}

func forEachKernelCase(t *testing.T, f func(t *testing.T, k kernelCase)) {
	for _, k := range kernelCases {
		t.Run(fmt.Sprintf("%s/%v", k.dev, k.ps), func(t *testing.T) { f(t, k) })
	}
}

func (k kernelCase) addr(t *testing.T) string {
	kernelPort++
	return fmt.Sprintf("%s:%d", testbed.Require(t).MustDevice(t, k.dev).IPv4, kernelPort)
}

// config is raw: the kernel sees exactly the bytes given.
func (k kernelCase) config() ConnConfig {
	return ConnConfig{RawPrivateData: true, ConnectTimeout: 5 * time.Second}
}

// qpType is the QP type of the case's port space: Dial or DialUD, Listen
// or ListenUD.
func (k kernelCase) qpType() verbs.QPType {
	if k.ps == PortSpaceUDP {
		return verbs.QPTypeUD
	}
	return verbs.QPTypeRC
}

// listen listens at addr, RC or UD, until the test ends.
func (k kernelCase) listen(t *testing.T, addr string) *listener {
	t.Helper()
	lc := &ListenConfig{ConnConfig: k.config()}
	l, err := lc.listen(context.Background(), k.qpType(), addr)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l
}

// rejectStatus is what a dialer's reject says on this transport.
func (k kernelCase) rejectStatus() int {
	switch {
	case k.cm == cmIWARP:
		return rejectIWARPMPA
	case k.ps == PortSpaceUDP:
		return sidrReject
	}
	return rejectConsumer
}

// pattern is n bytes without a zero, so that padding would show.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = (seed+byte(i)*7)%255 + 1
	}
	return b
}

type dialResult struct {
	c   *conn
	err error
}

// dialing dials addr, RC or UD, in the background until the test ends.
func (k kernelCase) dialing(ctx context.Context, addr string) <-chan dialResult {
	out := make(chan dialResult, 1)
	go func() {
		d := &Dialer{ConnConfig: k.config()}
		c, err := d.dial(ctx, k.qpType(), addr)
		out <- dialResult{c, err}
	}()
	return out
}

func (r dialResult) close() {
	if r.c != nil {
		r.c.Close()
	}
}

// listenRequest listens on a fresh address, dials it and returns the
// request and what the dialer will get.
func (k kernelCase) listenRequest(t *testing.T, ctx context.Context) (*listener, *request, <-chan dialResult) {
	addr := k.addr(t)
	l := k.listen(t, addr)
	dialed := k.dialing(ctx, addr)
	r, err := l.next(ctx)
	require.NoError(t, err)
	return l, r, dialed
}

// requireRejected checks that the dialer was rejected with exactly data,
// or, if data is nil, with none: a raw dialer then sees the IB CM's
// padding, zeros alone, and its error claims no private data.
func (k kernelCase) requireRejected(t *testing.T, res dialResult, data []byte) {
	t.Helper()
	res.close()
	var rej *RejectedError
	require.ErrorAs(t, res.err, &rej)
	assert.Equal(t, k.rejectStatus(), rej.Status)
	if data != nil {
		assert.Equal(t, data, rej.PrivateData)
		return
	}
	assert.True(t, allZero(rej.PrivateData), "%x", rej.PrivateData)
	assert.NotContains(t, res.err.Error(), "private data")
}

// requireConnectError checks that the dialer's connection failed without a
// reject: siw could not read the frame the wrapped length announced.
func requireConnectError(t *testing.T, res dialResult) {
	t.Helper()
	res.close()
	require.ErrorIs(t, res.err, ErrConnect)
	var oe *OpError
	require.ErrorAs(t, res.err, &oe)
	assert.Equal(t, "CONNECT_ERROR", oe.Event)
	assert.Equal(t, -int(syscall.EINVAL), oe.Status)
}

func TestKernelRejectLimit(t *testing.T) {
	forEachKernelCase(t, func(t *testing.T, k kernelCase) {
		testbed.CheckNoLeaks(t) // the error paths release what they made
		testbed.CheckCount(t, "CM ids", OpenIDs)
		ctx := ctxWithin(t, 30*time.Second)
		limit, _ := wireLimit(k.cm, k.ps, msgReject)
		over, at := pattern(limit+1, 3), pattern(limit, 5)

		_, r, dialed := k.listenRequest(t, ctx)
		r.claim()
		defer r.id.Close()
		err := r.id.reject(over)
		if k.cm == cmIB {
			require.ErrorIs(t, err, syscall.EINVAL, "the IB CM refuses %d bytes", limit+1)
			// Nothing was sent: the request is still pending.
			require.NoError(t, r.id.reject(at))
			k.requireRejected(t, <-dialed, at)
			return
		}
		require.NoError(t, err, "siw takes %d bytes", limit+1)
		requireConnectError(t, <-dialed)

		_, r, dialed = k.listenRequest(t, ctx)
		r.claim()
		defer r.id.Close()
		require.NoError(t, r.id.reject(at))
		k.requireRejected(t, <-dialed, at)
	})
}

// kernelAccept is ConnRequest.Accept without its check of the data.
func kernelAccept(ctx context.Context, r *request, data []byte) (*conn, error) {
	r.claim()
	o := r.l.opts
	e := &endpoint{op: "accept", o: &o, id: r.id, local: r.local, remote: r.remote}
	c, err := e.accept(ctx, r, data)
	if err != nil {
		e.abort()
	}
	return c, err
}

func TestKernelAcceptLimit(t *testing.T) {
	forEachKernelCase(t, func(t *testing.T, k kernelCase) {
		testbed.CheckNoLeaks(t) // the error paths release what they made
		testbed.CheckCount(t, "CM ids", OpenIDs)
		ctx := ctxWithin(t, 30*time.Second)
		limit, _ := wireLimit(k.cm, k.ps, msgAccept)
		over, at := pattern(limit+1, 3), pattern(limit, 5)

		_, r, dialed := k.listenRequest(t, ctx)
		c, err := kernelAccept(ctx, r, over)
		if k.cm == cmIB {
			require.ErrorIs(t, err, syscall.EINVAL, "the IB CM refuses %d bytes", limit+1)
			// ... and rdma_accept rejects the request, without data.
			k.requireRejected(t, <-dialed, nil)
		} else {
			require.NoError(t, err, "siw takes %d bytes", limit+1)
			c.Close()
			requireConnectError(t, <-dialed)
		}

		_, r, dialed = k.listenRequest(t, ctx)
		c, err = kernelAccept(ctx, r, at)
		require.NoError(t, err)
		defer c.Close()
		res := <-dialed
		require.NoError(t, res.err)
		defer res.close()
		assert.Equal(t, at, res.c.peerData)
	})
}

func TestKernelConnectLimit(t *testing.T) {
	forEachKernelCase(t, func(t *testing.T, k kernelCase) {
		testbed.CheckNoLeaks(t) // the error paths release what they made
		testbed.CheckCount(t, "CM ids", OpenIDs)
		ctx := ctxWithin(t, 30*time.Second)
		limit, _ := wireLimit(k.cm, k.ps, msgConnect)
		for _, n := range []int{limit + 1, limit} {
			addr := k.addr(t)
			l := k.listen(t, addr)
			data := pattern(n, 7)
			o, err := (&Dialer{ConnConfig: k.config()}).settings(k.qpType())
			require.NoError(t, err)
			c, err := newConnector(addr, &o)
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.ResolveAddr(ctx))
			require.NoError(t, c.ResolveRoute(ctx))
			require.NoError(t, c.CreateQP())
			// Connect's first half, without the check.
			err = c.e.sendConnect(ctx, data)
			if n > limit && k.cm == cmIB {
				require.ErrorIs(t, err, syscall.EINVAL, "the IB CM refuses %d bytes", n)
				requireNoRequest(t, l, 500*time.Millisecond)
				continue
			}
			require.NoError(t, err)
			c.e.connecting = true
			if n > limit {
				// siw sent it; the listener's siw rejects the frame by
				// itself, and the application never sees the request.
				_, err := c.e.answer(ctx)
				var rej *RejectedError
				require.ErrorAs(t, err, &rej)
				assert.Equal(t, rejectIWARPMPA, rej.Status)
				assert.Empty(t, rej.PrivateData)
				requireNoRequest(t, l, 100*time.Millisecond)
				continue
			}
			r, err := l.next(ctx)
			require.NoError(t, err)
			assert.Equal(t, data, r.data, "the request carries exactly what was sent")
			require.NoError(t, r.reject(nil))
			_, err = c.e.answer(ctx)
			assert.ErrorIs(t, err, ErrRejected)
		}
	})
}

// requireNoRequest checks that no request reaches l within d.
func requireNoRequest(t *testing.T, l *listener, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	r, err := l.next(ctx)
	if err == nil {
		r.reject(nil)
		t.Fatalf("a request with %d bytes of private data reached the listener", len(r.data))
	}
	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
}

func ctxWithin(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
