//go:build integration

package msg

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// A Conn dropped without Close, on either side, is closed once the garbage
// collector finds it unreachable, as an *os.File is: its peer receives what
// was sent, then io.EOF, and nothing of it is left (checkNoLeaks: the QP,
// the buffers, the goroutine). A Recv waiting on a Conn keeps it: a Conn
// that only a waiting goroutine refers to is not closed under it.
func TestDroppedConnIsClosed(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 60*time.Second)
		l, addr := listen(t, d, nil)
		// recvCollecting receives on c, running the collector meanwhile.
		recvCollecting := func(c *Conn) (*Message, error) {
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
						runtime.GC()
					}
				}
			}()
			return c.Recv(ctx)
		}

		// An accepted Conn, dropped after one message.
		var peer *Conn
		func() {
			client, server := dialAccept(t, ctx, l, addr, nil)
			peer = client
			require.NoError(t, server.Send(ctx, []byte("sent, then dropped")))
		}()
		defer peer.Close() // on failure; closed below
		m, err := recvCollecting(peer)
		require.NoError(t, err)
		assert.Equal(t, "sent, then dropped", string(m.Bytes()))
		m.Release()
		_, err = recvCollecting(peer)
		require.ErrorIs(t, err, io.EOF, "the dropped Conn's Close told its peer")
		require.NoError(t, peer.Close())

		// A dialed Conn that only a goroutine waiting in Recv refers to.
		got := make(chan error, 1)
		func() {
			client, server := dialAccept(t, ctx, l, addr, nil)
			peer = server
			go func() {
				m, err := client.Recv(ctx)
				if err == nil {
					m.Release()
				}
				got <- err
			}()
		}()
		defer peer.Close()
		for range 25 {
			runtime.GC()
			time.Sleep(20 * time.Millisecond)
		}
		select {
		case err := <-got:
			t.Fatalf("a Recv waiting on a Conn nothing else refers to returned: %v", err)
		default:
		}
		require.NoError(t, peer.Send(ctx, []byte("wakes the Recv")))
		require.NoError(t, <-got)
		_, err = recvCollecting(peer)
		require.ErrorIs(t, err, io.EOF, "the dropped Conn's Close told its peer")
	})
}

// A Listener dropped without Close is closed once the garbage collector
// finds it unreachable: a dial then finds no listener, the connection it
// accepted lives on, and nothing of it is left (checkNoLeaks: its cm_id
// and its goroutine). While an Accept waits on it, it is kept.
func TestDroppedListenerIsClosed(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 60*time.Second)
		addr := d.at(port())
		accepted := make(chan *Conn, 1)
		func() {
			l, err := Listen(ctx, nil, addr, nil)
			require.NoError(t, err)
			go func() {
				c, err := l.Accept(ctx) // keeps l until it returns
				assert.NoError(t, err)
				accepted <- c
			}()
		}()
		for range 25 {
			runtime.GC()
			time.Sleep(20 * time.Millisecond)
		}
		client, err := Dial(ctx, nil, addr, nil)
		require.NoError(t, err, "the Listener an Accept waits on still listens")
		defer client.Close()
		server := <-accepted
		require.NotNil(t, server)
		defer server.Close()

		// Nothing refers to the Listener now. Until it is closed, a dial
		// succeeds (its goroutine runs handshakes for Accepts to come), or
		// once 16 wait, times out; then it is refused.
		quick := &rdmacm.Dialer{ResolveRetries: -1, ConnConfig: rdmacm.ConnConfig{ConnectTimeout: 500 * time.Millisecond}}
		var dialErr error
		for start := time.Now(); time.Since(start) < 15*time.Second; {
			runtime.GC()
			var c *Conn
			if c, dialErr = Dial(ctx, quick, addr, nil); dialErr == nil {
				c.Close()
				continue
			}
			if !errors.Is(dialErr, rdmacm.ErrTimeout) {
				break
			}
		}
		require.Error(t, dialErr, "a dial to the dropped Listener")
		assert.NotErrorIs(t, dialErr, rdmacm.ErrTimeout, "the dropped Listener still listened")
		t.Logf("%s: dial after the Listener was dropped: %v", d.name, dialErr)

		require.NoError(t, client.Send(ctx, []byte("still up")))
		m, err := server.Recv(ctx)
		require.NoError(t, err, "the connection it accepted lives on")
		assert.Equal(t, "still up", string(m.Bytes()))
		m.Release()
	})
}

