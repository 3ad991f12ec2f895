package verbs

import (
	"fmt"
	"strconv"
)

// MTU is a path MTU as the verbs encode it (enum ibv_mtu): 1 = 256 bytes up to
// 5 = 4096 bytes. 0 is invalid.
type MTU int

const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the payload size the MTU stands for, or 0 if invalid.
func (m MTU) Bytes() int {
	if !m.Valid() {
		return 0
	}
	return 128 << int(m)
}

// Valid reports whether m is one of the five defined values.
func (m MTU) Valid() bool { return m >= MTU256 && m <= MTU4096 }

func (m MTU) String() string {
	if !m.Valid() {
		return fmt.Sprintf("MTU(%d)", int(m))
	}
	return fmt.Sprint(m.Bytes())
}

// MTUFromBytes returns the MTU for exactly 256, 512, 1024, 2048 or 4096 bytes.
func MTUFromBytes(n int) (MTU, error) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, nil
		}
	}
	return 0, fmt.Errorf("verbs: %d bytes is not a path MTU (want 256, 512, 1024, 2048 or 4096)", n)
}

// The kernel (iboe_get_mtu) reserves, below the netdev MTU, room for a GRH-sized
// network header (40), UDP (8), the base transport header (12), an XRC header
// (4), the largest extended header (atomic, 28) and the ICRC (4).
const roceHeaderOverhead = 40 + 8 + 12 + 4 + 28 + 4

// MTUForNetdev returns the largest path MTU a RoCE packet can use on a netdev
// with the given MTU: 1500 gives 1024, 9000 gives 4096. It returns 0 when even
// 256 bytes do not fit.
func MTUForNetdev(netdevMTU int) MTU {
	return MTUAtMost(netdevMTU - roceHeaderOverhead)
}

// MTUAtMost returns the largest path MTU of at most n bytes: 2044 gives
// 1024, 4096 and more give 4096, and less than 256 gives 0.
func MTUAtMost(n int) MTU {
	best := MTU(0)
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() <= n {
			best = m
		}
	}
	return best
}

// MarshalJSON writes the MTU as bytes (1024), not as the enum's code.
func (m MTU) MarshalJSON() ([]byte, error) {
	return []byte(fmt.Sprint(m.Bytes())), nil
}

// UnmarshalJSON reads an MTU in bytes; 0 is the zero MTU.
func (m *MTU) UnmarshalJSON(b []byte) error {
	n, err := strconv.Atoi(string(b)) // whole: 1024.5 or 1024x is no MTU
	if err != nil {
		return fmt.Errorf("verbs: MTU %s: want a whole number of bytes", b)
	}
	if n == 0 {
		*m = 0
		return nil
	}
	v, err := MTUFromBytes(n)
	if err != nil {
		return err
	}
	*m = v
	return nil
}
