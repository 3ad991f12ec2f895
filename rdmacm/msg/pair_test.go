//go:build testbed

package msg

import (
	"context"
	"fmt"
	"net/netip"
	"os"
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
	os.Exit(m.Run())
}

// TestTwoGuestsKeepalive holds an idle message connection over rxe and one
// over siw from guest b to guest a, then takes a away: first its RoCE link
// (the siw connection, on the other link, must stay up), then the whole
// guest. Guest b learns of each only through its keepalive probes, within
// the bound.
func TestTwoGuestsKeepalive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, b, err := testbed.BootPair(ctx, testbed.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { a.Close(); b.Close() })
	self, err := os.Executable()
	require.NoError(t, err)
	start := func(g *testbed.Guest, spec string) (*testbed.Cmd, *lockedOutput) {
		c := g.Command(ctx, self, "-test.run=^$")
		c.Env = append(os.Environ(), keepalivePeerEnv+"="+spec)
		out := &lockedOutput{}
		c.Stdout, c.Stderr = out, out
		require.NoError(t, c.Start())
		return c, out
	}
	type conn struct {
		cli  *testbed.Cmd
		cout *lockedOutput
	}
	conns := map[string]conn{}
	for i, dev := range []string{"rxe0", "siw0"} {
		addr := fmt.Sprintf("%s:%d", a.Topology.MustDevice(t, dev).IPv4, 7800+i)
		_, sout := start(a, "server:"+addr)
		require.NoError(t, a.WaitListening(ctx, netip.MustParseAddrPort(addr)))
		cli, cout := start(b, "client:"+addr)
		waitFor(t, cout, "client connected", time.Minute)
		waitFor(t, sout, "server connected", time.Minute)
		conns[dev] = conn{cli, cout}
	}
	time.Sleep(1500 * time.Millisecond)
	for dev, c := range conns {
		require.NotContains(t, c.cout.String(), "Recv failed", "%s: a live peer was declared dead", dev)
	}

	// The RoCE link goes down on a's side.
	require.NoError(t, a.SetLink(ctx, a.Topology.MustDevice(t, "rxe0").Netdev, false))
	d := waitFor(t, conns["rxe0"].cout, "Recv failed", keepaliveBound)
	require.NoError(t, conns["rxe0"].cli.Wait(), "rxe0 client:\n%s", conns["rxe0"].cout)
	assert.Contains(t, conns["rxe0"].cout.String(), "saw the peer stop answering")
	t.Logf("rxe0, link cut: noticed within %v (bound %v):\n%s", d.Round(time.Millisecond), keepaliveBound, conns["rxe0"].cout)
	assert.NotContains(t, conns["siw0"].cout.String(), "Recv failed", "siw0 is on the other link, which is up")

	// Then guest a vanishes.
	a.Kill()
	d = waitFor(t, conns["siw0"].cout, "Recv failed", keepaliveBound)
	require.NoError(t, conns["siw0"].cli.Wait(), "siw0 client:\n%s", conns["siw0"].cout)
	assert.Contains(t, conns["siw0"].cout.String(), "saw the peer stop answering")
	t.Logf("siw0, peer guest killed: noticed within %v (bound %v):\n%s", d.Round(time.Millisecond), keepaliveBound, conns["siw0"].cout)
}