// Messages held across Close stay readable and intact; Release after Close
// is fine; the last release (or the garbage collector, for a message
// dropped unreleased) frees the connection, and nothing leaks.
func TestMessagesOutliveClose(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		client, server := pair(t, d, nil, nil)
		ctx := ctxFor(t, 30*time.Second)
		const n = 3
		for i := range n {
			require.NoError(t, client.Send(ctx, payload(i, 4000)))
		}
		require.NoError(t, server.Send(ctx, []byte("dropped unreleased")))
		var held []*Message
		var bytes [][]byte // taken before Close, as a reader would
		for range n {
			m, err := server.Recv(ctx)
			require.NoError(t, err)
			held = append(held, m)
			bytes = append(bytes, m.Bytes())
		}
		require.NoError(t, server.Close())
		_, err := server.Recv(ctx)
		assert.ErrorIs(t, err, ErrClosed)
		assert.ErrorIs(t, err, net.ErrClosed)
		for i, m := range held {
			assert.Equal(t, payload(i, 4000), bytes[i], "message %d after Close", i)
			assert.Equal(t, payload(i, 4000), m.Bytes(), "message %d after Close", i)
		}
		for _, m := range held[:n-1] {
			m.Release()
		}
		select {
		case <-server.freedCh:
			t.Fatal("the connection was released while a message was still held")
		default:
		}
		assert.Equal(t, payload(n-1, 4000), bytes[n-1], "the last message held, after the others went")
		held[n-1].Release()
		held[n-1].Release()
		assert.Nil(t, held[n-1].Bytes(), "Bytes after Release")
		select {
		case <-server.freedCh:
		case <-time.After(5 * time.Second):
			t.Fatal("the last Release did not release the connection")
		}

		// A message dropped without Release: the garbage collector frees
		// the connection.
		func() {
			m, err := client.Recv(ctx)
			require.NoError(t, err)
			require.Equal(t, "dropped unreleased", string(m.Bytes()))
			require.NoError(t, client.Close())
			assert.Equal(t, "dropped unreleased", string(m.Bytes()))
		}()
		deadline := time.After(10 * time.Second)
		for freed := false; !freed; {
			runtime.GC()
			select {
			case <-client.freedCh:
				freed = true
			case <-time.After(50 * time.Millisecond):
			case <-deadline:
				t.Fatal("a message dropped unreleased after Close kept the connection")
			}
		}
	})
}

// A Send waiting for credit fails when this side closes with an error that
// says so (ErrClosed, net.ErrClosed), and the peer's, waiting too, with the
// connection's end (rdmacm.ErrEnded): not the same.
func TestSendWaitingForCreditAndClose(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		cfg := &Config{MaxMessageSize: 256, Credits: 2}
		client, server := pair(t, d, cfg, cfg)
		ctx := ctxFor(t, 30*time.Second)
		// Neither side reads: each sends until it has no credit left.
		flood := func(c *Conn, sent *atomic.Int64) <-chan error {
			done := make(chan error, 1)
			go func() {
				for {
					if err := c.Send(ctx, []byte("flood")); err != nil {
						done <- err
						return
					}
					sent.Add(1)
				}
			}()
			return done
		}
		var cs, ss atomic.Int64
		clientDone, serverDone := flood(client, &cs), flood(server, &ss)
		for last, stable := int64(-1), 0; stable < 4; {
			time.Sleep(50 * time.Millisecond)
			if now := cs.Load() + ss.Load(); now == last {
				stable++
			} else {
				last, stable = now, 0
			}
		}
		require.Positive(t, cs.Load())
		require.Positive(t, ss.Load())
		select {
		case err := <-clientDone:
			t.Fatalf("the client's Send returned: %v", err)
		case err := <-serverDone:
			t.Fatalf("the server's Send returned: %v", err)
		default:
		}
		start := time.Now()
		require.NoError(t, client.Close())
		err := <-clientDone
		assert.Less(t, time.Since(start), time.Second, "Close waited out a timeout")
		assert.ErrorIs(t, err, ErrClosed)
		assert.ErrorIs(t, err, net.ErrClosed)
		assert.NotErrorIs(t, err, ErrSendClosed, "the Send waiting was told of a CloseSend: %v", err)
		assert.NotErrorIs(t, err, rdmacm.ErrEnded, "%v", err)
		var oe *OpError
		assert.True(t, errors.As(err, &oe) && oe.Op == "send", "%v", err)
		err = <-serverDone
		assert.ErrorIs(t, err, rdmacm.ErrEnded, "the peer's Send: %v", err)
		assert.NotErrorIs(t, err, net.ErrClosed, "the peer's Send: %v", err)
		assert.ErrorIs(t, client.Send(ctx, nil), net.ErrClosed, "a Send after Close")
		assert.ErrorIs(t, client.CloseSend(ctx), net.ErrClosed, "CloseSend after Close")
	})
}

