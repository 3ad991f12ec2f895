//go:build linux

package resolver

import (
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/verbs"
)

func TestFindPort(t *testing.T) {
	mac := net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	ibGID := verbs.GID{0xfe, 0x80, 15: 0x42}
	ipoib := append(net.HardwareAddr{0, 0, 0, 0x48}, ibGID[:]...)
	table := &Table{Ports: []Port{
		{Device: "mlx5_0", Port: 1, Transport: verbs.TransportIB, LinkLayer: verbs.LinkLayerEthernet,
			GIDs: []verbs.GIDEntry{{Index: 0, Netdev: "eth0"}}},
		{Device: "siw0", Port: 1, Transport: verbs.TransportIWARP, LinkLayer: verbs.LinkLayerEthernet,
			GIDs: []verbs.GIDEntry{{Index: 0, GID: verbs.GID{0x52, 0x54, 0, 0x12, 0x34, 0x56}}}},
		{Device: "mlx4_0", Port: 1, Transport: verbs.TransportIB, LinkLayer: verbs.LinkLayerInfiniBand,
			GIDs: []verbs.GIDEntry{{Index: 0, GID: ibGID}}},
		{Device: "rxe9", Port: 1, Transport: verbs.TransportIB, LinkLayer: verbs.LinkLayerEthernet,
			GIDs: []verbs.GIDEntry{{Index: 0, Netdev: "eth0"}}},
	}}
	ps := findPorts(table, "eth0", net.HardwareAddr{1, 2, 3, 4, 5, 6})
	require.Len(t, ps, 2, "a second device on the same netdev is found")
	assert.Equal(t, "mlx5_0", ps[0].Device)
	assert.Equal(t, "rxe9", ps[1].Device)
	ps = findPorts(table, "eth1", mac)
	require.Len(t, ps, 1)
	assert.Equal(t, "siw0", ps[0].Device, "iWARP by the MAC in its GID")
	ps = findPorts(table, "ib0", ipoib)
	require.Len(t, ps, 1)
	assert.Equal(t, "mlx4_0", ps[0].Device, "InfiniBand by the GID in the IPoIB address")
	assert.Empty(t, findPorts(table, "eth9", net.HardwareAddr{9, 9, 9, 9, 9, 9}))
}

func TestResolveHostFamily(t *testing.T) {
	_, err := ResolveHost(t.Context(), "10.0.0.1", Options{Network: "ip6"})
	assert.ErrorContains(t, err, "10.0.0.1 is not an ip6 address")
	_, err = ResolveHost(t.Context(), "fd00::1", Options{Network: "ip4"})
	assert.ErrorContains(t, err, "not an ip4 address")
	_, err = ResolveHost(t.Context(), "x", Options{Network: "tcp"})
	assert.ErrorContains(t, err, "want ip, ip4 or ip6")

	// A lookup's answers: a given source picks its family.
	v6, v4 := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("::ffff:10.0.0.1")
	addrs := []netip.Addr{v6, v4}
	assert.Equal(t, v6, pickAddr(addrs, netip.Addr{}), "no source: the first answer")
	assert.Equal(t, v4.Unmap(), pickAddr(addrs, netip.IPv4Unspecified()), "the wildcard names a family")
	assert.Equal(t, v4.Unmap(), pickAddr(addrs, netip.MustParseAddr("10.0.0.2")))
	assert.Equal(t, v6, pickAddr(addrs, netip.MustParseAddr("fd00::2")))
	assert.Equal(t, v6, pickAddr(addrs[:1], netip.MustParseAddr("10.0.0.2")),
		"none of the source's family: the first, which resolve then refuses")

	_, err = Resolve(t.Context(), netip.MustParseAddr("10.0.0.1"), Options{Source: netip.MustParseAddr("fd00::2")})
	assert.ErrorContains(t, err, "source fd00::2 and destination 10.0.0.1 are of different families")
	_, err = Resolve(t.Context(), netip.MustParseAddr("fd00::1"), Options{Source: netip.MustParseAddr("::ffff:10.0.0.2")})
	assert.ErrorContains(t, err, "source 10.0.0.2 and destination fd00::1 are of different families",
		"an IPv4-mapped source is IPv4")
	// A zone on the wildcard binds nothing: it is the wildcard still.
	_, err = Resolve(t.Context(), netip.MustParseAddr("fd00::1"), Options{Source: netip.MustParseAddr("::%lo"),
		Table: &Table{}})
	var re *ResolveError
	require.ErrorAs(t, err, &re)
	assert.Contains(t, re.Path.Explain(), "source ::%lo: the wildcard")
	assert.NotContains(t, re.Path.Explain(), "binds the path to lo")
	_, err = Resolve(t.Context(), netip.MustParseAddr("fd00::1"), Options{Source: netip.IPv4Unspecified()})
	assert.ErrorContains(t, err, "source 0.0.0.0 and destination fd00::1 are of different families",
		"the wildcard has a family too")
}

