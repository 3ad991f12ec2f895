//go:build integration

package msg

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/test/testbed"
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
}
