//go:build !linux

package resolver

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
)

// errNotLinux: the resolver reads Linux's routing tables over netlink.
var errNotLinux = fmt.Errorf("resolver: resolving an RDMA path reads Linux's routes and neighbours over netlink: %w", errors.ErrUnsupported)

func resolveHost(ctx context.Context, host string, opts Options) (*Path, error) {
	return nil, errNotLinux
}

func resolve(ctx context.Context, dst netip.Addr, opts Options) (*Path, error) {
	return nil, errNotLinux
}