// The kernel CM takes the device registered first: a table ordered by the
// kernel's indexes finds that one, whatever the names.
func TestFindPortTakesTheDeviceRegisteredFirst(t *testing.T) {
	table := &Table{Ports: []Port{
		{Device: "aaa0", Port: 1, Transport: verbs.TransportIWARP, LinkLayer: verbs.LinkLayerEthernet,
			GIDs: []verbs.GIDEntry{{Index: 0, GID: verbs.GID{0x52, 0x54, 0, 0x12, 0x34, 0x56}}}},
		{Device: "rxe0", Port: 1, Transport: verbs.TransportIB, LinkLayer: verbs.LinkLayerEthernet,
			GIDs: []verbs.GIDEntry{{Index: 0, Netdev: "eth0"}}},
	}}
	mac := net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	assert.Equal(t, "aaa0", findPorts(table, "eth0", mac)[0].Device, "unordered: the first listed")
	table.orderBy(map[string]int{"rxe0": 1, "aaa0": 3})
	assert.True(t, table.Ordered)
	ps := findPorts(table, "eth0", mac)
	require.Len(t, ps, 2)
	assert.Equal(t, "rxe0", ps[0].Device, "registered first")
	assert.Equal(t, 1, ps[0].DeviceIndex)
	assert.Equal(t, "aaa0", ps[1].Device)
	assert.Equal(t, 3, ps[1].DeviceIndex)

	// A device the kernel's list lacks (renamed since) goes last, and the
	// table does not claim the kernel's order.
	table.orderBy(map[string]int{"aaa0": 0})
	assert.False(t, table.Ordered)
	assert.Equal(t, "aaa0", table.Ports[0].Device)
	assert.Equal(t, -1, table.Ports[1].DeviceIndex)
}

// One device that cannot be read (being removed, say) leaves the others
// usable, and the table says which was left out; with none read, the
// error names each.
func TestUnreadDeviceIsLeftOut(t *testing.T) {
	gone := errors.New("no such device")
	read := func(t *Table, info verbs.DeviceInfo) error {
		t.Ports = append(t.Ports, Port{Device: info.Name, Port: 1})
		if info.Name == "gone0" {
			return gone // after a port was added: a device half read
		}
		return nil
	}
	table, err := readDevices([]verbs.DeviceInfo{{Name: "rxe0"}, {Name: "gone0"}, {Name: "siw0"}}, read)
	require.NoError(t, err)
	assert.Equal(t, []Port{{Device: "rxe0", Port: 1}, {Device: "siw0", Port: 1}}, table.Ports)
	assert.Equal(t, []string{"gone0 (no such device)"}, table.Unread)

	_, err = readDevices([]verbs.DeviceInfo{{Name: "gone0"}}, read)
	assert.ErrorIs(t, err, gone)
	assert.ErrorContains(t, err, "no RDMA device could be read: gone0: no such device")
}

func TestPathMTU(t *testing.T) {
	for _, tc := range []struct {
		kind   verbs.Kind
		netdev int
		active verbs.MTU
		want   verbs.MTU
	}{
		{verbs.KindRoCE, 1500, verbs.MTU4096, verbs.MTU1024},        // 1500 - 96 holds 1024
		{verbs.KindRoCE, 9000, verbs.MTU1024, verbs.MTU1024},        // the port bounds it
		{verbs.KindRoCE, 4200, verbs.MTU4096, verbs.MTU4096},        // 4096 + 96 fits
		{verbs.KindRoCE, 4150, verbs.MTU4096, verbs.MTU2048},        // it does not
		{verbs.KindInfiniBand, 2044, verbs.MTU2048, verbs.MTU2048},  // IPoIB datagram mode
		{verbs.KindInfiniBand, 65520, verbs.MTU4096, verbs.MTU4096}, // connected mode
		{verbs.KindInfiniBand, 2044, 0, verbs.MTU2048},              // active MTU not read (sysfs)
		{verbs.KindInfiniBand, 65520, 0, verbs.MTU4096},
	} {
		got, why := pathMTU(tc.kind, tc.netdev, tc.active)
		assert.Equal(t, tc.want, got, "%v, netdev MTU %d, active %v: %s", tc.kind, tc.netdev, tc.active, why)
	}
}