// When the connection's goroutine fails (a post the device refuses, made
// here on purpose), the messages that had arrived are still received, in
// order, before the error; the peer learns of the end.
func TestFailureDeliversWhatArrived(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		cfg := &Config{MaxMessageSize: 1024, Credits: 8}
		client, server := pair(t, d, cfg, cfg)
		ctx := ctxFor(t, 30*time.Second)
		deliverOne(t, ctx, client, server)
		time.Sleep(100 * time.Millisecond) // the server's goroutine waits for receives

		// Woken for its housekeeping, the server's goroutine waits for the
		// lock; the messages complete meanwhile, and its housekeeping then
		// fails, before Recv has taken any of them.
		injected := &kindError{ErrTransport, errors.New("injected: the device refused a post")}
		server.mu.Lock()
		server.fault = injected
		server.wakeLocked()
		const n = 4
		for i := range n {
			require.NoError(t, client.Send(ctx, payload(i, 1000)))
		}
		for sent := false; !sent; {
			time.Sleep(20 * time.Millisecond)
			client.mu.Lock()
			client.reapLocked()
			sent = client.inSQ == 0 // 1000-byte messages ask for their completions
			client.mu.Unlock()
		}
		time.Sleep(200 * time.Millisecond) // and siw's receive side has placed them
		server.mu.Unlock()

		for i := range n {
			m, err := server.Recv(ctx)
			require.NoError(t, err, "message %d arrived before the failure", i)
			assert.Equal(t, payload(i, 1000), m.Bytes())
			m.Release()
		}
		_, err := server.Recv(ctx)
		assert.ErrorIs(t, err, injected)
		assert.ErrorIs(t, err, ErrTransport)
		_, err = client.Recv(ctx)
		assert.ErrorIs(t, err, rdmacm.ErrEnded, "the peer learns of the end")
	})
}

// CloseSend while a Send copies a large message into its send buffer
// (without the connection's lock): the message, whose Send returns nil,
// arrives whole before the end of the stream, and the Sends after
// CloseSend fail with ErrSendClosed.
func TestCloseSendDuringACopy(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		cfg := &Config{MaxMessageSize: 512 << 10, Credits: 2, SendBuffers: 2}
		client, server := pair(t, d, cfg, cfg)
		ctx := ctxFor(t, 60*time.Second)
		base := make([]byte, cfg.MaxMessageSize)
		for j := range base {
			base[j] = byte(j * 7)
		}
		message := func(i int) []byte {
			b := bytes.Clone(base)
			binary.BigEndian.PutUint64(b, uint64(i))
			binary.BigEndian.PutUint64(b[len(b)-8:], uint64(i))
			return b
		}
		sent := make(chan int, 1)
		go func() {
			n := 0
			defer func() { sent <- n }()
			for i := 0; ; i++ {
				if err := client.Send(ctx, message(i)); err != nil {
					assert.ErrorIs(t, err, ErrSendClosed, "message %d", i)
					return
				}
				n++
			}
		}()
		received := make(chan int, 1)
		go func() {
			n := 0
			defer func() { received <- n }()
			for {
				m, err := server.Recv(ctx)
				if err == io.EOF {
					return
				}
				if !assert.NoError(t, err) {
					return
				}
				assert.Equal(t, message(n), m.Bytes(), "message %d", n)
				n++
				m.Release()
			}
		}()
		// CloseSend once the sender is in the middle of a copy.
		for copying := false; !copying; {
			runtime.Gosched()
			client.mu.Lock()
			copying = client.copying > 0
			client.mu.Unlock()
		}
		require.NoError(t, client.CloseSend(ctx))
		n := <-sent
		t.Logf("%d messages sent before CloseSend", n)
		assert.Positive(t, n)
		assert.Equal(t, n, <-received, "every Send that returned nil arrived before the end")
	})
}

