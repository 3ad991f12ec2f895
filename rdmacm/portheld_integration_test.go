//go:build integration

package rdmacm_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
)

// On iWARP the connect call binds a TCP socket to the port the CM chose for
// the id, and the CM chooses from the kernel's ephemeral range without
// looking at TCP's own sockets. Here that range is two ports and an
// ordinary TCP connection holds one of them: every dial must still
// connect, taking the other port, as often as it is tried.
func TestDialIWARPPortHeldByTCP(t *testing.T) {
	d := siw(t)
	checkNoLeaks(t)
	const low = 47000
	const knob = "/proc/sys/net/ipv4/ip_local_port_range"
	old, err := os.ReadFile(knob)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(knob, []byte(fmt.Sprintf("%d %d", low, low+1)), 0o644))
	t.Cleanup(func() { os.WriteFile(knob, old, 0o644) })

	// A plain TCP connection from d's address, port low: no SO_REUSEADDR,
	// so siw's bind to that port fails with EADDRINUSE.
	tl, err := net.Listen("tcp", d.at(port()))
	require.NoError(t, err)
	defer tl.Close()
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	held, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(d.addr), Port: low}}).Dial("tcp", tl.Addr().String())
	require.NoError(t, err)
	defer held.Close()

	for i := range 6 {
		// A listener of its own each time: the last connection's TCP
		// socket may linger on its 4-tuple.
		l, addr := listen(t, d, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		accepted := make(chan error, 1)
		go func() {
			c, err := l.Accept(ctx)
			if err == nil {
				err = c.Close()
			}
			accepted <- err
		}()
		c, err := (&rdmacm.Dialer{}).Dial(ctx, addr)
		require.NoError(t, err, "dial %d", i+1)
		require.Equal(t, low+1, int(c.LocalAddr().Port()), "the port the TCP connection holds is not the dial's")
		require.NoError(t, c.Close())
		require.NoError(t, <-accepted)
		require.NoError(t, l.Close())
		cancel()
	}
}
