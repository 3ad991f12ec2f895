//go:build integration

package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/examples/internal/interop"
)

// conns stays under siw's limit of about 35 connection ends per process.
const conns = 16

var rowRE = regexp.MustCompile(`^([a-z ]+?)\s*:\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$`)

// table parses cmtime's table (ours or C's) into step -> total ms.
func table(t *testing.T, out string) map[string]float64 {
	t.Helper()
	rows := map[string]float64{}
	for _, l := range strings.Split(out, "\n") {
		if m := rowRE.FindStringSubmatch(l); m != nil {
			v, err := strconv.ParseFloat(m[2], 64)
			require.NoError(t, err)
			rows[m[1]] = v
		}
	}
	return rows
}

func checkTable(t *testing.T, out string, steps ...string) {
	t.Helper()
	rows := table(t, out)
	for _, s := range steps {
		v, ok := rows[s]
		if assert.True(t, ok, "no %q row in:\n%s", s, out) {
			assert.Greater(t, v, 0.0, "step %q took no time:\n%s", s, out)
		}
	}
	assert.NotContains(t, out, "failed")
}

// cmSteps are the C tool's rows, which ours match.
var cmSteps = []string{"create id", "resolve addr", "resolve route", "create qp", "connect", "disconnect", "destroy"}

func TestGoClientCServer(t *testing.T) {
	for _, dev := range interop.Devices {
		t.Run(dev, func(t *testing.T) {
			ctx := interop.Begin(t)
			addr := interop.Addr(t, dev)
			a, p := addr.Addr().String(), fmt.Sprint(addr.Port())
			srv := interop.Start(t, ctx, "cmtime", "-b", a, "-p", p)
			srv.WaitListening(t, ctx, addr)
			var out bytes.Buffer
			require.NoError(t, run(ctx, []string{"-s", a, "-p", p, "-c", fmt.Sprint(conns)}, &out), out.String())
			checkTable(t, out.String(), cmSteps...)
			t.Logf("Go client, C server on %s:\n%s", dev, out.String())
		})
	}
}

func TestCClientGoServer(t *testing.T) {
	for _, dev := range interop.Devices {
		t.Run(dev, func(t *testing.T) {
			ctx := interop.Begin(t)
			addr := interop.Addr(t, dev)
			a, p := addr.Addr().String(), fmt.Sprint(addr.Port())
			sctx, stop := context.WithCancel(ctx)
			srv := interop.Go(func() error { return run(sctx, []string{"-b", a, "-p", p}, &bytes.Buffer{}) })
			srv.WaitListening(t, ctx, addr)
			cli := interop.Start(t, ctx, "cmtime", "-s", a, "-p", p, "-c", fmt.Sprint(conns))
			out, err := cli.Wait()
			require.NoError(t, err, out)
			checkTable(t, out, cmSteps...)
			stop()
			require.NoError(t, srv.Wait())
		})
	}
}

// In manual mode the QP transitions are ours, and timed.
func TestManualGoClientGoServer(t *testing.T) {
	ctx := interop.Begin(t)
	addr := interop.Addr(t, "rxe0")
	a, p := addr.Addr().String(), fmt.Sprint(addr.Port())
	sctx, stop := context.WithCancel(ctx)
	srv := interop.Go(func() error { return run(sctx, []string{"-b", a, "-p", p}, &bytes.Buffer{}) })
	srv.WaitListening(t, ctx, addr)
	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"-s", a, "-p", p, "-c", fmt.Sprint(conns), "-q"}, &out), out.String())
	checkTable(t, out.String(), append(cmSteps, "init qp", "rtr qp", "rts qp", "establish")...)
	stop()
	require.NoError(t, srv.Wait())
}

// With no server, every connection fails, the table still prints, and the
// error says why.
func TestNoServer(t *testing.T) {
	ctx := interop.Begin(t)
	addr := interop.Addr(t, "rxe0")
	var out bytes.Buffer
	err := run(ctx, []string{"-s", addr.Addr().String(), "-p", fmt.Sprint(addr.Port()), "-c", "4"}, &out)
	require.Error(t, err)
	assert.Contains(t, out.String(), "4 of 4 connections failed")
	assert.Contains(t, err.Error(), "rejected")
}

func TestBadArguments(t *testing.T) {
	interop.BadArguments(t, run, map[string]string{
		"-s 10.0.0.1 -c 0":       "invalid number of connections",
		"-s 10.0.0.1 -p 0":       "invalid port",
		"-s 10.0.0.1 -t 0":       "invalid timeout",
		"-s 10.0.0.1 -b nowhere": "bind address",
	})
}
