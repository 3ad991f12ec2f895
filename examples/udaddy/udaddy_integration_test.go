//go:build integration

package main

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/examples/internal/interop"
)

// UD exists on RoCE only: these run on rxe. C udaddy has no port option:
// every test that runs it uses 7174.

func cPort(t *testing.T) netip.AddrPort {
	return netip.AddrPortFrom(interop.Addr(t, "rxe0").Addr(), 7174)
}

func TestGoClientCServer(t *testing.T) {
	ctx := interop.Begin(t)
	addr := cPort(t)
	a, p := addr.Addr().String(), fmt.Sprint(addr.Port())
	srv := interop.Start(t, ctx, "udaddy", "-b", a, "-C", "20", "-S", "512")
	srv.WaitListening(t, ctx, addr)
	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"-s", a, "-port", p, "-C", "20", "-S", "512"}, &out), out.String())
	assert.Contains(t, out.String(), "data transfers complete")
	sout, err := srv.Wait()
	require.NoError(t, err, sout)
	assert.Contains(t, sout, "data transfers complete")
	assert.Contains(t, sout, "return status 0")
}

func TestCClientGoServer(t *testing.T) {
	ctx := interop.Begin(t)
	addr := cPort(t)
	a, p := addr.Addr().String(), fmt.Sprint(addr.Port())
	var sout bytes.Buffer
	srv := interop.Go(func() error {
		return run(ctx, []string{"-b", a, "-port", p, "-P", "udp", "-C", "20", "-S", "512"}, &sout)
	})
	srv.WaitListening(t, ctx, addr)
	cli := interop.Start(t, ctx, "udaddy", "-s", a, "-C", "20", "-S", "512")
	out, err := cli.Wait()
	require.NoError(t, err, out)
	assert.Contains(t, out, "data transfers complete")
	assert.Contains(t, out, "return status 0")
	require.NoError(t, srv.Wait())
	assert.Contains(t, sout.String(), "data transfers complete")
}

func TestGoClientGoServerManyConnections(t *testing.T) {
	ctx := interop.Begin(t)
	addr := interop.Addr(t, "rxe0")
	a, p := addr.Addr().String(), fmt.Sprint(addr.Port())
	srv := interop.Go(func() error { return run(ctx, []string{"-b", a, "-port", p, "-c", "4"}, &bytes.Buffer{}) })
	srv.WaitListening(t, ctx, addr)
	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"-s", a, "-port", p, "-c", "4"}, &out))
	require.NoError(t, srv.Wait())
	assert.Contains(t, out.String(), "data transfers complete")
}

// A datagram larger than the path MTU is refused before it is sent.
func TestSizeAboveMTURefused(t *testing.T) {
	ctx := interop.Begin(t)
	addr := cPort(t)
	a, p := addr.Addr().String(), fmt.Sprint(addr.Port())
	srv := interop.Start(t, ctx, "udaddy", "-b", a)
	srv.WaitListening(t, ctx, addr)
	err := run(ctx, []string{"-s", a, "-port", p, "-S", "8192"}, &bytes.Buffer{})
	require.Error(t, err)
	// Refused before a datagram goes out: at the QP's set-up, from the
	// port's active MTU, as C udaddy checks it.
	assert.Contains(t, err.Error(), "message size 8192 is larger than the active MTU 1024")
}

// iWARP has no UD: the refusal says so.
func TestRefusedOnIWARP(t *testing.T) {
	ctx := interop.Begin(t)
	addr := interop.Addr(t, "siw0")
	err := run(ctx, []string{"-b", addr.Addr().String(), "-port", fmt.Sprint(addr.Port())}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "iWARP devices have no UD")
}

func TestBadArguments(t *testing.T) {
	interop.BadArguments(t, run, map[string]string{
		"-s 10.0.0.1 -c 0":       "invalid number of connections",
		"-s 10.0.0.1 -C 0":       "invalid message count",
		"-s 10.0.0.1 -S 0":       "invalid message size",
		"-s 10.0.0.1 -b nowhere": "bind address",
		"-s 10.0.0.1 -p 0x2":     "only UDP",
		"-s 10.0.0.1 -P ipoib":   "only udp",
	})
}
