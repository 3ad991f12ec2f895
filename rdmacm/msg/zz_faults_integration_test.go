//go:build integration

package msg

// (This file sorts last: a deleted device lingers until the process exits.)

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
)

// The two tests below run before TestFaultMatrix, whose deleted devices
// librdmacm lets go of later: a descriptor count across that would see it.

// siw ends every connection of a device when the device's netdev goes
// down, however briefly: on NETDEV_GOING_DOWN, siw_netdev_event
// (drivers/infiniband/sw/siw/siw_main.c) schedules siw_netdev_down, which
// moves each QP of the device to ERROR; from RTS that drops the
// connection (siw_qp_modify, siw_qp_cm_drop), and both ends get
// DISCONNECTED. Here the device (siw0) sits on a dummy netdev and the
// connection is to its own address, so its TCP stream runs over the
// loopback and a flap of the dummy touches nothing but siw: the
// connection, idle and without keepalive probes, still ends, within a
// second of the flap. This is the siw row of the two-guest flap
// (TestTwoGuestsFaultMatrix); rxe keeps its QPs through a flap.
func TestSiwEndsConnectionsOnNetdevDown(t *testing.T) {
	d := siw(t)
	netdev := testbed.Require(t).MustDevice(t, d.name).Netdev
	t.Cleanup(func() { exec.Command("ip", "link", "set", netdev, "up").Run() })
	snap, err := testbed.TakeSnapshot()
	require.NoError(t, err)
	client, server := openPair(t, d, nil) // no keepalive
	ctx := ctxFor(t, time.Minute)
	sent := sendNumbered(t, ctx, client, 5)
	require.Equal(t, sent, receiveInOrder(t, ctx, server, sent))
	failed := make(chan error, 2)
	for _, c := range []*Conn{client, server} {
		go func() { _, err := c.Recv(ctx); failed <- err }()
	}
	down := time.Now()
	sh(t, "ip", "link", "set", netdev, "down")
	time.Sleep(200 * time.Millisecond)
	sh(t, "ip", "link", "set", netdev, "up")
	for range 2 {
		select {
		case err := <-failed:
			require.ErrorIs(t, err, rdmacm.ErrEnded)
			t.Logf("%v after the link went down (down 200 ms): %v", time.Since(down).Round(time.Millisecond), err)
			assert.Contains(t, err.Error(), "DISCONNECTED")
		case <-time.After(20 * time.Second):
			t.Fatalf("the connection outlived a 200 ms flap of siw's netdev by 20 s: siw no longer ends QPs " +
				"on NETDEV_GOING_DOWN; see whether the two-guest flap row now survives on siw")
		}
	}
	client.Close()
	server.Close()
	assert.Equal(t, "none", leaksSince(snap))

	// The device itself is fine once the link is back: a new connection
	// works.
	testbed.WaitPortActive(t, d.name)
	client, server = openPair(t, d, nil)
	sent = sendNumbered(t, ctx, client, 5)
	assert.Equal(t, sent, receiveInOrder(t, ctx, server, sent))
}

// A message Dial to a host that answers nothing returns when its context
// ends, on iWARP too, where the kernel's rdma_connect blocks while it
// connects the TCP stream; what the attempt held is released once that
// call returns on its own (stream.Dial is this Dial underneath). The
// address resolves and its packets vanish (testbed.SilentHost).
func TestDialSilentHostHonoursContext(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ip := testbed.SilentHost(t, testbed.Require(t).MustDevice(t, d.name), 78)
		before := len(testbed.Goroutines())
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		dl := &rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{ConnectTimeout: time.Minute}}
		_, err := Dial(ctx, dl, fmt.Sprintf("%s:%d", ip, port()), &Config{KeepAlive: time.Second})
		took := time.Since(start)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		t.Logf("after %v: %v", took.Round(time.Millisecond), err)
		assert.Less(t, took, 2*time.Second, "the dial returns when its context ends")
		// The leak check runs after the background release.
		t.Cleanup(func() {
			for start := time.Now(); time.Since(start) < 30*time.Second; time.Sleep(100 * time.Millisecond) {
				if len(testbed.Goroutines()) <= before {
					return
				}
			}
		})
	})
}

