package resolver

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/verbs"
)

// slot is one GID table entry of a fixture. typ "" leaves the types file out
// (old kernels); ndev "" leaves the ndevs file out (EINVAL on real kernels).
type slot struct {
	idx  int
	addr string // an IP address, or a raw sysfs GID text
	typ  string
	ndev string
}

// sysfsFixture lays out /sys/class/infiniband/<dev> as the kernel does: every
// slot of the table has a gids file (empty ones all zeros); types and ndevs
// exist only for used slots.
func sysfsFixture(fsys fstest.MapFS, dev, nodeType, linkLayer string, tableLen int, slots ...slot) {
	fsys[dev+"/node_type"] = &fstest.MapFile{Data: []byte(nodeType + "\n")}
	dir := dev + "/ports/1/"
	fsys[dir+"link_layer"] = &fstest.MapFile{Data: []byte(linkLayer + "\n")}
	fsys[dir+"state"] = &fstest.MapFile{Data: []byte("4: ACTIVE\n")}
	for i := range tableLen {
		fsys[fmt.Sprintf("%sgids/%d", dir, i)] = &fstest.MapFile{Data: []byte("0000:0000:0000:0000:0000:0000:0000:0000\n")}
	}
	for _, s := range slots {
		text := s.addr
		if ip, err := netip.ParseAddr(s.addr); err == nil {
			g := verbs.GIDFromIP(ip)
			var parts []string
			for i := 0; i < 16; i += 2 {
				parts = append(parts, fmt.Sprintf("%02x%02x", g[i], g[i+1]))
			}
			text = strings.Join(parts, ":")
		}
		fsys[fmt.Sprintf("%sgids/%d", dir, s.idx)] = &fstest.MapFile{Data: []byte(text + "\n")}
		if s.typ != "" {
			fsys[fmt.Sprintf("%sgid_attrs/types/%d", dir, s.idx)] = &fstest.MapFile{Data: []byte(s.typ + "\n")}
		}
		if s.ndev != "" {
			fsys[fmt.Sprintf("%sgid_attrs/ndevs/%d", dir, s.idx)] = &fstest.MapFile{Data: []byte(s.ndev + "\n")}
		}
	}
}

const (
	v1 = "IB/RoCE v1"
	v2 = "RoCE v2"
)

func fixtureHost() fstest.MapFS {
	fsys := fstest.MapFS{}
	// mlx5-like: each address once per RoCE version, v1 first.
	sysfsFixture(fsys, "mlx5_0", "1: CA", "Ethernet", 16,
		slot{0, "fe80::1", v1, "eth0"}, slot{1, "fe80::1", v2, "eth0"},
		slot{2, "192.168.1.10", v1, "eth0"}, slot{3, "192.168.1.10", v2, "eth0"})
	// rxe-like: v2 only, IPv4 and IPv6, a VLAN upper with its own addresses
	// and the same link-local value, a secondary IPv4, an empty slot in the
	// middle (a deleted address) and one behind it.
	sysfsFixture(fsys, "rxe0", "1: CA", "Ethernet", 32,
		slot{0, "fe80::2", v2, "veth0"},
		slot{1, "10.0.0.1", v2, "veth0"},
		slot{2, "fd00::1", v2, "veth0"},
		slot{3, "fe80::2", v2, "veth0.100"},
		slot{4, "10.0.100.1", v2, "veth0.100"},
		// 5 and 6 empty
		slot{7, "10.0.0.2", v2, "veth0"},
	)
	// An old kernel: no types files.
	sysfsFixture(fsys, "old0", "1: CA", "Ethernet", 4, slot{0, "fe80::3", "", "eth2"}, slot{1, "172.16.0.1", "", "eth2"})
	// siw: one MAC-derived entry, "IB/RoCE v1", no ndevs file on 6.1.
	sysfsFixture(fsys, "siw0", "4: RNIC", "Ethernet", 1, slot{0, "5254:0012:3456:0000:0000:0000:0000:0000", v1, ""})
	return fsys
}

