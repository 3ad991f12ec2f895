//go:build integration

package stream

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/rdmacm/msg"
	"github.com/rdmago/rdmago/test/testbed"
)

type device struct{ name, addr string }

// forEachDevice runs f on rxe (RoCE) and siw (iWARP).
func forEachDevice(t *testing.T, f func(t *testing.T, d device)) {
	top := testbed.Require(t)
	for _, name := range []string{"rxe0", "siw0"} {
		d := top.MustDevice(t, name)
		t.Run(name, func(t *testing.T) {
			testbed.CheckNoRNR(t, d.Name) // the credits keep every SEND to a posted receive
			f(t, device{d.Name, d.IPv4})
		})
	}
}

var nextPort = 29000 + os.Getpid()%1000*10

func (d device) next() string {
	nextPort++
	return fmt.Sprintf("%s:%d", d.addr, nextPort)
}

func TestMain(m *testing.M) {
	if addr := os.Getenv("STREAM_TEST_PEER"); addr != "" {
		peerMain(addr)
		return
	}
	if top, err := testbed.Load(); err == nil {
		// librdmacm keeps what a first connection opens for the life of
		// the process: not a leak of the first test's.
		rdmacm.OpenDevice("rxe0")
		for _, name := range []string{"rxe0", "siw0"} {
			if d, err := top.Device(name); err == nil {
				c1, c2, stop, err := pipe(device{d.Name, d.IPv4}, nil)()
				if err == nil {
					c1.Close()
					c2.Close()
					stop()
				}
			}
		}
	}
	os.Exit(m.Run())
}

// pipe makes connected pairs on d, for nettest.
func pipe(d device, cfg *msg.Config) nettest.MakePipe {
	return func() (net.Conn, net.Conn, func(), error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		l, err := Listen(ctx, nil, d.next(), cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		type result struct {
			c   net.Conn
			err error
		}
		accepted := make(chan result, 1)
		go func() {
			c, err := l.Accept()
			accepted <- result{c, err}
		}()
		dl := Dialer{}
		if cfg != nil {
			dl.Config = *cfg
		}
		c1, err := dl.DialContext(ctx, "rdma", l.Addr().String())
		if err != nil {
			l.Close()
			<-accepted
			return nil, nil, nil, err
		}
		r := <-accepted
		if r.err != nil {
			c1.Close()
			l.Close()
			return nil, nil, nil, r.err
		}
		stop := func() {
			c1.Close()
			r.c.Close()
			l.Close()
		}
		return c1, r.c, stop, nil
	}
}

// checkNoLeaks asserts, at the end of the test, that every cm_id, QP, CQ,
// MR and PD, every descriptor and every goroutine the test made is gone.
func checkNoLeaks(t *testing.T) {
	t.Helper()
	testbed.CheckNoLeaks(t)
	// CM ids that never bound to a device, which the kernel does not list.
	testbed.CheckCount(t, "CM ids", rdmacm.OpenIDs)
}

// The standard conformance suite for a net.Conn: basic I/O, ping-pong,
// racy reads and writes, deadlines past, present and future, Close
// unblocking calls, concurrent methods.
func TestNettest(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		nettest.TestConn(t, pipe(d, nil))
	})
}

func connPair(t *testing.T, d device, cfg *msg.Config) (net.Conn, net.Conn) {
	t.Helper()
	c1, c2, stop, err := pipe(d, cfg)()
	require.NoError(t, err)
	t.Cleanup(stop)
	// Each end's addresses are the other's, swapped, on RoCE and iWARP.
	assert.Equal(t, c1.LocalAddr().String(), c2.RemoteAddr().String())
	assert.Equal(t, c1.RemoteAddr().String(), c2.LocalAddr().String())
	assert.Equal(t, d.addr, c2.LocalAddr().(Addr).Addr().String())
	assert.Equal(t, "rdma", c1.LocalAddr().Network())
	return c1, c2
}

