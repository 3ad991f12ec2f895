//go:build integration

package rdmacm_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
)

// A Connector taken through the steps by hand gives a working connection,
// reports each step once, and its Close leaves the Conn alone.
func TestConnectorSteps(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 20*time.Second)
		l, addr := listen(t, d, nil)
		accepted := make(chan *rdmacm.Conn, 1)
		go func() {
			c, err := l.Accept(ctx)
			assert.NoError(t, err)
			accepted <- c
		}()
		var steps []rdmacm.Step
		o := &rdmacm.Options{Trace: func(s rdmacm.Step, _ time.Time, _ time.Duration) { steps = append(steps, s) }}
		c, err := rdmacm.NewConnector(addr, o)
		require.NoError(t, err)
		require.NoError(t, c.ResolveAddr(ctx))
		require.NoError(t, c.ResolveRoute(ctx))
		require.NoError(t, c.CreateQP())
		client, err := c.Connect(ctx)
		require.NoError(t, err)
		assert.NoError(t, c.Close(), "after Connect, Close has nothing to release")
		server := <-accepted
		require.NotNil(t, server)
		exchange(t, client, server) // the Conn still owns its QP, CQs and PD
		assert.Equal(t, []rdmacm.Step{rdmacm.StepCreateID, rdmacm.StepResolveAddr, rdmacm.StepResolveRoute,
			rdmacm.StepCreateQP, rdmacm.StepConnect}, steps)

		_, err = c.Connect(ctx)
		assert.ErrorIs(t, err, rdmacm.ErrClosed, "a closed Connector takes no more steps")

		// Disconnect ends both sides and releases nothing; Close does.
		require.NoError(t, client.Disconnect(ctx))
		assert.Equal(t, rdmacm.StepDisconnect, steps[len(steps)-1])
		select {
		case <-client.Done():
		default:
			t.Fatal("Done is open after Disconnect returned")
		}
		assert.ErrorIs(t, client.Err(), rdmacm.ErrDisconnected)
		select {
		case <-server.Done():
		case <-ctx.Done():
			t.Fatal("the server never saw the disconnect")
		}
		assert.NoError(t, client.Disconnect(ctx), "a second Disconnect")
		assert.NoError(t, server.Disconnect(ctx), "Disconnect after the peer's")
		assert.NoError(t, client.Close())
		assert.NoError(t, server.Close())
		assert.Equal(t, []rdmacm.Step{rdmacm.StepDisconnect, rdmacm.StepDestroyQP, rdmacm.StepDestroyID}, steps[5:])
	})
}

// Steps out of order are refused with the method that must come first, and
// a Connector closed halfway releases what it made.
func TestConnectorOrder(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 20*time.Second)
		_, addr := listen(t, d, nil)
		c, err := rdmacm.NewConnector(addr, nil)
		require.NoError(t, err)
		assert.ErrorContains(t, c.CreateQP(), "out of order: ResolveAddr must come first")
		_, err = c.Connect(ctx)
		assert.ErrorContains(t, err, "out of order: ResolveAddr must come first")
		require.NoError(t, c.ResolveAddr(ctx), "a refused call does not spoil the Connector")
		assert.ErrorContains(t, c.ResolveAddr(ctx), "out of order: ResolveAddr is done already")
		assert.ErrorContains(t, c.CreateQP(), "out of order: ResolveRoute must come first")
		require.NoError(t, c.ResolveRoute(ctx))
		require.NoError(t, c.CreateQP())
		assert.NoError(t, c.Close(), "with an id, CQs and a QP")
		assert.NoError(t, c.Close(), "twice")
		assert.ErrorIs(t, c.ResolveRoute(ctx), rdmacm.ErrClosed)
	})
}

// A failed step ends the dial: later steps return that failure, and Close
// releases everything. A refused connect fails in Connect; when Start sent
// it, in Start on iWARP (whose connect opens its TCP stream at once) and
// still in Connect on RoCE.
func TestConnectorFailureSticks(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		for _, started := range []bool{false, true} {
			t.Run(map[bool]string{false: "waited", true: "started"}[started], func(t *testing.T) {
				checkNoLeaks(t)
				ctx := ctxFor(t, 20*time.Second)
				c, err := rdmacm.NewConnector(d.at(port()), nil) // nobody listens there
				require.NoError(t, err)
				require.NoError(t, c.ResolveAddr(ctx))
				require.NoError(t, c.ResolveRoute(ctx))
				require.NoError(t, c.CreateQP())
				switch {
				case !started:
					_, err = c.Connect(ctx)
				case d.iwarp:
					err = c.Start(rdmacm.StepConnect)
				default:
					require.NoError(t, c.Start(rdmacm.StepConnect))
					_, err = c.Connect(ctx)
				}
				require.ErrorIs(t, err, rdmacm.ErrRejected)
				_, again := c.Connect(ctx)
				assert.Same(t, err, again, "the failure sticks")
				var oe *rdmacm.OpError
				require.True(t, errors.As(err, &oe))
				assert.Equal(t, d.name, oe.Device)
				assert.NoError(t, c.Close())
			})
		}
	})
}

