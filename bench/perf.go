package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A Go CPU profile sees only Go's own process, and inside a cgo call only
// that the call took long. Where the C tool and ours spend the guest's
// CPUs apart (the kernel's rdma_cm and rxe/siw work, librdmacm, libibverbs,
// the provider, other processes, idle time) is what perf's system-wide
// sampling shows, for both tools alike.

// cpuTime is where a profiled run's CPU time went, in ms (samples at
// 999 Hz, each about 1 ms of one CPU's time).
type cpuTime struct {
	name                           string
	toolKernel, toolUser, server   float64 // the tool's threads; the C server's (cmtime)
	kernelThreads, idle, elsewhere float64
}

// systemProfile runs f while `perf record` samples every CPU of the guest,
// then writes perf's summaries to profiles/perf-<name>.txt under title and
// keeps the split of CPU time for the report. Threads of the command tool
// count as the tool's, except those in serverTIDs (a C server's, which f
// fills in while the server runs; nil if there is none). make bench
// installs perf (linux-perf).
func (b *bench) systemProfile(ctx context.Context, name, title, tool string, serverTIDs map[string]bool, f func() error) error {
	// The samples go to the guest's memory: writing them into the work
	// tree over 9p would take CPU from the run they record.
	data := filepath.Join(os.TempDir(), "rdmago-perf-"+name+".data")
	defer os.Remove(data)
	// cpu-clock: the emulated CPU has no hardware counters. -g: call
	// chains, which the summaries fold away but `perf report -i` can show.
	rec := exec.CommandContext(ctx, "perf", "record", "-q", "-a", "-g", "-F", strconv.Itoa(perfHz), "-e", "cpu-clock", "-o", data)
	var recOut strings.Builder
	rec.Stdout, rec.Stderr = &recOut, &recOut
	if err := rec.Start(); err != nil {
		return fmt.Errorf("perf record (install linux-perf; make bench does): %w", err)
	}
	// perf writes its header once it samples: wait for it, or samples of
	// the run's start would be lost.
	for i := 0; ; i++ {
		if st, err := os.Stat(data); err == nil && st.Size() > 0 {
			break
		}
		if i == 100 {
			rec.Process.Kill()
			rec.Wait()
			return fmt.Errorf("perf record did not start in 10 s:\n%s", recOut.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	ferr := f()
	rec.Process.Signal(os.Interrupt)
	if err := rec.Wait(); err != nil && !interrupted(err) {
		return fmt.Errorf("perf record: %w\n%s", err, recOut.String())
	}
	if ferr != nil {
		return ferr
	}
	var txt strings.Builder
	fmt.Fprintf(&txt, "%s\n\nRows are threads (tid:command), with the number of samples (about 1 ms of a CPU each).\n", title)
	if serverTIDs != nil {
		fmt.Fprintf(&txt, "The C server's threads: %s; the other %s threads are the client's.\n", strings.Join(slices.Sorted(maps.Keys(serverTIDs)), ", "), tool)
	}
	for _, v := range []struct{ what, sort string }{
		{"Samples by thread and object (swapper is an idle CPU)", "pid,dso"},
		{"Samples by thread and function, the top ones", "pid,sym"},
	} {
		out, err := exec.CommandContext(ctx, "perf", "report", "-q", "-n", "-i", data, "--no-children", "-g", "none",
			"--sort", v.sort, "--percent-limit", "0.5").CombinedOutput()
		if err != nil {
			return fmt.Errorf("perf report: %w\n%s", err, out)
		}
		lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
		fmt.Fprintf(&txt, "\n## %s\n\n%s\n", v.what, strings.Join(lines[:min(len(lines), 40)], "\n"))
	}
	out, err := exec.CommandContext(ctx, "perf", "report", "-q", "-n", "-i", data, "--no-children", "-g", "none",
		"--sort", "pid,dso").CombinedOutput()
	if err != nil {
		return fmt.Errorf("perf report: %w\n%s", err, out)
	}
	t, err := splitCPUTime(string(out), tool, serverTIDs)
	if err != nil {
		return fmt.Errorf("perf report of %s: %w", name, err)
	}
	t.name = name
	b.systemProfiled = append(b.systemProfiled, t)
	return os.WriteFile(filepath.Join(b.profiles, "perf-"+name+".txt"), []byte(txt.String()), 0o644)
}

// A line of `perf report -q -n --sort pid,dso`: share, samples, tid:command, object.
var perfRow = regexp.MustCompile(`^\s*[0-9.]+%\s+([0-9]+)\s+([0-9]+):(\S+)\s+(\S+)`)

// splitCPUTime sorts the samples of a report by pid,dso into cpuTime's
// parts: the tool's threads (in the kernel or in user space), the server's,
// kernel threads, idle CPUs and everything else (perf itself, other
// processes).
func splitCPUTime(report, tool string, serverTIDs map[string]bool) (cpuTime, error) {
	var t cpuTime
	rows := 0
	for _, l := range strings.Split(report, "\n") {
		m := perfRow.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		rows++
		n, _ := strconv.ParseFloat(m[1], 64)
		ms := n * 1000 / perfHz
		tid, comm, dso := m[2], m[3], m[4]
		switch {
		case serverTIDs[tid]:
			t.server += ms
		case comm == tool && dso == "[kernel.kallsyms]":
			t.toolKernel += ms
		case comm == tool:
			t.toolUser += ms
		case comm == "swapper":
			t.idle += ms
		case dso == "[kernel.kallsyms]" && (strings.HasPrefix(comm, "kworker/") || strings.HasPrefix(comm, "ksoftirqd/") ||
			strings.HasPrefix(comm, "rcu_") || strings.HasPrefix(comm, "migration/") || strings.HasPrefix(comm, "kthreadd")):
			t.kernelThreads += ms
		default:
			t.elsewhere += ms
		}
	}
	if rows == 0 {
		return t, fmt.Errorf("no samples in:\n%s", report)
	}
	return t, nil
}

const perfHz = 999

// interrupted tells whether perf ended by the interrupt that stops it.
func interrupted(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && (ws.Signaled() && ws.Signal() == syscall.SIGINT || ws.Exited() && ws.ExitStatus() == 130)
}
