//go:build testbed

package rdmacm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

// The test binary doubles as the programs run in each guest.
const peerEnv = "RDMAGO_RDMACM_PEER" // role:mode:address

func TestMain(m *testing.M) {
	if spec := os.Getenv(peerEnv); spec != "" {
		if err := runPeer(spec); err != nil {
			fmt.Println("peer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type pairRun struct {
	a, b *testbed.Guest
	self string
}

func bootPair(t *testing.T, ctx context.Context) *pairRun {
	a, b, err := testbed.BootPair(ctx, testbed.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { a.Close(); b.Close() })
	self, err := os.Executable()
	require.NoError(t, err)
	return &pairRun{a: a, b: b, self: self}
}

// lockedBuffer collects a guest command's output as it arrives.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (p *pairRun) start(t *testing.T, ctx context.Context, g *testbed.Guest, spec string) (*testbed.Cmd, *lockedBuffer) {
	c := g.Command(ctx, p.self, "-test.run=^$")
	c.Env = append(os.Environ(), peerEnv+"="+spec)
	out := &lockedBuffer{}
	c.Stdout, c.Stderr = out, out
	require.NoError(t, c.Start())
	return c, out
}

// TestTwoGuests connects guest b to guest a over rxe (a real two-host RoCE
// link) and over siw, in both modes where the transport has them, and
// runs the data path both ways.
func TestTwoGuests(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	p := bootPair(t, ctx)
	cases := []struct {
		dev  string
		mode rdmacm.Mode
	}{{"rxe0", rdmacm.ModeCM}, {"rxe0", rdmacm.ModeManual}, {"siw0", rdmacm.ModeCM}}
	for i, tc := range cases {
		t.Run(tc.dev+"/"+tc.mode.String(), func(t *testing.T) {
			addr := fmt.Sprintf("%s:%d", p.a.Topology.MustDevice(t, tc.dev).IPv4, 7600+i)
			srv, sout := p.start(t, ctx, p.a, fmt.Sprintf("server:%d:%s", tc.mode, addr))
			require.NoError(t, p.a.WaitListening(ctx, mustAddrPort(addr)))
			cli, cout := p.start(t, ctx, p.b, fmt.Sprintf("client:%d:%s", tc.mode, addr))
			cerr, serr := cli.Wait(), srv.Wait()
			// Both sides' output either way: one side's failure is often
			// explained by what the other saw.
			require.NoError(t, cerr, "client:\n%sserver:\n%s", cout, sout)
			require.NoError(t, serr, "server:\n%sclient:\n%s", sout, cout)
			assert.Contains(t, cout.String(), "client: ok")
			assert.Contains(t, sout.String(), "server: ok")
			t.Logf("client:\n%sserver:\n%s", cout, sout)
		})
	}
}

// TestTwoGuestsFaults streams RDMA traffic from b to a and then breaks the
// connection from outside: the link cut, then guest a killed outright. The
// survivor (b) must report the failure within its timeouts, close, and
// hold no RDMA object afterwards.
func TestTwoGuestsFaults(t *testing.T) {
	for _, fault := range []string{"link-cut", "peer-killed"} {
		t.Run(fault, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			p := bootPair(t, ctx)
			addr := p.a.Topology.MustDevice(t, "rxe0").IPv4 + ":7700"
			srv, _ := p.start(t, ctx, p.a, "sink:0:"+addr)
			defer srv.Signal(9)
			require.NoError(t, p.a.WaitListening(ctx, mustAddrPort(addr)))
			cli, cout := p.start(t, ctx, p.b, "stream:0:"+addr)
			deadline := time.Now().Add(60 * time.Second)
			for !strings.Contains(cout.String(), "streaming") {
				require.True(t, time.Now().Before(deadline), "never started streaming:\n%s", cout)
				time.Sleep(100 * time.Millisecond)
			}
			time.Sleep(time.Second)
			start := time.Now()
			switch fault {
			case "link-cut":
				require.NoError(t, p.a.SetLink(ctx, p.a.Topology.MustDevice(t, "rxe0").Netdev, false))
			case "peer-killed":
				p.a.Kill()
			}
			done := make(chan error, 1)
			go func() { done <- cli.Wait() }()
			select {
			case err := <-done:
				require.NoError(t, err, "survivor:\n%s", cout)
			case <-time.After(60 * time.Second):
				t.Fatalf("the survivor did not notice within 60 s:\n%s", cout)
			}
			t.Logf("survivor exited %v after the fault:\n%s", time.Since(start).Round(time.Millisecond), cout)
			assert.Contains(t, cout.String(), "survivor: ok")
		})
	}
}

func runPeer(spec string) error {
	parts := strings.SplitN(spec, ":", 3)
	if len(parts) != 3 {
		return fmt.Errorf("bad %s=%q", peerEnv, spec)
	}
	var mode rdmacm.Mode
	fmt.Sscan(parts[1], &mode)
	role, addr := parts[0], parts[2]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Short reliability timers: the survivor must give up in seconds.
	cfg := rdmacm.ConnConfig{Mode: mode, ACKTimeout: 14, RetryCount: 3, ConnectTimeout: 10 * time.Second}
	switch role {
	case "server", "sink":
		// The receives go up before the accept: the client sends the
		// moment it is connected, and on iWARP a SEND that finds no
		// receive ends the connection.
		var mr *verbs.MR
		posts, size := 1, 64
		if role == "sink" {
			posts, size = 8, 4096 // the stream's message size
		}
		cfg.BeforeConnect = func(s rdmacm.Setup) (err error) {
			if mr, err = s.RegisterMemory(1<<16, access); err != nil {
				return err
			}
			for i := 0; i < posts; i++ {
				if err := s.PostRecv(mr, i*4096, size); err != nil {
					return err
				}
			}
			return nil
		}
		lc := &rdmacm.ListenConfig{ConnConfig: cfg}
		l, err := lc.Listen(ctx, addr)
		if err != nil {
			return err
		}
		defer l.Close()
		c, err := l.Accept(ctx)
		if err != nil {
			return err
		}
		defer c.Close()
		fmt.Println("server: connected", c.Route())
		if role == "sink" {
			return sink(ctx, c, mr)
		}
		return serve(ctx, c, mr)
	case "client", "stream":
		c, err := (&rdmacm.Dialer{ConnConfig: cfg}).Dial(ctx, addr)
		if err != nil {
			return err
		}
		fmt.Println("client: connected", c.Route())
		if role == "stream" {
			return stream(ctx, c)
		}
		defer c.Close()
		return talk(ctx, c)
	}
	return fmt.Errorf("unknown role %q", role)
}

// talk: send a message, learn the server's buffer, WRITE and READ it.
func talk(ctx context.Context, c *rdmacm.Conn) error {
	mr, err := c.RegisterMemory(1<<16, access)
	if err != nil {
		return err
	}
	if err := c.PostRecv(mr, 0, 64); err != nil {
		return err
	}
	copy(mr.Bytes()[4096:], "hello across guests")
	if err := c.Send(ctx, mr, 4096, 19); err != nil {
		return err
	}
	if _, err := c.Recv(ctx); err != nil {
		return err
	}
	remote, err := rdmacm.ParseRemoteBuffer(mr.Bytes())
	if err != nil {
		return err
	}
	pattern := bytes.Repeat([]byte{0x5a, 0xa5, 0x3c}, 4000)[:8192]
	copy(mr.Bytes()[8192:], pattern)
	if err := c.RDMAWrite(ctx, mr, 8192, 8192, remote); err != nil {
		return err
	}
	if err := c.RDMARead(ctx, mr, 32768, 8192, remote); err != nil {
		return err
	}
	if !bytes.Equal(mr.Bytes()[32768:32768+8192], pattern) {
		return errors.New("RDMA READ did not bring back what RDMA WRITE put there")
	}
	// Tell the server we are done, so it can check its memory.
	copy(mr.Bytes()[4096:], "done")
	if err := c.Send(ctx, mr, 4096, 4); err != nil {
		return err
	}
	fmt.Println("client: ok, path", c.Route())
	return nil
}

// serve answers talk; its first receive is posted (BeforeConnect).
func serve(ctx context.Context, c *rdmacm.Conn, mr *verbs.MR) error {
	if _, err := c.Recv(ctx); err != nil {
		return err
	}
	if got := string(mr.Bytes()[:19]); got != "hello across guests" {
		return fmt.Errorf("received %q", got)
	}
	if err := c.PostRecv(mr, 0, 64); err != nil {
		return err
	}
	copy(mr.Bytes()[4096:], rdmacm.RemoteBufferOf(mr, 16384, 16384).Marshal())
	if err := c.Send(ctx, mr, 4096, rdmacm.RemoteBufferSize); err != nil {
		return err
	}
	if _, err := c.Recv(ctx); err != nil {
		return err
	}
	pattern := bytes.Repeat([]byte{0x5a, 0xa5, 0x3c}, 4000)[:8192]
	if !bytes.Equal(mr.Bytes()[16384:16384+8192], pattern) {
		return errors.New("the client's RDMA WRITE did not land")
	}
	fmt.Println("server: ok, path", c.Route())
	return nil
}

// sink keeps receives posted until the connection ends; the first eight
// are posted (BeforeConnect).
func sink(ctx context.Context, c *rdmacm.Conn, mr *verbs.MR) error {
	for {
		wc, err := c.Recv(ctx)
		if err != nil {
			return nil
		}
		c.PostRecv(mr, int(wc.ID-mr.Addr()), 4096) // the ID is the buffer's address
	}
}

// stream sends until the connection fails, then closes and checks that
// nothing of it is left in the kernel.
func stream(ctx context.Context, c *rdmacm.Conn) error {
	mr, err := c.RegisterMemory(4096, access)
	if err != nil {
		return err
	}
	fmt.Println("streaming")
	var sendErr error
	start := time.Now()
	for n := 0; ; n++ {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		sendErr = c.Send(sctx, mr, 0, 4096)
		cancel()
		if sendErr != nil {
			fmt.Printf("after %d messages: %v\n", n, sendErr)
			break
		}
		start = time.Now()
	}
	fmt.Printf("noticed %v after the last good send\n", time.Since(start).Round(time.Millisecond))
	if errors.Is(sendErr, context.DeadlineExceeded) {
		return fmt.Errorf("the send hung instead of failing: %w", sendErr)
	}
	var ce *verbs.CompletionError
	if !errors.As(sendErr, &ce) || (ce.WC.Status != verbs.WCRetryExcErr && ce.WC.Status != verbs.WCWRFlushErr) {
		return fmt.Errorf("want a retry-exceeded or flush completion, got %v", sendErr)
	}
	closeStart := time.Now()
	c.Close()
	fmt.Printf("closed in %v\n", time.Since(closeStart).Round(time.Millisecond))
	// Every thread's objects: the kernel names the thread that made one,
	// and Go makes them on any.
	var left map[string]int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if left, err = testbed.Objects(); err != nil || len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("left behind: %v", left)
	}
	fmt.Println("survivor: ok")
	return nil
}

const access = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead

func mustAddrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
