//go:build integration

package main

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/examples/internal/interop"
	"github.com/rdmago/rdmago/verbs"
)

const pings = 20

// wantData is what C rping's client sends (and, after the round trip,
// prints) for ping n of a size-byte buffer.
func wantData(n, size int) string {
	buf := make([]byte, size)
	fill(buf, n, byte(65+n%58))
	return string(cstring(buf))
}

func checkPings(t *testing.T, out, prefix string, size int) {
	t.Helper()
	lines := interop.Lines(out, prefix)
	require.Len(t, lines, pings, "output:\n%s", out)
	for n, l := range lines {
		assert.Equal(t, prefix+wantData(n, size), l)
	}
}

type mode struct {
	name string
	args []string
}

// modes are the QP modes to test on a device: manual only where it exists.
func modes(device string) []mode {
	m := []mode{{"CM", nil}}
	if device == "rxe0" {
		m = append(m, mode{"manual", []string{"-q"}})
	}
	return m
}

func TestGoClientCServer(t *testing.T) {
	for _, dev := range interop.Devices {
		for _, m := range modes(dev) {
			t.Run(dev+"/"+m.name, func(t *testing.T) {
				ctx := interop.Begin(t)
				addr := interop.Addr(t, dev)
				a, p := addr.Addr().String(), fmt.Sprint(addr.Port())
				srv := interop.Start(t, ctx, append([]string{"rping", "-s", "-v", "-a", a, "-p", p, "-S", "100"}, m.args...)...)
				srv.WaitListening(t, ctx, addr)
				var out bytes.Buffer
				err := run(ctx, append([]string{"-c", "-v", "-V", "-a", a, "-p", p, "-C", fmt.Sprint(pings), "-S", "100"}, m.args...), &out)
				if err != nil {
					t.Fatalf("client: %v\nC rping server:\n%s", err, srv.Stop())
				}
				checkPings(t, out.String(), "ping data: ", 100)
				sout, serr := srv.Wait()
				require.NoError(t, serr, "C rping server:\n%s", sout)
				checkPings(t, sout, "server ping data: ", 100)
			})
		}
	}
}

func TestCClientGoServer(t *testing.T) {
	for _, dev := range interop.Devices {
		for _, m := range modes(dev) {
			t.Run(dev+"/"+m.name, func(t *testing.T) {
				ctx := interop.Begin(t)
				addr := interop.Addr(t, dev)
				a, p := addr.Addr().String(), fmt.Sprint(addr.Port())
				var out bytes.Buffer
				srv := interop.Go(func() error {
					return run(ctx, append([]string{"-s", "-v", "-a", a, "-p", p, "-S", "100"}, m.args...), &out)
				})
				srv.WaitListening(t, ctx, addr)
				// C rping -V compares each echo with what it sent.
				cli := interop.Start(t, ctx, append([]string{"rping", "-c", "-v", "-V", "-a", a, "-p", p, "-C", fmt.Sprint(pings), "-S", "100"}, m.args...)...)
				cout, cerr := cli.Wait()
				require.NoError(t, cerr, "C rping client:\n%s", cout)
				checkPings(t, cout, "ping data: ", 100)
				require.NoError(t, srv.Wait())
				checkPings(t, out.String(), "server ping data: ", 100)
			})
		}
	}
}

func TestGoClientGoServer(t *testing.T) {
	for _, dev := range interop.Devices {
		for _, m := range modes(dev) {
			t.Run(dev+"/"+m.name, func(t *testing.T) {
				ctx := interop.Begin(t)
				addr := interop.Addr(t, dev)
				a, p := addr.Addr().String(), fmt.Sprint(addr.Port())
				srv := interop.Go(func() error { return run(ctx, append([]string{"-s", "-a", a, "-p", p}, m.args...), &bytes.Buffer{}) })
				srv.WaitListening(t, ctx, addr)
				var out bytes.Buffer
				err := run(ctx, append([]string{"-c", "-v", "-V", "-a", a, "-p", p, "-C", fmt.Sprint(pings)}, m.args...), &out)
				require.NoError(t, srv.Wait(), "server")
				require.NoError(t, err, "client")
				checkPings(t, out.String(), "ping data: ", 64)
			})
		}
	}
}

// iWARP has no manual mode: -q is refused at once, on both sides, where C
// rping's client would hang.
func TestManualRefusedOnIWARP(t *testing.T) {
	ctx := interop.Begin(t)
	addr := interop.Addr(t, "siw0")
	a, p := addr.Addr().String(), fmt.Sprint(addr.Port())

	err := run(ctx, []string{"-s", "-q", "-a", a, "-p", p}, &bytes.Buffer{})
	require.ErrorIs(t, err, verbs.ErrIWARPManual)
	assert.Contains(t, err.Error(), "siw0")

	srv := interop.Start(t, ctx, "rping", "-s", "-a", a, "-p", p)
	srv.WaitListening(t, ctx, addr)
	start := time.Now()
	err = run(ctx, []string{"-c", "-q", "-a", a, "-p", p, "-C", "1"}, &bytes.Buffer{})
	require.ErrorIs(t, err, verbs.ErrIWARPManual)
	assert.Less(t, time.Since(start), 5*time.Second)
	t.Logf("refused with: %v", err)
}

func TestBadArguments(t *testing.T) {
	interop.BadArguments(t, run, map[string]string{
		"-c":                        "needs the server's address",
		"-s -c -a 10.0.0.1":         "say -s (server) or -c (client)",
		"-c -a 10.0.0.1 -S 10":      "invalid size 10",
		"-c -a 10.0.0.1 -C -1":      "invalid count",
		"-c -a 10.0.0.1 -p 70000":   "invalid port",
		"-c -a 10.0.0.1 -I nowhere": "source address",
	})
}