// A Send waiting for a send buffer whose request will never complete (siw
// takes a request posted after its QP went to the error state, before the
// end is known, and flushes nothing) fails when the connection ends, not
// when its context does. Found by the soak: a Send to a killed peer waited
// out its 15 s.
func TestSendWaitingOnAStrandedRequestEndsWithTheConnection(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		cfg := &Config{MaxMessageSize: 1024, Credits: 8, SendBuffers: 2}
		client, server := pair(t, d, cfg, cfg)
		defer strandSendBuffers(t, client, server)() // before Close, which would otherwise wait for them
		sendDone := make(chan error, 1)
		go func() { sendDone <- client.Send(ctxFor(t, 20*time.Second), []byte("waits")) }()
		select {
		case err := <-sendDone:
			t.Fatalf("Send returned before the end: %v", err)
		case <-time.After(300 * time.Millisecond):
		}

		begin := time.Now()
		require.NoError(t, server.Close())
		select {
		case err := <-sendDone:
			assert.ErrorIs(t, err, rdmacm.ErrEnded)
			t.Logf("Send failed %v after the peer closed: %v", time.Since(begin).Round(time.Millisecond), err)
		case <-time.After(10 * time.Second):
			t.Fatal("Send still waits 10 s after the connection ended")
		}
	})
}

// strandSendBuffers, once a message went from client to server and its
// send completed, takes every send buffer of client as if posted and never
// to complete, as a peer gone silent leaves them; the function it returns
// gives them back.
func strandSendBuffers(t *testing.T, client, server *Conn) (restore func()) {
	t.Helper()
	deliverOne(t, ctxFor(t, 30*time.Second), client, server)
	for sent, deadline := false, time.Now().Add(10*time.Second); !sent; time.Sleep(10 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the warm-up's send never completed")
		client.mu.Lock()
		client.reapLocked()
		sent = client.inSQ == 0
		client.mu.Unlock()
	}
	client.mu.Lock()
	stranded := client.freeSend
	client.freeSend = nil
	client.inSQ += len(stranded)
	client.mu.Unlock()
	return func() {
		client.mu.Lock()
		client.freeSend = append(client.freeSend, stranded...)
		client.inSQ -= len(stranded)
		client.broadcastLocked()
		client.mu.Unlock()
	}
}

// CloseSend waits for a send buffer at most CloseTimeout: with every
// buffer's request stranded it returns, without sending the end, and says
// why; the end goes out once a buffer is free again.
func TestCloseSendWaitsAtMostCloseTimeout(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		cfg := &Config{MaxMessageSize: 1024, Credits: 8, SendBuffers: 2, CloseTimeout: 300 * time.Millisecond}
		client, server := pair(t, d, cfg, cfg)
		restore := strandSendBuffers(t, client, server)
		begin := time.Now()
		err := client.CloseSend(ctxFor(t, 20*time.Second))
		took := time.Since(begin)
		restore()
		t.Logf("CloseSend returned after %v: %v", took.Round(time.Millisecond), err)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorContains(t, err, "CloseTimeout (300ms)")
		assert.GreaterOrEqual(t, took, 300*time.Millisecond)
		assert.Less(t, took, 5*time.Second, "CloseSend waited past CloseTimeout")

		ctx := ctxFor(t, 10*time.Second)
		require.NoError(t, client.CloseSend(ctx))
		_, err = server.Recv(ctx)
		assert.ErrorIs(t, err, io.EOF, "the end goes out once a buffer is free")
	})
}

