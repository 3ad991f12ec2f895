package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A report as perf 6.1 prints it with -q -n --sort pid,dso.
const sampleReport = `
    30.93%           999        0:swapper          [kernel.kallsyms]
     9.28%           300      245:cmtime           [kernel.kallsyms]
     2.97%           100      245:cmtime           cmtime
     1.00%            50      245:cmtime           librdmacm.so.1.3.44.0
     1.52%            40      242:cmtime           [kernel.kallsyms]
     1.20%            20      242:cmtime           libc.so.6
     3.24%            30       14:ksoftirqd/0      [kernel.kallsyms]
     2.50%            25       22:kworker/1:0-eve  [kernel.kallsyms]
     1.14%            10       15:rcu_preempt      [kernel.kallsyms]
     1.01%             5      236:perf             [kernel.kallsyms]
     0.72%             4      236:perf             perf
`

func TestSplitCPUTime(t *testing.T) {
	got, err := splitCPUTime(sampleReport, "cmtime", map[string]bool{"242": true})
	require.NoError(t, err)
	ms := func(samples float64) float64 { return samples * 1000 / perfHz }
	assert.InDelta(t, ms(300), got.toolKernel, 1e-9)
	assert.InDelta(t, ms(150), got.toolUser, 1e-9, "the tool's own code and the C libraries it calls")
	assert.InDelta(t, ms(60), got.server, 1e-9, "the server's threads, kernel and user")
	assert.InDelta(t, ms(65), got.kernelThreads, 1e-9)
	assert.InDelta(t, ms(999), got.idle, 1e-9)
	assert.InDelta(t, ms(9), got.elsewhere, 1e-9)

	// Without a server every thread of the command is the tool's.
	got, err = splitCPUTime(sampleReport, "cmtime", nil)
	require.NoError(t, err)
	assert.InDelta(t, ms(340), got.toolKernel, 1e-9)
	assert.InDelta(t, ms(170), got.toolUser, 1e-9)
	assert.Zero(t, got.server)
}

func TestSplitCPUTimeNoSamples(t *testing.T) {
	_, err := splitCPUTime("# perf report: no samples\n", "cmtime", nil)
	assert.ErrorContains(t, err, "no samples")
}
