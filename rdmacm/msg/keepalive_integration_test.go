//go:build integration

package msg

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

// An idle connection whose peer is alive answers every probe and stays
// up: probes go out, nothing fails, and messages flow afterwards.
func TestKeepaliveKeepsAnIdleConnection(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		cfg := &Config{KeepAlive: 100 * time.Millisecond, KeepAliveTimeout: 500 * time.Millisecond}
		client, server := pair(t, d, cfg, cfg)
		time.Sleep(1500 * time.Millisecond)
		for _, c := range []*Conn{client, server} {
			c.mu.Lock()
			probes, failed := c.ka.probes, c.failed
			c.mu.Unlock()
			require.NoError(t, failed)
			assert.GreaterOrEqual(t, probes, 3, "probes sent in 1.5 s of silence, every 100 ms")
		}
		ctx := ctxFor(t, 10*time.Second)
		require.NoError(t, client.Send(ctx, []byte("still there?")))
		m, err := server.Recv(ctx)
		require.NoError(t, err)
		assert.Equal(t, "still there?", string(m.Bytes()))
		m.Release()
	})
}

// A peer that grants no RDMA READs (its ResponderResources negative) leaves
// this side's QP with an initiator depth of 0 on rxe: the first probe is
// refused at the post, and the connection fails at once saying why,
// rather than waiting for a teardown that a refusal usually foretells.
// (siw does not apply a peer's IRD of 0: there the probes go.)
func TestKeepaliveWithoutReadsFailsSayingWhy(t *testing.T) {
	checkNoLeaks(t)
	d := rxe(t)
	addr := d.at(port())
	l, err := Listen(ctxFor(t, 5*time.Second), &rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{ResponderResources: -1}},
		addr, nil)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, l.Close()) })
	ctx := ctxFor(t, 20*time.Second)
	client, server := dialAccept(t, ctx, l, addr, &Config{KeepAlive: 20 * time.Millisecond})
	t.Cleanup(func() {
		assert.NoError(t, client.Close())
		assert.NoError(t, server.Close())
	})
	_, err = client.Recv(ctx)
	assert.ErrorIs(t, err, ErrTransport)
	assert.ErrorIs(t, err, verbs.ErrNoInitiatorDepth)
	assert.ErrorContains(t, err, "the peer granted no responder resources (its ConnConfig.ResponderResources is negative)")
	_, err = server.Recv(ctx)
	assert.Error(t, err, "the dialer disconnected")
}

// On iWARP a peer that vanishes leaves TCP retransmitting for minutes; with
// KeepAlive the other end notices within the bound. The two ends run in
// the namespaces of siwa and siwb (two iWARP hosts joined by a veth pair),
// and the test cuts the server's link under an idle connection: the
// client, whose link stays up, can tell only by its probes; the server
// hears of its own link from its device.
func TestKeepaliveNoticesASilentPeerIWARP(t *testing.T) {
	topo := testbed.Require(t)
	a, b := topo.MustDevice(t, "siwa"), topo.MustDevice(t, "siwb")
	self, err := os.Executable()
	require.NoError(t, err)
	ctx := ctxFor(t, 2*time.Minute)
	addr := fmt.Sprintf("%s:%d", a.IPv4, port())
	start := func(netns, spec string) (*exec.Cmd, *lockedOutput) {
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", netns, self, "-test.run=^$")
		cmd.Env = append(os.Environ(), keepalivePeerEnv+"="+spec)
		out := &lockedOutput{}
		cmd.Stdout, cmd.Stderr = out, out
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd, out
	}
	srv, sout := start(a.Netns, "server:"+addr)
	time.Sleep(500 * time.Millisecond) // the listener is up well before this
	cli, cout := start(b.Netns, "client:"+addr)
	waitFor(t, cout, "client connected", 30*time.Second)
	waitFor(t, sout, "server connected", 30*time.Second)

	// Probes come and go while the link is up.
	time.Sleep(1500 * time.Millisecond)
	require.NotContains(t, cout.String()+sout.String(), "Recv failed", "a live peer was declared dead")

	link := func(state string) error {
		return exec.Command("ip", "-n", a.Netns, "link", "set", a.Netdev, state).Run()
	}
	require.NoError(t, link("down"))
	t.Cleanup(func() { assert.NoError(t, link("up")) })
	dc := waitFor(t, cout, "Recv failed", keepaliveBound)
	ds := waitFor(t, sout, "Recv failed", keepaliveBound)
	cerr, serr := cli.Wait(), srv.Wait()
	t.Logf("after the cut, the client noticed within %v and the server within %v (bound %v):\nclient: %sserver: %s",
		dc.Round(time.Millisecond), ds.Round(time.Millisecond), keepaliveBound, cout, sout)
	assert.NoError(t, cerr, "client:\n%s", cout)
	assert.NoError(t, serr, "server:\n%s", sout)
	// The client's link stayed up: only the probes can tell it.
	assert.Contains(t, cout.String(), "saw the peer stop answering")
	// Each end released everything once its connection failed.
	assert.Contains(t, cout.String(), "client: leaked: none")
	assert.Contains(t, sout.String(), "server: leaked: none")
}

