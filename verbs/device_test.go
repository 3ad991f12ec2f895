package verbs

import (
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGIDFromIP(t *testing.T) {
	g := GIDFromIP(netip.MustParseAddr("10.10.0.1"))
	assert.Equal(t, "::ffff:10.10.0.1", g.String(), "IPv4 maps into ::ffff:0:0/96 as the kernel's ip2gid does")
	assert.Equal(t, netip.MustParseAddr("10.10.0.1"), g.IP())
	g6 := GIDFromIP(netip.MustParseAddr("fe80::1"))
	assert.Equal(t, "fe80::1", g6.String())
	assert.False(t, g6.IsZero())
	assert.True(t, GID{}.IsZero())
}

func TestKindOf(t *testing.T) {
	assert.Equal(t, KindIWARP, KindOf(TransportIWARP, LinkLayerEthernet), "iWARP ports report Ethernet too: transport decides")
	assert.Equal(t, KindRoCE, KindOf(TransportIB, LinkLayerEthernet))
	assert.Equal(t, KindInfiniBand, KindOf(TransportIB, LinkLayerInfiniBand))
	assert.Equal(t, KindUnknown, KindOf(TransportUSNIC, LinkLayerEthernet))
}

func TestEnumStrings(t *testing.T) {
	assert.Equal(t, "iWARP", TransportIWARP.String())
	assert.Equal(t, "ACTIVE", PortActive.String())
	assert.Equal(t, "RoCE v2", GIDTypeRoCEv2.String())
	assert.Equal(t, "Ethernet", LinkLayerEthernet.String())
	assert.Equal(t, "RNIC", NodeRNIC.String())
	assert.Equal(t, "PortState(42)", PortState(42).String())
}

func TestMTU(t *testing.T) {
	for m, n := range map[MTU]int{MTU256: 256, MTU512: 512, MTU1024: 1024, MTU2048: 2048, MTU4096: 4096} {
		assert.Equal(t, n, m.Bytes())
		back, err := MTUFromBytes(n)
		assert.NoError(t, err)
		assert.Equal(t, m, back)
	}
	assert.Equal(t, 0, MTU(0).Bytes())
	assert.Equal(t, 0, MTU(6).Bytes())
	_, err := MTUFromBytes(1500)
	assert.ErrorContains(t, err, "1500 bytes is not a path MTU")

	for n, want := range map[int]MTU{255: 0, 256: MTU256, 2044: MTU1024, 2048: MTU2048, 65520: MTU4096} {
		assert.Equal(t, want, MTUAtMost(n), "%d bytes", n)
	}

	// In JSON (oob's lines), an MTU is a whole number of bytes.
	var m MTU
	require.NoError(t, m.UnmarshalJSON([]byte("2048")))
	assert.Equal(t, MTU2048, m)
	require.NoError(t, m.UnmarshalJSON([]byte("0")))
	assert.Equal(t, MTU(0), m)
	for _, bad := range []string{"1024.5", "1024x", `"1024"`, "", "1500"} {
		assert.Error(t, m.UnmarshalJSON([]byte(bad)), "%q", bad)
	}
}

func TestMTUForNetdev(t *testing.T) {
	// The kernel reserves 96 bytes of headers below the netdev MTU.
	cases := map[int]MTU{
		1500: MTU1024, // the common case: 1404 bytes of room
		9000: MTU4096,
		4192: MTU4096, // 4096 + 96 exactly
		4191: MTU2048,
		1120: MTU1024,
		1119: MTU512,
		352:  MTU256,
		351:  0,
	}
	for netdev, want := range cases {
		assert.Equal(t, want, MTUForNetdev(netdev), "netdev MTU %d", netdev)
	}
}

func TestMTUJSON(t *testing.T) {
	b, err := json.Marshal(struct{ M MTU }{MTU1024})
	assert.NoError(t, err)
	assert.Equal(t, `{"M":1024}`, string(b))
	var v struct{ M MTU }
	assert.NoError(t, json.Unmarshal([]byte(`{"M":4096}`), &v))
	assert.Equal(t, MTU4096, v.M)
	assert.Error(t, json.Unmarshal([]byte(`{"M":1500}`), &v))
}
