package testbed

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCountOwned(t *testing.T) {
	out := `link rxe0/1 cm-idn 0 state LISTEN ps TCP pid 186 comm rdmacm.test src-addr 10.10.0.1:9001 dst-addr 0.0.0.0:0
link rxe0/1 cm-idn 1 state CONNECT ps TCP pid 191 comm rdmacm.test src-addr 10.10.0.1:40000 dst-addr 10.10.0.1:9001
link rxe0/1 cm-idn 2 state CONNECT ps TCP pid 1860 comm other src-addr 10.10.0.1:9001 dst-addr 10.10.0.1:40000
link rxe0/1 lqpn 1 type GSI state RTS sq-psn 0 comm [ib_core]
`
	assert.Equal(t, 2, countOwned(out, map[int]bool{186: true, 191: true}), "objects of two threads of one process")
	assert.Equal(t, 1, countOwned(out, map[int]bool{1860: true}), "a pid is matched whole, not as a prefix")
	assert.Equal(t, 0, countOwned(out, map[int]bool{18: true}))
	assert.Equal(t, 0, countOwned("", map[int]bool{1: true}))
}

// The MR lengths of this process's threads are summed, others' are not.
func TestSumOwned(t *testing.T) {
	out := "dev rxe0 mrn 3 rkey 0x1 lkey 0x1 mrlen 4096 pdn 1 pid 10 comm a\n" +
		"dev rxe0 mrn 4 rkey 0x2 lkey 0x2 mrlen 16 pdn 1 pid 11 comm a\n" +
		"dev siw0 mrn 5 rkey 0x3 lkey 0x3 mrlen 1000 pdn 2 pid 99 comm b\n" +
		"dev rxe0 mrn 6 mrlen 7 pdn 3\n"
	if got := sumOwned(out, "mrlen", map[int]bool{10: true, 11: true}); got != 4112 {
		t.Errorf("sumOwned: %d, want 4112", got)
	}
}
