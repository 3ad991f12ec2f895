package resolver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/rdmago/rdmago/verbs"
)

func resolveHost(ctx context.Context, host string, opts Options) (*Path, error) {
	network := opts.Network
	if network == "" {
		network = "ip"
	}
	if network != "ip" && network != "ip4" && network != "ip6" {
		return nil, fmt.Errorf("resolver: Options.Network %q: want ip, ip4 or ip6", network)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if (network == "ip4" && !a.Unmap().Is4()) || (network == "ip6" && a.Unmap().Is4()) {
			return nil, fmt.Errorf("resolver: %v is not an %s address", a, network)
		}
		return Resolve(ctx, a, opts)
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, network, host)
	if err != nil {
		return nil, fmt.Errorf("resolver: looking up %q (%s): %w", host, network, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolver: %q has no %s address", host, network)
	}
	return resolve(ctx, pickAddr(addrs, opts.Source), opts)
}

// pathMTU is the largest MTU a path's port and netdev allow, and why. On
// Ethernet (RoCE, iWARP) the netdev's MTU must hold a packet and its
// headers (iboe_get_mtu); IPoIB's netdev MTU is the IB MTU less its own
// 4-byte header (datagram mode) or unrelated to it (connected mode), so on
// InfiniBand the port's active MTU alone counts.
func pathMTU(kind verbs.Kind, netdevMTU int, active verbs.MTU) (verbs.MTU, string) {
	if kind == verbs.KindInfiniBand {
		if active.Valid() {
			return active, "the port's active MTU (InfiniBand: the subnet manager's path record may give a lower one)"
		}
		// Not read (sysfs): datagram mode's netdev MTU is the IB MTU
		// less 4 bytes; connected mode's exceeds every IB MTU.
		return verbs.MTUAtMost(netdevMTU + 4), fmt.Sprintf("InfiniBand, port active MTU not read: the largest IB MTU that IPoIB's netdev MTU %d "+
			"and its 4-byte header allow", netdevMTU)
	}
	room := verbs.MTUForNetdev(netdevMTU)
	mtu := room
	if active.Valid() && active < room {
		mtu = active
	}
	return mtu, fmt.Sprintf("netdev MTU %d leaves room for %v, port active MTU %v", netdevMTU, room, mtuText(active))
}

// sourceText is a source as given, for an error: "none" when none was.
func sourceText(source netip.Addr) string {
	if !source.IsValid() {
		return "none"
	}
	return source.String()
}

// pickAddr takes the first of a lookup's addresses, or, given a source (a
// wildcard too), the first of the source's family, as a dialer would: the
// lookup's first answer may be of the other.
func pickAddr(addrs []netip.Addr, source netip.Addr) netip.Addr {
	if s := source.Unmap(); s.IsValid() {
		for _, a := range addrs {
			if a.Unmap().Is4() == s.Is4() {
				return a.Unmap()
			}
		}
	}
	return addrs[0].Unmap()
}

func resolve(ctx context.Context, dst netip.Addr, opts Options) (*Path, error) {
	p := &Path{Destination: dst, GIDIndex: -1, HopLimit: 64}
	fail := func(err error) (*Path, error) {
		p.note("FAILED: %v", err)
		return nil, &ResolveError{Path: p, Err: err}
	}
	if !dst.IsValid() {
		return fail(fmt.Errorf("resolver: no destination address"))
	}
	// An IPv4-mapped address (a dual-stack socket's view of an IPv4 peer)
	// is the IPv4 address: rdmacm hands it to the kernel CM so (the kernel
	// would take it as IPv6), and its GID is the same.
	if dst.Is4In6() {
		dst = dst.Unmap()
		p.Destination = dst
	}
	if opts.Source.Is4In6() {
		opts.Source = opts.Source.Unmap()
	}
	if s := opts.Source; s.IsValid() && s.Is4() != dst.Is4() {
		return fail(fmt.Errorf("resolver: source %v and destination %v are of different families; "+
			"the kernel CM refuses the pair with EINVAL", s, dst))
	}
	// A wildcard (a listener's bind address, say) names a family but no
	// address: the kernel CM binds the id to no netdev for it (cma_any_addr)
	// and takes the route's source, as we do. A zone on it is ignored (only
	// a link-local source's scope binds). But it is a source: the
	// destination's scope, which the kernel copies into an id given no
	// source (cma_bind_addr), is not copied into one bound to the wildcard,
	// so a link-local destination's route is looked up with no netdev, and
	// its zone counts only if that route happens to leave by it (checked
	// below).
	given, wildZone := opts.Source, ""
	if s := opts.Source; s.IsValid() && s.WithZone("").IsUnspecified() {
		p.note("source %v: the wildcard, which names no address; the route's source is taken", s)
		if z := dst.Zone(); z != "" && dst.IsLinkLocalUnicast() {
			wildZone = zoneNetdev(z)
			dst = dst.WithZone("")
			p.note("zone %q of %v: not used, as the kernel CM takes a destination's scope only when no source is given "+
				"(cma_bind_addr): the route is looked up without it", wildZone, dst)
		}
		opts.Source = netip.Addr{}
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	table := opts.Table
	if table == nil {
		var err error
		if table, err = ReadTable(); err != nil {
			return fail(err)
		}
	}
	if len(table.Unread) > 0 {
		p.note("left out, as they could not be read: %s", strings.Join(table.Unread, "; "))
	}
	if dst.IsLoopback() || dst.IsUnspecified() {
		return fail(fmt.Errorf("resolver: %v: %w: the kernel CM takes it as this host (cma_resolve_loopback) and binds an "+
			"id without source to the first active port, GID index 0, but then fails rdma_resolve_route with ENODEV "+
			"on RoCE (no netdev is bound); with a source, the connect request reaches no listener. Reach this host "+
			"by an address of a netdev with an RDMA device (%s)", dst, ErrLoopback, rdmaNetdevs(table)))
	}

	// A given source binds the path to the netdev that holds it, as the
	// kernel CM binds the id before it resolves (rdma_bind_addr_dst: a
	// link-local source's zone, otherwise the netdev rdma_translate_ip
	// finds): the route is looked up out of that netdev, and the GID entry
	// is that netdev's (cma_acquire_dev_by_src_ip), whatever the route.
	var bound netlink.Link
	if s := opts.Source; s.IsValid() && !s.IsLoopback() {
		if s.Is6() && s.IsLinkLocalUnicast() && s.Zone() == "" {
			return fail(fmt.Errorf("resolver: source %v: %w: a link-local source needs its zone (%v%%netdev); "+
				"the kernel CM refuses it with EINVAL", s, ErrNoGIDForSource, s))
		}
		l, err := linkWithAddr(s)
		if err != nil {
			return fail(fmt.Errorf("resolver: source %v: %w: no netdev holds it (%v); the kernel CM's bind fails with "+
				"EADDRNOTAVAIL", s, ErrNoGIDForSource, err))
		}
		bound = l
		if z := s.Zone(); z != "" && !s.IsLinkLocalUnicast() {
			p.note("zone %q of source %v: ignored, as the kernel CM takes a scope only from a link-local address "+
				"(cma_check_linklocal)", z, s.WithZone(""))
		}
		p.note("source %v: given; it binds the path to %s, which holds it", s, l.Attrs().Name)
		if i := opts.Interface; i != "" {
			if il, err := linkByZone(i); err != nil || il.Attrs().Index != l.Attrs().Index {
				return fail(fmt.Errorf("resolver: source %v is on %s, but Options.Interface is %q: %w: the kernel CM has "+
					"no interface option, and a source binds the path to the netdev that holds it (the route is looked "+
					"up out of it); leave Interface out, or give a source on %s", s, l.Attrs().Name, i,
					ErrSourceNotOnEgress, i))
			}
		}
	}

	// Route, looked up as the kernel CM does: out of the bound netdev,
	// and as uid 0 (the CM's lookups carry no uid; ip rule uidrange would
	// otherwise apply the caller's).
	var root uint32
	ro := &netlink.RouteGetOptions{UID: &root}
	if opts.Interface != "" {
		ro.Oif = zoneNetdev(opts.Interface) // a name or an ifindex, as a zone
	}
	if opts.Source.IsValid() {
		ro.SrcAddr = net.IP(opts.Source.WithZone("").AsSlice())
	}
	if bound != nil && ro.Oif == "" {
		ro.Oif = bound.Attrs().Name
	}
	if z := dst.Zone(); z != "" && ro.Oif == "" {
		if dst.IsLinkLocalUnicast() {
			ro.Oif = zoneNetdev(z)
		} else {
			p.note("zone %q of %v: ignored, as the kernel CM takes a scope only from a link-local address (cma_bind_addr)",
				z, dst.WithZone(""))
		}
	}
	if z := dst.Zone(); z != "" && dst.IsLinkLocalUnicast() && ro.Oif != "" && ro.Oif != zoneNetdev(z) {
		by := "Options.Interface"
		if opts.Interface == "" {
			by = "the source's netdev"
		}
		p.note("zone %q of %v: not used; %s (%s) decides where the route leaves", z, dst.WithZone(""), by, ro.Oif)
	}
	if dst.Is6() && dst.IsLinkLocalUnicast() && ro.Oif == "" && wildZone == "" {
		return fail(fmt.Errorf("resolver: %v: %w: a link-local destination needs its zone (%v%%netdev) or Options.Interface",
			dst, ErrNoRoute, dst))
	}
	routes, err := netlink.RouteGetWithOptions(net.IP(dst.WithZone("").AsSlice()), ro)
	if err != nil || len(routes) == 0 {
		why := "no route came back"
		if err != nil {
			why = err.Error()
		}
		return fail(fmt.Errorf("resolver: %v (source %v, interface %q): %w: %s; check 'ip route get %v'",
			dst, sourceText(given), opts.Interface, ErrNoRoute, why, dst.WithZone("")))
	}
	r := routes[0]
	link, err := netlink.LinkByIndex(r.LinkIndex)
	if err != nil {
		return fail(fmt.Errorf("resolver: route to %v leaves by ifindex %d: %w", dst, r.LinkIndex, err))
	}
	desc := fmt.Sprintf("route to %v: dev %s", dst, link.Attrs().Name)
	if r.Gw != nil {
		p.Gateway, _ = netip.AddrFromSlice(r.Gw)
		p.Gateway = p.Gateway.Unmap()
		desc += fmt.Sprintf(" via %v", p.Gateway)
	}
	if r.Src != nil {
		desc += fmt.Sprintf(" src %v", r.Src)
	}
	p.note("%s", desc)

	src := opts.Source
	if src.IsValid() {
		if bound == nil {
			p.note("source %v: given", src)
		}
	} else if a, ok := netip.AddrFromSlice(r.Src); ok {
		// A link-local one takes the egress netdev's name as its zone
		// below: the destination's zone, unless Options.Interface sent
		// the route elsewhere.
		src = a.Unmap()
		p.note("source %v: the route's preferred source", src)
	}
	if link.Attrs().Flags&net.FlagLoopback != 0 {
		// Local destination: RDMA does not run on lo; the kernel takes
		// the netdev that holds the destination (rdma_set_src_addr_rcu),
		// and fails when none does (a route via lo to an address no
		// netdev holds).
		owner := dst
		l, err := linkWithAddr(owner)
		if err != nil {
			return fail(fmt.Errorf("resolver: the route to %v uses lo, but no netdev holds %v (%v): %w; "+
				"the kernel CM fails this with ADDR_ERROR -ENODEV", dst, owner, err, ErrNoRDMADevice))
		}
		p.note("%v is on this host: the route uses lo, which RDMA does not; like the kernel, leave by %s, which holds %v",
			dst, l.Attrs().Name, owner)
		link = l
		if !src.IsValid() {
			src = dst.WithZone("")
		}
	}
	if wildZone != "" {
		if name := link.Attrs().Name; name != wildZone {
			by := "the route it looks up without the zone leaves by " + name
			if opts.Interface != "" {
				by = "Options.Interface sends the route by " + name
			}
			return fail(fmt.Errorf("resolver: %v%%%s from source %q: %w by %s: the kernel CM does not use the destination's "+
				"zone for a wildcard source (cma_bind_addr takes a scope only when no source is given), and %s; give no "+
				"source, or a link-local source of %s with its zone", dst, wildZone, given, ErrNoRoute, wildZone, by, wildZone))
		}
		p.note("the route leaves by %s, the zone's netdev, all the same", wildZone)
	}
	if !src.IsValid() {
		if src, err = pickSource(link, dst); err != nil {
			return fail(err)
		}
		p.note("source %v: an address of %s in the destination's scope (the route named none)", src, link.Attrs().Name)
	}
	if src.Is6() && src.IsLinkLocalUnicast() && src.Zone() == "" {
		src = src.WithZone(link.Attrs().Name)
	}
	p.Source = src
	p.Netdev, p.NetdevIndex, p.NetdevMTU = link.Attrs().Name, link.Attrs().Index, link.Attrs().MTU
	if v, ok := link.(*netlink.Vlan); ok {
		p.VLAN = v.VlanId
		p.note("egress netdev %s (ifindex %d, MTU %d) is VLAN %d", p.Netdev, p.NetdevIndex, p.NetdevMTU, p.VLAN)
	} else {
		p.note("egress netdev %s (ifindex %d, MTU %d)", p.Netdev, p.NetdevIndex, p.NetdevMTU)
	}

	// Port: the one serving the bound netdev (the CM acquires the device
	// at bind time), else the egress.
	gidLink := link
	if bound != nil {
		gidLink = bound
	}
	gidNetdev := gidLink.Attrs().Name
	ports := findPorts(table, gidNetdev, gidLink.Attrs().HardwareAddr)
	if len(ports) == 0 {
		unread := ""
		if len(table.Unread) > 0 {
			unread = " (of the devices read; these could not be: " + strings.Join(table.Unread, "; ") + ")"
		}
		lower := gidNetdev
		if v, ok := gidLink.(*netlink.Vlan); ok {
			// rxe takes no VLAN netdev: the lower one's device carries
			// the VLAN's GID entries.
			if parent, err := netlink.LinkByIndex(v.Attrs().ParentIndex); err == nil {
				lower = parent.Attrs().Name
			}
		}
		return fail(fmt.Errorf("resolver: %s (holding %v): %w%s; create one (rdma link add rxe0 type rxe netdev %s) "+
			"or reach %v by a netdev that has one", gidNetdev, src, ErrNoRDMADevice, unread, lower, dst))
	}
	// As cma_acquire_dev_by_src_ip: the first port, in the devices'
	// registration order, that has an entry for the source of its default
	// GID type on the netdev; an iWARP or InfiniBand port qualifies by
	// serving the netdev. When none has, the first one's error is the
	// answer.
	chosen := 0
	for i, cand := range ports {
		if cand.Kind() != verbs.KindRoCE {
			chosen = i
			break
		}
		want, _ := DefaultGIDType(cand, configfsOr(opts.Configfs))
		if opts.RoCE != RoCEDefault {
			want = opts.RoCE.gidType()
		}
		if _, _, err := SelectGID(cand, src, gidNetdev, want); err == nil {
			chosen = i
			break
		}
	}
	port := ports[chosen]
	p.Device, p.Port, p.Kind, p.KindName = port.Device, port.Port, port.Kind(), port.Kind().String()
	p.ActiveMTU = port.ActiveMTU
	for _, o := range ports[:chosen] {
		p.note("note: %v also serves %s, and comes first, but has no GID entry for %v of its GID type: passed over, as "+
			"the kernel CM tries each port (cma_acquire_dev_by_src_ip)", o, gidNetdev, src)
	}
	p.note("RDMA device %v (%v) serves %s", port, p.Kind, gidNetdev)
	if port.State != verbs.PortActive && port.State != 0 { // 0: not read
		p.note("note: port %v is %v: connections over it wait until it is ACTIVE (check the netdev's link)", port, port.State)
	}
	for _, o := range ports[chosen+1:] {
		if table.Ordered {
			p.note("note: %v also serves %s; the kernel CM takes the device registered first, %s (index %d, %s's %d)",
				o, gidNetdev, port.Device, port.DeviceIndex, o.Device, o.DeviceIndex)
		} else {
			p.note("note: %v also serves %s; the kernel CM takes the device registered first, which this table "+
				"does not tell (Table.Ordered is false): the first listed was taken", o, gidNetdev)
		}
	}

	// MTU.
	room := verbs.MTUForNetdev(p.NetdevMTU)
	var why string
	p.PathMTU, why = pathMTU(p.Kind, p.NetdevMTU, p.ActiveMTU)
	p.note("path MTU %v: %s (the peer's must be taken into account too)", p.PathMTU, why)

	switch p.Kind {
	case verbs.KindIWARP:
		// The kernel CM takes an iWARP device by the egress netdev's MAC
		// (copy_src_l2_addr, then cma_acquire_dev_by_src_ip) and never
		// looks the source address up on it: a route's preferred source
		// held by another netdev is fine, and the iWARP TCP stream is sent
		// from it (Linux's weak host model). RoCE, whose GID is the
		// address, has no such freedom.
		if owner, err := linkWithAddr(src); bound == nil && (err != nil || owner.Attrs().Index != p.NetdevIndex) {
			where := "held by no netdev"
			if err == nil {
				where = "on " + owner.Attrs().Name
			}
			p.note("source %v is %s, not on the egress %s: iWARP takes the device by the egress netdev, "+
				"and the TCP stream leaves from %v all the same", src, where, p.Netdev, src)
		}
		p.note("iWARP: no GID to choose; the iWARP CM connects by IP address and moves the QP itself")
		return p, nil
	case verbs.KindInfiniBand:
		p.GIDIndex, p.GID, p.GIDType = 0, port.GIDs[0].GID, verbs.GIDTypeIB
		p.GIDText, p.TypeName = p.GID.String(), p.GIDType.String()
		p.note("InfiniBand: addressed by LID within the subnet; a GRH is needed only across subnets, "+
			"and then the port GID (index 0, %v) is the source", p.GID)
		return p, nil
	}

	if room == 0 {
		return fail(fmt.Errorf("resolver: %s's MTU %d leaves no room for RoCE's smallest MTU (256 bytes and 96 of "+
			"headers): %w; the kernel CM fails the route with EINVAL (iboe_get_mtu)", p.Netdev, p.NetdevMTU, ErrMTUTooSmall))
	}

	// GID.
	want, why := DefaultGIDType(port, configfsOr(opts.Configfs))
	raised := false
	switch {
	case opts.RoCE != RoCEDefault:
		want, why = opts.RoCE.gidType(), "asked for"
		if want == verbs.GIDTypeRoCEv1 && p.Gateway.IsValid() {
			why += fmt.Sprintf("; but RoCE v1 is not routable, and the route goes via %v: its packets will not "+
				"get there (the kernel CM would take RoCE v2)", p.Gateway)
		}
	case want == verbs.GIDTypeRoCEv1 && p.Gateway.IsValid():
		// rdma_set_src_addr_rcu marks a path with a gateway as an IP
		// network, and cma_resolve_iboe_route raises the path record's
		// GID type to RoCE v2 for it, whatever the port's default.
		want, why = verbs.GIDTypeRoCEv2, fmt.Sprintf("the port's default is RoCE v1 (%s), but the route goes via %v "+
			"and RoCE v1 is not routable: the kernel CM's path record takes RoCE v2 (cma_resolve_iboe_route)", why, p.Gateway)
		raised = true
	}
	p.note("GID type %v: %s", want, why)
	entry, cands, err := SelectGID(port, src, gidNetdev, want)
	p.Candidates = cands
	for _, c := range cands {
		if c.Chosen {
			p.note("  index %d %v %v %s: chosen (source address, %v, netdev %s)", c.Entry.Index, c.Entry.GID, c.Entry.Type,
				orUnknown(c.Entry.Netdev), want, gidNetdev)
		} else {
			p.note("  index %d %v %v %s: %s", c.Entry.Index, c.Entry.GID, c.Entry.Type, orUnknown(c.Entry.Netdev), c.Rejected)
		}
	}
	if err != nil && raised && errors.Is(err, ErrGIDTypeUnavailable) {
		err = fmt.Errorf("resolver: %v: %w: the route goes via %v, for which the kernel CM takes RoCE v2 whatever the "+
			"port's default, and the port has no RoCE v2 entry for %v; reach %v without a gateway, or use a port with "+
			"RoCE v2", port, ErrGIDTypeUnavailable, p.Gateway, src, dst)
	}
	if err != nil {
		return fail(err)
	}
	p.GIDIndex, p.GID, p.GIDType = entry.Index, entry.GID, entry.Type
	p.GIDText, p.TypeName = entry.GID.String(), entry.Type.String()
	p.note("GID index %d", p.GIDIndex)
	return p, nil
}

func mtuText(m verbs.MTU) string {
	if !m.Valid() {
		return "unknown (sysfs does not publish it)"
	}
	return m.String()
}

func configfsOr(f fs.FS) fs.FS {
	if f != nil {
		return f
	}
	if _, err := os.Stat(ConfigfsRoot + "/rdma_cm"); err == nil {
		return os.DirFS(ConfigfsRoot)
	}
	return nil
}

// findPorts returns the ports serving netdev, in the table's order: a RoCE
// port with GID entries tagged with it; an iWARP port bound to it (by ndev
// name where the kernel gives one, else by the MAC its GID holds); an
// InfiniBand port whose GID an IPoIB netdev carries in the last 16 bytes of
// its 20-byte address.
func findPorts(t *Table, netdev string, hw net.HardwareAddr) []*Port {
	var found []*Port
	for i := range t.Ports {
		p := &t.Ports[i]
		for _, e := range p.GIDs {
			byName := e.Netdev == netdev
			byMAC := p.Kind() == verbs.KindIWARP && e.Netdev == "" && len(hw) == 6 && bytes.Equal(e.GID[:6], hw)
			byIPoIB := p.Kind() == verbs.KindInfiniBand && len(hw) == 20 && bytes.Equal(e.GID[:], hw[4:])
			if byName || byMAC || byIPoIB {
				found = append(found, p)
				break
			}
		}
	}
	return found
}

// linkWithAddr returns the netdev holding a. A link-local address's zone
// names it: such a value may sit on several netdevs (a VLAN upper inherits
// its parent's MAC, and so its link-local address). Any other address's
// zone is ignored, as the kernel CM ignores its scope (cma_check_linklocal)
// and finds the netdev by the address (rdma_translate_ip).
func linkWithAddr(a netip.Addr) (netlink.Link, error) {
	if z := a.Zone(); z != "" && a.IsLinkLocalUnicast() {
		return linkByZone(z)
	}
	a = a.WithZone("").Unmap()
	family := netlink.FAMILY_V4
	if a.Is6() {
		family = netlink.FAMILY_V6
	}
	addrs, err := netlink.AddrList(nil, family)
	if err != nil {
		return nil, err
	}
	for _, ad := range addrs {
		if x, ok := netip.AddrFromSlice(ad.IP); ok && x.Unmap() == a {
			return netlink.LinkByIndex(ad.LinkIndex)
		}
	}
	return nil, errors.New("address not configured")
}

// linkByZone is the netdev a zone names: by name, or by ifindex when it
// is a number (the sin6_scope_id the kernel takes).
func linkByZone(z string) (netlink.Link, error) {
	l, err := netlink.LinkByName(z)
	if err != nil {
		if i, perr := strconv.Atoi(z); perr == nil && i > 0 {
			return netlink.LinkByIndex(i)
		}
	}
	return l, err
}

// zoneNetdev is the name of the netdev a zone names, or the zone itself
// when no netdev answers to it (the lookups then say so).
func zoneNetdev(z string) string {
	if l, err := linkByZone(z); err == nil {
		return l.Attrs().Name
	}
	return z
}

// pickSource chooses an address of link in the destination's family and
// scope, for routes without a preferred source (often IPv6).
func pickSource(link netlink.Link, dst netip.Addr) (netip.Addr, error) {
	family := netlink.FAMILY_V4
	if dst.Is6() && !dst.Is4In6() {
		family = netlink.FAMILY_V6
	}
	addrs, err := netlink.AddrList(link, family)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("resolver: addresses of %s: %w", link.Attrs().Name, err)
	}
	for _, ad := range addrs {
		a, ok := netip.AddrFromSlice(ad.IP)
		if ok && a.IsLinkLocalUnicast() == dst.IsLinkLocalUnicast() {
			return a.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("resolver: %s has no address to reach %v from: %w", link.Attrs().Name, dst, ErrNoGIDForSource)
}

// rdmaNetdevs names the netdevs the table's ports serve, for an error
// that says where RDMA does run on this host.
func rdmaNetdevs(t *Table) string {
	var names []string
	for _, p := range t.Ports {
		for _, e := range p.GIDs {
			if e.Netdev != "" && !slices.Contains(names, e.Netdev) {
				names = append(names, e.Netdev)
			}
		}
	}
	if len(names) == 0 {
		return "none has one"
	}
	return strings.Join(names, ", ")
}
