package resolver_test

import (
	"fmt"
	"net/netip"

	"github.com/rdmago/rdmago/resolver"
	"github.com/rdmago/rdmago/verbs"
)

// A port with a VLAN upper: the VLAN's link-local GID has the same value as
// the base netdev's, at another index. The kernel CM's rule matches value,
// type and netdev.
func ExampleSelectGID() {
	gid := func(s string) verbs.GID { return verbs.GIDFromIP(netip.MustParseAddr(s)) }
	port := &resolver.Port{Device: "rxe0", Port: 1, Transport: verbs.TransportIB, LinkLayer: verbs.LinkLayerEthernet,
		GIDs: []verbs.GIDEntry{
			{Index: 0, GID: gid("fe80::1"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"},
			{Index: 1, GID: gid("10.0.0.1"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"},
			{Index: 2, GID: gid("fe80::1"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0.100"},
		}}
	typ, why := resolver.DefaultGIDType(port, nil)
	fmt.Println(typ, "because", why)
	e, candidates, _ := resolver.SelectGID(port, netip.MustParseAddr("fe80::1%eth0.100"), "eth0.100", typ)
	fmt.Println("index", e.Index)
	for _, c := range candidates {
		if !c.Chosen {
			fmt.Printf("  not %d: %s\n", c.Entry.Index, c.Rejected)
		}
	}
	_, _, err := resolver.SelectGID(port, netip.MustParseAddr("10.0.0.1"), "eth0.100", typ)
	fmt.Println(err)
	// Output:
	// RoCE v2 because the port supports RoCE v2, the kernel CM's preferred type
	// index 2
	//   not 0: belongs to netdev eth0; the route leaves by eth0.100
	//   not 1: holds ::ffff:10.0.0.1, not the source address fe80::1%eth0.100
	// resolver: rxe0 port 1: source 10.0.0.1, egress netdev eth0.100, RoCE v2: the source address is not on the netdev the route leaves by: 10.0.0.1 belongs to eth0 but the route leaves by eth0.100 (the kernel CM fails this with ADDR_ERROR -ENODEV); add a route via eth0, or use a source address on eth0.100
}
