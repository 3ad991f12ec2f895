package resolver

import (
	"context"
	"net/netip"
)

// ResolveHost looks host up (a name or an address) in the family
// opts.Network names and resolves the first address, or, with
// opts.Source, the first of the source's family. It needs Linux, as
// [Resolve] does.
func ResolveHost(ctx context.Context, host string, opts Options) (*Path, error) {
	return resolveHost(ctx, host, opts)
}

// Resolve finds the RDMA path to dst as the kernel CM would: route lookup
// for dst (with the source and interface if given) gives the egress netdev
// and source address; the RDMA port is the one with GID entries for that
// netdev; the GID entry is the one holding the source address, of the port's
// default type, tagged with the egress netdev. A destination on this host
// routes through lo, which RDMA does not use: as the kernel does, the path
// then leaves by the netdev that owns the address. A loopback or
// unspecified destination (127.0.0.1, ::1, 0.0.0.0) fails with
// [ErrLoopback]: the kernel CM resolves its address but not its route.
//
// It runs in the caller's network namespace. On failure the error is a
// *[ResolveError] whose Path explains what was decided before it failed.
//
// It needs Linux: elsewhere it returns an error matching [errors.ErrUnsupported].
func Resolve(ctx context.Context, dst netip.Addr, opts Options) (*Path, error) {
	return resolve(ctx, dst, opts)
}
