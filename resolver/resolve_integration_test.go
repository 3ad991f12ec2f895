//go:build integration

package resolver_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/internal/cmprobe"
	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/resolver"
	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

// cmDeviceEnv has the test binary, run again as a child, print the device
// the kernel CM binds an id to when it resolves the address in it (source
// and destination alike), and exit: see kernelCMDevice.
const cmDeviceEnv = "RESOLVER_TEST_KERNEL_CM_DEVICE"

func TestMain(m *testing.M) {
	if a := os.Getenv(cmDeviceEnv); a != "" {
		os.Exit(printKernelCMDevice(a))
	}
	if _, err := testbed.Load(); err == nil {
		// librdmacm opens every device at its first use and keeps them:
		// before the first leak check.
		rdmacm.OpenDevice("rxe0")
	}
	os.Exit(m.Run())
}

func run(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	require.NoError(t, err, "%v: %s", args, out)
}

// checkAgainstKernel resolves src→dst and connects the same addresses
// through the kernel CM: the GID index must be the one the CM used.
func checkAgainstKernel(t *testing.T, src, dst string, port uint16) *resolver.Path {
	t.Helper()
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	path, err := resolver.Resolve(context.Background(), d, resolver.Options{Source: s})
	require.NoError(t, err)
	active, passive, err := cmprobe.SGIDIndexes(s, d, port, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, active, path.GIDIndex, "resolver vs kernel CM (active side) for %s → %s:\n%s", src, dst, path.Explain())
	assert.Equal(t, passive, path.GIDIndex, "same addresses, same entry on the passive side")
	assert.Equal(t, verbs.GIDTypeRoCEv2, path.GIDType)
	return path
}

func TestResolveMatchesKernelCM(t *testing.T) {
	rxe := testbed.Require(t).MustDevice(t, "rxe0")
	ll := rxe.IPv6LinkLocal
	cases := []struct{ name, addr string }{
		{"IPv4", rxe.IPv4},
		{"IPv6 global", rxe.IPv6},
		{"IPv6 link-local", ll + "%" + rxe.Netdev},
		{"VLAN IPv4", rxe.VLAN.IPv4},
		{"VLAN IPv6", rxe.VLAN.IPv6},
		// The VLAN upper inherits the MAC: same link-local value, another entry.
		{"VLAN link-local", ll + "%" + rxe.VLAN.Netdev},
	}
	indexOf := map[string]int{}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := checkAgainstKernel(t, tc.addr, tc.addr, uint16(7500+i))
			indexOf[tc.name] = p.GIDIndex
			assert.Equal(t, rxe.Name, p.Device)
			assert.Equal(t, verbs.KindRoCE, p.Kind)
		})
	}
	assert.NotEqual(t, indexOf["IPv6 link-local"], indexOf["VLAN link-local"],
		"equal GID values on two netdevs are two entries: matching by value alone would be wrong")

	t.Run("secondary address, then a deleted slot reused", func(t *testing.T) {
		run(t, "ip", "addr", "add", "10.10.0.2/24", "dev", rxe.Netdev)
		t.Cleanup(func() { exec.Command("ip", "addr", "flush", "dev", rxe.Netdev, "to", "10.10.0.2/32").Run() })
		first := checkAgainstKernel(t, "10.10.0.2", "10.10.0.2", 7600)
		run(t, "ip", "addr", "del", "10.10.0.2/24", "dev", rxe.Netdev)
		run(t, "ip", "addr", "add", "10.10.0.3/24", "dev", rxe.Netdev)
		t.Cleanup(func() { exec.Command("ip", "addr", "del", "10.10.0.3/24", "dev", rxe.Netdev).Run() })
		// The GID table updates from a work queue: wait for the new entry.
		dev, err := verbs.Open(rxe.Name)
		require.NoError(t, err)
		want := verbs.GIDFromIP(netip.MustParseAddr("10.10.0.3"))
		require.Eventually(t, func() bool {
			table, err := dev.GIDTable()
			return err == nil && slices.ContainsFunc(table, func(e verbs.GIDEntry) bool { return e.GID == want })
		}, 10*time.Second, 10*time.Millisecond, "10.10.0.3 in %s's GID table", rxe.Name)
		require.NoError(t, dev.Close())
		second := checkAgainstKernel(t, "10.10.0.3", "10.10.0.3", 7601)
		assert.Equal(t, first.GIDIndex, second.GIDIndex, "the new address reuses the freed slot")
		_, err = resolver.Resolve(context.Background(), netip.MustParseAddr("10.10.0.2"),
			resolver.Options{Source: netip.MustParseAddr("10.10.0.2")})
		assert.Error(t, err, "the deleted address resolves no more")
	})
}

