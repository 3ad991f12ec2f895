package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/rdmacm/msg"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		kind string
	}{
		{nil, ""},
		{fmt.Errorf("echo: %w", errCorrupt), kindCorruption},
		{&msg.OpError{Op: "receive", Err: context.DeadlineExceeded}, kindHang},
		{&net.OpError{Op: "read", Net: "rdma", Err: os.ErrDeadlineExceeded}, kindHang},
		{&msg.OpError{Op: "receive", Err: &msg.ProtocolError{What: "garbage"}}, kindProtocol},
		{&msg.OpError{Op: "send", Err: errors.Join(msg.ErrPeerUnresponsive, rdmacm.ErrEnded)}, "peer unresponsive"},
		{&msg.OpError{Op: "send", Err: errors.Join(msg.ErrTransport, rdmacm.ErrEnded)}, "transport"},
		{&msg.OpError{Op: "dial", Err: errors.Join(msg.ErrHandshake, rdmacm.ErrRejected)}, "handshake"},
		{&rdmacm.OpError{Op: "connect", Kind: rdmacm.ErrRejected, Err: errors.New("status 8")}, "rejected"},
		{fmt.Errorf("dial: %w", errors.Join(rdmacm.ErrBacklogFull, rdmacm.ErrRejected)), "backlog full"},
		{&rdmacm.OpError{Op: "connect", Kind: rdmacm.ErrUnreachable}, "unreachable"},
		{&rdmacm.OpError{Op: "resolve route", Kind: rdmacm.ErrRouteResolution}, "resolution"},
		{&rdmacm.OpError{Op: "connect", Kind: rdmacm.ErrTimeout}, "cm timeout"},
		{&rdmacm.OpError{Op: "connect", Kind: rdmacm.ErrConnect}, "connect"},
		{&msg.OpError{Op: "receive", Err: errors.Join(rdmacm.ErrEnded, rdmacm.ErrDisconnected)}, "ended"},
		{&rdmacm.OpError{Op: "disconnect", Kind: rdmacm.ErrDisconnected}, "disconnected"},
		{io.ErrUnexpectedEOF, "eof"},
		{msg.ErrClosed, "closed"},
		{context.Canceled, "canceled"},
		{errors.New("something else"), "other"},
	} {
		assert.Equal(t, tc.kind, classify(tc.err), "%v", tc.err)
	}
}

func TestPattern(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 100, 16384} {
		b := make([]byte, n)
		fill(b, 42)
		assert.True(t, check(b, 42), "%d bytes", n)
		if n > 0 {
			assert.False(t, check(b, 43), "%d bytes, another seed", n)
			b[n-1] ^= 1
			assert.False(t, check(b, 42), "%d bytes, last one flipped", n)
		}
	}
}

func TestStats(t *testing.T) {
	s := newStats("siw0", "siw", "10.30.0.1")
	assert.Equal(t, "rejected", s.fail("dial msg", &rdmacm.OpError{Kind: rdmacm.ErrRejected, Err: errors.New("refused")}, true))
	s.fail("dial msg", &rdmacm.OpError{Kind: rdmacm.ErrRejected, Err: errors.New("refused again")}, false)
	s.add(func(d *deviceStats) { d.Dials += 2; d.DialErrors += 2 })
	d := s.snapshot()
	k := errKey{"dial msg", "rejected"}
	assert.Equal(t, int64(2), d.Errors[k])
	assert.Equal(t, int64(1), d.Unexplained[k], "only the error while the server was alive")
	assert.Contains(t, d.Samples[k], "refused", "the first error is kept")
	assert.NotContains(t, d.Samples[k], "again")
	s.fail("msg", errCorrupt, false)
	assert.Zero(t, d.Errors[errKey{"msg", kindCorruption}], "a snapshot is a copy")
}

