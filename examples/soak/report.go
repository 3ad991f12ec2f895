package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/rdmacm/msg"
)

// errCorrupt: bytes that came back were not the ones sent, or the server
// saw bytes that were not the ones sent, or a message went missing.
var errCorrupt = errors.New("data corruption")

// Error kinds that fail the soak whenever they occur.
const (
	kindCorruption = "corruption"
	kindHang       = "hang"
	kindProtocol   = "protocol"
)

// fatalKinds fail the run: data corruption, an operation that outlived its
// timeout, a peer seen to break the message protocol.
var fatalKinds = map[string]bool{kindCorruption: true, kindHang: true, kindProtocol: true}

// classify names an error's kind, from the packages' sentinels: the most
// specific first. A context deadline or a net.Conn deadline is the soak's
// own per-operation timeout firing: a hang.
func classify(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, errCorrupt):
		return kindCorruption
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return kindHang
	case errors.Is(err, msg.ErrProtocol):
		return kindProtocol
	case errors.Is(err, msg.ErrPeerUnresponsive):
		return "peer unresponsive"
	case errors.Is(err, msg.ErrTransport):
		return "transport"
	case errors.Is(err, msg.ErrHandshake):
		return "handshake"
	case errors.Is(err, rdmacm.ErrBacklogFull):
		return "backlog full"
	case errors.Is(err, rdmacm.ErrRejected):
		return "rejected"
	case errors.Is(err, rdmacm.ErrUnreachable):
		return "unreachable"
	case errors.Is(err, rdmacm.ErrAddrResolution), errors.Is(err, rdmacm.ErrRouteResolution):
		return "resolution"
	case errors.Is(err, rdmacm.ErrTimeout):
		return "cm timeout"
	case errors.Is(err, rdmacm.ErrConnect):
		return "connect"
	case errors.Is(err, rdmacm.ErrEnded):
		return "ended"
	case errors.Is(err, rdmacm.ErrDisconnected):
		return "disconnected"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case errors.Is(err, net.ErrClosed):
		return "closed"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "other"
}

// errKey is where an error happened (dial, msg, stream) and its kind.
type errKey struct{ phase, kind string }

// deviceStats are one device's figures.
type deviceStats struct {
	Device string
	Kind   string // rxe or siw
	Addr   string

	Dials, DialErrors int64
	Closes            int64 // connections that ended by the client's choice
	Requests          int64 // msg request/response round trips verified
	OneWay            int64 // msg one-way messages (bursts), counted by the server
	StreamRounds      int64 // stream write/read-back rounds verified
	Bytes             int64 // payload bytes sent and verified back, both transports
	Kills             int64
	Servers           int64 // server processes started
	// SlowestNotice is the longest a connection took to fail once its
	// server was killed.
	SlowestNotice time.Duration

	// Errors by where and kind; Unexplained counts those whose server had
	// not been killed when the error was seen.
	Errors      map[errKey]int64
	Unexplained map[errKey]int64
	Samples     map[errKey]string // the first error of each
}

// stats guards a device's figures for its workers.
type stats struct {
	mu sync.Mutex
	d  deviceStats
}

func newStats(dev, kind, addr string) *stats {
	return &stats{d: deviceStats{Device: dev, Kind: kind, Addr: addr,
		Errors: map[errKey]int64{}, Unexplained: map[errKey]int64{}, Samples: map[errKey]string{}}}
}

func (s *stats) add(f func(d *deviceStats)) {
	s.mu.Lock()
	f(&s.d)
	s.mu.Unlock()
}

// fail counts err, seen in phase; killed says whether the server of the
// connection (or of the dial) had been killed by then.
func (s *stats) fail(phase string, err error, killed bool) string {
	k := errKey{phase, classify(err)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.d.Errors[k]++
	if !killed {
		s.d.Unexplained[k]++
	}
	if _, ok := s.d.Samples[k]; !ok {
		s.d.Samples[k] = err.Error()
	}
	return k.kind
}

func (s *stats) snapshot() deviceStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.d
	d.Errors, d.Unexplained, d.Samples = clone(d.Errors), clone(d.Unexplained), clone(d.Samples)
	return d
}