func port(t *testing.T, table *Table, dev string) *Port {
	t.Helper()
	for i := range table.Ports {
		if table.Ports[i].Device == dev {
			return &table.Ports[i]
		}
	}
	t.Fatalf("no device %s in %+v", dev, table)
	return nil
}

func TestReadSysfs(t *testing.T) {
	table, err := ReadSysfs(fixtureHost())
	require.NoError(t, err)
	assert.Equal(t, "sysfs", table.Source)
	require.Len(t, table.Ports, 4)

	rxe := port(t, table, "rxe0")
	assert.Equal(t, verbs.KindRoCE, rxe.Kind())
	assert.Equal(t, verbs.PortActive, rxe.State)
	var idx []int
	for _, e := range rxe.GIDs {
		idx = append(idx, e.Index)
		assert.Equal(t, verbs.GIDTypeRoCEv2, e.Type)
	}
	assert.Equal(t, []int{0, 1, 2, 3, 4, 7}, idx, "empty slots are skipped, later ones kept")
	assert.Equal(t, "veth0.100", rxe.GIDs[4].Netdev)

	for _, e := range port(t, table, "old0").GIDs {
		assert.Equal(t, verbs.GIDTypeRoCEv1, e.Type, "no types file: RoCE v1 on Ethernet")
	}
	siw := port(t, table, "siw0")
	assert.Equal(t, verbs.KindIWARP, siw.Kind())
	assert.Equal(t, verbs.GIDTypeIB, siw.GIDs[0].Type, "iWARP entries are no RoCE GIDs")
	assert.Empty(t, siw.GIDs[0].Netdev)

	_, err = ReadSysfs(fstest.MapFS{"x0/node_type": &fstest.MapFile{Data: []byte("1: CA")}})
	assert.ErrorContains(t, err, "x0 has no ports directory")
	bad := fixtureHost()
	bad["rxe0/ports/1/gids/1"] = &fstest.MapFile{Data: []byte("not a gid")}
	_, err = ReadSysfs(bad)
	assert.ErrorContains(t, err, "rxe0 port 1 GID 1: malformed GID")
}

func TestSelectGID(t *testing.T) {
	table, err := ReadSysfs(fixtureHost())
	require.NoError(t, err)
	cases := []struct {
		name, dev, src, egress string
		want                   RoCEVersion
		index                  int
	}{
		{"mlx5 IPv4, default v2", "mlx5_0", "192.168.1.10", "eth0", RoCEDefault, 3},
		{"mlx5 IPv4, v1 asked", "mlx5_0", "192.168.1.10", "eth0", RoCEv1, 2},
		{"mlx5 link-local, default v2", "mlx5_0", "fe80::1%eth0", "eth0", RoCEDefault, 1},
		{"rxe IPv4", "rxe0", "10.0.0.1", "veth0", RoCEDefault, 1},
		{"rxe IPv6 global", "rxe0", "fd00::1", "veth0", RoCEDefault, 2},
		{"rxe link-local of the base netdev", "rxe0", "fe80::2%veth0", "veth0", RoCEDefault, 0},
		{"rxe link-local of the VLAN: same value, other index", "rxe0", "fe80::2%veth0.100", "veth0.100", RoCEDefault, 3},
		{"rxe VLAN address", "rxe0", "10.0.100.1", "veth0.100", RoCEDefault, 4},
		{"rxe secondary IPv4 behind empty slots", "rxe0", "10.0.0.2", "veth0", RoCEDefault, 7},
		{"old kernel, v1 by default", "old0", "172.16.0.1", "eth2", RoCEDefault, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := port(t, table, tc.dev)
			want, _ := DefaultGIDType(p, nil)
			if tc.want != RoCEDefault {
				want = tc.want.gidType()
			}
			e, cands, err := SelectGID(p, netip.MustParseAddr(tc.src), tc.egress, want)
			require.NoError(t, err)
			assert.Equal(t, tc.index, e.Index)
			chosen := 0
			for _, c := range cands {
				if c.Chosen {
					chosen++
					assert.Empty(t, c.Rejected)
				} else {
					assert.NotEmpty(t, c.Rejected, "every passed-over entry says why: %+v", c)
				}
			}
			assert.Equal(t, 1, chosen)
			assert.Len(t, cands, len(p.GIDs), "every entry is considered")
		})
	}
}