// TestFaultMatrix puts the faults one guest can stage to message
// connections on rxe and siw, and records for each what the application
// saw, how soon, what was left behind and what was lost:
//
//   - the peer process killed (SIGKILL);
//   - the listener closed with connect requests pending;
//   - the address removed from the device's netdev (on a device of its
//     own: Linux 6.1 raises ADDR_CHANGE for a bonding failover, not for a
//     removed address, and none was seen);
//   - the device deleted under live connections, then added again, and a
//     new connection in the same process.
//
// The faults that need a second kernel (a cut link, a flap, a guest that
// vanishes) are in TestTwoGuestsFaultMatrix.
func TestFaultMatrix(t *testing.T) {
	var table faultTable
	bound := keepaliveBound
	for _, d := range []device{rxe(t), siw(t)} {
		transport := "RoCE (rxe)"
		if d.iwarp {
			transport = "iWARP (siw)"
		}
		t.Run("peer killed/"+d.name, func(t *testing.T) {
			table.add(peerKilledRow(t, d, transport, bound))
		})
		t.Run("listener closed/"+d.name, func(t *testing.T) {
			table.add(listenerClosedRow(t, d, transport))
		})
	}
	for _, kind := range []string{"rxe", "siw"} {
		t.Run("own device/"+kind, func(t *testing.T) {
			for _, r := range ownDeviceRows(t, kind, bound) {
				table.add(r)
			}
		})
	}
	table.write(t, "faults-one-guest.md", "Faults in one guest (TestFaultMatrix)",
		fmt.Sprintf("Message connections (rdmacm/msg) with KeepAlive %v and KeepAliveTimeout %v: the bound is 2 × KeepAlive + "+
			"KeepAliveTimeout and 2 s of slack for the emulated CPU. \"Leaked\" counts this process's cm_ids, QPs, CQs, MRs, "+
			"PDs, descriptors and goroutines after Close against before the connection. \"Lost\" is messages whose Send "+
			"returned nil before the fault and that never reached the peer's Recv.",
			keepaliveTestConfig.KeepAlive, keepaliveTestConfig.KeepAliveTimeout))
}

// peerKilledRow: a peer process sends five messages, then is killed while
// this side waits in Recv.
func peerKilledRow(t *testing.T, d device, transport string, bound time.Duration) faultRow {
	row := faultRow{fault: "peer process killed (SIGKILL)", transport: transport, bound: bound}
	ctx := ctxFor(t, 90*time.Second)
	snap, err := testbed.TakeSnapshot()
	require.NoError(t, err)
	cfg := keepaliveTestConfig
	l, addr := listen(t, d, &cfg)
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "MSG_TEST_PEER="+addr)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	c, err := l.Accept(ctx)
	require.NoError(t, err)
	l.Close()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "sent\n", line)
	got := receiveInOrder(t, ctx, c, 5)
	failed := make(chan error, 1)
	go func() { _, err := c.Recv(ctx); failed <- err }()
	time.Sleep(100 * time.Millisecond) // Recv is waiting
	killed := time.Now()
	require.NoError(t, cmd.Process.Kill())
	select {
	case err = <-failed:
		row.detect = time.Since(killed)
	case <-time.After(bound):
		t.Fatalf("Recv still waiting %v after the peer was killed", bound)
	}
	require.Error(t, err)
	row.errors = "Recv: " + firstLine(err)
	c.Close()
	cmd.Wait() // the child's pipe and process descriptor are the test's, not the connection's
	row.leaked = leaksSince(snap)
	row.lost = fmt.Sprintf("%d of 5", 5-got)
	assert.Equal(t, "none", row.leaked)
	assert.Equal(t, 5, got)
	return row
}

// receiveInOrder receives up to n of the peer's payloads (payload(i, 100))
// and returns how many arrived whole and in order.
func receiveInOrder(t *testing.T, ctx context.Context, c *Conn, n int) int {
	t.Helper()
	for i := 0; i < n; i++ {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := c.Recv(rctx)
		cancel()
		if err != nil {
			t.Errorf("message %d of %d: %v", i, n, err)
			return i
		}
		ok := bytes.Equal(m.Bytes(), payload(i, 100))
		m.Release()
		if !ok {
			t.Errorf("message %d arrived altered or out of order", i)
			return i
		}
	}
	return n
}

