//go:build integration

package verbs_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

func TestDevicesMatchTopology(t *testing.T) {
	topo := testbed.Require(t)
	devs, err := verbs.Devices()
	require.NoError(t, err)
	byName := map[string]verbs.DeviceInfo{}
	for _, d := range devs {
		byName[d.Name] = d
	}
	for _, want := range topo.Devices {
		got, ok := byName[want.Name]
		if !assert.True(t, ok, "device %s missing from %v", want.Name, devs) {
			continue
		}
		switch want.Kind {
		case "rxe":
			assert.Equal(t, verbs.TransportIB, got.Transport, want.Name)
			assert.Equal(t, verbs.NodeCA, got.NodeType, want.Name)
		case "siw":
			assert.Equal(t, verbs.TransportIWARP, got.Transport, want.Name)
			assert.Equal(t, verbs.NodeRNIC, got.NodeType, want.Name)
		default:
			t.Errorf("unknown device kind %q", want.Kind)
		}
		assert.NotZero(t, got.GUID, want.Name)
	}
}

func TestRXEPortAndGIDTable(t *testing.T) {
	topo := testbed.Require(t)
	for _, want := range topo.OfKind("rxe") {
		t.Run(want.Name, func(t *testing.T) {
			dev, err := verbs.Open(want.Name)
			require.NoError(t, err)
			defer dev.Close()

			attr, err := dev.Query()
			require.NoError(t, err)
			assert.Equal(t, 1, attr.PhysicalPortCount, "rxe has one port")
			assert.Positive(t, attr.MaxQP)

			port, err := dev.QueryPort(1)
			require.NoError(t, err)
			assert.Equal(t, verbs.PortActive, port.State)
			assert.Equal(t, verbs.LinkLayerEthernet, port.LinkLayer)
			assert.Equal(t, verbs.KindRoCE, verbs.KindOf(dev.Info.Transport, port.LinkLayer))
			assert.Equal(t, verbs.MTU4096, port.MaxMTU, "rxe always reports max_mtu 4096")
			netdev, err := net.InterfaceByName(want.Netdev)
			require.NoError(t, err)
			assert.Equal(t, verbs.MTUForNetdev(netdev.MTU), port.ActiveMTU,
				"active MTU follows the netdev (%d bytes)", netdev.MTU)

			table, err := dev.GIDTable()
			require.NoError(t, err)
			require.NotEmpty(t, table)
			for _, e := range table {
				assert.Equal(t, verbs.GIDTypeRoCEv2, e.Type, "rxe has RoCE v2 entries only: %+v", e)
				assert.Equal(t, 1, e.Port)
			}
			// Every configured address has a RoCE v2 entry tagged with the
			// netdev that owns it: the base netdev or its VLAN upper.
			expect := map[string]string{want.IPv4: want.Netdev, want.IPv6: want.Netdev}
			if want.IPv6LinkLocal != "" {
				expect[want.IPv6LinkLocal] = want.Netdev
			}
			if want.VLAN != nil {
				expect[want.VLAN.IPv4] = want.VLAN.Netdev
				expect[want.VLAN.IPv6] = want.VLAN.Netdev
			}
			for addr, owner := range expect {
				if addr == "" {
					continue
				}
				ifc, err := net.InterfaceByName(owner)
				require.NoError(t, err)
				gid := verbs.GIDFromIP(netip.MustParseAddr(addr))
				found := false
				for _, e := range table {
					if e.GID == gid && e.NetdevIndex == ifc.Index {
						found = true
						assert.Equal(t, owner, e.Netdev, "the name of the entry's netdev")
						one, err := dev.QueryGID(1, e.Index)
						require.NoError(t, err)
						assert.Equal(t, e, one, "ibv_query_gid_ex agrees with the table")
					}
				}
				assert.True(t, found, "no RoCE v2 GID %v on netdev %s in %+v", gid, owner, table)
			}
		})
	}
}

func TestSIWPorts(t *testing.T) {
	topo := testbed.Require(t)
	siws := topo.OfKind("siw")
	require.NotEmpty(t, siws)
	for _, want := range siws {
		dev, err := verbs.Open(want.Name)
		require.NoError(t, err)
		port, err := dev.QueryPort(1)
		require.NoError(t, err)
		assert.Equal(t, verbs.PortActive, port.State, want.Name)
		assert.Equal(t, verbs.KindIWARP, verbs.KindOf(dev.Info.Transport, port.LinkLayer),
			"%s: iWARP, though its link layer says %v", want.Name, port.LinkLayer)
		require.NoError(t, dev.Close())
	}
}

func TestOpenUnknownDevice(t *testing.T) {
	testbed.Require(t)
	_, err := verbs.Open("nosuchdev0")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nosuchdev0")
	assert.Contains(t, err.Error(), "rxe0", "the error lists the devices that exist")
}
