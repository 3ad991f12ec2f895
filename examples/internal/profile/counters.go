package profile

import (
	"bytes"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// Counters are the process's counts that need no clock: exact on any
// machine, so that a benchmark can say per operation how many crossings
// into C and how many heap allocations its figure paid for. Idle is the
// exception: the machine's idle time, which in the test bed's cost model
// (where an idle CPU's clock jumps to its next timer) is time that no
// instruction paid for, so a figure's wait for a timer shows there.
type Counters struct {
	CgoCalls int64
	Allocs   uint64
	Idle     float64 // seconds, summed over CPUs; -1 where /proc/uptime cannot be read
	CPU      float64 // this process's CPU time (all threads, user and kernel), seconds; -1 if unknown
}

// Count reads the counters now. It stops the world (as testing's
// AllocsPerRun does) for an exact count: runtime/metrics counts small
// allocations only as each P's cache is refilled. Call it outside timed
// code.
func Count() Counters {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return Counters{CgoCalls: runtime.NumCgoCall(), Allocs: m.Mallocs, Idle: idleSeconds(), CPU: cpuSeconds()}
}

// idleSeconds is the second field of /proc/uptime.
func idleSeconds() float64 {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return -1
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return -1
	}
	s, err := strconv.ParseFloat(string(f[1]), 64)
	if err != nil {
		return -1
	}
	return s
}

// cpuSeconds is the process's CPU time, from the kernel's exact
// accounting (not the tick-sampled getrusage).
func cpuSeconds() float64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return -1
	}
	return float64(ts.Nano()) / 1e9
}

// PerOp is what happened since c, divided by ops.
type PerOp struct {
	CgoCalls float64 `json:"cgo_calls_per_op"`
	Allocs   float64 `json:"allocs_per_op"`
	IdleUs   float64 `json:"idle_us_per_op,omitempty"` // machine idle time, µs per op
	CPUUs    float64 `json:"cpu_us_per_op,omitempty"`  // this process's CPU time, µs per op
}

// Since returns the counts since c per op (zero ops count as one).
func (c Counters) Since(ops int) PerOp {
	now := Count()
	n := float64(max(ops, 1))
	p := PerOp{CgoCalls: float64(now.CgoCalls-c.CgoCalls) / n, Allocs: float64(now.Allocs-c.Allocs) / n}
	if c.Idle >= 0 && now.Idle >= 0 {
		p.IdleUs = (now.Idle - c.Idle) * 1e6 / n
	}
	if c.CPU >= 0 && now.CPU >= 0 {
		p.CPUUs = (now.CPU - c.CPU) * 1e6 / n
	}
	return p
}
