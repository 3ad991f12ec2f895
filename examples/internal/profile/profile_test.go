package profile

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
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
	// Spin for 20 ms of this process's CPU time: the count must show it
	// per op, and never more than the wall time the ops took.
	start := time.Now()
	for cpuSeconds()-c.CPU < 0.02 {
	}
	wall := time.Since(start)
	p := c.Since(10)
	assert.GreaterOrEqual(t, p.CPUUs, 2000.0, "10 ops over 20 ms of CPU: at least 2 ms each")
	assert.LessOrEqual(t, p.CPUUs, float64(wall.Microseconds())/10*float64(runtime.NumCPU())+1000)
	assert.GreaterOrEqual(t, p.IdleUs, 0.0, "the machine's idle time only grows")
}