func sampleReport() *report {
	rxe := newStats("rxe0", "rxe", "10.10.0.1")
	rxe.add(func(d *deviceStats) {
		d.Dials, d.DialErrors, d.Closes, d.Requests, d.OneWay, d.StreamRounds = 10, 2, 8, 100, 1000, 50
		d.Bytes, d.Servers, d.Kills, d.SlowestNotice = 5e6, 3, 1, 350*time.Millisecond
	})
	rxe.fail("dial msg", &rdmacm.OpError{Kind: rdmacm.ErrRejected, Err: errors.New("no `listener`")}, true)
	rxe.fail("msg", errors.Join(rdmacm.ErrEnded, rdmacm.ErrDisconnected), true)
	siw := newStats("siw0", "siw", "10.30.0.1")
	siw.add(func(d *deviceStats) { d.Dials, d.Requests = 4, 20 })
	return &report{
		Start:    time.Date(2026, 11, 25, 14, 0, 0, 0, time.UTC),
		Duration: 3*time.Minute + 400*time.Millisecond,
		Kernel:   "6.1.0-56-amd64",
		Settings: "2 server processes per device",
		Devices:  []deviceStats{rxe.snapshot(), siw.snapshot()},
	}
}

func TestReportPasses(t *testing.T) {
	r := sampleReport()
	assert.Empty(t, r.failures())
	md := r.markdown()
	for _, want := range []string{
		"# Soak", "- Date: 2026-11-25 14:00 UTC", "- Duration: 3m0s", "6.1.0-56-amd64", "**ok**",
		"| rxe0 (rxe, 10.10.0.1) | 10 | 2 | 8 | 100 | 1000 | 50 | 5.0 MB | 3 | 1 | 350ms |",
		"| siw0 (siw, 10.30.0.1) | 4 | 0 |",
		"| where | kind | rxe0 | rxe0, server alive | siw0 | siw0, server alive |",
		"| dial msg | rejected | 1 | 0 | 0 | 0 |",
		"| msg | ended | 1 | 0 | 0 | 0 |",
		"- rxe0, dial msg, rejected: `rdmacm: : connection rejected: no 'listener'`",
		"- rxe0, msg, ended: `connection ended disconnected`",
		"- Coordinator: none", "- Servers: none",
	} {
		assert.Contains(t, md, want)
	}
	// Rows sorted by where, then kind.
	assert.Less(t, strings.Index(md, "| dial msg | rejected"), strings.Index(md, "| msg | ended"))
	line := r.summary()
	assert.NotContains(t, line, "\n")
	assert.True(t, strings.HasPrefix(line, "soak 3m0s: rxe0 10 dials 100 requests 1000 one-way 50 stream rounds 5.0 MB 1 kills;"), line)
	assert.Contains(t, line, "1184 operations, 2 errors, 1 kills: ok")
}

func TestReportFails(t *testing.T) {
	r := sampleReport()
	r.Devices[1].Errors[errKey{"stream", kindHang}] = 1
	r.Devices[0].Errors[errKey{"msg", kindCorruption}] = 2
	r.Leaks = []string{"goroutines 12, 10 before"}
	r.ServerLeaks = []string{"siw0 server 3: file descriptors 9, 8 before"}
	f := r.failures()
	require.Len(t, f, 4)
	assert.Equal(t, []string{"rxe0: 2 corruption (msg)", "siw0: 1 hang (stream)",
		"goroutines 12, 10 before", "siw0 server 3: file descriptors 9, 8 before"}, f)
	assert.Contains(t, r.markdown(), "**FAIL**: rxe0: 2 corruption (msg)")
	assert.Contains(t, r.markdown(), "- Coordinator: goroutines 12, 10 before")
	assert.Contains(t, r.summary(), ": FAIL (rxe0: 2 corruption (msg); siw0: 1 hang (stream);")
}

func TestParse(t *testing.T) {
	c, err := parse(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 3*time.Minute, c.duration)
	assert.NotZero(t, c.seed)
	_, err = parse([]string{"-serve-msg", "10.10.0.1:1"}, io.Discard)
	assert.Error(t, err)
	_, err = parse([]string{"-servers", "0"}, io.Discard)
	assert.Error(t, err)
	c, err = parse([]string{"-serve-msg", "a:1", "-serve-stream", "a:2", "-seed", "7"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, uint64(7), c.seed)
}