// Writes far larger than a message arrive whole, both ways at once.
func TestLargeWrites(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		c1, c2 := connPair(t, d, &msg.Config{MaxMessageSize: 8192})
		data := make([]byte, 4<<20+123)
		r := rand.New(rand.NewPCG(3, 4))
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		want := sha256.Sum256(data)
		errs := make(chan error, 2)
		for _, c := range []net.Conn{c1, c2} {
			go func() {
				n, err := c.Write(data)
				if err == nil && n != len(data) {
					err = fmt.Errorf("wrote %d of %d", n, len(data))
				}
				errs <- err
			}()
		}
		for _, c := range []net.Conn{c2, c1} {
			got := make([]byte, len(data))
			_, err := io.ReadFull(c, got)
			require.NoError(t, err)
			assert.Equal(t, want, sha256.Sum256(got))
		}
		require.NoError(t, <-errs)
		require.NoError(t, <-errs)
	})
}

// A deadline set while a Read or a Write is blocked interrupts it with
// os.ErrDeadlineExceeded; one moved later lets it wait on; after a timeout
// the connection still works.
func TestDeadlinesInterruptBlockedCalls(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		c1, c2 := connPair(t, d, &msg.Config{Credits: 2, MaxMessageSize: 1024})

		got := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := c1.Read(make([]byte, 10))
			got <- err
		}()
		time.Sleep(100 * time.Millisecond)
		c1.SetReadDeadline(time.Now().Add(5 * time.Second)) // later: still waiting
		time.Sleep(100 * time.Millisecond)
		select {
		case err := <-got:
			t.Fatalf("a deadline moved later ended the Read: %v", err)
		default:
		}
		c1.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		err := <-got
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		var ne net.Error
		require.True(t, errors.As(err, &ne) && ne.Timeout())
		assert.Less(t, time.Since(start), 2*time.Second)

		// A writer whose peer reads nothing blocks once the credits and
		// the peer's buffers are used up; a past deadline wakes it.
		wrote := make(chan error, 1)
		go func() {
			_, err := c1.Write(make([]byte, 1<<20))
			wrote <- err
		}()
		time.Sleep(200 * time.Millisecond)
		select {
		case err := <-wrote:
			t.Fatalf("a 1 MiB write to a peer with 2 KiB of room returned: %v", err)
		default:
		}
		c1.SetWriteDeadline(time.Unix(1, 0))
		require.ErrorIs(t, <-wrote, os.ErrDeadlineExceeded)

		// Both directions still work once the deadlines are cleared.
		c1.SetDeadline(time.Time{})
		go io.Copy(io.Discard, c2)
		_, err = c1.Write([]byte("still works"))
		require.NoError(t, err)
		_, err = c2.Write([]byte("back"))
		require.NoError(t, err)
		b := make([]byte, 4)
		_, err = io.ReadFull(c1, b)
		require.NoError(t, err)
		assert.Equal(t, "back", string(b))
	})
}

// A Write that sent every byte reports them sent, with no error, though
// its deadline passed or Close began after its last message went: the
// peer has the bytes, and a caller that took the error for a failure
// would send them again. One that passes after a part went reports that
// part. A zero-length Read returns at once, deadline or not, as on TCP.
func TestWriteThatSentEverythingSucceeds(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		c1, c2 := connPair(t, d, &msg.Config{MaxMessageSize: 1024})
		s := c1.(*Conn)
		testHookSent = func() { s.SetWriteDeadline(time.Unix(1, 0)) }
		t.Cleanup(func() { testHookSent = nil })

		n, err := c1.Write(make([]byte, 512))
		assert.NoError(t, err, "the deadline passed after the only message went")
		assert.Equal(t, 512, n)
		s.SetWriteDeadline(time.Time{})
		n, err = c1.Write(make([]byte, 2048))
		assert.ErrorIs(t, err, os.ErrDeadlineExceeded, "the deadline passed after the first of two messages")
		assert.Equal(t, 1024, n)
		b := make([]byte, 512+1024)
		_, err = io.ReadFull(c2, b)
		require.NoError(t, err)

		c2.SetReadDeadline(time.Unix(1, 0))
		n, err = c2.Read(nil)
		assert.NoError(t, err, "a zero-length Read past its deadline")
		assert.Zero(t, n)

		testHookSent = func() {
			go s.Close()
			<-s.closeCtx.Done()
		}
		s.SetWriteDeadline(time.Time{})
		n, err = c1.Write([]byte("last"))
		assert.NoError(t, err, "Close began after the only message went")
		assert.Equal(t, 4, n)
		c2.SetReadDeadline(time.Time{})
		rest, err := io.ReadAll(c2)
		require.NoError(t, err)
		assert.Equal(t, "last", string(rest))
		require.NoError(t, c2.Close())
	})
}

