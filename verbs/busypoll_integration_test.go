//go:build integration && !race

package verbs_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdmago/rdmago/verbs"
)

// threadSwitches is how many times this process's threads have left a
// CPU, voluntarily or not.
func threadSwitches(t *testing.T) int64 {
	t.Helper()
	var ru unix.Rusage
	require.NoError(t, unix.Getrusage(unix.RUSAGE_SELF, &ru))
	return ru.Nvcsw + ru.Nivcsw
}

// A goroutine that ping-pongs and busy-polls for a while, as a
// latency-bound program does, must not set off the Go runtime's forced
// preemption of goroutines that never yield. The preemption takes the P
// whenever it finds the goroutine in C, and each take keeps the runtime's
// monitor thread waking every 20 µs for a millisecond: without the yield in
// Poll this loop made 1400-1900 thread switches a second in the test bed,
// with it 230-310.
//
// The race detector slows the loop fourfold and brings switches of its
// own, which hide the difference, so this test is built without it: make
// test runs it in the verbs package's cgocheck2 pass.
func TestBusyPollingLoopSwitchesLittle(t *testing.T) {
	checkNoLeaks(t)
	a, b := pairOnRXE(t, verbs.QPTypeRC, 21, 23)

	recv := verbs.RecvWR{ID: 1, SGEs: []verbs.SGE{b.mr.SGE(0, 64)}}
	send := verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled | verbs.SendInline,
		SGEs: []verbs.SGE{a.mr.SGE(0, 64)}}
	wcs := make([]verbs.WorkCompletion, 1)
	await := func(cq *verbs.CQ) error {
		for spins := 0; ; spins++ {
			n, err := cq.Poll(wcs)
			switch {
			case err != nil:
				return err
			case n == 1:
				return wcs[0].Err()
			case spins > 1<<24:
				return errors.New("no completion after 16M polls")
			}
		}
	}
	roundTrip := func() error {
		if err := b.qp.PostRecv(recv); err != nil {
			return err
		}
		if err := a.qp.PostSend(send); err != nil {
			return err
		}
		if err := await(a.cq); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		return await(b.cq)
	}
	require.NoError(t, roundTrip())

	const run = time.Second
	before, start, trips := threadSwitches(t), time.Now(), 0
	for ; time.Since(start) < run; trips++ {
		if err := roundTrip(); err != nil { // no arguments boxed per trip: the loop must not allocate
			t.Fatalf("round trip %d: %v", trips, err)
		}
	}
	switches := threadSwitches(t) - before
	t.Logf("%d round trips, %d thread switches in %v", trips, switches, time.Since(start))
	assert.Less(t, switches, int64(750), "thread switches in %v of busy polling (the storm makes 1500 or more)", run)
}
