package testbed

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"
)

// SilentHost makes, inside the guest, an IPv4 address on d's subnet (its
// last byte host) that resolves and answers nothing: the packets go out
// and vanish, so a connect to it can only time out. On RoCE it adds a
// permanent neighbour entry on d's netdev (siw's dummy netdev needs none),
// and it lowers net.ipv4.tcp_syn_retries to 1, so that an iWARP connect,
// which the kernel keeps trying over TCP, gives up in about 3 s instead of
// 2 minutes. Both are undone when tb ends.
func SilentHost(tb testing.TB, d Device, host byte) netip.Addr {
	tb.Helper()
	own, err := netip.ParseAddr(d.IPv4)
	if err != nil || !own.Is4() {
		tb.Fatalf("testbed: %s has no IPv4 address to put a silent host beside (%q)", d.Name, d.IPv4)
	}
	b := own.As4()
	b[3] = host
	ip := netip.AddrFrom4(b)
	if d.Kind != "siw" {
		mac := fmt.Sprintf("02:00:00:00:00:%02x", host)
		out, err := exec.Command("ip", "neigh", "replace", ip.String(), "lladdr", mac, "dev", d.Netdev, "nud", "permanent").CombinedOutput()
		if err != nil {
			tb.Fatalf("testbed: a neighbour entry for the silent host %v on %s: %v\n%s", ip, d.Netdev, err, out)
		}
		tb.Cleanup(func() { exec.Command("ip", "neigh", "del", ip.String(), "dev", d.Netdev).Run() })
	}
	const knob = "/proc/sys/net/ipv4/tcp_syn_retries"
	old, err := os.ReadFile(knob)
	if err == nil {
		err = os.WriteFile(knob, []byte("1"), 0o644)
	}
	if err != nil {
		tb.Fatalf("testbed: lowering %s for the silent host: %v", knob, err)
	}
	tb.Cleanup(func() { os.WriteFile(knob, old, 0o644) })
	return ip
}
