package testbed

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"time"
)

// WaitListening waits, inside a guest, until an rdma_cm id is listening on
// addr (any device, any namespace), as 'rdma resource show cm_id' reports it.
// Starting a client a fixed time after its server is flaky under emulation;
// waiting for the listener is not.
func WaitListening(ctx context.Context, addr netip.AddrPort) error {
	return waitListening(ctx, addr, func() ([]byte, error) {
		return exec.CommandContext(ctx, "rdma", "resource", "show", "cm_id").CombinedOutput()
	})
}

// WaitListening is the host-side form of the package function: it waits
// until an rdma_cm id listens on addr inside g.
func (g *Guest) WaitListening(ctx context.Context, addr netip.AddrPort) error {
	return waitListening(ctx, addr, func() ([]byte, error) {
		return g.Command(ctx, "rdma", "resource", "show", "cm_id").CombinedOutput()
	})
}

func waitListening(ctx context.Context, addr netip.AddrPort, list func() ([]byte, error)) error {
	var last string
	for {
		out, err := list()
		last = string(out)
		if err == nil && listening(last, addr) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testbed: nothing listening on %v: %w; rdma resource show cm_id said:\n%s", addr, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// listening reports whether 'rdma resource show cm_id' output shows a
// listener on addr.
func listening(out string, addr netip.AddrPort) bool {
	want := "src-addr " + addr.Addr().String() + ":" + fmt.Sprint(addr.Port()) + " "
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "state LISTEN") && strings.Contains(line+" ", want) {
			return true
		}
	}
	return false
}
