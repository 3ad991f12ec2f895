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
	// perf starts with its events off (-D -1) and turns them on when told
	// over its control pipe, answering once they are on: the file's header
	// appears seconds before sampling starts under emulation, and a run as
	// short as siw's cmtime would be lost.
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer ctlR.Close()
	defer ctlW.Close()
	ackR, ackW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer ackR.Close()
	defer ackW.Close()
	rec := exec.CommandContext(ctx, "perf", "record", "-q", "-a", "-g", "-F", strconv.Itoa(perfHz), "-e", "cpu-clock",
		"-D", "-1", "--control", "fd:3,4", "-o", data)
	rec.ExtraFiles = []*os.File{ctlR, ackW} // fds 3 and 4
	var recOut strings.Builder
	rec.Stdout, rec.Stderr = &recOut, &recOut
	if err := rec.Start(); err != nil {
		return fmt.Errorf("perf record (install linux-perf; make bench does): %w", err)
	}
	ctlR.Close()
	ackW.Close()
	if err := perfEnable(ctlW, ackR); err != nil {
		rec.Process.Kill()
		rec.Wait()
		return fmt.Errorf("perf record: %w\n%s", err, recOut.String())
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
	// One report by thread and object serves both the text (its top
	// rows) and the split of the CPU time (all rows).
	byObject, err := perfReport(ctx, data, "pid,dso")
	if err != nil {
		return err
	}
	bySymbol, err := perfReport(ctx, data, "pid,sym")
	if err != nil {
		return err
	}
	for _, v := range []struct{ what, report string }{
		{"Samples by thread and object (swapper is an idle CPU)", byObject},
		{"Samples by thread and function, the top ones", bySymbol},
	} {
		lines := strings.Split(strings.TrimRight(v.report, "\n"), "\n")
		fmt.Fprintf(&txt, "\n## %s\n\n%s\n", v.what, strings.Join(lines[:min(len(lines), 40)], "\n"))
	}
	t, err := splitCPUTime(byObject, tool, serverTIDs)
	if err != nil {
		return fmt.Errorf("perf report of %s: %w", name, err)
	}
	t.name = name
	b.systemProfiled = append(b.systemProfiled, t)
	return os.WriteFile(filepath.Join(b.profiles, "perf-"+name+".txt"), []byte(txt.String()), 0o644)
}

// perfReport is perf's report of data sorted by keys, with sample counts,
// rows in descending order.
func perfReport(ctx context.Context, data, keys string) (string, error) {
	out, err := exec.CommandContext(ctx, "perf", "report", "-q", "-n", "-i", data, "--no-children", "-g", "none",
		"--sort", keys).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("perf report: %w\n%s", err, out)
	}
	return string(out), nil
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

// perfEnable turns perf's events on and waits, up to 30 s, for its answer.
func perfEnable(ctl, ack *os.File) error {
	if _, err := ctl.WriteString("enable\n"); err != nil {
		return fmt.Errorf("enabling the events: %w", err)
	}
	ack.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 16)
	n, err := ack.Read(buf)
	if err != nil {
		return fmt.Errorf("no answer to enabling the events: %w", err)
	}
	if got := strings.TrimRight(string(buf[:n]), "\x00\n"); got != "ack" {
		return fmt.Errorf("perf answered %q to enabling the events", got)
	}
	return nil
}

// interrupted tells whether perf ended by the interrupt that stops it.
func interrupted(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && (ws.Signaled() && ws.Signal() == syscall.SIGINT || ws.Exited() && ws.ExitStatus() == 130)
}
