package stream

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
)

// Resolver looks up a host name's addresses; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// dialAddrs are the addresses to try, in order, for a dial to address
// ("host:port") on network: the address itself when host is numeric, else
// what r finds for the name, keeping to network's family ("tcp4",
// "tcp6"). The port must be numeric: rdma_cm has no services.
func dialAddrs(ctx context.Context, r Resolver, network, address string) ([]netip.AddrPort, error) {
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("address %q: the port must be a number from 0 to 65535", address)
	}
	fits := func(a netip.Addr) bool {
		switch network {
		case "tcp4":
			return a.Is4() || a.Is4In6()
		case "tcp6":
			return a.Is6() && !a.Is4In6()
		}
		return true
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !fits(a) {
			return nil, fmt.Errorf("address %q is not of network %s", address, network)
		}
		return []netip.AddrPort{netip.AddrPortFrom(a.Unmap(), uint16(port))}, nil
	}
	if host == "" {
		return nil, fmt.Errorf("address %q: no host to dial", address)
	}
	if r == nil {
		r = net.DefaultResolver
	}
	ipNet := map[string]string{"tcp4": "ip4", "tcp6": "ip6"}[network]
	if ipNet == "" {
		ipNet = "ip"
	}
	ips, err := r.LookupNetIP(ctx, ipNet, host)
	if err != nil {
		return nil, err
	}
	var addrs []netip.AddrPort
	for _, a := range ips {
		if fits(a) {
			addrs = append(addrs, netip.AddrPortFrom(a.Unmap(), uint16(port)))
		}
	}
	if len(addrs) == 0 {
		return nil, &net.DNSError{Err: "no " + ipNet + " address", Name: host, IsNotFound: true}
	}
	return addrs, nil
}

// listenAddr is the address to listen at: a missing host (":7471") is the
// IPv4 wildcard, every RDMA device's IPv4 addresses.
func listenAddr(address string) string {
	if host, port, err := net.SplitHostPort(address); err == nil && host == "" {
		return net.JoinHostPort(netip.IPv4Unspecified().String(), port)
	}
	return address
}