// listenerClosedRow: dials whose requests wait in the listener's queue
// (nobody accepts) when the listener closes.
func listenerClosedRow(t *testing.T, d device, transport string) faultRow {
	const dials = 4
	const dialTimeout = 10 * time.Second
	row := faultRow{fault: fmt.Sprintf("listener closed with %d requests pending", dials), transport: transport, bound: dialTimeout}
	snap, err := testbed.TakeSnapshot()
	require.NoError(t, err)
	addr := d.at(port())
	l, err := Listen(ctxFor(t, 5*time.Second), nil, addr, nil)
	require.NoError(t, err)
	errs := make(chan error, dials)
	var wg sync.WaitGroup
	for range dials {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
			defer cancel()
			c, err := Dial(ctx, nil, addr, nil)
			if err == nil {
				c.Close()
				err = errors.New("connected to a listener that never accepted")
			}
			errs <- err
		}()
	}
	time.Sleep(time.Second) // the requests reach the listener
	closed := time.Now()
	require.NoError(t, l.Close())
	wg.Wait()
	row.detect = time.Since(closed)
	close(errs)
	var kinds []string
	for err := range errs {
		require.Error(t, err)
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "a dial waited out its timeout: %v", err)
		if s := sameKind(err); !containsString(kinds, s) {
			kinds = append(kinds, s)
		}
	}
	row.errors = fmt.Sprintf("all %d Dials: %s", dials, strings.Join(kinds, "; "))
	row.leaked = leaksSince(snap)
	row.lost = "–"
	assert.Equal(t, "none", row.leaked)
	assert.Less(t, row.detect, dialTimeout)
	return row
}

