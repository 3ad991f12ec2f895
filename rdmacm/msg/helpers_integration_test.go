//go:build integration

package msg

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
)

// device is an RDMA device of the test bed and the address to connect to
// it over (a connection from the device to itself).
type device struct {
	name, addr string
	iwarp      bool
}

func rxe(t testing.TB) device {
	d := testbed.Require(t).MustDevice(t, "rxe0")
	return device{name: d.Name, addr: d.IPv4}
}

func siw(t testing.TB) device {
	d := testbed.Require(t).MustDevice(t, "siw0")
	return device{name: d.Name, addr: d.IPv4, iwarp: true}
}

// forEachDevice runs f on rxe (RoCE) and siw (iWARP).
func forEachDevice(t *testing.T, f func(t *testing.T, d device)) {
	for _, d := range []device{rxe(t), siw(t)} {
		t.Run(d.name, func(t *testing.T) { f(t, d) })
	}
}

var nextPort = 19000 + os.Getpid()%1000*10

func port() int {
	nextPort++
	return nextPort
}

func (d device) at(port int) string { return fmt.Sprintf("%s:%d", d.addr, port) }

func TestMain(m *testing.M) {
	if addr := os.Getenv("MSG_TEST_PEER"); addr != "" {
		peerMain(addr)
		return
	}
	if spec := os.Getenv(keepalivePeerEnv); spec != "" {
		os.Exit(keepalivePeer(spec))
	}
	if top, err := testbed.Load(); err == nil {
		// librdmacm opens every device on first use and keeps them for
		// the life of the process: not a leak of the first test's.
		rdmacm.OpenDevice("rxe0")
		for _, name := range []string{"rxe0", "siw0"} {
			if d, err := top.Device(name); err == nil {
				warmUp(d.IPv4)
			}
		}
	}
	os.Exit(m.Run())
}

// warmUp connects once, so that what librdmacm keeps from a first
// connection is there before any leak check counts.
func warmUp(addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Listen(ctx, nil, addr+":18999", nil)
	if err != nil {
		return
	}
	defer l.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		if c, err := l.Accept(ctx); err == nil {
			c.Recv(ctx)
			c.Close()
		}
	}()
	if c, err := Dial(ctx, nil, addr+":18999", nil); err == nil {
		c.Close()
	} else {
		l.Close()
	}
	<-served
}

// checkNoLeaks asserts, at the end of the test, that every cm_id, QP, CQ,
// MR and PD, every descriptor and every goroutine the test made is gone.
func checkNoLeaks(t *testing.T) {
	t.Helper()
	testbed.CheckNoLeaks(t)
	// CM ids that never bound to a device, which the kernel does not list.
	testbed.CheckCount(t, "CM ids", rdmacm.OpenIDs)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// deliverOne sends a message from one side and receives and releases it
// on the other: the connection is set up and working both ways.
func deliverOne(t *testing.T, ctx context.Context, from, to *Conn) {
	t.Helper()
	require.NoError(t, from.Send(ctx, []byte("warm up")))
	m, err := to.Recv(ctx)
	require.NoError(t, err)
	m.Release()
}

// listen listens on a fresh port of d until the test ends.
func listen(t *testing.T, d device, cfg *Config) (*Listener, string) {
	t.Helper()
	addr := d.at(port())
	l, err := Listen(ctxFor(t, 5*time.Second), nil, addr, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l, addr
}

// pair connects a dialer to a listener on d and returns both ends, closed
// when the test ends.
func pair(t *testing.T, d device, dialCfg, listenCfg *Config) (client, server *Conn) {
	t.Helper()
	testbed.CheckNoRNR(t, d.name) // the credits keep every SEND to a posted receive
	ctx := ctxFor(t, 20*time.Second)
	l, addr := listen(t, d, listenCfg)
	client, server = dialAccept(t, ctx, l, addr, dialCfg)
	t.Cleanup(func() {
		assert.NoError(t, client.Close())
		assert.NoError(t, server.Close())
	})
	return client, server
}

// dialAccept dials l at addr and returns both ends, which the caller
// closes.
func dialAccept(t *testing.T, ctx context.Context, l *Listener, addr string, dialCfg *Config) (client, server *Conn) {
	t.Helper()
	type result struct {
		c   *Conn
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		c, err := l.Accept(ctx)
		accepted <- result{c, err}
	}()
	client, err := Dial(ctx, nil, addr, dialCfg)
	require.NoError(t, err)
	r := <-accepted
	require.NoError(t, r.err)
	return client, r.c
}

// rnrCounters reads the device's counters about receiver-not-ready (RNR
// NAKs sent and received, RNR retries exceeded): rxe's; siw has none.
func rnrCounters(t *testing.T, dev string) map[string]uint64 {
	t.Helper()
	counts, err := testbed.RNRCounters(dev)
	require.NoError(t, err)
	return counts
}
