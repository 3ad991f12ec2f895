package main

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tables as C cmtime (rdma-core 44) and ours print them, trimmed.
const (
	cTable = `step              total ms     max ms     min us  us / conn
create id    :        4.00       0.10      30.00      40.00
bind addr    :        0.50       0.01       4.00       5.00
resolve addr :       23.00       1.00     200.00     230.00
resolve route:       13.00       0.50     100.00     130.00
create qp    :       63.00       1.00     500.00     630.00
connect      :      504.00      50.00    4000.00    5040.00
disconnect   :      258.00      25.00    2000.00    2580.00
destroy      :        5.00       0.10      40.00      50.00
`
	goTable = `step              total ms     max ms     min us  us / conn
create id    :       10.00       0.20      90.00     100.00
resolve addr :       20.00       1.00     180.00     200.00
resolve route:       29.00       1.00     250.00     290.00
create qp    :      104.00       2.00     900.00    1040.00
connect      :      700.00      70.00    6000.00    7000.00
disconnect   :      326.00      30.00    3000.00    3260.00
destroy      :       17.00       0.50     150.00     170.00
go process: 10 OS threads created, peak RSS 25000 kB
`
)

func TestStepRowsComparesTheSameWork(t *testing.T) {
	c, err := stepRows(cTable, false)
	require.NoError(t, err)
	g, err := stepRows(goTable, true)
	require.NoError(t, err)

	// Both destroy each QP inside their disconnect step.
	assert.InDelta(t, 2580.0, c["disconnect"], 1e-9)
	assert.InDelta(t, 3260.0, g["disconnect"], 1e-9)
	assert.InDelta(t, 50.0, c["destroy"], 1e-9)
	assert.InDelta(t, 170.0, g["destroy"], 1e-9)

	// The totals hold every step both tools time, and only those: C's bind
	// row has no counterpart in ours.
	assert.InDelta(t, 40.0+230+130+630+5040+2580+50, c["total"], 1e-9)
	assert.InDelta(t, 100.0+200+290+1040+7000+3260+170, g["total"], 1e-9)
}

func TestStepRowsNamesAMissingRow(t *testing.T) {
	_, err := stepRows("destroy      :       17.00       0.50     150.00     170.00\n", true)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `no "create id" row`)
}

func TestByRoundPairsEachRoundsFigures(t *testing.T) {
	// Rounds pair by index: round 2's Go figure is over round 2's C figure,
	// not over C's median or its sorted order.
	c := []float64{100, 50, 200}
	g := []float64{110, 100, 180}
	assert.Equal(t, "0.90 1.10 2.00", byRound(c, g))
	assert.Equal(t, "(2 C rounds, 1 Go rounds)", byRound([]float64{1, 2}, []float64{1}))
}

func TestParsePerfStat(t *testing.T) {
	// perf stat -x, as perf 6.1 writes it to -o: a comment, a blank line,
	// then value,unit,event,run time,percentage,,
	out := "# started on Wed Nov 25 14:00:00 2026\n\n145,,raw_syscalls:sys_enter,3923292,100.00,,\n52,,context-switches,3923292,100.00,,\n"
	m, err := parsePerfStat(out)
	require.NoError(t, err)
	assert.Equal(t, 145.0, m["raw_syscalls:sys_enter"])
	assert.Equal(t, 52.0, m["context-switches"])

	_, err = parsePerfStat("<not counted>,,raw_syscalls:sys_enter,0,0.00,,\n52,,context-switches,1,100.00,,\n")
	assert.ErrorContains(t, err, "counted no raw_syscalls:sys_enter")
	_, err = parsePerfStat("52,,context-switches,1,100.00,,\n")
	assert.ErrorContains(t, err, "printed no raw_syscalls:sys_enter")
}

func TestSummary(t *testing.T) {
	err := errors.New("[streambench -connect a]: exit status 1\nstreambench: dial a: connection refused\n\nthe server printed: listening\n")
	if got, want := summary(err), "[streambench -connect a]: exit status 1 (streambench: dial a: connection refused)"; got != want {
		t.Errorf("summary = %q, want %q", got, want)
	}
	if got, want := summary(errors.New("killed")), "killed"; got != want {
		t.Errorf("summary = %q, want %q", got, want)
	}
}
