//go:build testbed

package testbed_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/test/testbed"
)

// costModelWorkload, set in the environment, makes this test binary the
// workload that TestCostModelTimingRepeats runs in the guest.
const costModelWorkload = "RDMAGO_TEST_COST_MODEL_WORKLOAD"

// TestCostModelTimingRepeats is what the cost model is for: the same work
// takes the same guest time, run after run, even while the host is busy.
// On the normal guest the same rounds differ by tens of percent.
func TestCostModelTimingRepeats(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, err := testbed.Boot(ctx, testbed.Options{CostModel: true})
	require.NoError(t, err)
	defer g.Close()

	out, err := g.Command(ctx, "nproc").Output()
	require.NoError(t, err)
	assert.Equal(t, "1", strings.TrimSpace(string(out)), "a cost-model guest has one vCPU")

	exe, err := os.Executable()
	require.NoError(t, err)
	measure := func() []float64 {
		cmd := g.Command(ctx, exe)
		cmd.Env = append(os.Environ(), costModelWorkload+"=1")
		out, err := cmd.Output()
		require.NoError(t, err, "%s", out)
		var ns []float64
		for _, f := range strings.Fields(string(out)) {
			if v, err := strconv.ParseFloat(strings.TrimPrefix(f, "ns="), 64); err == nil && strings.HasPrefix(f, "ns=") {
				ns = append(ns, v)
			}
		}
		require.Len(t, ns, workloadRounds, "the workload's output: %s", out)
		return ns[1:] // the first round faults its pages in
	}
	quiet := measure()
	// The same again with every host CPU busy: the guest's clock counts its
	// own instructions, so the host's load must not show.
	var stop atomic.Bool
	var wg sync.WaitGroup
	t.Cleanup(func() { stop.Store(true); wg.Wait() }) // also when measure fails
	for range runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
			}
		}()
	}
	loaded := measure()
	stop.Store(true)
	wg.Wait()

	all := append(slices.Clone(quiet), loaded...)
	lo, hi := slices.Min(all), slices.Max(all)
	t.Logf("guest µs per round, quiet host: %v; busy host: %v", micros(quiet), micros(loaded))
	assert.LessOrEqual(t, hi/lo, 1.03, "rounds of the same work must agree within 3 %% in the cost model")
}

const workloadRounds = 6

// TestMain runs, in place of the tests, the work TestCostModelTimingRepeats
// times in the guest, when asked to.
func TestMain(m *testing.M) {
	if os.Getenv(costModelWorkload) != "" {
		costModelWorkloadMain()
		return
	}
	os.Exit(m.Run())
}

// costModelWorkloadMain hashes a fixed buffer, no allocation, no system
// call, timed by the guest's clock.
func costModelWorkloadMain() {
	buf := make([]byte, 256<<10)
	var sum [sha256.Size]byte
	for r := 0; r < workloadRounds; r++ {
		start := time.Now()
		for range 8 {
			sum = sha256.Sum256(buf)
			buf[0] = sum[0]
		}
		fmt.Printf("ns=%d\n", time.Since(start).Nanoseconds())
	}
}

func micros(ns []float64) []string {
	s := make([]string, len(ns))
	for i, v := range ns {
		s[i] = fmt.Sprintf("%.0f", v/1e3)
	}
	return s
}