func clone[V any](m map[errKey]V) map[errKey]V {
	c := make(map[errKey]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// report is what a run found.
type report struct {
	Start    time.Time
	Duration time.Duration
	Kernel   string
	Settings string
	Devices  []deviceStats
	// Leaks of the coordinator and of the servers stopped at the end; an
	// empty list is none.
	Leaks       []string
	ServerLeaks []string
}

// failures lists why the run fails: fatal error kinds, leaks.
func (r *report) failures() []string {
	var f []string
	for _, d := range r.Devices {
		for k, n := range d.Errors {
			if fatalKinds[k.kind] && n > 0 {
				f = append(f, fmt.Sprintf("%s: %d %s (%s)", d.Device, n, k.kind, k.phase))
			}
		}
	}
	sort.Strings(f)
	f = append(f, r.Leaks...)
	return append(f, r.ServerLeaks...)
}

func (r *report) totals() (ops, errs, kills int64) {
	for _, d := range r.Devices {
		ops += d.Dials + d.Requests + d.OneWay + d.StreamRounds
		kills += d.Kills
		for _, n := range d.Errors {
			errs += n
		}
	}
	return ops, errs, kills
}

// summary is the one line for standard output.
func (r *report) summary() string {
	ops, errs, kills := r.totals()
	var b strings.Builder
	fmt.Fprintf(&b, "soak %v:", r.Duration.Round(time.Second))
	for _, d := range r.Devices {
		fmt.Fprintf(&b, " %s %d dials %d requests %d one-way %d stream rounds %s %d kills;",
			d.Device, d.Dials, d.Requests, d.OneWay, d.StreamRounds, mb(d.Bytes), d.Kills)
	}
	fmt.Fprintf(&b, " %d operations, %d errors, %d kills", ops, errs, kills)
	if f := r.failures(); len(f) > 0 {
		fmt.Fprintf(&b, ": FAIL (%s)", strings.Join(f, "; "))
	} else {
		b.WriteString(": ok (no corruption, no hang, no leak)")
	}
	return b.String()
}

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

// markdown is the report for bench/soak.md.
func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Soak\n\n")
	fmt.Fprintf(&b, "`examples/soak`, run by `make bench` in a fresh test bed guest: %v of mixed traffic over "+
		"`rdmacm/msg` and `rdmacm/stream` on each device, connections opened and closed continually, "+
		"server processes killed (SIGKILL) at random and started again.\n\n", r.Duration.Round(time.Second))
	fmt.Fprintf(&b, "- Date: %s\n", r.Start.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "- Duration: %v\n", r.Duration.Round(time.Second))
	if r.Kernel != "" {
		fmt.Fprintf(&b, "- Guest kernel: %s\n", r.Kernel)
	}
	if r.Settings != "" {
		fmt.Fprintf(&b, "- Settings: %s\n", r.Settings)
	}
	f := r.failures()
	if len(f) == 0 {
		fmt.Fprintf(&b, "- Verdict: **ok**: no corruption, no hang, no leak\n")
	} else {
		fmt.Fprintf(&b, "- Verdict: **FAIL**: %s\n", strings.Join(f, "; "))
	}

	fmt.Fprintf(&b, "\n## Operations\n\n")
	fmt.Fprintf(&b, "| device | dials | failed dials | closes | requests | one-way messages | stream rounds | bytes | servers started | kills | slowest failure after a kill |\n")
	fmt.Fprintf(&b, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, d := range r.Devices {
		fmt.Fprintf(&b, "| %s (%s, %s) | %d | %d | %d | %d | %d | %d | %s | %d | %d | %v |\n", d.Device, d.Kind, d.Addr,
			d.Dials, d.DialErrors, d.Closes, d.Requests, d.OneWay, d.StreamRounds, mb(d.Bytes), d.Servers, d.Kills,
			d.SlowestNotice.Round(time.Millisecond))
	}

	fmt.Fprintf(&b, "\n## Errors by kind\n\n")
	fmt.Fprintf(&b, "Each failed dial or connection counts once, by its first error. \"Server alive\" counts the errors "+
		"seen while the connection's server had not been killed (expected: none). Corruption, hangs (an "+
		"operation past its timeout) and protocol errors fail the soak.\n\n")
	keys := map[errKey]bool{}
	for _, d := range r.Devices {
		for k := range d.Errors {
			keys[k] = true
		}
	}
	if len(keys) == 0 {
		fmt.Fprintf(&b, "None.\n")
	} else {
		sorted := make([]errKey, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Slice(sorted, func(i, j int) bool {
			if sorted[i].phase != sorted[j].phase {
				return sorted[i].phase < sorted[j].phase
			}
			return sorted[i].kind < sorted[j].kind
		})
		b.WriteString("| where | kind |")
		sep := "|---|---|"
		for _, d := range r.Devices {
			fmt.Fprintf(&b, " %s | %s, server alive |", d.Device, d.Device)
			sep += "--:|--:|"
		}
		b.WriteString("\n" + sep + "\n")
		for _, k := range sorted {
			fmt.Fprintf(&b, "| %s | %s |", k.phase, k.kind)
			for _, d := range r.Devices {
				fmt.Fprintf(&b, " %d | %d |", d.Errors[k], d.Unexplained[k])
			}
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "\nThe first error of each:\n\n")
		for _, d := range r.Devices {
			for _, k := range sorted {
				if s, ok := d.Samples[k]; ok {
					fmt.Fprintf(&b, "- %s, %s, %s: `%s`\n", d.Device, k.phase, k.kind, strings.NewReplacer("`", "'", "\n", " ").Replace(s))
				}
			}
		}
	}

	fmt.Fprintf(&b, "\n## Leaks\n\n")
	fmt.Fprintf(&b, "After closing everything and stopping the servers: the coordinator's RDMA objects (cm_ids, QPs, "+
		"CQs, MRs, PDs, as `rdma resource show` lists them) against a snapshot taken once librdmacm had opened "+
		"the devices, its file descriptors and its goroutines; and the same for the last server of each device, "+
		"stopped gracefully.\n\n")
	leakLine(&b, "Coordinator", r.Leaks)
	leakLine(&b, "Servers", r.ServerLeaks)
	return b.String()
}

func leakLine(b *strings.Builder, who string, leaks []string) {
	if len(leaks) == 0 {
		fmt.Fprintf(b, "- %s: none\n", who)
		return
	}
	fmt.Fprintf(b, "- %s: %s\n", who, strings.Join(leaks, "; "))
}