// CloseWrite half-closes: the peer reads io.EOF after the data, and can
// still write back.
func TestCloseWrite(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		c1, c2 := connPair(t, d, nil)
		_, err := c1.Write([]byte("request"))
		require.NoError(t, err)
		require.NoError(t, c1.(*Conn).CloseWrite())
		require.NoError(t, c1.(*Conn).CloseWrite(), "a second CloseWrite, as shutdown(2) takes one")
		_, err = c1.Write([]byte("more"))
		assert.ErrorIs(t, err, msg.ErrSendClosed)
		b, err := io.ReadAll(c2)
		require.NoError(t, err)
		assert.Equal(t, "request", string(b))
		_, err = c2.Write([]byte("response"))
		require.NoError(t, err)
		require.NoError(t, c2.Close())
		b, err = io.ReadAll(c1)
		require.NoError(t, err)
		assert.Equal(t, "response", string(b))
	})
}

// As on TCP, CloseWrite does not wait for a Write blocked on a peer that
// reads nothing: the end goes out after what that Write sent, whose rest
// fails; the peer reads exactly what the Write reports written, then
// io.EOF. A write deadline in the past does not stop a CloseWrite either.
func TestCloseWriteBesideABlockedWrite(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		c1, c2 := connPair(t, d, &msg.Config{Credits: 2, MaxMessageSize: 1024})
		type result struct {
			n   int
			err error
		}
		wrote := make(chan result, 1)
		go func() {
			n, err := c1.Write(make([]byte, 1<<20))
			wrote <- result{n, err}
		}()
		select {
		case r := <-wrote:
			t.Fatalf("a 1 MiB write to a peer with 2 KiB of room returned: %d, %v", r.n, r.err)
		case <-time.After(300 * time.Millisecond):
		}
		closed := make(chan error, 1)
		go func() { closed <- c1.(*Conn).CloseWrite() }()
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("CloseWrite waited for the blocked Write")
		}
		var r result
		select {
		case r = <-wrote:
		case <-time.After(5 * time.Second):
			t.Fatal("the blocked Write did not end with the CloseWrite")
		}
		assert.ErrorIs(t, r.err, msg.ErrSendClosed)
		b, err := io.ReadAll(c2)
		require.NoError(t, err)
		assert.Equal(t, r.n, len(b), "the peer reads what the Write reports written, then io.EOF")

		c3, c4 := connPair(t, d, nil)
		require.NoError(t, c3.SetWriteDeadline(time.Unix(1, 0)))
		require.NoError(t, c3.(*Conn).CloseWrite(), "the write deadline does not apply")
		b, err = io.ReadAll(c4)
		require.NoError(t, err)
		assert.Empty(t, b)
	})
}

// Close with a peer that reads nothing more: it gives up passing the rest
// on after CloseTimeout and does not hang; the Listener's Accept returns
// net.ErrClosed once closed.
func TestCloseDoesNotHang(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		c1, _ := connPair(t, d, &msg.Config{Credits: 2, MaxMessageSize: 1024, CloseTimeout: 500 * time.Millisecond})
		c1.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		_, err := c1.Write(make([]byte, 1<<20))
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		start := time.Now()
		c1.Close()
		assert.Less(t, time.Since(start), 4*time.Second)
		_, err = c1.Read(make([]byte, 1))
		assert.ErrorIs(t, err, net.ErrClosed)
		assert.ErrorIs(t, c1.Close(), net.ErrClosed, "a second Close, as on a net.TCPConn")
		for name, set := range map[string]func(time.Time) error{"SetDeadline": c1.SetDeadline,
			"SetReadDeadline": c1.SetReadDeadline, "SetWriteDeadline": c1.SetWriteDeadline} {
			assert.ErrorIs(t, set(time.Now().Add(time.Second)), net.ErrClosed, "%s after Close, as on a net.TCPConn", name)
		}

		l, err := Listen(context.Background(), nil, d.next(), nil)
		require.NoError(t, err)
		accepted := make(chan error, 1)
		go func() {
			_, err := l.Accept()
			accepted <- err
		}()
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, l.Close())
		assert.ErrorIs(t, <-accepted, net.ErrClosed)
		assert.ErrorIs(t, l.Close(), net.ErrClosed, "a second Close, as on a net.TCPListener")
	})
}

