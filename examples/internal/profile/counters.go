package profile

import (
	"bytes"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Counters are the process's counts that a benchmark divides by its
// operations: cgo crossings and heap allocations (exact on any machine),
// the process's CPU time, and the machine's idle time. In the test bed's
// cost model, where an idle CPU's clock jumps to its next timer, idle time
// is time that no instruction paid for: a figure that waits on a timer
// shows there.
type Counters struct {
	CgoCalls int64
	Allocs   uint64
	Idle     float64 // seconds summed over CPUs, at /proc/uptime's 10 ms; -1 where it cannot be read
	CPU      float64 // this process's CPU time (all threads, user and kernel), seconds; -1 if unknown
}

// Count reads the counters now. It stops the world (as testing's
// AllocsPerRun does) for an exact count: runtime/metrics counts small
// allocations only as each P's cache is refilled. The clocks are read
// without allocating, so that counting adds nothing to the allocations
// counted. Call it outside timed code.
func Count() Counters {
	idle, cpu := idleSeconds(), cpuSeconds()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return Counters{CgoCalls: runtime.NumCgoCall(), Allocs: m.Mallocs, Idle: idle, CPU: cpu}
}

// uptimePath is /proc/uptime as the kernel takes a path: opening it from
// this array, with a raw system call, allocates nothing.
var uptimePath = [...]byte{'/', 'p', 'r', 'o', 'c', '/', 'u', 'p', 't', 'i', 'm', 'e', 0}

// idleSeconds is the second field of /proc/uptime ("12.34 56.78"), read
// into a buffer on the stack and parsed without allocating. The file is
// opened and closed each time: a descriptor kept open would show as a
// leak to the tools' own checks.
func idleSeconds() float64 {
	atCWD := unix.AT_FDCWD
	fd, _, e := unix.Syscall6(unix.SYS_OPENAT, uintptr(atCWD), uintptr(unsafe.Pointer(&uptimePath[0])),
		uintptr(unix.O_RDONLY|unix.O_CLOEXEC), 0, 0, 0)
	if e != 0 {
		return -1
	}
	// A raw read: unix.Read tells the race detector of the buffer, which
	// moves the buffer to the heap in a -race build.
	var buf [128]byte
	r, _, e := unix.Syscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
	unix.Close(int(fd))
	n := int(r)
	if e != 0 || n <= 0 {
		return -1
	}
	b := buf[:n]
	sp := bytes.IndexByte(b, ' ')
	if sp < 0 {
		return -1
	}
	return parseSeconds(bytes.TrimSpace(b[sp+1:]))
}

// parseSeconds parses "123.45" (digits, an optional fraction), or -1.
func parseSeconds(b []byte) float64 {
	v, scale, frac := 0.0, 1.0, false
	if len(b) == 0 {
		return -1
	}
	for _, c := range b {
		switch {
		case c == '.' && !frac:
			frac = true
		case c >= '0' && c <= '9':
			v = v*10 + float64(c-'0')
			if frac {
				scale *= 10
			}
		default:
			return -1
		}
	}
	return v / scale
}

// cpuSeconds is the process's CPU time, as the kernel accounts it.
func cpuSeconds() float64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return -1
	}
	return float64(ts.Nano()) / 1e9
}

// PerOp is what happened since c, divided by ops. IdleUs and CPUUs are -1
// where their clock could not be read.
type PerOp struct {
	CgoCalls float64 `json:"cgo_calls_per_op"`
	Allocs   float64 `json:"allocs_per_op"`
	IdleUs   float64 `json:"idle_us_per_op"` // the machine's idle time, µs per op
	CPUUs    float64 `json:"cpu_us_per_op"`  // this process's CPU time, µs per op
}

// Since returns the counts since c per op (zero ops count as one).
func (c Counters) Since(ops int) PerOp {
	now := Count()
	n := float64(max(ops, 1))
	p := PerOp{CgoCalls: float64(now.CgoCalls-c.CgoCalls) / n, Allocs: float64(now.Allocs-c.Allocs) / n, IdleUs: -1, CPUUs: -1}
	if c.Idle >= 0 && now.Idle >= 0 {
		p.IdleUs = (now.Idle - c.Idle) * 1e6 / n
	}
	if c.CPU >= 0 && now.CPU >= 0 {
		p.CPUUs = (now.CPU - c.CPU) * 1e6 / n
	}
	return p
}
