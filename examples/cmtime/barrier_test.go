package main

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
)

// runParties drives n parties through seq as Dial and Close would, with
// the party numbered fail leaving instead of doing step failAt. It reports,
// per step, the most parties that were inside it at once.
func runParties(t *testing.T, n int, seq []rdmacm.Step, fail, failAt int) (*barrier, []int32) {
	t.Helper()
	b := newBarrier(seq)
	inside := make([]atomic.Int32, len(seq))
	most := make([]atomic.Int32, len(seq))
	entered := make([]sync.WaitGroup, len(seq))
	for k := range seq {
		entered[k].Add(n)
		if fail >= 0 && k >= failAt {
			entered[k].Add(-1)
		}
	}
	var wg sync.WaitGroup
	for p := 0; p < n; p++ {
		turn := make(chan struct{}, 1)
		b.join(turn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer b.leave()
			<-turn
			for k, s := range seq {
				if p == fail && k == failAt {
					return
				}
				now := inside[k].Add(1)
				for m := most[k].Load(); now > m && !most[k].CompareAndSwap(m, now); m = most[k].Load() {
				}
				entered[k].Done()
				if !inTurns[s] {
					entered[k].Wait() // a network step: every party is in it before any answer
				} else {
					time.Sleep(time.Millisecond) // a local call, long enough to overlap if allowed to
				}
				inside[k].Add(-1)
				b.arrive(s, turn)
			}
		}()
	}
	b.start()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("the parties did not get through the steps: the barrier holds one back")
	}
	out := make([]int32, len(seq))
	for k := range most {
		out[k] = most[k].Load()
	}
	return b, out
}

func TestBarrierRunsLocalStepsInTurnsAndNetworkStepsTogether(t *testing.T) {
	for _, manual := range []bool{false, true} {
		seq := stepsOf(manual)
		b, most := runParties(t, 8, seq, -1, 0)
		require.Len(t, b.walls, len(seq))
		assert.Equal(t, seq, b.steps)
		for k, s := range seq {
			if inTurns[s] {
				assert.EqualValues(t, 1, most[k], "step %d (%v) is a local call: one party at a time", k, s)
			} else {
				assert.EqualValues(t, 8, most[k], "step %d (%v) waits for the network: all parties at once", k, s)
			}
		}
	}
}

func TestBarrierPassesTheTurnOfAPartyThatFails(t *testing.T) {
	seq := stepsOf(false)
	for failAt := range seq {
		b, most := runParties(t, 5, seq, 2, failAt)
		require.Len(t, b.walls, len(seq), "failing at step %d (%v)", failAt, seq[failAt])
		for k, s := range seq {
			if inTurns[s] {
				assert.LessOrEqual(t, most[k], int32(1), "step %v", s)
			}
		}
	}
}
