//go:build integration

package main

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/examples/internal/interop"
	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

func TestDemoOnEachDevice(t *testing.T) {
	ctx := interop.Begin(t)
	top := testbed.Require(t)
	var addrs []string
	for _, d := range interop.Devices {
		addrs = append(addrs, top.MustDevice(t, d).IPv4)
	}
	var out bytes.Buffer
	require.NoError(t, run(ctx, append([]string{"-n", "200", "-bw-n", "100"}, addrs...), &out))
	s := out.String()
	t.Log("\n" + s)
	for _, d := range interop.Devices {
		assert.Contains(t, s, "on "+d+" port 1")
	}
	assert.Equal(t, 2, strings.Count(s, "64 B "), s)
	assert.Equal(t, 2, strings.Count(s, "4 KiB "), s)
	assert.Equal(t, 2, strings.Count(s, "MB/s"), s)
}

// The two ends as separate roles, with the client's results as JSON.
func TestListenConnectJSON(t *testing.T) {
	ctx := interop.Begin(t)
	addr := interop.Addr(t, "siw0")
	srv := interop.Go(func() error { return run(ctx, []string{"-listen", addr.String()}, &bytes.Buffer{}) })
	srv.WaitListening(t, ctx, addr)
	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"-connect", addr.String(), "-json", "-sizes", "8,1000", "-n", "100", "-bw-n", "50", "-bw-size", "4096"}, &out))
	require.NoError(t, srv.Wait())
	var r results
	require.NoError(t, json.Unmarshal(out.Bytes(), &r))
	assert.Equal(t, "siw0", r.Device)
	require.Len(t, r.Latency, 2)
	assert.Equal(t, []int{8, 1000}, []int{r.Latency[0].Size, r.Latency[1].Size})
	for _, l := range r.Latency {
		assert.Greater(t, l.P50us, 0.0)
		assert.LessOrEqual(t, l.P50us, l.P99us)
	}
	assert.Greater(t, r.MBps, 0.0)
	assert.Equal(t, 4096, r.BWSize)
}

// Event mode (-event) on both ends, as the cost model measures it: every
// wait sleeps on the completion channel, and the counters per round trip
// come with the figures.
func TestEventMode(t *testing.T) {
	for _, dev := range interop.Devices {
		t.Run(dev, func(t *testing.T) {
			ctx := interop.Begin(t)
			addr := interop.Addr(t, dev)
			srv := interop.Go(func() error { return run(ctx, []string{"-listen", addr.String(), "-event"}, &bytes.Buffer{}) })
			srv.WaitListening(t, ctx, addr)
			var out bytes.Buffer
			require.NoError(t, run(ctx, []string{"-connect", addr.String(), "-event", "-json", "-sizes", "64,4096", "-n", "200", "-bw-n", "200"}, &out))
			require.NoError(t, srv.Wait())
			var r results
			require.NoError(t, json.Unmarshal(out.Bytes(), &r))
			require.Len(t, r.Latency, 2)
			for _, l := range r.Latency {
				assert.Greater(t, l.P50us, 0.0)
				// A round trip posts a send and a receive and waits for the
				// echo, all from Go on rxe's and siw's queues (package
				// verbs): nothing enters C.
				assert.Zero(t, l.CgoCalls, "cgo calls per round trip")
			}
			assert.Greater(t, r.MBps, 0.0)
		})
	}
}

// On iWARP the dialing side must send first: a server message that reaches
// the client with the MPA reply fails its connect on siw. So the server
// sends nothing until the client's hello, and answers it with its window.
func TestServerWaitsForTheClientToSpeakFirst(t *testing.T) {
	ctx := interop.Begin(t)
	addr := interop.Addr(t, "siw0")
	srv := interop.Go(func() error { return run(ctx, []string{"-listen", addr.String()}, &bytes.Buffer{}) })
	srv.WaitListening(t, ctx, addr)

	var recv *receives
	var d rdmacm.Dialer
	d.Cap = capacity()
	d.BeforeConnect = func(s rdmacm.Setup) error {
		var err error
		recv, err = postReceives(s)
		return err
	}
	conn, err := d.Dial(ctx, addr.String())
	require.NoError(t, err)
	defer conn.Close()
	send, err := conn.RegisterMemory(maxMsg, verbs.AccessLocalWrite)
	require.NoError(t, err)

	wc := make([]verbs.WorkCompletion, 1)
	for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		n, err := conn.RecvCQ().Poll(wc)
		require.NoError(t, err)
		require.Zero(t, n, "the server sent before the client's first message")
	}

	p := poller{conn: conn}
	require.NoError(t, p.send(ctx, send, 0, 1))
	got, err := p.next(ctx, conn.RecvCQ())
	require.NoError(t, err)
	window, err := rdmacm.ParseRemoteBuffer(recv.slot(got))
	require.NoError(t, err, "the answer to the hello is the server's window")
	assert.EqualValues(t, maxMsg, window.Len)

	require.NoError(t, p.send(ctx, send, 0, 0)) // goodbye, echoed
	_, err = p.next(ctx, conn.RecvCQ())
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	require.NoError(t, srv.Wait())
}

func TestNothingListening(t *testing.T) {
	ctx := interop.Begin(t)
	addr := interop.Addr(t, "rxe0")
	err := run(ctx, []string{"-connect", netip.AddrPortFrom(addr.Addr(), addr.Port()).String()}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "rejected")
}

func TestBadArguments(t *testing.T) {
	interop.BadArguments(t, run, map[string]string{
		"":                                "give addresses",
		"-listen 10.0.0.1:1 10.0.0.2":     "give addresses",
		"-connect 10.0.0.1:1 -n 0":        "iterations must be positive",
		"-connect 10.0.0.1:1 -sizes 0":    "message size",
		"-connect 10.0.0.1:1 -bw-size -1": "-bw-size",
	})
}