// A Listener dropped without Close is closed once the garbage collector
// finds it unreachable: a dial is then refused (while it listened, with no
// Accept, a dial waited for its ConnectTimeout), and nothing is left.
func TestDroppedListenerIsClosed(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		addr := d.next()
		func() {
			_, err := Listen(ctx, nil, addr, nil)
			require.NoError(t, err)
		}()
		dl := Dialer{RDMA: rdmacm.Dialer{ResolveRetries: -1, ConnConfig: rdmacm.ConnConfig{ConnectTimeout: 500 * time.Millisecond}}}
		var err error
		for start := time.Now(); time.Since(start) < 15*time.Second; {
			runtime.GC()
			var c net.Conn
			if c, err = dl.DialContext(ctx, Network, addr); err == nil {
				c.Close()
				continue
			}
			if !errors.Is(err, rdmacm.ErrTimeout) {
				break // refused: no listener
			}
		}
		require.Error(t, err, "a dial to the dropped Listener")
		assert.NotErrorIs(t, err, rdmacm.ErrTimeout, "the dropped Listener still listened")
		t.Logf("%s: dial after the Listener was dropped: %v", d.name, err)
	})
}

// A Conn dropped without Close is closed once the garbage collector finds
// it unreachable, as an *os.File is, also while it holds a message half
// read: its peer reads what was written, then io.EOF, and nothing of it is
// left behind (checkNoLeaks).
func TestDroppedConnIsClosed(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		before, err := testbed.Objects()
		require.NoError(t, err)
		ctx := context.Background()
		l, err := Listen(ctx, nil, d.next(), nil)
		require.NoError(t, err)
		var closeListener sync.Once
		defer closeListener.Do(func() { assert.NoError(t, l.Close()) })
		// Each peer reads to the end, or for 30 s, and says what it read.
		type end struct {
			b   []byte
			err error
		}
		ends := make(chan end, 2)
		readToEnd := func(c net.Conn) {
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			b, err := io.ReadAll(c)
			ends <- end{b, err}
		}
		// A dialer's handshake needs an Accept under way. Its errors go
		// to the test's goroutine, which may have ended (a failed Dial).
		type acceptance struct {
			c   net.Conn
			err error
		}
		accepted := make(chan acceptance, 2)
		go func() {
			for range 2 {
				c, err := l.Accept()
				accepted <- acceptance{c, err}
				if err != nil {
					return
				}
			}
		}()
		accept := func() net.Conn {
			a := <-accepted
			require.NoError(t, a.err)
			return a.c
		}
		// The dialed Conns are referred to only inside these functions.
		func() {
			c, err := Dial(ctx, l.Addr().String())
			require.NoError(t, err)
			_, err = c.Write([]byte("written, then dropped"))
			require.NoError(t, err)
		}()
		go readToEnd(accept())
		func() {
			c, err := Dial(ctx, l.Addr().String())
			require.NoError(t, err)
			peer := accept()
			_, err = peer.Write([]byte("half read"))
			require.NoError(t, err)
			_, err = c.Read(make([]byte, 1)) // the rest stays held
			require.NoError(t, err)
			go readToEnd(peer)
		}()

		// Collect until both peers have read the end.
		var got []string
		for len(got) < 2 {
			runtime.GC()
			select {
			case e := <-ends:
				assert.NoError(t, e.err, "a dropped Conn's peer reads to its end")
				got = append(got, string(e.b))
			case <-time.After(50 * time.Millisecond):
			}
		}
		assert.ElementsMatch(t, []string{"written, then dropped", ""}, got)
		closeListener.Do(func() { assert.NoError(t, l.Close()) })
		// The message held at the drop keeps the QP and buffers until a
		// collection finds it unreachable too (msg.Conn.Close): collect
		// until they are gone, for checkNoLeaks.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			runtime.GC()
			if now, err := testbed.Objects(); err == nil && reflect.DeepEqual(now, before) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// peerMain is the peer process of TestPeerDeath: it dials, writes, says so,
// and waits to be killed.
func peerMain(addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr)
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	if os.Getenv("STREAM_TEST_PEER_BUSY") != "" {
		// Mid-stream: write without end until killed, reading nothing.
		fmt.Println("writing")
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				fmt.Println("write:", err)
				os.Exit(1)
			}
		}
	}
	if _, err := c.Write([]byte("written before dying")); err != nil {
		fmt.Println("write:", err)
		os.Exit(1)
	}
	fmt.Println("written")
	<-ctx.Done()
}

