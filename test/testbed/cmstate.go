package testbed

import (
	"context"
	"fmt"
	"os/exec"
	"time"
)

// ConnStateScript is a shell script that prints what a machine holds of
// connections: the CM's ids with their states, and TCP's sockets (siw's
// among them: iWARP runs over the kernel's TCP).
const ConnStateScript = "rdma res show cm_id; ss -tanoi"

// CMState is what a test that failed to connect should print, inside a
// guest: ConnStateScript's output and the kernel log's last lines. The
// shell is killed after 10 s; a command stuck in the kernel would still
// hold the caller until it returns.
func CMState() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	script := ConnStateScript + "; dmesg | tail -n 20"
	out, err := exec.CommandContext(ctx, "sh", "-c", script).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s(%s: %v)", out, script, err)
	}
	return string(out)
}
