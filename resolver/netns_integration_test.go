//go:build integration

package resolver_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/resolver"
	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

// Route, egress and source decisions with the real netlink of a throw-away
// namespace. It runs in the guest because the host kernel has no dummy or
// VLAN links. The GID table is a fixture naming the namespace's netdevs.
func TestResolveRoutesInNetns(t *testing.T) {
	testbed.Require(t)
	const ns = "resolver-test"
	sh := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
		require.NoError(t, err, "ip -n %s %v: %s", ns, args, out)
	}
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	sh("link", "set", "lo", "up")
	for _, l := range []string{"dummy0", "dummy1", "dummy2", "dummy3"} {
		sh("link", "add", l, "type", "dummy")
		if l == "dummy0" {
			sh("link", "set", l, "addrgenmode", "none") // its one link-local address is fe80::1, below
		}
		sh("link", "set", l, "up")
	}
	sh("link", "add", "link", "dummy0", "name", "dummy0.7", "type", "vlan", "id", "7")
	sh("link", "set", "dummy0.7", "up")
	sh("link", "add", "link", "dummy2", "name", "dummy2.9", "type", "vlan", "id", "9")
	sh("link", "set", "dummy2.9", "up")
	sh("addr", "add", "10.9.0.1/24", "dev", "dummy2.9")
	sh("addr", "add", "fe80::1/64", "dev", "dummy0", "nodad")
	sh("addr", "add", "10.1.0.1/24", "dev", "dummy0")
	sh("addr", "add", "fd01::1/64", "dev", "dummy0", "nodad")
	sh("addr", "add", "10.2.0.1/24", "dev", "dummy1")
	sh("addr", "add", "10.7.0.1/24", "dev", "dummy0.7")
	sh("addr", "add", "10.3.0.1/24", "dev", "dummy2")
	sh("link", "set", "dummy3", "mtu", "340")
	sh("addr", "add", "10.4.0.1/24", "dev", "dummy3")
	sh("route", "add", "10.99.0.0/16", "via", "10.2.0.254", "dev", "dummy1")
	sh("route", "add", "10.98.0.0/16", "dev", "dummy0.7")
	sh("route", "add", "10.97.0.0/16", "dev", "dummy2")
	sh("route", "add", "10.96.0.0/16", "dev", "dummy1", "src", "10.1.0.1") // a preferred source off the egress
	sh("route", "add", "10.53.0.0/24", "dev", "lo")                        // via lo, held by no netdev

	gid := func(s string) verbs.GID { return verbs.GIDFromIP(netip.MustParseAddr(s)) }
	table := &resolver.Table{Source: "fixture", Ports: []resolver.Port{{
		Device: "fake0", Port: 1, Transport: verbs.TransportIB, LinkLayer: verbs.LinkLayerEthernet,
		State: verbs.PortActive, ActiveMTU: verbs.MTU4096,
		GIDs: []verbs.GIDEntry{
			{Index: 0, GID: gid("fe80::1"), Type: verbs.GIDTypeRoCEv2, Netdev: "dummy0"},
			{Index: 1, GID: gid("10.1.0.1"), Type: verbs.GIDTypeRoCEv2, Netdev: "dummy0"},
			{Index: 2, GID: gid("fd01::1"), Type: verbs.GIDTypeRoCEv2, Netdev: "dummy0"},
			{Index: 3, GID: gid("10.2.0.1"), Type: verbs.GIDTypeRoCEv2, Netdev: "dummy1"},
			{Index: 4, GID: gid("10.7.0.1"), Type: verbs.GIDTypeRoCEv2, Netdev: "dummy0.7"},
			{Index: 5, GID: gid("10.4.0.1"), Type: verbs.GIDTypeRoCEv2, Netdev: "dummy3"},
		}}}}
	resolve := func(dst, src string) (*resolver.Path, error) {
		var p *resolver.Path
		err := testbed.InNetns(ns, func() error {
			opts := resolver.Options{Table: table}
			if src != "" {
				opts.Source = netip.MustParseAddr(src)
			}
			var err error
			p, err = resolver.Resolve(context.Background(), netip.MustParseAddr(dst), opts)
			return err
		})
		return p, err
	}

	for _, tc := range []struct {
		dst, src, netdev, source, gateway string
		vlan, index                       int
	}{
		{dst: "10.1.0.50", netdev: "dummy0", source: "10.1.0.1", index: 1},
		{dst: "10.99.1.1", netdev: "dummy1", source: "10.2.0.1", gateway: "10.2.0.254", index: 3},
		{dst: "10.98.0.5", netdev: "dummy0.7", source: "10.7.0.1", vlan: 7, index: 4},
		{dst: "fd01::50", netdev: "dummy0", source: "fd01::1", index: 2},
		{dst: "10.1.0.1", netdev: "dummy0", source: "10.1.0.1", index: 1}, // local: via lo, then the owner
		// IPv4-mapped, as a dual-stack socket reports an IPv4 peer: the IPv4 address.
		{dst: "::ffff:10.1.0.50", src: "::ffff:10.1.0.1", netdev: "dummy0", source: "10.1.0.1", index: 1},
	} {
		t.Run(tc.dst, func(t *testing.T) {
			p, err := resolve(tc.dst, tc.src)
			require.NoError(t, err)
			assert.Equal(t, tc.netdev, p.Netdev)
			assert.Equal(t, tc.source, p.Source.String())
			assert.Equal(t, tc.vlan, p.VLAN)
			assert.Equal(t, tc.index, p.GIDIndex, "%s", p.Explain())
			if tc.gateway != "" {
				assert.Equal(t, tc.gateway, p.Gateway.String())
			}
			assert.Equal(t, verbs.MTU1024, p.PathMTU, "dummy's 1500 bytes cap the port's 4096")
		})
	}

	t.Run("source on dummy0, route via dummy1", func(t *testing.T) {
		// As the kernel CM: the given source binds the path to dummy0, the
		// route is looked up out of it (IPv4 holds to that netdev, and
		// takes the destination to be on its link), and the GID entry is
		// dummy0's.
		p, err := resolve("10.99.1.1", "10.1.0.1")
		require.NoError(t, err)
		assert.Equal(t, "dummy0", p.Netdev)
		assert.Equal(t, 1, p.GIDIndex, "%s", p.Explain())
		assert.False(t, p.Gateway.IsValid(), "on dummy0's link, not via dummy1's gateway")
		assert.Contains(t, p.Explain(), "it binds the path to dummy0")
	})
	t.Run("route's preferred source off the egress", func(t *testing.T) {
		_, err := resolve("10.96.0.5", "")
		assert.ErrorIs(t, err, resolver.ErrSourceNotOnEgress)
		assert.ErrorContains(t, err, "10.1.0.1 belongs to dummy0 but the route leaves by dummy1")
		var re *resolver.ResolveError
		require.ErrorAs(t, err, &re)
		assert.Contains(t, re.Path.Explain(), "route to 10.96.0.5: dev dummy1 src 10.1.0.1")
		assert.Contains(t, re.Path.Explain(), "FAILED")
	})
	t.Run("source no netdev holds", func(t *testing.T) {
		_, err := resolve("10.1.0.50", "10.1.0.77")
		assert.ErrorIs(t, err, resolver.ErrNoGIDForSource)
		assert.ErrorContains(t, err, "no netdev holds it")
	})
	t.Run("route via lo to an address no netdev holds", func(t *testing.T) {
		_, err := resolve("10.53.0.1", "")
		assert.ErrorIs(t, err, resolver.ErrNoRDMADevice)
		assert.ErrorContains(t, err, "uses lo, but no netdev holds 10.53.0.1")
	})
	t.Run("MTU too small for RoCE", func(t *testing.T) {
		_, err := resolve("10.4.0.50", "")
		assert.ErrorIs(t, err, resolver.ErrMTUTooSmall)
		assert.ErrorContains(t, err, "dummy3's MTU 340")
	})
	t.Run("no route", func(t *testing.T) {
		_, err := resolve("192.0.2.1", "")
		assert.ErrorIs(t, err, resolver.ErrNoRoute)
		assert.ErrorContains(t, err, "ip route get 192.0.2.1")
	})
	t.Run("netdev without RDMA device", func(t *testing.T) {
		_, err := resolve("10.97.0.1", "")
		assert.ErrorIs(t, err, resolver.ErrNoRDMADevice)
		assert.ErrorContains(t, err, "dummy2 (holding 10.3.0.1)")
		assert.ErrorContains(t, err, "rdma link add")
	})
	t.Run("link-local without zone", func(t *testing.T) {
		_, err := resolve("fe80::99", "")
		assert.ErrorIs(t, err, resolver.ErrNoRoute)
		assert.ErrorContains(t, err, "needs its zone")
	})
	t.Run("RoCE v1 asked, only v2 present", func(t *testing.T) {
		err := testbed.InNetns(ns, func() error {
			_, err := resolver.Resolve(context.Background(), netip.MustParseAddr("10.1.0.50"),
				resolver.Options{Table: table, RoCE: resolver.RoCEv1})
			return err
		})
		assert.ErrorIs(t, err, resolver.ErrGIDTypeUnavailable)
	})
	ifindex := func(t *testing.T, name string) int {
		t.Helper()
		var index int
		require.NoError(t, testbed.InNetns(ns, func() error {
			l, err := net.InterfaceByName(name)
			if err == nil {
				index = l.Index
			}
			return err
		}))
		return index
	}
	resolveWith := func(dst string, opts resolver.Options) (*resolver.Path, error) {
		var p *resolver.Path
		err := testbed.InNetns(ns, func() error {
			if opts.Table == nil {
				opts.Table = table
			}
			var err error
			p, err = resolver.Resolve(context.Background(), netip.MustParseAddr(dst), opts)
			return err
		})
		return p, err
	}
	t.Run("Interface against the source's netdev", func(t *testing.T) {
		// The kernel CM has no interface option: the source decides.
		_, err := resolveWith("10.99.1.1", resolver.Options{Source: netip.MustParseAddr("10.1.0.1"), Interface: "dummy1"})
		assert.ErrorIs(t, err, resolver.ErrSourceNotOnEgress)
		assert.ErrorContains(t, err, `source 10.1.0.1 is on dummy0, but Options.Interface is "dummy1"`)
		p, err := resolveWith("10.99.1.1", resolver.Options{Source: netip.MustParseAddr("10.1.0.1"), Interface: "dummy0"})
		require.NoError(t, err, "the source's own netdev")
		assert.Equal(t, "dummy0", p.Netdev)
		p, err = resolveWith("10.99.1.1", resolver.Options{Interface: strconv.Itoa(ifindex(t, "dummy1"))})
		require.NoError(t, err, "an ifindex names the netdev")
		assert.Equal(t, "dummy1", p.Netdev)
	})
	t.Run("zone of an address that is not link-local", func(t *testing.T) {
		// Ignored, as the kernel CM ignores such a scope: the address
		// names its netdev.
		p, err := resolve("fd01::50", "fd01::1%dummy1")
		require.NoError(t, err)
		assert.Equal(t, "dummy0", p.Netdev)
		assert.Equal(t, 2, p.GIDIndex, "%s", p.Explain())
		assert.Contains(t, p.Explain(), `zone "dummy1" of source fd01::1: ignored`)
		p, err = resolve("fd01::1%dummy1", "")
		require.NoError(t, err, "a local destination: the netdev that holds it")
		assert.Equal(t, "dummy0", p.Netdev)
	})
	t.Run("link-local destination, zone by name and by number", func(t *testing.T) {
		for _, dst := range []string{"fe80::9%dummy0", fmt.Sprintf("fe80::9%%%d", ifindex(t, "dummy0"))} {
			p, err := resolve(dst, "")
			require.NoError(t, err, dst)
			assert.Equal(t, "dummy0", p.Netdev, dst)
			assert.Equal(t, "fe80::1%dummy0", p.Source.String(), dst)
			assert.Equal(t, 0, p.GIDIndex, "%s: %s", dst, p.Explain())
		}
	})
	t.Run("the first device lacks the source's entry", func(t *testing.T) {
		// cma_acquire_dev_by_src_ip tries each port: the second one,
		// which has the entry, is taken.
		two := &resolver.Table{Source: "fixture", Ports: []resolver.Port{
			{Device: "fake9", Port: 1, Transport: verbs.TransportIB, LinkLayer: verbs.LinkLayerEthernet,
				State: verbs.PortActive, ActiveMTU: verbs.MTU4096,
				GIDs: []verbs.GIDEntry{{Index: 0, GID: gid("fe80::1"), Type: verbs.GIDTypeRoCEv2, Netdev: "dummy0"}}},
			table.Ports[0]}}
		p, err := resolveWith("10.1.0.50", resolver.Options{Table: two})
		require.NoError(t, err)
		assert.Equal(t, "fake0", p.Device, "%s", p.Explain())
		assert.Equal(t, 1, p.GIDIndex)
		assert.Contains(t, p.Explain(), "fake9 port 1 also serves dummy0, and comes first, but has no GID entry for 10.1.0.1")
	})
	t.Run("RoCE v1 by default, through a gateway", func(t *testing.T) {
		// A path via a gateway is an IP network to the kernel CM, which
		// raises its GID type to RoCE v2 (v1 is not routable).
		v1 := &resolver.Table{Source: "fixture", Ports: []resolver.Port{table.Ports[0]}}
		v1.Ports[0].GIDs = append(slices.Clone(v1.Ports[0].GIDs),
			verbs.GIDEntry{Index: 6, GID: gid("10.2.0.1"), Type: verbs.GIDTypeRoCEv1, Netdev: "dummy1"})
		configfs := fstest.MapFS{"rdma_cm/fake0/ports/1/default_roce_mode": {Data: []byte("IB/RoCE v1\n")}}
		p, err := resolveWith("10.2.0.5", resolver.Options{Table: v1, Configfs: configfs})
		require.NoError(t, err)
		assert.Equal(t, 6, p.GIDIndex, "on the link: the default, RoCE v1: %s", p.Explain())
		p, err = resolveWith("10.99.1.1", resolver.Options{Table: v1, Configfs: configfs})
		require.NoError(t, err)
		assert.Equal(t, 3, p.GIDIndex, "via 10.2.0.254: RoCE v2: %s", p.Explain())
		assert.Contains(t, p.Explain(), "RoCE v1 is not routable")

		// A port with RoCE v1 entries only: the kernel CM takes v2 all
		// the same, and finds no entry.
		only := &resolver.Table{Source: "fixture", Ports: []resolver.Port{table.Ports[0]}}
		only.Ports[0].GIDs = []verbs.GIDEntry{{Index: 0, GID: gid("10.2.0.1"), Type: verbs.GIDTypeRoCEv1, Netdev: "dummy1"}}
		_, err = resolveWith("10.99.1.1", resolver.Options{Table: only})
		assert.ErrorIs(t, err, resolver.ErrGIDTypeUnavailable)
		assert.ErrorContains(t, err, "the route goes via 10.2.0.254, for which the kernel CM takes RoCE v2")
	})
	t.Run("VLAN netdev without RDMA device", func(t *testing.T) {
		_, err := resolve("10.9.0.50", "")
		assert.ErrorIs(t, err, resolver.ErrNoRDMADevice)
		assert.ErrorContains(t, err, "dummy2.9 (holding 10.9.0.1)")
		assert.ErrorContains(t, err, "rdma link add rxe0 type rxe netdev dummy2)", "the VLAN's lower netdev")
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := resolver.Resolve(ctx, netip.MustParseAddr("10.1.0.50"), resolver.Options{Table: table})
		assert.ErrorIs(t, err, context.Canceled)
	})
}
