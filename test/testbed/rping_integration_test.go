//go:build integration

package testbed_test

import (
	"bytes"
	"context"
	"net/netip"
	"os/exec"
	"testing"

	"github.com/rdmago/rdmago/test/testbed"
)

type localProcess struct {
	cmd *exec.Cmd
	out *bytes.Buffer
}

func (p *localProcess) wait() (string, error) {
	err := p.cmd.Wait()
	return p.out.String(), err
}

// inGuest runs commands in this guest, in a namespace if asked.
func inGuest(ctx context.Context, netns string, argv ...string) (process, error) {
	if netns != "" {
		argv = append([]string{"ip", "netns", "exec", netns}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &localProcess{cmd: cmd, out: out}, nil
}

func local(netns string) endpoint {
	return endpoint{run: inGuest, netns: netns, waitListening: testbed.WaitListening}
}

func TestRpingRXE(t *testing.T) {
	topo := testbed.Require(t)
	rxe := topo.MustDevice(t, "rxe0")
	// One rxe device talks to itself: the connection loops inside the real
	// rxe stack (QPs, packets, completions), over each kind of address.
	for name, addr := range map[string]string{"IPv4": rxe.IPv4, "IPv6": rxe.IPv6, "VLAN": rxe.VLAN.IPv4} {
		t.Run(name, func(t *testing.T) {
			checkRping(t, local(""), local(""), netip.AddrPortFrom(netip.MustParseAddr(addr), 7100), 20)
		})
	}
}

func TestRpingSIW(t *testing.T) {
	topo := testbed.Require(t)
	t.Run("loop", func(t *testing.T) {
		siw := topo.MustDevice(t, "siw0")
		checkRping(t, local(""), local(""), netip.AddrPortFrom(netip.MustParseAddr(siw.IPv4), 7200), 20)
	})
	t.Run("namespaces", func(t *testing.T) {
		// Two iWARP hosts: server on siwa in its namespace, client on siwb in another.
		a, b := topo.MustDevice(t, "siwa"), topo.MustDevice(t, "siwb")
		checkRping(t, local(a.Netns), local(b.Netns), netip.AddrPortFrom(netip.MustParseAddr(a.IPv4), 7201), 20)
	})
}
