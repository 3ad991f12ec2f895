package stream

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm/msg"
)

// names is a Resolver over a fixed table.
type names map[string][]netip.Addr

func (n names) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	addrs, ok := n[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var out []netip.Addr
	for _, a := range addrs {
		if network == "ip" || network == "ip4" && a.Is4() || network == "ip6" && a.Is6() {
			out = append(out, a)
		}
	}
	return out, nil
}

func TestDialAddrs(t *testing.T) {
	ctx := context.Background()
	r := names{"server": {netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1"), netip.MustParseAddr("10.0.0.2")},
		"v6only": {netip.MustParseAddr("fd00::2")}}
	for _, tc := range []struct {
		network, address string
		want             []string
	}{
		{"rdma", "10.0.0.9:7471", []string{"10.0.0.9:7471"}},
		{"tcp", "[fe80::1%eth0]:7471", []string{"[fe80::1%eth0]:7471"}},
		{"tcp4", "[::ffff:10.0.0.9]:1", []string{"10.0.0.9:1"}},
		{"tcp", "server:7471", []string{"10.0.0.1:7471", "[fd00::1]:7471", "10.0.0.2:7471"}},
		{"tcp4", "server:7471", []string{"10.0.0.1:7471", "10.0.0.2:7471"}},
		{"tcp6", "server:80", []string{"[fd00::1]:80"}},
	} {
		addrs, err := dialAddrs(ctx, r, tc.network, tc.address)
		require.NoError(t, err, "%s %s", tc.network, tc.address)
		var got []string
		for _, a := range addrs {
			got = append(got, a.String())
		}
		assert.Equal(t, tc.want, got, "%s %s", tc.network, tc.address)
	}
	for _, tc := range []struct{ network, address, says string }{
		{"tcp", "10.0.0.1", "missing port"},
		{"tcp", "server:http", "the port must be a number"},
		{"tcp", "server:65536", "the port must be a number"},
		{"tcp6", "10.0.0.1:7471", "not of network tcp6"},
		{"tcp4", "[fd00::1]:7471", "not of network tcp4"},
		{"tcp4", "v6only:7471", "no ip4 address"},
		{"tcp", ":7471", "no host to dial"},
		{"tcp", "nowhere:7471", "no such host"},
	} {
		_, err := dialAddrs(ctx, r, tc.network, tc.address)
		assert.ErrorContains(t, err, tc.says, "%s %s", tc.network, tc.address)
	}
	var dnsErr *net.DNSError
	_, err := dialAddrs(ctx, r, "tcp", "nowhere:7471")
	assert.True(t, errors.As(err, &dnsErr) && dnsErr.IsNotFound, "the resolver's error stays a *net.DNSError: %v", err)
}

func TestListenAddr(t *testing.T) {
	assert.Equal(t, "0.0.0.0:7471", listenAddr(":7471"), "no host: every device")
	assert.Equal(t, "10.0.0.1:7471", listenAddr("10.0.0.1:7471"))
	assert.Equal(t, "[fe80::1%eth0]:7471", listenAddr("[fe80::1%eth0]:7471"))
	assert.Equal(t, "bad", listenAddr("bad"), "left for msg.Listen to refuse by name")
}

// cancelling is a Resolver whose lookup ends the dial's context, as a
// caller giving up while the dial is under way would.
type cancelling struct {
	names
	cancel context.CancelFunc
}

func (c cancelling) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	c.cancel()
	return c.names.LookupNetIP(ctx, network, host)
}

// A dial that ends with its context says so, whatever the address tried
// failed with (here a setting msg.Dial refuses before it looks at the
// context), as net.Dialer's does.
func TestDialContextEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	d := Dialer{Config: msg.Config{Credits: -1},
		Resolver: cancelling{names{"peer": {netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")}}, cancel}}
	_, err := d.DialContext(ctx, "tcp", "peer:7471")
	assert.ErrorIs(t, err, context.Canceled)
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "10.0.0.1:7471", oe.Addr.String(), "the address being tried")
}
