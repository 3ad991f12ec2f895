package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// The counters that need no clock, Go's and C's, next to each figure:
// system calls and context switches of the client process (perf stat,
// following all its threads), and, for Go, cgo crossings and heap
// allocations, which our tools count themselves (examples/internal/profile).
// C makes no cgo crossings, and its mallocs are not counted.

// counts is one client run's counters, per operation.
type counts struct {
	syscalls, switches float64
	cgo, allocs        float64 // Go only; -1 where not known
}

// perfStatEvents: tracepoints and software events, which an emulated CPU
// without hardware counters has.
const perfStatEvents = "raw_syscalls:sys_enter,context-switches"

// counted runs f once, not timed, with every client command it starts
// (b.clientWrap) under perf stat, and returns the last client's counts
// divided by ops. perftest's clients may be started more than once while
// their server comes up; only the last, the run that connected, counts.
func (b *bench) counted(ops int, f func() error) (counts, error) {
	out := filepath.Join(os.TempDir(), "rdmago-bench-perfstat.csv")
	defer os.Remove(out)
	b.clientWrap = []string{"perf", "stat", "-x,", "-o", out, "-e", perfStatEvents, "--"}
	defer func() { b.clientWrap = nil }()
	if err := f(); err != nil {
		return counts{}, err
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return counts{}, fmt.Errorf("perf stat wrote nothing (install linux-perf; make bench does): %w", err)
	}
	c, err := parsePerfStat(string(data))
	if err != nil {
		return counts{}, err
	}
	n := float64(max(ops, 1))
	return counts{syscalls: c["raw_syscalls:sys_enter"] / n, switches: c["context-switches"] / n, cgo: -1, allocs: -1}, nil
}

// parsePerfStat reads perf stat's CSV (-x,): value,unit,event,...
func parsePerfStat(out string) (map[string]float64, error) {
	m := map[string]float64{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Split(l, ",")
		if len(f) < 3 || strings.HasPrefix(l, "#") {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("perf stat counted no %s: %q", f[2], f[0])
		}
		m[f[2]] = v
	}
	for _, e := range strings.Split(perfStatEvents, ",") {
		if _, ok := m[e]; !ok {
			return nil, fmt.Errorf("perf stat printed no %s:\n%s", e, out)
		}
	}
	return m, nil
}

// wrap puts the client command under b.clientWrap, when counting.
func (b *bench) wrap(argv []string) []string {
	if len(b.clientWrap) == 0 {
		return argv
	}
	return append(append([]string{}, b.clientWrap...), argv...)
}

var cmtimeCounters = regexp.MustCompile(`per connection ([0-9.]+) cgo calls and ([0-9.]+) allocations`)

// counterRows prints the table of counters that follows a section's
// figures.
type counterRow struct {
	figure string
	c, g   counts
}

func (b *bench) counterTable(per string, rows []counterRow) {
	if len(rows) == 0 {
		return
	}
	b.printf("Counters %s, from one more run of each client (not timed): system calls and context switches of the client\n", per)
	b.printf("process (perf stat, all threads, the whole run including its setup, divided by the operations); Go's cgo crossings\n")
	b.printf("and heap allocations counted by the tool itself, over the measured operations only.\n\n")
	b.printf("| figure | syscalls C | syscalls Go | switches C | switches Go | cgo calls Go | allocs Go |\n|---|---:|---:|---:|---:|---:|---:|\n")
	known := func(v float64) string {
		if v < 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f", v)
	}
	for _, r := range rows {
		b.printf("| %s | %.2f | %.2f | %.2f | %.2f | %s | %s |\n", r.figure, r.c.syscalls, r.g.syscalls, r.c.switches, r.g.switches,
			known(r.g.cgo), known(r.g.allocs))
	}
	b.printf("\n")
}

// countedPair counts C's client and then Go's, each over ops operations;
// goCounts fills in Go's own counters from its output.
func (b *bench) countedPair(ops int, c, g func() error) (counts, counts, error) {
	cc, err := b.counted(ops, c)
	if err != nil {
		return cc, counts{}, fmt.Errorf("counting C's client: %w", err)
	}
	gc, err := b.counted(ops, g)
	if err != nil {
		return cc, gc, fmt.Errorf("counting Go's client: %w", err)
	}
	return cc, gc, nil
}