func TestSelectGIDErrors(t *testing.T) {
	table, err := ReadSysfs(fixtureHost())
	require.NoError(t, err)
	rxe := port(t, table, "rxe0")

	_, cands, err := SelectGID(rxe, netip.MustParseAddr("10.0.0.1"), "veth0.100", verbs.GIDTypeRoCEv2)
	assert.ErrorIs(t, err, ErrSourceNotOnEgress)
	assert.ErrorContains(t, err, "10.0.0.1 belongs to veth0 but the route leaves by veth0.100")
	assert.ErrorContains(t, err, "ADDR_ERROR -ENODEV")
	assert.Contains(t, cands[1].Rejected, "belongs to netdev veth0; the route leaves by veth0.100")

	_, _, err = SelectGID(rxe, netip.MustParseAddr("10.9.9.9"), "veth0", verbs.GIDTypeRoCEv2)
	assert.ErrorIs(t, err, ErrNoGIDForSource)
	_, _, err = SelectGID(rxe, netip.MustParseAddr("fe80::99"), "veth0", verbs.GIDTypeRoCEv2)
	assert.ErrorContains(t, err, "link-local source needs its zone")

	_, _, err = SelectGID(rxe, netip.MustParseAddr("10.0.0.1"), "veth0", verbs.GIDTypeRoCEv1)
	assert.ErrorIs(t, err, ErrGIDTypeUnavailable, "rxe has no v1 entries")
	assert.ErrorContains(t, err, "the entries for it are RoCE v2")

	assert.ErrorContains(t, err, "configfs sets (rdma_cm/rxe0/ports/1/default_roce_mode)")
	assert.ErrorContains(t, err, "can ask for RoCE v2 (Options.RoCE)")

	old := port(t, table, "old0")
	_, _, err = SelectGID(old, netip.MustParseAddr("172.16.0.1"), "eth2", verbs.GIDTypeRoCEv2)
	assert.ErrorIs(t, err, ErrGIDTypeUnavailable, "only v1 entries")

	// An entry whose netdev sysfs did not name (another namespace's):
	// the error says so instead of naming an empty netdev.
	unnamed := *rxe
	unnamed.GIDs = slices.Clone(rxe.GIDs)
	for i := range unnamed.GIDs {
		unnamed.GIDs[i].Netdev = ""
	}
	_, _, err = SelectGID(&unnamed, netip.MustParseAddr("10.0.0.1"), "veth0", verbs.GIDTypeRoCEv2)
	assert.ErrorIs(t, err, ErrSourceNotOnEgress)
	assert.ErrorContains(t, err, "the entries holding 10.0.0.1 name no netdev here")
	assert.NotContains(t, err.Error(), "via ,")
}

func TestDefaultGIDType(t *testing.T) {
	table, err := ReadSysfs(fixtureHost())
	require.NoError(t, err)
	mlx := port(t, table, "mlx5_0")
	typ, why := DefaultGIDType(mlx, nil)
	assert.Equal(t, verbs.GIDTypeRoCEv2, typ)
	assert.Contains(t, why, "supports RoCE v2")
	cfg := fstest.MapFS{"rdma_cm/mlx5_0/ports/1/default_roce_mode": &fstest.MapFile{Data: []byte("IB/RoCE v1\n")}}
	typ, why = DefaultGIDType(mlx, cfg)
	assert.Equal(t, verbs.GIDTypeRoCEv1, typ, "configfs overrides")
	assert.Contains(t, why, "configfs")
	typ, _ = DefaultGIDType(port(t, table, "old0"), cfg)
	assert.Equal(t, verbs.GIDTypeRoCEv1, typ)
}
