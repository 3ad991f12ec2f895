//go:build testbed

// Tests built with the testbed tag run on the host and boot guests themselves:
// two RoCE hosts need two kernels, and faults (a cut link, a guest killed
// outright) need a machine to break. Run them with 'go test -tags testbed'.
package testbed_test

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/test/testbed"
)

func bootPair(t *testing.T) (a, b *testbed.Guest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, b, err := testbed.BootPair(ctx, testbed.Options{})
	require.NoError(t, err)
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b
}

type guestProcess struct {
	cmd *testbed.Cmd
	out *bytes.Buffer
}

func (p *guestProcess) wait() (string, error) {
	err := p.cmd.Wait()
	return p.out.String(), err
}

func remote(g *testbed.Guest) endpoint {
	run := func(ctx context.Context, netns string, argv ...string) (process, error) {
		cmd := g.Command(ctx, argv[0], argv[1:]...)
		cmd.Netns = netns
		out := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		return &guestProcess{cmd: cmd, out: out}, nil
	}
	return endpoint{run: run, waitListening: g.WaitListening}
}

// TestTwoGuests runs on one pair, in order: rping across the link on both
// devices, then a cut link, then a guest killed outright (last: it ends the pair).
func TestTwoGuests(t *testing.T) {
	a, b := bootPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rxeA, rxeB := a.Topology.MustDevice(t, "rxe0"), b.Topology.MustDevice(t, "rxe0")
	siwA := a.Topology.MustDevice(t, "siw0")

	for _, tc := range []struct{ name, addr string }{
		{"rping/rxe/IPv4", rxeA.IPv4},
		{"rping/rxe/IPv6", rxeA.IPv6},
		{"rping/siw/IPv4", siwA.IPv4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkRping(t, remote(a), remote(b), netip.AddrPortFrom(netip.MustParseAddr(tc.addr), 7300), 50)
		})
	}

	portState := func(g *testbed.Guest) string {
		out, err := g.Command(ctx, "rdma", "link", "show", "rxe0/1").CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	t.Run("cut link", func(t *testing.T) {
		require.NoError(t, b.SetLink(ctx, rxeB.Netdev, false))
		assert.Eventually(t, func() bool { return strings.Contains(portState(b), "state DOWN") },
			10*time.Second, 100*time.Millisecond, "rxe0 port on b goes DOWN with its netdev")
		err := a.Command(ctx, "ping", "-c", "1", "-W", "1", rxeB.IPv4).Run()
		assert.Error(t, err, "nothing crosses a cut link")
		require.NoError(t, b.SetLink(ctx, rxeB.Netdev, true))
		assert.Eventually(t, func() bool { return strings.Contains(portState(b), "state ACTIVE") },
			10*time.Second, 100*time.Millisecond, "and comes back ACTIVE")
		checkRping(t, remote(a), remote(b), netip.AddrPortFrom(netip.MustParseAddr(rxeA.IPv4), 7301), 10)
	})
	t.Run("kill guest", func(t *testing.T) {
		sleeper := b.Command(ctx, "sleep", "600")
		require.NoError(t, sleeper.Start())
		start := time.Now()
		b.Kill()
		err := sleeper.Wait()
		var exit *testbed.ExitError
		require.ErrorAs(t, err, &exit, "a command in a killed guest fails")
		assert.Less(t, time.Since(start), 10*time.Second, "and fails promptly")
		out, err := a.Command(ctx, "rdma", "link", "show").CombinedOutput()
		require.NoError(t, err)
		assert.Contains(t, string(out), "rxe0/1 state ACTIVE", "the surviving guest is unaffected")
		err = a.Command(ctx, "ping", "-c", "1", "-W", "2", rxeB.IPv4).Run()
		assert.Error(t, err, "the killed guest is gone from the link")
	})
}

// A guest that cannot start fails at once with qemu's reason: here a
// regular file shared as a writable directory.
func TestBootFailureShowsQemuError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-directory")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	start := time.Now()
	_, err := testbed.Boot(context.Background(), testbed.Options{Writable: []string{file}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "qemu said:")
	assert.Contains(t, err.Error(), "Not a directory")
	assert.Less(t, time.Since(start), time.Minute, "noticed at once, not at the boot timeout")
}

// A guest whose kernel dies under a command fails the command loudly, with
// the kernel's last words from the console.
func TestGuestCrashShowsConsole(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g, err := testbed.Boot(ctx, testbed.Options{})
	require.NoError(t, err)
	defer g.Close()
	err = g.Command(ctx, "sh", "-c", "echo c > /proc/sysrq-trigger").Run()
	var exit *testbed.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Contains(t, err.Error(), "lost the guest's agent")
	assert.Contains(t, err.Error(), "--- guest console")
	assert.Contains(t, err.Error(), "Kernel panic", "the console tail is in the error")
}