// A post refused because the QP left RTS is a teardown under way (siw
// resets the QPs of a netdev that went down before rdmacm reports the
// end): Send and Recv report the end that follows, as they would had it
// come first. With no end coming, the refusal is the reason, after
// CloseTimeout, and the peer learns of the end. Close meanwhile neither
// hangs nor posts.
//
// On rxe only: the test moves the QP to RESET by hand, and on siw a post
// after that move is queued without an error (seen in the test bed), so no
// refusal can be had this way. siw refuses posts after its own teardown:
// the flap row of TestTwoGuestsFaultMatrix.
func TestRefusedPostReportsTheEndThatFollows(t *testing.T) {
	t.Run("rxe0", func(t *testing.T) {
		d := rxe(t)
		checkNoLeaks(t)
		cfg := &Config{MaxMessageSize: 1024, Credits: 8, CloseTimeout: time.Second}
		reset := func(t *testing.T, c *Conn) {
			t.Helper()
			// As siw does to the QPs of a netdev that goes down.
			require.NoError(t, c.qp.Modify(&verbs.QPAttr{State: verbs.QPStateReset}, verbs.AttrState))
		}
		// refusedSendWaits resets the client's QP under a Send and checks
		// that the Send waits for the end rather than returning the
		// refusal. The client's CloseTimeout is long: the end, when it
		// comes, follows the peer's own wait for its FIN.
		refusedSendWaits := func(t *testing.T, ctx context.Context) (client, server *Conn, sendDone chan error) {
			t.Helper()
			client, server = pair(t, d, &Config{MaxMessageSize: 1024, Credits: 8, CloseTimeout: 10 * time.Second}, cfg)
			deliverOne(t, ctx, client, server)
			reset(t, client)
			sendDone = make(chan error, 1)
			go func() { sendDone <- client.Send(ctx, []byte("refused")) }()
			select {
			case err := <-sendDone:
				t.Fatalf("Send returned before the end came or Close began: %v", err)
			case <-time.After(300 * time.Millisecond):
			}
			return client, server, sendDone
		}

		t.Run("the end follows", func(t *testing.T) {
			ctx := ctxFor(t, 30*time.Second)
			client, server, sendDone := refusedSendWaits(t, ctx)
			require.NoError(t, server.Close())
			select {
			case err := <-sendDone:
				require.ErrorIs(t, err, rdmacm.ErrEnded, "the refused Send reports the end")
				assert.NotErrorIs(t, err, ErrTransport)
			case <-time.After(10 * time.Second):
				t.Fatal("the refused Send still waits 10 s after the peer closed")
			}
			_, err := client.Recv(ctx)
			assert.ErrorIs(t, err, rdmacm.ErrEnded)
			assert.ErrorIs(t, client.Send(ctx, []byte("after")), rdmacm.ErrEnded)
			assert.NoError(t, client.Close())
		})

		t.Run("no end comes", func(t *testing.T) {
			client, server := pair(t, d, cfg, cfg)
			ctx := ctxFor(t, 30*time.Second)
			deliverOne(t, ctx, client, server)
			reset(t, client)
			// A Send that gives up first keeps its context's error, and
			// says the connection is ending.
			begin := time.Now()
			short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			err := client.Send(short, []byte("refused"))
			cancel()
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.ErrorIs(t, err, ErrTransport)
			var oe *OpError
			if assert.ErrorAs(t, err, &oe) {
				assert.True(t, oe.Timeout(), "a net.Error timeout: %v", err)
			}
			err = client.Send(ctx, []byte("refused"))
			waited := time.Since(begin)
			require.ErrorIs(t, err, ErrTransport)
			assert.Contains(t, err.Error(), "post a DATA frame")
			assert.Contains(t, err.Error(), "the QP is in RESET")
			assert.GreaterOrEqual(t, waited, 900*time.Millisecond, "the end was awaited for CloseTimeout")
			assert.Less(t, waited, 5*time.Second)
			_, rerr := client.Recv(ctx)
			assert.ErrorIs(t, rerr, ErrTransport, "Recv reports the same reason")
			// This side ended the connection: the peer learns of it.
			sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
			_, serr := server.Recv(sctx)
			scancel()
			assert.ErrorIs(t, serr, rdmacm.ErrEnded, "the peer learns of the end")
			assert.NoError(t, client.Close())
			assert.NoError(t, server.Close())
		})

		t.Run("Close while the end is awaited", func(t *testing.T) {
			client, server, sendDone := refusedSendWaits(t, ctxFor(t, 30*time.Second))
			begin := time.Now()
			closed := make(chan error, 1)
			go func() { closed <- client.Close() }()
			select {
			case err := <-sendDone:
				assert.ErrorIs(t, err, ErrClosed, "the waiting Send learns of this side's Close")
			case <-time.After(5 * time.Second):
				t.Fatal("the refused Send still waits 5 s after Close began")
			}
			select {
			case err := <-closed:
				assert.NoError(t, err)
				t.Logf("Close took %v", time.Since(begin).Round(time.Millisecond))
			case <-time.After(30 * time.Second):
				t.Fatal("Close still runs 30 s later")
			}
			assert.NoError(t, server.Close())
		})
	})
}
