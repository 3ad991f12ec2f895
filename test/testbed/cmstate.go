package testbed

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// CMState is what a test that failed to connect should print, inside a
// guest: the CM's ids (rdma res show cm_id), the TCP listeners (siw
// listens with a kernel TCP socket), and the kernel log's last lines.
// Each command is killed after 10 s; one stuck in the kernel would still
// hold the caller until it returns.
func CMState() string {
	var b strings.Builder
	for _, c := range [][]string{{"rdma", "res", "show", "cm_id"}, {"ss", "-tln"}, {"sh", "-c", "dmesg | tail -n 20"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput()
		cancel()
		fmt.Fprintf(&b, "$ %s\n%s", strings.Join(c, " "), out)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
	}
	return b.String()
}