func TestResolveWithoutSource(t *testing.T) {
	rxe := testbed.Require(t).MustDevice(t, "rxe0")
	// The kernel CM binds an id without source to the destination's scope:
	// the VLAN's link-local (same value as the base netdev's) is its own entry.
	for i, dst := range []string{rxe.IPv4, rxe.IPv6, rxe.VLAN.IPv4, rxe.IPv6LinkLocal + "%" + rxe.Netdev,
		rxe.IPv6LinkLocal + "%" + rxe.VLAN.Netdev} {
		d := netip.MustParseAddr(dst)
		p, err := resolver.Resolve(context.Background(), d, resolver.Options{})
		require.NoError(t, err)
		active, _, err := cmprobe.SGIDIndexes(netip.Addr{}, d, uint16(7700+i), 5*time.Second)
		require.NoError(t, err)
		assert.Equal(t, active, p.GIDIndex, "no source, %s:\n%s", dst, p.Explain())

		// The wildcard (a listener's bind address, passed on) binds no
		// address, but it is a source: the kernel CM binds it as given.
		wild := netip.IPv4Unspecified()
		if d.Is6() {
			wild = netip.IPv6Unspecified()
		}
		wp, err := resolver.Resolve(context.Background(), d, resolver.Options{Source: wild})
		if d.Zone() == rxe.VLAN.Netdev {
			// The kernel CM drops the zone for the wildcard, and the
			// route leaves by the base netdev, the first to hold the
			// address: not the zone's, which Resolve refuses (below,
			// the kernel CM's own attempt).
			assert.ErrorIs(t, err, resolver.ErrNoRoute, "source %v, %s", wild, dst)
			assert.ErrorContains(t, err, "leaves by "+rxe.Netdev)
			continue
		}
		require.NoError(t, err, "source %v, %s", wild, dst)
		wildActive, _, err := cmprobe.SGIDIndexes(wild, d, uint16(7710+i), 5*time.Second)
		require.NoError(t, err)
		assert.Equal(t, wildActive, wp.GIDIndex, "source %v, %s:\n%s", wild, dst, wp.Explain())
		assert.Equal(t, p.Source, wp.Source, "source %v, %s", wild, dst)
	}

	// What the refusal stands for: from the wildcard, the kernel CM's path
	// to the VLAN's link-local address leaves by the base netdev (the first
	// to hold that value), and the listener bound to the VLAN refuses it.
	vlanLL := netip.MustParseAddr(rxe.IPv6LinkLocal + "%" + rxe.VLAN.Netdev)
	_, _, err := cmprobe.SGIDIndexes(netip.IPv6Unspecified(), vlanLL, 7720, 5*time.Second)
	assert.ErrorContains(t, err, "REJECTED", "the kernel CM ignored the zone %s", rxe.VLAN.Netdev)
	_, _, err = cmprobe.SGIDIndexes(netip.Addr{}, vlanLL, 7721, 5*time.Second)
	assert.NoError(t, err, "with no source, the kernel CM takes the zone")

	p, err := resolver.Resolve(context.Background(), netip.MustParseAddr(rxe.IPv4), resolver.Options{})
	require.NoError(t, err)
	assert.Equal(t, rxe.IPv4, p.Source.String())
	assert.Equal(t, rxe.Netdev, p.Netdev)
	assert.Contains(t, p.Explain(), "which RDMA does not; like the kernel, leave by "+rxe.Netdev)
	assert.Equal(t, verbs.MTU1024, p.PathMTU, "1500-byte netdev")
	assert.Equal(t, verbs.MTU1024, p.ActiveMTU)

	vp, err := resolver.Resolve(context.Background(), netip.MustParseAddr(rxe.VLAN.IPv4), resolver.Options{})
	require.NoError(t, err)
	assert.Equal(t, rxe.VLAN.ID, vp.VLAN)
	assert.Equal(t, rxe.VLAN.Netdev, vp.Netdev)
}

