//go:build integration || testbed

package msg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
)

// keepalivePeerEnv makes the test binary one end of a keepalive test, in
// another network namespace or guest: "server:ADDRESS" or "client:ADDRESS".
// The end connects, then waits in Recv until the connection fails, and
// exits 0 only if it failed because the peer stopped answering, or the
// connection ended (the end whose own link is cut hears it from its device).
const keepalivePeerEnv = "MSG_KEEPALIVE_PEER"

// keepaliveBound is how long after a cut the ends must have noticed:
// a silent period, the wait for the probe's answer, and slack for the
// emulated CPU and the timers.
var (
	keepaliveTestConfig = Config{KeepAlive: 300 * time.Millisecond, KeepAliveTimeout: time.Second}
	keepaliveBound      = 2*keepaliveTestConfig.KeepAlive + keepaliveTestConfig.KeepAliveTimeout + 2*time.Second
)

func keepalivePeer(spec string) int {
	role, addr, _ := strings.Cut(spec, ":")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := keepaliveTestConfig
	// librdmacm opens every device on first use and keeps them: before the
	// leak snapshot.
	rdmacm.OpenDevice("rxe0")
	snap, err := testbed.TakeSnapshot()
	if err != nil {
		fmt.Println(role, "error:", err)
		return 1
	}
	var c *Conn
	switch role {
	case "server":
		var l *Listener
		if l, err = Listen(ctx, nil, addr, &cfg); err == nil {
			c, err = l.Accept(ctx)
			l.Close()
		}
	case "client":
		// A link that just came back up may still drop the first
		// requests (neighbour entries, the port going ACTIVE): retry.
		for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
			if c, err = Dial(ctx, nil, addr, &cfg); err == nil || time.Since(start) > 30*time.Second {
				break
			}
		}
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Println(role, "error:", err)
		return 1
	}
	fmt.Println(role, "connected")
	start := time.Now()
	_, err = c.Recv(ctx)
	c.mu.Lock()
	probes := c.ka.probes
	c.mu.Unlock()
	fmt.Printf("%s: Recv failed after %v, %d probes sent: %v\n", role, time.Since(start).Round(time.Millisecond), probes, err)
	c.Close()
	fmt.Printf("%s: leaked: %s\n", role, leaksSince(snap))
	switch {
	case errors.Is(err, ErrPeerUnresponsive):
		fmt.Println(role, "saw the peer stop answering: ok")
	case errors.Is(err, rdmacm.ErrEnded):
		fmt.Println(role, "saw the connection end: ok")
	default:
		return 1
	}
	return 0
}

// lockedOutput collects a child process's output as it arrives.
type lockedOutput struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedOutput) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedOutput) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor waits until out contains s, or fails the test.
func waitFor(t *testing.T, out *lockedOutput, s string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for !strings.Contains(out.String(), s) {
		require.Less(t, time.Since(start), within, "no %q within %v:\n%s", s, within, out)
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}