var (
	addrPort = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+:\d+`)
	qpNum    = regexp.MustCompile(`QP 0x[0-9a-f]+`)
)

// sameKind is an error's first line with its ports and QP numbers taken
// out, so that errors of one kind read alike in the table.
func sameKind(err error) string {
	s := addrPort.ReplaceAllStringFunc(firstLine(err), func(a string) string { return a[:strings.LastIndex(a, ":")] + ":port" })
	return qpNum.ReplaceAllString(s, "QP n")
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ownDeviceRows makes a device of kind (rxe on a veth, siw on a dummy) for
// two faults that would break the shared devices: its address removed,
// then the device deleted under live connections and added again.
func ownDeviceRows(t *testing.T, kind string, bound time.Duration) []faultRow {
	transport := map[string]string{"rxe": "RoCE (rxe)", "siw": "iWARP (siw)"}[kind]
	netdev, ip, name := "veth-flt", "10.71.0.1", "rxeflt"
	if kind == "siw" {
		netdev, ip, name = "dummy-flt", "10.72.0.1", "siwflt"
		sh(t, "ip", "link", "add", netdev, "type", "dummy")
	} else {
		sh(t, "ip", "link", "add", netdev, "type", "veth", "peer", "name", netdev+"-p")
		sh(t, "ip", "link", "set", netdev+"-p", "up")
	}
	// Deleting a device waits for its users: clean up without waiting.
	t.Cleanup(func() { exec.Command("ip", "link", "del", netdev).Start() })
	sh(t, "ip", "link", "set", netdev, "up")
	sh(t, "ip", "addr", "add", ip+"/24", "dev", netdev)
	sh(t, "rdma", "link", "add", name, "type", kind, "netdev", netdev)
	testbed.WaitPortActive(t, name)
	d := device{name: name, addr: ip, iwarp: kind == "siw"}
	// librdmacm opens a new device on first use and keeps it: not a leak.
	_, err := rdmacm.OpenDevice(name)
	require.NoError(t, err)
	var rows []faultRow

	// The address goes away under a live connection.
	row := faultRow{fault: "address removed from the netdev", transport: transport, bound: bound}
	snap, err := testbed.TakeSnapshot()
	require.NoError(t, err)
	cfg := keepaliveTestConfig
	client, server := openPair(t, d, &cfg)
	ctx := ctxFor(t, time.Minute)
	sent := sendNumbered(t, ctx, client, 5)
	got := receiveInOrder(t, ctx, server, sent)
	removed := time.Now()
	sh(t, "ip", "addr", "del", ip+"/24", "dev", netdev)
	// Either the connection keeps working or it fails, within the bound.
	rctx, cancel := context.WithTimeout(ctx, bound)
	err = client.Send(rctx, payload(0, 100))
	var m *Message
	if err == nil {
		m, err = server.Recv(rctx)
	}
	cancel()
	switch {
	case err == nil:
		m.Release()
		row.errors = "none: the connection kept working (one more message sent and received)"
	case errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("neither delivered nor failed within %v of the address's removal", bound)
	default:
		row.detect = time.Since(removed)
		row.errors = firstLine(err)
	}
	client.Close()
	server.Close()
	sh(t, "ip", "addr", "add", ip+"/24", "dev", netdev)
	row.leaked = leaksSince(snap)
	row.lost = fmt.Sprintf("%d of %d", sent-got, sent)
	assert.Equal(t, "none", row.leaked)
	rows = append(rows, row)

	// The device is deleted under a live connection.
	row = faultRow{fault: "device deleted under a live connection", transport: transport, bound: bound}
	snap, err = testbed.TakeSnapshot()
	require.NoError(t, err)
	client, server = openPair(t, d, &cfg)
	sent = sendNumbered(t, ctx, client, 5)
	got = receiveInOrder(t, ctx, server, sent)
	failed := make(chan error, 2)
	for _, c := range []*Conn{client, server} {
		go func() { _, err := c.Recv(ctx); failed <- err }()
	}
	time.Sleep(100 * time.Millisecond)
	deleted := time.Now()
	// The deletion waits until every user of the device has let go of it,
	// this process included: let it wait in the background, not in a
	// child of ours (whose descriptors and waiting goroutine would count).
	sh(t, "sh", "-c", "rdma link delete "+name+" >/dev/null 2>&1 &")
	var seen []string
	for range 2 {
		select {
		case err := <-failed:
			require.Error(t, err)
			row.detect = max(row.detect, time.Since(deleted))
			if s := firstLine(err); !containsString(seen, s) {
				seen = append(seen, s)
			}
		case <-time.After(bound):
			t.Fatalf("a Recv still waits %v after the device was deleted", bound)
		}
	}
	row.errors = "Recv: " + strings.Join(seen, "; ")
	client.Close()
	server.Close()
	row.leaked = leaksSince(snap)
	// Once nothing uses it, librdmacm closes it when told to, and the
	// kernel finishes deleting it.
	require.NoError(t, rdmacm.ReleaseRemovedDevices())
	gone := false
	for start := time.Now(); time.Since(start) < 10*time.Second && !gone; time.Sleep(200 * time.Millisecond) {
		out, _ := exec.Command("rdma", "link", "show").CombinedOutput()
		gone = !strings.Contains(string(out), name+"/")
	}
	require.True(t, gone, "the kernel still lists %s 10 s after its connections closed: something of this process holds it", name)
	row.lost = fmt.Sprintf("%d of %d", sent-got, sent)
	assert.Equal(t, "none", row.leaked)
	rows = append(rows, row)

	// The same kind of device comes back on the netdev: a new connection in
	// this process works.
	row = faultRow{fault: "device added again, new connection", transport: transport, lost: "–"}
	again := name + "2"
	var addErr error
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(200 * time.Millisecond) {
		var out []byte
		if out, addErr = exec.Command("rdma", "link", "add", again, "type", kind, "netdev", netdev).CombinedOutput(); addErr == nil {
			break
		} else {
			addErr = fmt.Errorf("%w: %s", addErr, bytes.TrimSpace(out))
		}
	}
	require.NoError(t, addErr, "adding %s again on %s", kind, netdev)
	t.Cleanup(func() { exec.Command("rdma", "link", "delete", again).Start() })
	testbed.WaitPortActive(t, again)
	_, err = rdmacm.OpenDevice(again)
	require.NoError(t, err)
	snap, err = testbed.TakeSnapshot()
	require.NoError(t, err)
	client, server = openPair(t, device{name: again, addr: ip, iwarp: kind == "siw"}, nil)
	sent = sendNumbered(t, ctx, client, 5)
	got = receiveInOrder(t, ctx, server, sent)
	row.errors = fmt.Sprintf("none: a new connection carried %d of %d messages", got, sent)
	client.Close()
	server.Close()
	row.leaked = leaksSince(snap)
	assert.Equal(t, "none", row.leaked)
	assert.Equal(t, sent, got)
	rows = append(rows, row)
	return rows
}

// sendNumbered sends payload(0..n-1, 100) and returns how many Sends
// returned nil.
func sendNumbered(t *testing.T, ctx context.Context, c *Conn, n int) int {
	t.Helper()
	for i := 0; i < n; i++ {
		if err := c.Send(ctx, payload(i, 100)); err != nil {
			t.Errorf("send %d: %v", i, err)
			return i
		}
	}
	return n
}

func sh(t *testing.T, argv ...string) {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	require.NoError(t, err, "%s: %s", strings.Join(argv, " "), out)
}

// openPair connects two ends over d with cfg, and closes the listener at
// once, so that a leak check after the ends' Close sees everything gone.
func openPair(t *testing.T, d device, cfg *Config) (client, server *Conn) {
	t.Helper()
	ctx := ctxFor(t, 20*time.Second)
	addr := d.at(port())
	l, err := Listen(ctx, nil, addr, cfg)
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan error, 1)
	go func() {
		var err error
		server, err = l.Accept(ctx)
		accepted <- err
	}()
	client, err = Dial(ctx, nil, addr, cfg)
	if err != nil {
		// Once (on a siw device the test had just made) the listener's
		// TCP port refused the dial: say what listened then.
		t.Fatalf("dial %s: %v\n%s", addr, err, testbed.CMState())
	}
	require.NoError(t, <-accepted)
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// firstLine keeps an error's first line for the table.
func firstLine(err error) string {
	if err == nil {
		return "none"
	}
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}
