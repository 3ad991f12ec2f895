package resolver

import (
	"io/fs"
	"net/netip"
)

// Options refine [Resolve].
type Options struct {
	// Source is the local address to send from (rdma_resolve_addr's source).
	// Default: the route's preferred source. As in the kernel CM, a given
	// source binds the path to the netdev that holds it (a link-local
	// one's zone names it, by name or index; any other address's zone is
	// ignored, as the kernel CM ignores it): the route is looked up out of
	// that netdev, and the GID entry is that netdev's. The wildcard (0.0.0.0, ::) binds no
	// netdev and the route's source is taken; but, as in the kernel CM, a
	// link-local destination's zone is then not used: the route is looked
	// up without it, and Resolve fails if it leaves by another netdev.
	Source netip.Addr
	// Interface makes the route leave by this netdev (a name, or an
	// ifindex). The kernel CM has
	// no such option: with a Source, whose netdev decides there, an
	// Interface other than that netdev is refused.
	Interface string
	// RoCE is the GID type; default: the port's default (see [DefaultGIDType]).
	RoCE RoCEVersion
	// Table is the GID tables to choose from; nil reads them ([ReadTable]).
	Table *Table
	// Configfs is the configfs root for default_roce_mode; nil reads
	// /sys/kernel/config when present.
	Configfs fs.FS
	// Network is the address family [ResolveHost] looks names up in: "ip4",
	// "ip6" or "ip" (default: either, the first answer of Source's family,
	// or the first answer).
	Network string
}
