//go:build integration

package stream

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
)

// A host name is looked up and its addresses tried in turn, as
// net.Dialer does: the first, loopback, where no RDMA device is, fails,
// and the second connects. A listener without a host (":port"), as
// net.Listen takes one, serves every device.
func TestDialByNameListenOnEveryDevice(t *testing.T) {
	top := testbed.Require(t)
	checkNoLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nextPort++
	port := nextPort
	l, err := Listen(ctx, nil, fmt.Sprintf(":%d", port), nil)
	require.NoError(t, err)
	defer func() { assert.NoError(t, l.Close()) }()
	assert.Equal(t, fmt.Sprintf("0.0.0.0:%d", port), l.Addr().String())
	quick := rdmacm.Dialer{ResolveAddrTimeout: 500 * time.Millisecond, ResolveRetries: -1}
	loopback := netip.MustParseAddr("127.0.0.1")

	for _, name := range []string{"rxe0", "siw0"} {
		dev := top.MustDevice(t, name)
		d := Dialer{RDMA: quick, Resolver: names{"peer": {loopback, netip.MustParseAddr(dev.IPv4)}}}
		accepted := make(chan net.Conn, 1)
		go func() {
			s, err := l.Accept()
			assert.NoError(t, err)
			accepted <- s
		}()
		c, err := d.DialContext(ctx, "tcp", fmt.Sprintf("peer:%d", port))
		require.NoError(t, err, "%s: the name's second address", name)
		assert.Equal(t, fmt.Sprintf("%s:%d", dev.IPv4, port), c.RemoteAddr().String())
		s := <-accepted
		require.NotNil(t, s)
		_, err = c.Write([]byte(name))
		require.NoError(t, err)
		require.NoError(t, c.Close())
		b, err := io.ReadAll(s)
		require.NoError(t, err)
		assert.Equal(t, name, string(b), "over %s", name)
		require.NoError(t, s.Close())
	}

	// When every address fails, the error is the first one's, naming it.
	d := Dialer{RDMA: quick, Resolver: names{"nowhere": {loopback, netip.MustParseAddr("127.0.0.2")}}}
	_, err = d.DialContext(ctx, "tcp", "nowhere:7471")
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "127.0.0.1:7471", oe.Addr.String())
	_, err = d.DialContext(ctx, "tcp", "unknown:7471")
	var dnsErr *net.DNSError
	assert.ErrorAs(t, err, &dnsErr, "a name that is not found")
}
