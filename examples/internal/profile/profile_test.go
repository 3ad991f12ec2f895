package profile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRunWritesTheProfileAndKeepsTheError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	want := errors.New("the run's own error")
	err := Run(path, func() error { return want })
	assert.ErrorIs(t, err, want)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Positive(t, fi.Size(), "a profile, even of a short run, has a header")

	ran := false
	require.NoError(t, Run("", func() error { ran = true; return nil }))
	assert.True(t, ran, "without a path f still runs")

	err = Run(filepath.Join(t.TempDir(), "missing", "cpu.prof"), func() error { t.Fatal("ran without its profile"); return nil })
	assert.ErrorContains(t, err, "cpu profile")
}

var sink []byte

func TestCountersCountAllocations(t *testing.T) {
	c := Count()
	for range 100 {
		sink = make([]byte, 1024)
	}
	p := c.Since(100)
	assert.GreaterOrEqual(t, p.Allocs, 1.0, "each op made a heap allocation")
	assert.Less(t, p.Allocs, 2.0)
	assert.Zero(t, p.CgoCalls, "no op crossed into C")
}

func TestCountersCountCPUTime(t *testing.T) {
	c := Count()
	require.GreaterOrEqual(t, c.CPU, 0.0, "CLOCK_PROCESS_CPUTIME_ID is readable on Linux")
	// Spinning for 30 ms of wall time takes about as much CPU time; sleeping
	// as long takes next to none: the count is CPU time, not wall time.
	for start := time.Now(); time.Since(start) < 30*time.Millisecond; {
	}
	spun := c.Since(1)
	assert.Greater(t, spun.CPUUs, 15000.0, "30 ms spun on one thread")
	s := Count()
	time.Sleep(30 * time.Millisecond)
	slept := s.Since(1)
	assert.Less(t, slept.CPUUs, 10000.0, "30 ms asleep")
	assert.NotEqual(t, -1.0, slept.IdleUs, "/proc/uptime is readable on Linux")
}

// Counting allocates nothing inside the window it counts. Allocations are
// counted process-wide, and another goroutine of the test binary can
// allocate inside one window (seen once with go1.24: 6), so the count is
// averaged over many windows, as AllocsPerRun does; an allocation of the
// counting itself shows in every one.
func TestCountingAllocatesNothing(t *testing.T) {
	total := 0.0
	const runs = 100
	for range runs {
		c := Count()
		total += c.Since(1).Allocs
	}
	assert.Less(t, total/runs, 1.0, "reading the counters allocated, inside the window counted (%v in %d windows)", total, runs)
}

func TestCountingKeepsNoDescriptor(t *testing.T) {
	Count()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, fd := range fds {
		target, _ := os.Readlink("/proc/self/fd/" + fd.Name())
		assert.NotEqual(t, "/proc/uptime", target, "the tools' leak checks count descriptors")
	}
}

func TestParseSeconds(t *testing.T) {
	assert.Equal(t, 56.78, parseSeconds([]byte("56.78")))
	assert.Equal(t, 3.0, parseSeconds([]byte("3")))
	for _, bad := range []string{"", "1.2.3", "x", "-1"} {
		assert.Equal(t, -1.0, parseSeconds([]byte(bad)), "%q", bad)
	}
}
