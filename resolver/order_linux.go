package resolver

import "github.com/vishvananda/netlink"

// orderByRegistration puts the ports in the order the kernel CM searches
// them, by their devices' RDMA netlink indexes. Without the indexes (no
// RDMA netlink) the name order stays, and Ordered is false.
func orderByRegistration(t *Table) {
	links, err := netlink.RdmaLinkList()
	if err != nil {
		return
	}
	index := make(map[string]int, len(links))
	for _, l := range links {
		index[l.Attrs.Name] = int(l.Attrs.Index)
	}
	t.orderBy(index)
}
