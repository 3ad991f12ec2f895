package resolver_test

import (
	"context"
	"errors"
	"fmt"
	"log"
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

// The path to a peer as the kernel CM would take it, and why; a loopback
// destination has none.
func ExampleResolve() {
	ctx := context.Background()
	path, err := resolver.Resolve(ctx, netip.MustParseAddr("10.10.0.2"), resolver.Options{})
	if err != nil {
		var re *resolver.ResolveError
		if errors.As(err, &re) {
			fmt.Print(re.Path.Explain()) // what was decided before it failed
		}
		log.Fatal(err)
	}
	fmt.Printf("%s port %d, GID index %d (%v), path MTU %v\n", path.Device, path.Port, path.GIDIndex, path.GIDType, path.PathMTU)
	fmt.Print(path.Explain())

	_, err = resolver.Resolve(ctx, netip.MustParseAddr("127.0.0.1"), resolver.Options{})
	fmt.Println(errors.Is(err, resolver.ErrLoopback))
}
