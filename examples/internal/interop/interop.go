// Package interop runs rdma-core's C tools next to our examples inside a
// test bed guest, for the examples' interoperability tests.
package interop

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
)

// Proc is a C tool running in the guest.
type Proc struct {
	cmd  *exec.Cmd
	out  *bytes.Buffer
	done chan struct{}
	err  error
}

// Start runs argv; the test's end kills it if it still runs.
func Start(t testing.TB, ctx context.Context, argv ...string) *Proc {
	t.Helper()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	p := &Proc{cmd: cmd, out: &bytes.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %v: %v", argv, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.Stop() })
	return p
}

// Wait waits for the tool to end and returns its output.
func (p *Proc) Wait() (string, error) {
	<-p.done
	return p.out.String(), p.err
}

// Stop ends a tool that serves forever (SIGTERM, then SIGKILL) and returns
// its output.
func (p *Proc) Stop() string {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(3 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	return p.out.String()
}

// Done is closed when the tool has ended.
func (p *Proc) Done() <-chan struct{} { return p.done }

// WaitListening waits until a CM id listens on addr, or the tool ended.
func (p *Proc) WaitListening(t testing.TB, ctx context.Context, addr netip.AddrPort) {
	t.Helper()
	if err := WaitListening(ctx, addr, p.done); err != nil {
		t.Fatalf("%v\noutput:\n%s", err, p.Stop())
	}
}

// WaitListening waits until a CM id listens on addr; it gives up when
// ended (the server's end) is closed first.
func WaitListening(ctx context.Context, addr netip.AddrPort, ended <-chan struct{}) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-ended:
			cancel()
		case <-wctx.Done():
		}
	}()
	if err := testbed.WaitListening(wctx, addr); err != nil {
		return fmt.Errorf("nothing listens on %v (did the server end early?): %w", addr, err)
	}
	return nil
}

// Task is one of our examples' run functions on a goroutine.
type Task struct {
	done chan struct{}
	err  error
}

// Go runs f.
func Go(f func() error) *Task {
	tk := &Task{done: make(chan struct{})}
	go func() {
		defer close(tk.done)
		tk.err = f()
	}()
	return tk
}

// Wait waits for f to return and returns its error.
func (tk *Task) Wait() error {
	<-tk.done
	return tk.err
}

// WaitListening waits until the task listens on addr.
func (tk *Task) WaitListening(t testing.TB, ctx context.Context, addr netip.AddrPort) {
	t.Helper()
	if err := WaitListening(ctx, addr, tk.done); err != nil {
		select {
		case <-tk.done:
			t.Fatalf("%v: the server returned %v", err, tk.err)
		default:
			t.Fatal(err)
		}
	}
}

var nextPort atomic.Int32

// Addr is a fresh port on the device's IPv4 address.
func Addr(t testing.TB, device string) netip.AddrPort {
	d := testbed.Require(t).MustDevice(t, device)
	return netip.AddrPortFrom(netip.MustParseAddr(d.IPv4), uint16(9000+nextPort.Add(1)))
}

// Lines are the output lines that start with prefix.
func Lines(out, prefix string) []string {
	var l []string
	for _, s := range strings.Split(out, "\n") {
		if strings.HasPrefix(s, prefix) {
			l = append(l, s)
		}
	}
	return l
}

// Device names the test bed's devices: one of each transport.
var Devices = []string{"rxe0", "siw0"}

// CheckNoLeaks fails the test if, once it ended, the process holds more
// file descriptors, goroutines or RDMA objects than before it began.
func CheckNoLeaks(t testing.TB) {
	t.Helper()
	warm.Do(func() { warmUp(t) })
	fds, gs, objs := openFDs(), runtime.NumGoroutine(), rdmaObjects(t)
	t.Cleanup(func() {
		var nfds, ngs int
		var nobjs string
		for i := 0; i < 50; i++ { // closing lets goroutines and the kernel catch up
			nfds, ngs, nobjs = openFDs(), runtime.NumGoroutine(), rdmaObjects(t)
			if nfds <= fds && ngs <= gs && nobjs == objs {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("leak: %d fds (was %d), %d goroutines (was %d), RDMA objects %q (was %q)", nfds, fds, ngs, gs, nobjs, objs)
	})
}

// Begin starts a test that runs examples on the test bed: it checks for
// leaks when the test ends, and returns the test's context, which ends
// after a minute or with the test.
func Begin(t testing.TB) context.Context {
	t.Helper()
	CheckNoLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var warm sync.Once

// warmUp connects once over each device: librdmacm and the providers keep
// what they open on first use (device files, contexts) for the life of
// the process, which is no leak. rdmacm.OpenDevice (cmtime's shared PD)
// has librdmacm open every device, which it keeps as well.
func warmUp(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, name := range Devices {
		if _, err := rdmacm.OpenDevice(name); err != nil {
			t.Fatalf("warm-up on %s: %v", name, err)
		}
		l, err := rdmacm.Listen(Addr(t, name).String())
		if err != nil {
			t.Fatalf("warm-up on %s: %v", name, err)
		}
		accepted := Go(func() error {
			c, err := l.Accept(ctx)
			if err == nil {
				<-c.Done()
				c.Close()
			}
			return err
		})
		c, err := rdmacm.Dial(ctx, l.Addr().String())
		if err != nil {
			t.Fatalf("warm-up on %s: %v", name, err)
		}
		c.Close()
		accepted.Wait()
		l.Close()
	}
}

func openFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

// rdmaObjects counts this process's CM ids, QPs, CQs, MRs and PDs.
func rdmaObjects(t testing.TB) string {
	counts, err := testbed.Objects()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, kind := range testbed.ObjectKinds {
		fmt.Fprintf(&b, "%s=%d ", kind, counts[kind])
	}
	return b.String()
}

// Run is an example's entry point: flags in, output to out.
type Run func(ctx context.Context, args []string, out io.Writer) error

// BadArguments checks that each argument line is refused with an error
// containing its expected text, before anything touches a device.
func BadArguments(t *testing.T, run Run, cases map[string]string) {
	t.Helper()
	for args, want := range cases {
		err := run(context.Background(), strings.Fields(args), io.Discard)
		if err == nil {
			t.Errorf("%q: accepted", args)
		} else if !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %q does not say %q", args, err, want)
		}
	}
}
