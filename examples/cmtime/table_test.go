package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func nodeWith(d map[string]time.Duration) *node {
	n := &node{}
	for s, t := range d {
		n.add(stepIndex(s), t)
	}
	return n
}

// A phase's row is its wall time; a step run inside other phases sums the
// connections' times; max and min are one connection's.
func TestRows(t *testing.T) {
	ms := time.Millisecond
	r := &result{conns: 2,
		nodes: []*node{
			nodeWith(map[string]time.Duration{stepCreateID: 1 * ms, stepConnect: 5 * ms,
				stepInitQP: 3 * ms, stepEstablish: 2 * ms}),
			nodeWith(map[string]time.Duration{stepCreateID: 3 * ms, stepConnect: 7 * ms,
				stepInitQP: 1 * ms}),
		},
		phases: []phase{{stepCreateID, 10 * ms}, {stepConnect, 8 * ms}},
		within: []string{stepInitQP, stepRTRQP, stepEstablish},
	}
	assert.Equal(t, []row{
		{step: "create id", total: 10 * ms, max: 3 * ms, min: 1 * ms, perConn: 5 * ms},
		{step: "connect", total: 8 * ms, max: 7 * ms, min: 5 * ms, perConn: 4 * ms},
		{step: "init qp", total: 4 * ms, max: 3 * ms, min: 1 * ms, perConn: 2 * ms},
		// rtr qp: no connection got there, no row.
		{step: "establish", total: 2 * ms, max: 2 * ms, min: 2 * ms, perConn: 1 * ms},
	}, r.rows())

	var out bytes.Buffer
	r.failed, r.err = 1, assert.AnError
	r.print(&out)
	lines := bytes.Split(out.Bytes(), []byte("\n"))
	require.GreaterOrEqual(t, len(lines), 6)
	assert.Equal(t, "create id    :       10.00       3.00    1000.00    5000.00", string(lines[1]))
	assert.Contains(t, out.String(), "1 of 2 connections failed; the first: "+assert.AnError.Error())
}
