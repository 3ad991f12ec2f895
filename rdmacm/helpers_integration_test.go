//go:build integration

package rdmacm_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
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

var nextPort = 9000 + os.Getpid()%1000*10

func port() int {
	nextPort++
	return nextPort
}

func (d device) at(port int) string { return fmt.Sprintf("%s:%d", d.addr, port) }

// kernelObjects counts this process's RDMA objects as the kernel lists them.
func kernelObjects(t *testing.T) map[string]int {
	t.Helper()
	counts, err := testbed.Objects()
	require.NoError(t, err)
	return counts
}

// TestMain connects once on each device before the tests: librdmacm opens
// the devices on first use and keeps them for the life of the process,
// which the leak checks must not count.
func TestMain(m *testing.M) {
	if addr := os.Getenv("RDMACM_TEST_DIAL"); addr != "" {
		peerMain(addr)
		return
	}
	if addr := os.Getenv("RDMAGO_DATAPATH_PEER"); addr != "" {
		echoPeer(addr, os.Getenv("RDMAGO_DATAPATH_IMM") != "")
		return
	}
	if top, err := testbed.Load(); err == nil {
		// OpenDevice has librdmacm open every device, kept as the ones
		// the connections below open.
		rdmacm.OpenDevice("rxe0")
		for _, name := range []string{"rxe0", "siw0"} {
			if d, err := top.Device(name); err == nil {
				warmUp(d.IPv4)
			}
		}
	}
	os.Exit(m.Run())
}

func warmUp(addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := rdmacm.Listen(addr + ":8999")
	if err != nil {
		return
	}
	defer l.Close()
	// Both ends are gone before the tests start: while an id lives,
	// librdmacm holds a PD of its own on the device, which the first test's
	// leak check would see go.
	served := make(chan struct{})
	go func() {
		defer close(served)
		if c, err := l.Accept(ctx); err == nil {
			<-c.Done()
			c.Close()
		}
	}()
	if c, err := rdmacm.Dial(ctx, addr+":8999"); err == nil {
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

// pair dials a listener on d, both sides configured with cfg, and returns
// both ends, closed when the test ends.
func pair(t *testing.T, d device, cfg rdmacm.ConnConfig) (client, server *rdmacm.Conn) {
	t.Helper()
	return pairWith(t, d, &rdmacm.Dialer{ConnConfig: cfg}, &rdmacm.ListenConfig{ConnConfig: cfg})
}

// pairWith is pair with a Dialer and a ListenConfig of their own, for the
// settings only one side has (private data, timeouts of resolution, the
// backlog) or that differ between the sides.
func pairWith(t *testing.T, d device, dl *rdmacm.Dialer, lc *rdmacm.ListenConfig) (client, server *rdmacm.Conn) {
	t.Helper()
	l, addr := listen(t, d, lc)
	return connect(t, l.Accept, func(ctx context.Context) (*rdmacm.Conn, error) { return dl.Dial(ctx, addr) })
}

// udPair is pairWith for UD endpoints (ListenUD and DialUD).
func udPair(t *testing.T, d device, dl *rdmacm.Dialer, lc *rdmacm.ListenConfig) (client, server *rdmacm.UDConn) {
	t.Helper()
	addr := d.at(port())
	l, err := lc.ListenUD(context.Background(), addr)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return connect(t, l.Accept, func(ctx context.Context) (*rdmacm.UDConn, error) { return dl.DialUD(ctx, addr) })
}

// connect runs accept and dial side by side and returns both ends, closed
// when the test ends.
func connect[C interface{ Close() error }](t *testing.T, accept, dial func(context.Context) (C, error)) (client, server C) {
	t.Helper()
	ctx := ctxFor(t, 20*time.Second)
	type result struct {
		c   C
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		c, err := accept(ctx)
		accepted <- result{c, err}
	}()
	client, err := dial(ctx)
	if err != nil {
		// siw has refused a dial to a live listener (status -111) once in a
		// few runs: say what the CM and the TCP listeners looked like.
		t.Fatalf("dial: %v\n%s", err, testbed.CMState())
	}
	r := <-accepted
	require.NoError(t, r.err)
	t.Cleanup(func() {
		assert.NoError(t, client.Close())
		assert.NoError(t, r.c.Close())
	})
	return client, r.c
}

const access = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead

func run(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	require.NoError(t, err, "%v: %s", args, out)
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func verbsCap(wr uint32) verbs.QPCap {
	return verbs.QPCap{MaxSendWR: wr, MaxRecvWR: wr, MaxSendSGE: 1, MaxRecvSGE: 1}
}

// listen listens on a fresh port of d with lc (nil: the zero ListenConfig)
// until the test ends.
func listen(t *testing.T, d device, lc *rdmacm.ListenConfig) (*rdmacm.Listener, string) {
	t.Helper()
	if lc == nil {
		lc = &rdmacm.ListenConfig{}
	}
	addr := d.at(port())
	l, err := lc.Listen(context.Background(), addr)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l, addr
}