func TestNewConnectorBadInput(t *testing.T) {
	_, err := rdmacm.NewConnector("nowhere", nil)
	assert.ErrorContains(t, err, "nowhere")
	_, err = rdmacm.NewConnector("10.0.0.1:1", &rdmacm.Options{PrivateData: make([]byte, 1000)})
	assert.ErrorIs(t, err, rdmacm.ErrPrivateDataTooLong)
}

// One goroutine takes several connections through the network steps as a
// C program does: Start for every connection, then the step's method to
// wait for each, and takes them down with StartDisconnect. Every
// connection works, each step is traced once per connection, and nothing
// is left behind.
func TestConnectorStart(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 30*time.Second)
		const n = 6
		l, addr := listen(t, d, nil)
		accepted := make(chan *rdmacm.Conn, n)
		go func() {
			for range n {
				c, err := l.Accept(ctx)
				if !assert.NoError(t, err) {
					return
				}
				accepted <- c
			}
		}()
		traced := make([]map[rdmacm.Step]int, n)
		cs := make([]*rdmacm.Connector, n)
		for i := range cs {
			traced[i] = map[rdmacm.Step]int{}
			o := &rdmacm.Options{Trace: func(s rdmacm.Step, _ time.Time, _ time.Duration) { traced[i][s]++ }}
			var err error
			cs[i], err = rdmacm.NewConnector(addr, o)
			require.NoError(t, err)
			defer cs[i].Close()
		}
		each := func(f func(c *rdmacm.Connector) error) {
			for _, c := range cs {
				require.NoError(t, f(c))
			}
		}
		each(func(c *rdmacm.Connector) error { return c.Start(rdmacm.StepResolveAddr) })
		each(func(c *rdmacm.Connector) error { return c.ResolveAddr(ctx) })
		each(func(c *rdmacm.Connector) error { return c.Start(rdmacm.StepResolveRoute) })
		each(func(c *rdmacm.Connector) error { return c.ResolveRoute(ctx) })
		each(func(c *rdmacm.Connector) error { return c.CreateQP() })
		each(func(c *rdmacm.Connector) error { return c.Start(rdmacm.StepConnect) })
		clients := map[netip.AddrPort]*rdmacm.Conn{}
		each(func(c *rdmacm.Connector) error {
			conn, err := c.Connect(ctx)
			if err == nil {
				clients[conn.LocalAddr()] = conn
			}
			return err
		})
		for range n {
			var server *rdmacm.Conn
			select {
			case server = <-accepted:
			case <-ctx.Done():
				t.Fatal("the listener did not accept every connection")
			}
			client := clients[server.RemoteAddr()]
			require.NotNil(t, client, "an accepted connection from %v, which no Connector made", server.RemoteAddr())
			exchange(t, client, server)
			defer server.Close()
		}
		// The teardown the same way: every disconnect sent, then each end
		// awaited.
		for _, c := range clients {
			require.NoError(t, c.StartDisconnect())
			assert.NoError(t, c.StartDisconnect(), "twice")
		}
		for _, c := range clients {
			select {
			case <-c.Done():
			case <-ctx.Done():
				t.Fatal("a disconnect StartDisconnect sent never ended the connection")
			}
			assert.ErrorIs(t, c.Err(), rdmacm.ErrDisconnected)
			assert.NoError(t, c.Disconnect(ctx), "Disconnect after StartDisconnect waits for the same end")
			assert.NoError(t, c.Close())
		}
		for i := range traced {
			assert.Equal(t, map[rdmacm.Step]int{rdmacm.StepCreateID: 1, rdmacm.StepResolveAddr: 1, rdmacm.StepResolveRoute: 1,
				rdmacm.StepCreateQP: 1, rdmacm.StepConnect: 1, rdmacm.StepDisconnect: 1, rdmacm.StepDestroyQP: 1,
				rdmacm.StepDestroyID: 1}, traced[i], "connection %d", i)
		}
	})
}

// Start refuses what it cannot start, and a Connector closed with a request
// out and nobody waiting releases everything.
func TestConnectorStartRefused(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 20*time.Second)
		_, addr := listen(t, d, nil)
		c, err := rdmacm.NewConnector(addr, nil)
		require.NoError(t, err)
		assert.ErrorContains(t, c.Start(rdmacm.StepCreateQP), "create qp waits for nothing: call CreateQP")
		assert.ErrorContains(t, c.Start(rdmacm.StepDisconnect), "not a step a Connector starts")
		assert.ErrorContains(t, c.Start(rdmacm.StepResolveRoute), "out of order: ResolveAddr must come first")
		require.NoError(t, c.Start(rdmacm.StepResolveAddr), "refusals do not spoil the Connector")
		assert.ErrorContains(t, c.Start(rdmacm.StepResolveAddr), "resolve addr is started already: call ResolveAddr to wait for it")
		require.NoError(t, c.ResolveAddr(ctx))
		assert.ErrorContains(t, c.Start(rdmacm.StepResolveAddr), "out of order: ResolveAddr is done already")
		require.NoError(t, c.Start(rdmacm.StepResolveRoute))
		assert.NoError(t, c.Close(), "with a route request out")
		assert.ErrorIs(t, c.Start(rdmacm.StepResolveRoute), rdmacm.ErrClosed)
	})
}
