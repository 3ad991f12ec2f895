package profile

import "runtime"

// Counters are the process's counts that need no clock: exact on any
// machine, so that a benchmark can say per operation how many crossings
// into C and how many heap allocations its figure paid for.
type Counters struct {
	CgoCalls int64
	Allocs   uint64
}

// Count reads the counters now. It stops the world (as testing's
// AllocsPerRun does) for an exact count: runtime/metrics counts small
// allocations only as each P's cache is refilled. Call it outside timed
// code.
func Count() Counters {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return Counters{CgoCalls: runtime.NumCgoCall(), Allocs: m.Mallocs}
}

// PerOp is what happened since c, divided by ops.
type PerOp struct {
	CgoCalls float64 `json:"cgo_calls_per_op"`
	Allocs   float64 `json:"allocs_per_op"`
}

// Since returns the counts since c per op (zero ops count as one).
func (c Counters) Since(ops int) PerOp {
	now := Count()
	n := float64(max(ops, 1))
	return PerOp{CgoCalls: float64(now.CgoCalls-c.CgoCalls) / n, Allocs: float64(now.Allocs-c.Allocs) / n}
}