func TestResolveHost(t *testing.T) {
	rxe := testbed.Require(t).MustDevice(t, "rxe0")
	p, err := resolver.ResolveHost(context.Background(), rxe.IPv6, resolver.Options{Network: "ip6"})
	require.NoError(t, err)
	assert.Equal(t, rxe.IPv6, p.Source.String())
	_, err = resolver.ResolveHost(context.Background(), "localhost", resolver.Options{Network: "ip4"})
	assert.ErrorIs(t, err, resolver.ErrLoopback, "localhost is 127.0.0.1, which no RDMA connection reaches")
}

func TestResolveIWARP(t *testing.T) {
	siw := testbed.Require(t).MustDevice(t, "siw0")
	p, err := resolver.Resolve(context.Background(), netip.MustParseAddr(siw.IPv4), resolver.Options{})
	require.NoError(t, err)
	assert.Equal(t, siw.Name, p.Device)
	assert.Equal(t, verbs.KindIWARP, p.Kind)
	assert.Equal(t, -1, p.GIDIndex, "no GID logic on iWARP")
	assert.Contains(t, p.Explain(), "iWARP: no GID to choose")

	// A source on rxe's netdev binds the path there, as the kernel CM
	// binds the id: the route via siw's netdev is not taken.
	rxe := testbed.Require(t).MustDevice(t, "rxe0")
	run(t, "ip", "route", "add", "10.56.0.0/24", "dev", siw.Netdev)
	t.Cleanup(func() { exec.Command("ip", "route", "del", "10.56.0.0/24").Run() })
	p, err = resolver.Resolve(context.Background(), netip.MustParseAddr("10.56.0.9"),
		resolver.Options{Source: netip.MustParseAddr(rxe.IPv4)})
	require.NoError(t, err)
	assert.Equal(t, rxe.Name, p.Device)
	assert.Equal(t, rxe.Netdev, p.Netdev)
}