// Busy connections with a short keepalive stay up: the probes that go out
// between bursts (and while the peer's device is busy sending) are valid
// RDMA READs on both transports, and the peer's device answers them rather
// than ending the connection with a TERMINATE (siw) or an error completion.
// Several pairs trade messages of many sizes both ways, rest (so that
// probes go out on a send queue whose slots held sends before), trade
// again, and must lose nothing; on siw, the kernel log must not show a
// TERMINATE.
func TestKeepaliveKeepsBusyConnections(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		terms := kernelTerminates(t)
		cfg := &Config{KeepAlive: 5 * time.Millisecond, KeepAliveTimeout: 5 * time.Second, MaxMessageSize: 16 << 10}
		const pairs, rounds, perRound = 3, 3, 100
		type end struct{ a, b *Conn }
		ends := make([]end, pairs)
		for i := range ends {
			ends[i].a, ends[i].b = pair(t, d, cfg, cfg)
		}
		ctx := ctxFor(t, 3*time.Minute)
		msgOf := func(i, n int) []byte {
			p := make([]byte, 1+(n*7919)%(16<<10-1))
			for j := range p {
				p[j] = byte(i + n + j)
			}
			return p
		}
		var wg sync.WaitGroup
		pump := func(i int, from, to *Conn, round int) {
			defer wg.Done()
			go func() {
				for n := round * perRound; n < (round+1)*perRound; n++ {
					if err := from.Send(ctx, msgOf(i, n)); err != nil {
						t.Errorf("pair %d: send %d: %v", i, n, err)
						return
					}
				}
			}()
			for n := round * perRound; n < (round+1)*perRound; n++ {
				m, err := to.Recv(ctx)
				if err != nil {
					t.Errorf("pair %d: receive %d: %v", i, n, err)
					return
				}
				ok := bytes.Equal(m.Bytes(), msgOf(i, n))
				m.Release()
				if !ok {
					t.Errorf("pair %d: message %d arrived changed", i, n)
					return
				}
			}
		}
		for round := range rounds {
			for i, e := range ends {
				wg.Add(2)
				go pump(i, e.a, e.b, round)
				go pump(i, e.b, e.a, round)
			}
			wg.Wait()
			if t.Failed() {
				break
			}
			// A rest: every end probes its silent peer.
			time.Sleep(100 * time.Millisecond)
		}
		for i, e := range ends {
			for _, c := range []*Conn{e.a, e.b} {
				c.mu.Lock()
				probes, failed := c.ka.probes, c.failed
				c.mu.Unlock()
				assert.NoError(t, failed, "pair %d", i)
				assert.Greater(t, probes, 0, "pair %d: no probe went out", i)
			}
		}
		assert.Equal(t, terms, kernelTerminates(t), "the kernel log shows siw TERMINATEs during the test:\n%s", kernelLog(t))
	})
}

// kernelTerminates counts siw's "got TERMINATE" lines in the kernel log.
func kernelTerminates(t *testing.T) int {
	return strings.Count(kernelLog(t), "got TERMINATE")
}

func kernelLog(t *testing.T) string {
	out, err := exec.Command("dmesg").CombinedOutput()
	require.NoError(t, err, "dmesg: %s", out)
	return string(out)
}