// startPeer runs a peer process (peerMain) that dials a listener on d, and
// returns the accepted connection once the peer says it wrote (busy: once
// it writes without end); the peer, the connection and the listener go
// when the test ends.
func startPeer(t *testing.T, d device, busy bool) (net.Conn, *exec.Cmd) {
	t.Helper()
	l, err := Listen(context.Background(), nil, d.next(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "STREAM_TEST_PEER="+l.Addr().String())
	want := "written\n"
	if busy {
		cmd.Env, want = append(cmd.Env, "STREAM_TEST_PEER_BUSY=1"), "writing\n"
	}
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	c, err := l.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, want, line)
	return c, cmd
}

// A peer process that dies: what it wrote is read, then a blocked Read
// fails (not io.EOF: the stream did not end in order), Writes fail, and
// Close does not hang.
func TestPeerDeath(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		c, cmd := startPeer(t, d, false)
		b := make([]byte, len("written before dying"))
		_, err := io.ReadFull(c, b)
		require.NoError(t, err)
		assert.Equal(t, "written before dying", string(b))

		c.SetDeadline(time.Now().Add(30 * time.Second))
		readErr := make(chan error, 1)
		go func() {
			_, err := c.Read(b)
			readErr <- err
		}()
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, cmd.Process.Kill())
		err = <-readErr
		require.Error(t, err)
		assert.NotErrorIs(t, err, io.EOF)
		assert.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the death is noticed, not the deadline")
		t.Logf("%s: Read after the peer died: %v", d.name, err)
		_, err = c.Write([]byte("to no one"))
		assert.Error(t, err)
		start := time.Now()
		c.Close()
		assert.Less(t, time.Since(start), 5*time.Second)
	})
}

// A peer process that dies mid-stream, both ways busy: it writes without
// end and reads nothing, while this side reads and has a 16 MiB Write
// blocked on it. Both pending calls fail (not io.EOF, not the deadline),
// and Close does not hang.
func TestPeerDeathMidStream(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		c, cmd := startPeer(t, d, true)
		require.NoError(t, c.SetDeadline(time.Now().Add(60*time.Second)))

		type result struct {
			n   int64
			err error
		}
		read, wrote := make(chan result, 1), make(chan result, 1)
		go func() {
			n, err := io.Copy(io.Discard, c)
			read <- result{n, err}
		}()
		go func() {
			n, err := c.Write(make([]byte, 16<<20))
			wrote <- result{int64(n), err}
		}()
		time.Sleep(time.Second) // bytes flow in, the Write blocks
		require.NoError(t, cmd.Process.Kill())
		for name, ch := range map[string]chan result{"Read": read, "Write": wrote} {
			select {
			case r := <-ch:
				require.Error(t, r.err, "%s after the peer died", name)
				assert.NotErrorIs(t, r.err, io.EOF)
				assert.NotErrorIs(t, r.err, os.ErrDeadlineExceeded, "the death is noticed, not the deadline")
				t.Logf("%s: %s ended after %d bytes: %v", d.name, name, r.n, r.err)
				if name == "Read" {
					assert.Positive(t, r.n, "bytes flowed before the death")
				}
			case <-time.After(45 * time.Second):
				t.Fatalf("%s still blocked 45 s after the peer died", name)
			}
		}
		start := time.Now()
		c.Close()
		assert.Less(t, time.Since(start), 5*time.Second)
	})
}
