package verbs

import (
	"runtime"
	"sync/atomic"
	"time"
)

// yieldEvery bounds how long a goroutine may busy-poll a CQ without passing
// through the Go scheduler.
//
// The runtime forcibly preempts a goroutine that has run for 10 ms without
// being rescheduled. A busy-polling goroutine spends much of that time in
// C, where the preemption cannot land, so the runtime takes its P instead,
// and every take sets the runtime's monitor thread waking every 20 µs again
// for about a millisecond. In the test bed a loop of round trips made 5-8
// times the thread switches with that than with a yield, and 15-50 % fewer
// round trips. A goroutine that yields more often than every 10 ms is never
// forcibly preempted, and the monitor backs off to sleeping 10 ms at a time.
// A yield may move the goroutine to another thread, so it should not come
// much more often than needed: 1 ms made fewer round trips than 5 ms.
const yieldEvery = 5 * time.Millisecond

// checkEvery is how many polls go between two looks at the clock: a look
// costs about as much as an empty poll of a software provider.
const checkEvery = 64

var monotonicEpoch = time.Now()

// yielder decides when a CQ's poller yields.
type yielder struct {
	polls atomic.Uint32
	last  atomic.Int64 // ns since monotonicEpoch
}

// due counts a poll and reports whether it should yield first; a true
// answer counts as the yield done.
func (y *yielder) due() bool {
	if y.polls.Add(1)%checkEvery != 0 {
		return false
	}
	now := int64(time.Since(monotonicEpoch))
	last := y.last.Load()
	if now-last < int64(yieldEvery) {
		return false
	}
	return y.last.CompareAndSwap(last, now)
}

// maybeYield yields the processor when due says so.
func (y *yielder) maybeYield() {
	if y.due() {
		runtime.Gosched()
	}
}
