package rdmacm

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/rdmago/rdmago/verbs"
)

// The 40 bytes before a UD datagram are read as ibv_init_ah_from_wc reads
// them: a GRH, or on RoCE v2 over IPv4 an IPv4 header in the last 20.
func TestGRHAddrs(t *testing.T) {
	v4 := make([]byte, verbs.GRHSize)
	ip := v4[20:]
	ip[0] = 0x45 // version 4, 5 words
	copy(ip[12:16], []byte{10, 0, 0, 7})
	copy(ip[16:20], []byte{239, 1, 2, 3})
	src, dst, ok := grhAddrs(v4)
	assert.True(t, ok)
	assert.Equal(t, netip.MustParseAddr("10.0.0.7"), src)
	assert.True(t, dst.IsMulticast())

	v6 := make([]byte, verbs.GRHSize)
	v6[0] = 0x60
	a, b := netip.MustParseAddr("fe80::1"), netip.MustParseAddr("ff0e::5")
	copy(v6[8:24], a.AsSlice())
	copy(v6[24:40], b.AsSlice())
	src, dst, ok = grhAddrs(v6)
	assert.True(t, ok)
	assert.Equal(t, a, src)
	assert.Equal(t, b, dst)

	// A GRH whose last 20 bytes happen to look like an IPv4 header with a
	// bad checksum stays a GRH; with a good one it is IPv4.
	copy(v6[20:], ip)
	_, dst, _ = grhAddrs(v6)
	assert.Equal(t, netip.AddrFrom16([16]byte(v6[24:40])).Unmap(), dst, "bad checksum: the GRH")
	sum := ipv4Checksum(v6[20:40]) // over the header with its check field zero
	v6[20+10], v6[20+11] = byte(sum>>8), byte(sum)
	src, _, _ = grhAddrs(v6)
	assert.Equal(t, netip.MustParseAddr("10.0.0.7"), src, "good checksum: the IPv4 header")

	_, _, ok = grhAddrs(make([]byte, verbs.GRHSize))
	assert.False(t, ok, "neither")
}

// A UD connection's MTU is the smaller of this port's and the peer's.
func TestUDPathMTU(t *testing.T) {
	assert.Equal(t, verbs.MTU1024, udPathMTU(verbs.MTU1024, 0))
	assert.Equal(t, verbs.MTU512, udPathMTU(verbs.MTU1024, verbs.MTU512))
	assert.Equal(t, verbs.MTU1024, udPathMTU(verbs.MTU1024, verbs.MTU4096))
	assert.Equal(t, verbs.MTU2048, udPathMTU(0, verbs.MTU2048))
}
