//go:build testbed

package msg

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/test/testbed"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(keepalivePeerEnv); spec != "" {
		os.Exit(keepalivePeer(spec))
	}
	if spec := os.Getenv(faultPeerEnv); spec != "" {
		os.Exit(faultPeer(spec))
	}
	os.Exit(m.Run())
}

// TestTwoGuestsFaultMatrix stages the faults that need a second kernel on
// message connections from guest b to guest a, over rxe (eth0) and siw
// (eth1), and records each as a row of the fault table:
//
//   - a link flap shorter than the retry window, under a stream of
//     numbered messages: the connection must survive and every message
//     arrive, in order;
//   - a link cut for longer than the keepalive bound, under an idle
//     connection: b learns of it only through its keepalive probes, and the
//     connection on the other link stays up;
//   - guest a killed outright, under idle connections on both links.
func TestTwoGuestsFaultMatrix(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, b, err := testbed.BootPair(ctx, testbed.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { a.Close(); b.Close() })
	self, err := os.Executable()
	require.NoError(t, err)
	startE := func(g *testbed.Guest, env, spec string) (*testbed.Cmd, *lockedOutput, error) {
		c := g.Command(ctx, self, "-test.run=^$")
		c.Env = append(os.Environ(), env+"="+spec)
		out := &lockedOutput{}
		c.Stdout, c.Stderr = out, out
		return c, out, c.Start()
	}
	start := func(g *testbed.Guest, env, spec string) (*testbed.Cmd, *lockedOutput) {
		c, out, err := startE(g, env, spec)
		require.NoError(t, err)
		return c, out
	}
	devs := []string{"rxe0", "siw0"}
	transport := map[string]string{"rxe0": "RoCE (rxe)", "siw0": "iWARP (siw)"}
	netdev := func(dev string) string { return a.Topology.MustDevice(t, dev).Netdev }
	addrOf := func(dev string, port int) string {
		return fmt.Sprintf("%s:%d", a.Topology.MustDevice(t, dev).IPv4, port)
	}
	var table faultTable

	// A flap on both links at once, under a stream each.
	const flap = 200 * time.Millisecond
	type streamEnds struct {
		src, sink       *testbed.Cmd
		srcOut, sinkOut *lockedOutput
	}
	type waited struct{ src, sink error }
	// flapOnce starts a stream on each link, flaps both, and waits for
	// the streams to end. It fails only where the test bed does.
	flapOnce := func() (map[string]streamEnds, map[string]waited, error) {
		streams := map[string]streamEnds{}
		for i, dev := range devs {
			addr := addrOf(dev, 7900+i)
			sink, sinkOut, err := startE(a, faultPeerEnv, "sink:"+addr)
			if err == nil {
				err = a.WaitListening(ctx, netip.MustParseAddrPort(addr))
			}
			if err != nil {
				return nil, nil, err
			}
			src, srcOut, err := startE(b, faultPeerEnv, "source:"+addr+"/4s")
			if err != nil {
				return nil, nil, err
			}
			for start := time.Now(); !strings.Contains(srcOut.String(), "source connected"); time.Sleep(20 * time.Millisecond) {
				if time.Since(start) > time.Minute {
					return nil, nil, fmt.Errorf("%s: the source did not connect within a minute:\n%s", dev, srcOut)
				}
			}
			streams[dev] = streamEnds{src, sink, srcOut, sinkOut}
		}
		time.Sleep(time.Second)
		for _, up := range []bool{false, true} {
			for _, dev := range devs {
				if err := a.SetLink(ctx, netdev(dev), up); err != nil {
					return nil, nil, err
				}
			}
			if !up {
				time.Sleep(flap)
			}
		}
		ends := map[string]waited{}
		for _, dev := range devs {
			w := waited{streams[dev].src.Wait(), streams[dev].sink.Wait()}
			for _, err := range []error{w.src, w.sink} {
				if rxePanicked(err) {
					return nil, nil, err
				}
			}
			ends[dev] = w
		}
		return streams, ends, nil
	}
	streams, ends, err := flapOnce()
	if rxePanicked(err) {
		// Debian's 6.1 rxe has crashed the guest's kernel once in several
		// runs (a NULL dereference in __rxe_put, in interrupt context, as
		// the link came back up): a kernel bug, not what this test
		// measures. One more try on a fresh pair; a second crash fails.
		t.Logf("rxe crashed guest a's kernel during the flap; trying once more on a fresh pair:\n%v", err)
		a.Kill()
		b.Close()
		a, b, err = testbed.BootPair(ctx, testbed.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { a.Close(); b.Close() })
		streams, ends, err = flapOnce()
	}
	require.NoError(t, err)
	for _, dev := range devs {
		e := streams[dev]
		srcErr, sinkErr := ends[dev].src, ends[dev].sink
		row := faultRow{fault: fmt.Sprintf("link flap (%v down) under a stream", flap), transport: transport[dev],
			bound: 2*flapConfig.KeepAlive + flapConfig.KeepAliveTimeout + 2*time.Second, leaked: peerLeaks(e.srcOut, e.sinkOut)}
		sent, got := count(e.srcOut, `sent (\d+)`), count(e.sinkOut, `received (\d+) in order`)
		survived := srcErr == nil && sinkErr == nil
		if survived {
			row.errors = fmt.Sprintf("none: the connection survived; %d messages sent, Close returned nil", sent)
			row.lost = fmt.Sprintf("%d of %d", sent-got, sent)
		} else {
			// The sender was told the connection failed, not that its
			// messages arrived: what did arrive must be a whole, ordered
			// prefix of what was sent.
			row.errors = "source: " + between(e.srcOut.String(), "send error: ", "; close:") +
				" / sink: " + between(e.sinkOut.String(), "then: ", "\n")
			if dev == "siw0" {
				row.errors = siwFlapLimit + row.errors
			}
			row.lost = fmt.Sprintf("0 (failed: %d sent, the first %d arrived in order)", sent, got)
			row.failed = true
			assert.NotContains(t, e.sinkOut.String(), "altered or out of order")
			assert.LessOrEqual(t, got, sent)
		}
		table.add(row)
		assert.Positive(t, sent)
		assert.Equal(t, "none", row.leaked)
		if survived {
			assert.Equal(t, sent, got, "%s: the connection survived, and every message sent arrives", dev)
		}
		if dev == "rxe0" {
			// RoCE retransmits through a short flap: it must survive whole.
			assert.True(t, survived, "%s source:\n%s\nsink:\n%s", dev, e.srcOut, e.sinkOut)
			assert.Equal(t, sent, got, "%s: every message sent arrives", dev)
		} else if !survived {
			// A known limit of siw, not of this library: siw ends every
			// connection of a device whose netdev goes down, however
			// briefly (see siwFlapLimit; TestSiwEndsConnectionsOnNetdevDown
			// shows it in one guest, with no keepalive and a TCP path the
			// flap does not touch). The table records it as such. Both
			// ends must learn of it as that teardown (DISCONNECTED, not a
			// probe's failure or a TERMINATE) and clean up. An end that
			// posts (a CREDIT frame) between siw's reset of the QP and
			// the DISCONNECTED event has its post refused, and reports
			// the end that follows (refusedLocked).
			assert.Contains(t, e.srcOut.String(), "send error: ", "the sender learns of the failure")
			for _, out := range []*lockedOutput{e.srcOut, e.sinkOut} {
				assert.Contains(t, out.String(), "DISCONNECTED", "siw's netdev-down teardown shows as DISCONNECTED; "+
					"any other failure is to be explained")
			}
			t.Logf("%s did not survive the flap (a siw limit):\n%s\n%s", dev, e.srcOut, e.sinkOut)
		}
	}

	// Idle connections with keepalive on both links.
	type idle struct {
		cli  *testbed.Cmd
		cout *lockedOutput
	}
	connectIdle := func(port int) map[string]idle {
		conns := map[string]idle{}
		for i, dev := range devs {
			addr := addrOf(dev, port+i)
			_, sout := start(a, keepalivePeerEnv, "server:"+addr)
			require.NoError(t, a.WaitListening(ctx, netip.MustParseAddrPort(addr)))
			cli, cout := start(b, keepalivePeerEnv, "client:"+addr)
			waitFor(t, cout, "client connected", time.Minute)
			waitFor(t, sout, "server connected", time.Minute)
			conns[dev] = idle{cli, cout}
		}
		return conns
	}
	noticed := func(fault, dev string, c idle, d time.Duration) {
		err := c.cli.Wait()
		out := c.cout.String()
		row := faultRow{fault: fault, transport: transport[dev], bound: keepaliveBound, detect: d,
			errors: "Recv: " + strings.TrimSpace(between(out, "probes sent: ", "\n")), leaked: peerLeaks(c.cout), lost: "– (idle)"}
		table.add(row)
		assert.NoError(t, err, "%s client:\n%s", dev, out)
		assert.Contains(t, out, "saw the peer stop answering")
		assert.Equal(t, "none", row.leaked)
	}
	conns := connectIdle(7800)
	time.Sleep(1500 * time.Millisecond)
	for dev, c := range conns {
		require.NotContains(t, c.cout.String(), "Recv failed", "%s: a live peer was declared dead", dev)
	}
	// One link at a time: the other connection must stay up.
	for i, dev := range devs {
		require.NoError(t, a.SetLink(ctx, netdev(dev), false))
		d := waitFor(t, conns[dev].cout, "Recv failed", keepaliveBound)
		noticed("link cut (netdev down) past the keepalive bound", dev, conns[dev], d)
		if i == 0 {
			assert.NotContains(t, conns[devs[1]].cout.String(), "Recv failed", "%s is on the other link, which is up", devs[1])
		}
	}

	// A fresh pair for the last fault: a's rxe0 takes no new connection
	// after the cut. Debian's 6.1 rxe stops taking packets (its rcvd_pkts
	// counter stands still, the GSI QP's send PSN too) once a connection
	// on it ended while its netdev was down, and stays so after the link
	// is back, until the device is deleted and added again. A flap with no
	// connection ending during it leaves rxe0 working. rping shows the same
	// (bench/notes.md, "rxe after a cut").
	a.Close()
	b.Close()
	a, b, err = testbed.BootPair(ctx, testbed.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { a.Close(); b.Close() })
	conns = connectIdle(7810)
	a.Kill()
	killed := time.Now()
	// Both ends are watched at once: each detection time is when its own
	// failure showed, not after the other's client was waited for.
	detected := map[string]time.Duration{}
	for len(detected) < len(devs) && time.Since(killed) < keepaliveBound {
		for _, dev := range devs {
			if _, ok := detected[dev]; !ok && strings.Contains(conns[dev].cout.String(), "Recv failed") {
				detected[dev] = time.Since(killed)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, dev := range devs {
		d, ok := detected[dev]
		require.True(t, ok, "%s: no failure within %v of the kill:\n%s", dev, keepaliveBound, conns[dev].cout)
		noticed("peer guest killed", dev, conns[dev], d)
	}
	table.write(t, "faults-two-guests.md", "Faults across two guests (TestTwoGuestsFaultMatrix)",
		fmt.Sprintf("Message connections (rdmacm/msg) from guest b to guest a, rxe on one link and siw on the other, with "+
			"KeepAlive %v and KeepAliveTimeout %v (bound: 2 × KeepAlive + KeepAliveTimeout and 2 s of slack for the emulated "+
			"CPU); under the flap, KeepAlive 2 s, longer than the flap, as a real keepalive period is. Faults are made on a's side; b's processes report what they saw and what they left behind (cm_ids, "+
			"QPs, CQs, MRs, PDs, fds, goroutines after Close). \"Lost\" is messages whose Send returned nil and that never "+
			"reached the peer's Recv.", keepaliveTestConfig.KeepAlive, keepaliveTestConfig.KeepAliveTimeout))
}

// siwFlapLimit heads the siw flap row when the connection ended: on
// NETDEV_GOING_DOWN siw_netdev_event (drivers/infiniband/sw/siw/siw_main.c,
// Linux 6.1) schedules siw_netdev_down, which moves every QP of the device
// to ERROR; from RTS that drops the connection (siw_qp_modify,
// siw_qp_cm_drop), and both ends get DISCONNECTED, whatever TCP would
// have survived.
const siwFlapLimit = "known siw limit, not survivable: siw moves every QP of the device to ERROR when its netdev goes down " +
	"(siw_netdev_down), so any flap ends its connections; what the ends saw: "

// rxePanicked reports whether err is a guest lost to a kernel panic in
// rdma_rxe (a function of the module in the trace, not just the module list).
func rxePanicked(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Kernel panic") && strings.Contains(err.Error(), "[rdma_rxe]")
}

// count reads the first number pattern captures in out (0 if none).
func count(out *lockedOutput, pattern string) int {
	m := regexp.MustCompile(pattern).FindStringSubmatch(out.String())
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// peerLeaks joins what the peers reported left behind ("none" if all did).
func peerLeaks(outs ...*lockedOutput) string {
	var left []string
	for _, o := range outs {
		l := between(o.String(), "leaked: ", "\n")
		if l == "" {
			l = "not reported"
		}
		if l != "none" {
			left = append(left, l)
		}
	}
	if len(left) == 0 {
		return "none"
	}
	return strings.Join(left, "; ")
}

// between is the text of s after the first from, up to to.
func between(s, from, to string) string {
	_, after, ok := strings.Cut(s, from)
	if !ok {
		return ""
	}
	before, _, _ := strings.Cut(after, to)
	return before
}