// A manual RC connection built only from resolver output passes data.
func TestManualConnectionFromResolver(t *testing.T) {
	rxe := testbed.Require(t).MustDevice(t, "rxe0")
	testbed.CheckNoLeaks(t)
	testbed.CheckCount(t, "CM ids", rdmacm.OpenIDs)
	p, err := resolver.Resolve(context.Background(), netip.MustParseAddr(rxe.IPv4), resolver.Options{})
	require.NoError(t, err)
	dev, err := verbs.Open(p.Device)
	require.NoError(t, err)
	defer func() { require.NoError(t, dev.Close()) }()
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	defer func() { require.NoError(t, pd.Close()) }()
	cq, err := dev.CreateCQ(16)
	require.NoError(t, err)
	defer func() { require.NoError(t, cq.Close()) }()
	mr, err := pd.RegisterMemory(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	defer func() { require.NoError(t, mr.Close()) }()
	var qps [2]*verbs.QP
	for i := range qps {
		qps[i], err = pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		require.NoError(t, err)
		qp := qps[i]
		defer func() { require.NoError(t, qp.Close()) }()
	}
	for i, qp := range qps {
		peer := qps[1-i]
		steps, err := verbs.QPSetup{Type: verbs.QPTypeRC, Port: uint8(p.Port), SQPSN: uint32(i),
			Remote: verbs.Remote{QPN: peer.QPN, PSN: uint32(1 - i), GID: p.GID}, PathAttr: p.PathAttr()}.Steps()
		require.NoError(t, err)
		for _, s := range steps {
			require.NoError(t, qp.Modify(&s.Attr, s.Mask))
		}
	}
	copy(mr.Bytes(), "resolved")
	require.NoError(t, qps[1].PostRecv(verbs.RecvWR{ID: 1, SGEs: []verbs.SGE{mr.SGE(1000, 100)}}))
	require.NoError(t, qps[0].PostSend(verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGEs: []verbs.SGE{mr.SGE(0, 8)}}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := 0
	wcs := make([]verbs.WorkCompletion, 4)
	for got < 2 {
		n, err := cq.PollWait(ctx, wcs)
		require.NoError(t, err)
		for _, wc := range wcs[:n] {
			require.NoError(t, wc.Err())
		}
		got += n
	}
	assert.Equal(t, "resolved", string(mr.Bytes()[1000:1008]))
}

// A loopback (or unspecified) destination has no RDMA path: the kernel CM
// resolves its address to the first active port, then fails the route,
// and the resolver says so, naming the netdevs RDMA runs on.
func TestResolveLoopbackAgreesWithKernelCM(t *testing.T) {
	rxe := testbed.Require(t).MustDevice(t, "rxe0")
	testbed.CheckNoLeaks(t) // the failed dials' ids and resources too
	testbed.CheckCount(t, "CM ids", rdmacm.OpenIDs)
	for i, dst := range []string{"127.0.0.1", "::1", "0.0.0.0"} {
		d := netip.MustParseAddr(dst)
		_, err := resolver.Resolve(context.Background(), d, resolver.Options{})
		assert.ErrorIs(t, err, resolver.ErrLoopback, dst)
		assert.ErrorContains(t, err, rxe.Netdev, "it says where RDMA runs")
		// The kernel CM's view, through librdmacm: the address resolves,
		// the route does not.
		dl := rdmacm.Dialer{ResolveRetries: -1}
		_, kerr := dl.Dial(ctxFor(t, 10*time.Second), netip.AddrPortFrom(d, uint16(7800+i)).String())
		assert.ErrorIs(t, kerr, rdmacm.ErrRouteResolution, dst)
		assert.ErrorIs(t, kerr, syscall.ENODEV, dst)
	}
}

// On iWARP a route's preferred source may sit on another netdev than the
// one the route leaves by: the kernel CM takes the device by the egress
// netdev, and so does the resolver (it used to refuse the path). On RoCE
// the same route has no GID entry for the source, and the resolver says so.
func TestResolveIWARPSourceOffTheEgressAgreesWithKernelCM(t *testing.T) {
	tb := testbed.Require(t)
	siw := tb.MustDevice(t, "siw0")
	testbed.CheckNoLeaks(t)
	testbed.CheckCount(t, "CM ids", rdmacm.OpenIDs)
	run(t, "ip", "link", "add", "dummy-off", "type", "dummy")
	t.Cleanup(func() { exec.Command("ip", "link", "del", "dummy-off").Run() })
	run(t, "ip", "link", "set", "dummy-off", "up")
	run(t, "ip", "addr", "add", "10.77.0.1/32", "dev", "dummy-off")
	run(t, "ip", "route", "add", "10.88.0.0/24", "dev", siw.Netdev, "src", "10.77.0.1")
	t.Cleanup(func() { exec.Command("ip", "route", "del", "10.88.0.0/24").Run() })
	dst := netip.MustParseAddr("10.88.0.5")

	id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
	require.NoError(t, err)
	defer func() { require.NoError(t, id.Close()) }()
	require.NoError(t, id.ResolveAddr(netip.Addr{}, netip.AddrPortFrom(dst, 7900), 2*time.Second))
	ev, err := id.Event(ctxFor(t, 10*time.Second))
	require.NoError(t, err)
	require.Equal(t, rdmacm.EventAddrResolved, ev.Type, "the kernel CM: %v", ev.Err())
	assert.Equal(t, siw.Name, id.DeviceName())
	assert.Equal(t, "10.77.0.1", id.LocalAddr().Addr().String())

	p, err := resolver.Resolve(context.Background(), dst, resolver.Options{})
	require.NoError(t, err)
	assert.Equal(t, siw.Name, p.Device, "%s", p.Explain())
	assert.Equal(t, siw.Netdev, p.Netdev)
	assert.Equal(t, "10.77.0.1", p.Source.String())
	assert.Contains(t, p.Explain(), "iWARP takes the device by the egress netdev")

	rxe := tb.MustDevice(t, "rxe0")
	run(t, "ip", "route", "add", "10.89.0.0/24", "dev", rxe.Netdev, "src", "10.77.0.1")
	t.Cleanup(func() { exec.Command("ip", "route", "del", "10.89.0.0/24").Run() })
	_, err = resolver.Resolve(context.Background(), netip.MustParseAddr("10.89.0.5"), resolver.Options{})
	assert.ErrorIs(t, err, resolver.ErrNoGIDForSource, "RoCE: the source's GID is not on the egress netdev")
}

func printKernelCMDevice(addr string) int {
	a := netip.MustParseAddr(addr)
	id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer id.Close()
	if err := id.ResolveAddr(a, netip.AddrPortFrom(a, 7950), 2*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := id.Event(ctx)
	if err != nil || ev.Type != rdmacm.EventAddrResolved {
		fmt.Fprintln(os.Stderr, "resolve addr:", ev, err)
		return 1
	}
	fmt.Println(id.DeviceName())
	return 0
}

// kernelCMDevice is the device the kernel CM binds to for addr, asked in a
// process of its own: librdmacm keeps a context on every device it opened
// until the process exits, and a device cannot be deleted before.
func kernelCMDevice(t *testing.T, addr string) string {
	t.Helper()
	cmd := exec.CommandContext(ctxFor(t, time.Minute), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), cmDeviceEnv+"="+addr)
	out, err := cmd.Output()
	var stderr []byte
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = ee.Stderr
	}
	require.NoError(t, err, "asking the kernel CM: %s", stderr)
	return strings.TrimSpace(string(out))
}

// Two RDMA devices on one netdev (rxe and siw both take any Ethernet
// netdev): the kernel CM binds to the one registered first, whatever the
// names, and so must the resolver. A siw device whose name sorts before
// rxe0's, added after it, shows whether the name decides. This process
// must not open aaa0 through librdmacm (the kernel CM's view is asked in a
// child): the device's deletion would wait for the process to exit.
func TestResolveTwoDevicesOnOneNetdevAgreesWithKernelCM(t *testing.T) {
	rxe := testbed.Require(t).MustDevice(t, "rxe0")
	run(t, "rdma", "link", "add", "aaa0", "type", "siw", "netdev", rxe.Netdev)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "rdma", "link", "delete", "aaa0").CombinedOutput()
		assert.NoError(t, err, "rdma link delete aaa0: %s", out)
	})
	testbed.WaitPortActive(t, "aaa0")

	for _, addr := range []string{rxe.IPv4, rxe.IPv6} {
		kernel := kernelCMDevice(t, addr)
		a := netip.MustParseAddr(addr)
		p, err := resolver.Resolve(context.Background(), a, resolver.Options{Source: a})
		require.NoError(t, err)
		assert.Equal(t, kernel, p.Device, "resolver vs kernel CM for %s:\n%s", addr, p.Explain())
		other := "aaa0"
		if kernel == "aaa0" {
			other = rxe.Name
		}
		assert.Contains(t, p.Explain(), other+" port 1 also serves "+rxe.Netdev)
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
