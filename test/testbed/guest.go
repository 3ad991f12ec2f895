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
	want := "src-addr " + addr.Addr().String() + ":" + fmt.Sprint(addr.Port()) + " "
	var last string
	for {
		out, err := exec.CommandContext(ctx, "rdma", "resource", "show", "cm_id").CombinedOutput()
		last = string(out)
		if err == nil {
			for _, line := range strings.Split(last, "\n") {
				if strings.Contains(line, "state LISTEN") && strings.Contains(line+" ", want) {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testbed: nothing listening on %v: %w; rdma resource show cm_id said:\n%s", addr, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
