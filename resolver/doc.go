// Package resolver finds the RDMA path to a destination address the way the
// kernel's RDMA CM does, and explains every decision: the route and egress
// netdev, the RDMA device and port behind it, the RoCE GID index, GID and
// type, the VLAN, and the MTU a RoCE packet can use.
//
// Choosing the RoCE GID index is the commonest cause of RDMA connections that
// fail at INIT→RTR (EINVAL, ENETUNREACH) or connect and then fail every
// completion (RETRY_EXC_ERR): index 0 is the link-local GID, RoCE v1 and v2
// entries sit side by side, VLAN uppers add entries with the same values, and
// indices move as addresses change. The rule here is the kernel's: the entry
// whose value is the source address, whose type is the port's default (RoCE
// v2 where supported) and whose netdev is the egress netdev (or, for a
// source the caller gave, the netdev holding it, to which the kernel CM
// binds the id first), lowest index on ties. There is never a silent fallback to index 0: when nothing qualifies
// the error says why and what to do.
//
// [Resolve] the path right before connecting: indices move when addresses or
// netdevs change ([verbs.EventGIDChange] tells).
package resolver
