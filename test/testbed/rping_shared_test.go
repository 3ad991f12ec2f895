//go:build integration || testbed

package testbed_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/rdmago/test/testbed"
)

// process is a started command: wait returns its combined output. Output is
// read only after the command ended, and each command has one writer (os/exec
// serialises a shared Stdout/Stderr; the guest agent writes from one
// goroutine), so a bytes.Buffer suffices.
type process interface {
	wait() (string, error)
}

// runner starts a command in some network namespace of some machine.
type runner func(ctx context.Context, netns string, argv ...string) (process, error)

// endpoint is where one side of an rping runs.
type endpoint struct {
	run   runner
	netns string
	// waitListening blocks until a listener is up on addr, seen from this side's machine.
	waitListening func(ctx context.Context, addr netip.AddrPort) error
}

// checkRping runs rdma-core's rping server on srv and client on cli against
// addr, and asserts both exit 0 having moved count verified pings. The server
// is waited for (not slept for) before the client starts.
func checkRping(t *testing.T, srv, cli endpoint, addr netip.AddrPort, count int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	a, p, n := addr.Addr().String(), fmt.Sprint(addr.Port()), fmt.Sprint(count)
	// rping prints through a buffered stdout: line-buffered, a run killed
	// by the timeout still shows how far it got.
	server, err := srv.run(ctx, srv.netns, "stdbuf", "-oL", "rping", "-s", "-v", "-a", a, "-p", p, "-C", n)
	if err != nil {
		t.Fatalf("starting rping server: %v", err)
	}
	if err := srv.waitListening(ctx, addr); err != nil {
		cancel()
		out, _ := server.wait()
		t.Fatalf("rping server never listened: %v\nserver output:\n%s\nserver's kernel log:\n%s", err, out, kernelTail(srv))
	}
	client, err := cli.run(ctx, cli.netns, "stdbuf", "-oL", "rping", "-c", "-v", "-V", "-a", a, "-p", p, "-C", n)
	if err != nil {
		t.Fatalf("starting rping client: %v", err)
	}
	// A run that hangs is killed at ctx's end, and its connection with it:
	// what the CM and TCP held is taken while it still hangs.
	hung := make(chan string, 1)
	watch := time.AfterFunc(45*time.Second, func() {
		hung <- "still running after 45 s; the client's side then:\n" + connState(cli) +
			"\nthe server's side:\n" + connState(srv)
	})
	cout, cerr := client.wait()
	sout, serr := server.wait()
	state := ""
	if !watch.Stop() {
		state = <-hung // taken, or being taken: it is sent once
	}
	if cerr != nil || serr != nil {
		ck, sk := kernelTail(cli), kernelTail(srv)
		logs := "client's kernel log:\n" + ck + "\nserver's kernel log:\n" + sk
		if ck == sk { // one machine
			logs = "kernel log:\n" + ck
		}
		if state != "" {
			logs += "\n" + state
		}
		t.Fatalf("rping over %v failed\nclient: %v\n%s\nserver: %v\n%s\n%s", addr, cerr, cout, serr, sout, logs)
	}
	// With -v each side prints one line per iteration; -V makes the client
	// compare what it read back with what it sent.
	if got := strings.Count(cout, "ping data: rdma-ping-"); got != count {
		t.Errorf("client completed %d pings, want %d:\n%s", got, count, cout)
	}
	if got := strings.Count(sout, "server ping data: rdma-ping-"); got != count {
		t.Errorf("server completed %d pings, want %d:\n%s", got, count, sout)
	}
}

// kernelTail is the end of the kernel log on e's machine, for a failure's
// report: a connection that never completes often leaves its reason there.
func kernelTail(e endpoint) string {
	return shellOutput(e, "", "dmesg | tail -n 40")
}

// connState is what e's machine holds of connections: the CM's ids with
// their states, and TCP's sockets in e's namespace (iWARP's among them).
func connState(e endpoint) string {
	return shellOutput(e, e.netns, testbed.ConnStateScript)
}

// shellOutput runs script with sh on e's machine, in netns, and returns
// its output, or why there is none.
func shellOutput(e endpoint, netns, script string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := e.run(ctx, netns, "sh", "-c", script)
	if err != nil {
		return fmt.Sprintf("(%s: %v)", script, err)
	}
	out, err := p.wait()
	if err != nil {
		return fmt.Sprintf("%s(%s: %v)", out, script, err)
	}
	return out
}
