//go:build integration

package msg

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

// Messages both ways at once arrive whole and in order; the receivers hold
// a few and release them in reverse order.
func TestOrderManyMessages(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		cfg := &Config{MaxMessageSize: 4096, Credits: 16, SendBuffers: 16}
		client, server := pair(t, d, cfg, cfg)
		ctx := ctxFor(t, 120*time.Second)
		const n = 3000
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for _, c := range []*Conn{client, server} {
			wg.Add(2)
			go func() {
				defer wg.Done()
				for i := range n {
					if err := c.Send(ctx, payload(i, 4096)); err != nil {
						errs <- fmt.Errorf("send %d: %w", i, err)
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				var held []*Message
				for i := range n {
					m, err := c.Recv(ctx)
					if err != nil {
						errs <- fmt.Errorf("receive %d: %w", i, err)
						return
					}
					if want := payload(i, 4096); !bytes.Equal(m.Bytes(), want) {
						errs <- fmt.Errorf("message %d: %d bytes, not the %d sent (first 8: %x)", i, len(m.Bytes()), len(want), m.Bytes()[:min(8, len(m.Bytes()))])
						return
					}
					held = append(held, m)
					if len(held) == 5 || i == n-1 {
						for j := len(held) - 1; j >= 0; j-- {
							held[j].Release()
						}
						held = held[:0]
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

// Messages of exactly the agreed maximum (the smaller side's) pass intact;
// one byte more is refused locally, and the connection goes on.
func TestMaxSizeMessages(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		client, server := pair(t, d, &Config{MaxMessageSize: 100000}, &Config{MaxMessageSize: 65536, Credits: 8})
		ctx := ctxFor(t, 60*time.Second)
		assert.Equal(t, 65536, client.MaxMessageSize())
		assert.Equal(t, 65536, server.MaxMessageSize())

		err := client.Send(ctx, make([]byte, 65537))
		require.ErrorIs(t, err, ErrTooLarge)
		assert.ErrorContains(t, err, "a 65537-byte message; the connection's maximum is 65536")

		const n = 40
		sums := make(chan [32]byte, n)
		go func() {
			r := rand.New(rand.NewPCG(1, 2))
			for range n {
				b := make([]byte, 65536)
				for i := range b {
					b[i] = byte(r.Uint32())
				}
				sums <- sha256.Sum256(b)
				if err := client.Send(ctx, b); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		for i := range n {
			m, err := server.Recv(ctx)
			require.NoError(t, err)
			require.Len(t, m.Bytes(), 65536)
			assert.Equal(t, <-sums, sha256.Sum256(m.Bytes()), "message %d", i)
			m.Release()
		}
		// Back the other way, the same limit.
		require.NoError(t, server.Send(ctx, make([]byte, 65536)))
		m, err := client.Recv(ctx)
		require.NoError(t, err)
		assert.Len(t, m.Bytes(), 65536)
		m.Release()
	})
}

// A slow receiver with few credits: the sender waits (Send blocks, no
// error), is never more than the credits ahead of what was released, and
// the device never sees receiver-not-ready.
func TestBackpressureSlowReceiver(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		const credits = 4
		client, server := pair(t, d, &Config{SendBuffers: 64}, &Config{Credits: credits})
		ctx := ctxFor(t, 60*time.Second)
		before := rnrCounters(t, d.name)
		t.Logf("RNR counters of %s before: %v", d.name, before)

		// Nothing released: a Send past the credits waits, until its
		// context ends, and that is no failure of the connection.
		var held []*Message
		for i := range credits - 1 { // the dialer's HELLO took one credit, given back since
			require.NoError(t, client.Send(ctx, []byte{byte(i)}))
		}
		for range credits - 1 {
			m, err := server.Recv(ctx)
			require.NoError(t, err)
			held = append(held, m)
		}
		require.NoError(t, client.Send(ctx, []byte("last credit")))
		m, err := server.Recv(ctx)
		require.NoError(t, err)
		held = append(held, m)
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err = client.Send(short, []byte("no credit"))
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "Send waits for credit")
		for _, m := range held {
			m.Release()
		}

		const n = 300
		var sent, released atomic.Int64
		done := make(chan error, 1)
		go func() {
			for i := range n {
				if err := client.Send(ctx, payload(i, 1000)); err != nil {
					done <- err
					return
				}
				sent.Add(1)
			}
			done <- nil
		}()
		for i := range n {
			m, err := server.Recv(ctx)
			require.NoError(t, err)
			require.Equal(t, payload(i, 1000), m.Bytes())
			time.Sleep(2 * time.Millisecond)
			m.Release()
			released.Add(1)
			// The sender can be at most the credits ahead.
			assert.LessOrEqual(t, sent.Load(), released.Load()+credits, "message %d", i)
		}
		require.NoError(t, <-done)
		after := rnrCounters(t, d.name)
		t.Logf("RNR counters of %s after: %v", d.name, after)
		assert.Equal(t, before, after, "no receiver-not-ready on %s", d.name)
		if d.name == "rxe0" {
			assert.NotEmpty(t, after, "rxe has RNR counters")
		}
	})
}

// A receiver that gives messages back while it holds no reply slot (its
// CREDIT frames used them all) owes the grant until the sender's next
// frames give slots back; then it must send it, without waiting for
// another release: an application that keeps its messages until more
// arrive would otherwise wait for the sender, and the sender for it.
func TestGrantOwedForWantOfAReplySlotGoesOutWithTheNextSlot(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		const credits = 16
		client, server := pair(t, d, &Config{SendBuffers: 64}, &Config{Credits: credits})
		ctx := ctxFor(t, 60*time.Second)
		sent := 0
		// fill sends until the client waits for credit.
		fill := func() {
			for {
				short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				err := client.Send(short, payload(sent, 100))
				cancel()
				if err != nil {
					require.ErrorIs(t, err, context.DeadlineExceeded, "after %d messages", sent)
					return
				}
				sent++
			}
		}
		var held []*Message
		got := 0
		// take has the server take every message that arrived, and keep it.
		take := func() {
			for {
				short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				m, err := server.Recv(short)
				cancel()
				if err != nil {
					require.ErrorIs(t, err, context.DeadlineExceeded)
					return
				}
				require.Equal(t, payload(got, 100), m.Bytes(), "message %d", got)
				got++
				held = append(held, m)
			}
		}
		for round := range 4 {
			fill()
			take()
			require.Equal(t, sent, got, "round %d: every message sent arrived", round)
			if len(held) < credits-1 {
				// The client must not be waiting: the server holds fewer
				// than its credits (but the one kept for FIN).
				err := client.Send(ctxFor(t, 5*time.Second), payload(sent, 100))
				require.NoError(t, err, "round %d: the client waits for credit while the server holds %d of its %d credits",
					round, len(held), credits)
				sent++
				take()
			}
			// One release at a time, one more than the reply slots: the last
			// grant finds no slot.
			for range replySlots + 1 {
				held[0].Release()
				held = held[1:]
			}
		}
		t.Logf("%d messages sent", sent)
		for _, m := range held {
			m.Release()
		}
	})
}

// rawPeer is a plain rdmacm connection that speaks the protocol badly on
// purpose, with a hello of its own.
type rawPeer struct {
	rc *rdmacm.Conn
	mr *verbs.MR
}

func rawDial(t *testing.T, addr string, h []byte) (*rawPeer, error) {
	ctx := ctxFor(t, 20*time.Second)
	d := rdmacm.Dialer{PrivateData: h}
	d.Cap = verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}
	d.BeforeConnect = func(s rdmacm.Setup) error {
		mr, err := s.RegisterMemory(16*8192, verbs.AccessLocalWrite)
		if err != nil {
			return err
		}
		for i := range 16 {
			if err := s.PostRecv(mr, i*8192, 8192); err != nil {
				return err
			}
		}
		return nil
	}
	rc, err := d.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { rc.Close() })
	mr, err := rc.RegisterMemory(65536, 0)
	require.NoError(t, err)
	return &rawPeer{rc: rc, mr: mr}, nil
}

// send sends b as one SEND; the last of a bad sequence may fail at the
// device (a receive too short for it fails the sender's too).
func (p *rawPeer) send(t *testing.T, b []byte) error {
	t.Helper()
	copy(p.mr.Bytes(), b)
	return p.rc.Send(ctxFor(t, 10*time.Second), p.mr, 0, len(b))
}

func rawFrame(typ frameType, flags uint8, grant uint32, p []byte) []byte {
	b := make([]byte, HeaderSize+len(p))
	header{typ: typ, flags: flags, grant: grant, length: uint32(len(p))}.put(b)
	copy(b[HeaderSize:], p)
	return b
}

// A peer that breaks the protocol ends its connection, with an error that
// says what it sent; the peer is disconnected, and nothing leaks. Nothing
// else is touched: a bystander connection on the same listener talks both
// ways after, and the listener serves the next dialer.
func TestProtocolAbuse(t *testing.T) {
	rawHello := hello{version: Version, replySlots: 4, credits: 8, maxMessage: 4096}.marshal()
	hello := rawFrame(frameHello, 0, 8, nil)
	for _, tc := range []struct {
		name   string
		frames [][]byte
		want   string
	}{
		{"garbage", [][]byte{[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")}, "magic byte 0x6d (got 0x47)"},
		{"wrong version", [][]byte{{0x6d, 2, 1, 0, 0, 0, 0, 8, 0, 0, 0, 0}}, "a frame of version 2 (this side speaks 1)"},
		{"data before hello", [][]byte{rawFrame(frameData, 0, 8, []byte("x"))}, "a DATA frame before its HELLO"},
		{"larger than agreed", [][]byte{hello, rawFrame(frameData, 0, 8, make([]byte, 1040))},
			"a 1040-byte message, larger than the 1024 bytes agreed in the hello"},
		{"larger than the buffers", [][]byte{hello, rawFrame(frameData, 0, 8, make([]byte, 4000))},
			"a frame larger than this side's 1088-byte receive buffers"},
		// Credits 2 and the buffer kept for FIN: three frames are granted.
		{"without credit", [][]byte{hello, rawFrame(frameData, 0, 8, []byte("1")), rawFrame(frameData, 0, 8, []byte("2")),
			rawFrame(frameData, 0, 8, []byte("3"))},
			"a DATA frame without credit: 4 credit-using frames arrived, 3 were granted"},
		{"credit without slot", [][]byte{hello, rawFrame(frameCredit, 0, 8, nil)}, "a CREDIT frame without a reply slot"},
		{"grant beyond", [][]byte{rawFrame(frameHello, 0, 100, nil)}, "granting 100 credits beyond what this side sent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachDevice(t, func(t *testing.T, d device) {
				checkNoLeaks(t)
				ctx := ctxFor(t, 30*time.Second)
				l, addr := listen(t, d, &Config{MaxMessageSize: 1024, Credits: 2})
				accepted := make(chan *Conn, 1)
				accept := func() {
					c, err := l.Accept(ctx)
					assert.NoError(t, err)
					accepted <- c
				}
				// A bystander on the same listener, up before the abuse.
				go accept()
				bc, err := Dial(ctx, nil, addr, nil)
				require.NoError(t, err)
				defer bc.Close()
				bs := <-accepted
				require.NotNil(t, bs)
				defer bs.Close()

				go accept()
				p, err := rawDial(t, addr, rawHello)
				require.NoError(t, err)
				server := <-accepted
				require.NotNil(t, server)
				defer server.Close()
				for i, f := range tc.frames {
					if err := p.send(t, f); err != nil {
						require.Equal(t, len(tc.frames)-1, i, "frame %d: %v", i, err)
						t.Logf("%s: the bad frame failed at the sender: %v", d.name, err)
					}
				}
				var ms []*Message
				for {
					m, err := server.Recv(ctx)
					if err == nil {
						ms = append(ms, m)
						continue
					}
					require.ErrorIs(t, err, ErrProtocol)
					assert.ErrorContains(t, err, tc.want)
					t.Logf("%s: %v", d.name, err)
					break
				}
				for _, m := range ms {
					m.Release()
				}
				assert.ErrorIs(t, server.Send(ctx, []byte("x")), ErrProtocol, "the next call fails too")
				select {
				case <-p.rc.Done():
				case <-ctx.Done():
					t.Fatal("the abusing peer was not disconnected")
				}
				start := time.Now()
				require.NoError(t, server.Close())
				t.Logf("%s: Close took %v", d.name, time.Since(start).Round(time.Millisecond))
				assert.Less(t, time.Since(start), 5*time.Second, "Close of the abused connection")

				// Nothing else was touched: the bystander talks both ways,
				// and the listener serves the next dialer.
				for _, ends := range [][2]*Conn{{bc, bs}, {bs, bc}} {
					require.NoError(t, ends[0].Send(ctx, []byte("still here")))
					m, err := ends[1].Recv(ctx)
					require.NoError(t, err)
					assert.Equal(t, "still here", string(m.Bytes()))
					m.Release()
				}
				requireMessageServes(t, ctx, l, addr)
			})
		})
	}
}

// A hello of another version is refused at the listener, and the dialer
// learns why; a dialer reaching a listener that is not a message listener
// learns that.
func TestHandshakeRefused(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 30*time.Second)
		l, addr := listen(t, d, nil)
		go l.Accept(ctx) // refuses the request and waits for the next
		h := hello{version: 9, replySlots: 4, credits: 8, maxMessage: 4096}.marshal()
		h[4] = 9
		_, err := rawDial(t, addr, h)
		require.ErrorIs(t, err, rdmacm.ErrRejected)
		var rej *rdmacm.RejectedError
		require.ErrorAs(t, err, &rej)
		assert.Contains(t, string(rej.PrivateData), "the peer speaks version 9 of the message protocol, this side 1")

		// A plain rdmacm listener answers without a hello.
		raddr := d.at(port())
		rl, err := rdmacm.Listen(raddr)
		require.NoError(t, err)
		defer rl.Close()
		go func() {
			if c, err := rl.Accept(ctx); err == nil {
				<-c.Done()
				c.Close()
			}
		}()
		_, err = Dial(ctx, nil, raddr, nil)
		require.ErrorIs(t, err, ErrHandshake)
		assert.ErrorContains(t, err, "no rdmago message hello")
	})
}

// The other side's Close ends the stream: what it sent arrives, then
// io.EOF; CloseSend half-closes and the other direction goes on.
func TestCloseAndCloseSend(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		client, server := pair(t, d, nil, nil)
		ctx := ctxFor(t, 30*time.Second)
		require.NoError(t, client.Send(ctx, []byte("one")))
		require.NoError(t, client.CloseSend(ctx))
		assert.ErrorIs(t, client.Send(ctx, []byte("two")), ErrSendClosed)
		m, err := server.Recv(ctx)
		require.NoError(t, err)
		assert.Equal(t, "one", string(m.Bytes()))
		m.Release()
		_, err = server.Recv(ctx)
		assert.ErrorIs(t, err, io.EOF)
		require.NoError(t, server.Send(ctx, []byte("reply")), "the other way still works")
		m, err = client.Recv(ctx)
		require.NoError(t, err)
		assert.Equal(t, "reply", string(m.Bytes()))
		m.Release()

		for i := range 20 {
			require.NoError(t, server.Send(ctx, payload(i, 1000)))
		}
		start := time.Now()
		require.NoError(t, server.Close())
		assert.Less(t, time.Since(start), 2*time.Second, "Close with a live peer does not wait out a timeout")
		for i := range 20 {
			m, err := client.Recv(ctx)
			require.NoError(t, err, "message %d sent before Close", i)
			assert.Equal(t, payload(i, 1000), m.Bytes())
			m.Release()
		}
		_, err = client.Recv(ctx)
		assert.ErrorIs(t, err, io.EOF)
		_, err = server.Recv(ctx)
		assert.ErrorIs(t, err, ErrClosed)
	})
}

// peerMain is the peer process of TestPeerDeath: it dials, sends, says so,
// and waits to be killed.
func peerMain(addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Dial(ctx, nil, addr, &Config{Credits: 4})
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	for i := range 5 {
		if err := c.Send(ctx, payload(i, 100)); err != nil {
			fmt.Println("send:", err)
			os.Exit(1)
		}
	}
	fmt.Println("sent")
	<-ctx.Done()
}

// A peer process that dies: the messages it sent are still received, then
// a Send waiting for credit and the next calls fail with the connection's
// end, and Close does not hang.
func TestPeerDeath(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 90*time.Second)
		l, addr := listen(t, d, nil)
		exe, err := os.Executable()
		require.NoError(t, err)
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), "MSG_TEST_PEER="+addr)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		defer cmd.Wait()
		defer cmd.Process.Kill()
		c, err := l.Accept(ctx)
		require.NoError(t, err)
		line, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "sent\n", line)

		// The peer holds what we send: its 4 credits, then Send waits.
		for i := range 4 {
			require.NoError(t, c.Send(ctx, []byte{byte(i)}))
		}
		sendErr := make(chan error, 1)
		go func() { sendErr <- c.Send(ctx, []byte("waits")) }()
		time.Sleep(200 * time.Millisecond)
		require.NoError(t, cmd.Process.Kill())
		killed := time.Now()

		select {
		case err := <-sendErr:
			require.Error(t, err)
			assert.True(t, errors.Is(err, rdmacm.ErrEnded) || errors.Is(err, ErrTransport), "%v", err)
			t.Logf("%s: the waiting Send failed %v after the kill: %v", d.name, time.Since(killed).Round(time.Millisecond), err)
		case <-ctx.Done():
			t.Fatal("the Send waiting for credit did not fail after the peer died")
		}
		for i := range 5 {
			m, err := c.Recv(ctx)
			require.NoError(t, err, "message %d, sent before the peer died", i)
			assert.Equal(t, payload(i, 100), m.Bytes())
			m.Release()
		}
		_, err = c.Recv(ctx)
		require.Error(t, err)
		assert.NotErrorIs(t, err, io.EOF, "a dead peer is no orderly end")
		assert.ErrorIs(t, err, rdmacm.ErrDisconnected, "the kernel disconnected the dead process's connection")
		assert.Error(t, c.Send(ctx, []byte("after")))
		start := time.Now()
		c.Close()
		assert.Less(t, time.Since(start), 5*time.Second, "Close on a dead peer")
	})
}

// The RNR counters the backpressure test watches do move when a receiver
// is not ready: a plain rdmacm connection that sends before the peer posted
// a receive makes rxe count it (siw has no RNR: it has no such counters).
func TestRNRCountersSeeReceiverNotReady(t *testing.T) {
	d := rxe(t)
	checkNoLeaks(t)
	ctx := ctxFor(t, 30*time.Second)
	addr := d.at(port())
	rl, err := rdmacm.Listen(addr)
	require.NoError(t, err)
	defer rl.Close()
	accepted := make(chan *rdmacm.Conn, 1)
	go func() {
		c, err := rl.Accept(ctx)
		assert.NoError(t, err)
		accepted <- c
	}()
	rc, err := rdmacm.Dial(ctx, addr)
	require.NoError(t, err)
	defer rc.Close()
	server := <-accepted
	require.NotNil(t, server)
	defer server.Close()

	before := rnrCounters(t, d.name)
	mr, err := rc.RegisterMemory(64, 0)
	require.NoError(t, err)
	// No receive posted on the other side: rxe NAKs and retries (past
	// the retry count asked for, in our guest), so give up after a while.
	sendCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	err = rc.Send(sendCtx, mr, 0, 64)
	require.Error(t, err)
	after := rnrCounters(t, d.name)
	t.Logf("send without a posted receive: %v; counters %v -> %v", err, before, after)
	assert.NotEqual(t, before, after, "an RNR shows in the counters")
}

// Senders in many goroutines at once: every message arrives once, each
// sender's in its order.
func TestConcurrentSenders(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		client, server := pair(t, d, &Config{SendBuffers: 8}, &Config{Credits: 8})
		ctx := ctxFor(t, 60*time.Second)
		const senders, each = 8, 300
		var wg sync.WaitGroup
		for s := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					if err := client.Send(ctx, []byte{byte(s), byte(i >> 8), byte(i)}); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		next := make([]int, senders)
		for range senders * each {
			m, err := server.Recv(ctx)
			require.NoError(t, err)
			b := m.Bytes()
			s, i := int(b[0]), int(b[1])<<8|int(b[2])
			require.Equal(t, next[s], i, "sender %d", s)
			next[s]++
			m.Release()
		}
		wg.Wait()
	})
}

// A peer reaches no memory of another connection: each connection has its
// own PD and registers its buffers without remote rights, so RDMA READ and
// WRITE with another connection's keys fail and move no data, on rxe and
// on siw. That holds for the one region a peer may read, the keepalive
// probes' (remote read, its key in every hello), and for keys gone stale
// with their connection. On its own connection's buffers rxe refuses both
// too; siw (6.1) refuses the WRITE but serves the READ, as it does not
// check remote read rights (siw_qp_tx.c checks a read response's memory
// with no rights): there the peer can read only its own connection's
// buffers, which hold the messages it sent and was sent.
func TestNoRemoteAccess(t *testing.T) {
	rawHello := hello{version: Version, replySlots: 4, credits: 8, maxMessage: 4096}.marshal()
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 90*time.Second)
		rxe := d.name == "rxe0"
		// Another connection, with a secret in its buffers both ways.
		otherClient, other := pair(t, d, nil, nil)
		secret := bytes.Repeat([]byte("secret"), 10)
		require.NoError(t, other.Send(ctx, secret))
		require.NoError(t, otherClient.Send(ctx, secret))
		m, err := other.Recv(ctx)
		require.NoError(t, err)
		defer m.Release()

		l, addr := listen(t, d, nil)
		accept := func() (*rawPeer, *Conn) {
			accepted := make(chan *Conn, 1)
			go func() {
				c, err := l.Accept(ctx)
				assert.NoError(t, err)
				accepted <- c
			}()
			p, err := rawDial(t, addr, rawHello)
			require.NoError(t, err)
			own := <-accepted
			require.NotNil(t, own)
			require.NoError(t, p.send(t, rawFrame(frameHello, 0, 8, nil)))
			return p, own
		}
		// A connection whose probe memory another peer goes for: its key
		// and address, as its own peer learned them from the hello.
		probeOf := func() (rdmacm.RemoteBuffer, func()) {
			q, victim := accept()
			h, err := parseHello(q.rc.PeerPrivateData())
			require.NoError(t, err)
			require.True(t, h.probe, "the hello names the probe memory")
			return rdmacm.RemoteBuffer{Addr: h.probeAddr, RKey: h.probeKey, Len: probeSize}, func() {
				require.NoError(t, victim.Close())
				require.NoError(t, q.rc.Close())
			}
		}
		live, closeVictim := probeOf()
		defer closeVictim()
		stale, closeStale := probeOf()
		closeStale()
		staleRecv := rdmacm.RemoteBufferOf(otherClient.recvMR, 0, 64)
		require.NoError(t, otherClient.Close())

		for _, tc := range []struct {
			op, what string
			target   func(own *Conn) (rdmacm.RemoteBuffer, *verbs.MR) // the MR, when it is still there to compare
			mustFail bool
		}{
			{"read", "another connection's receive buffers", func(*Conn) (rdmacm.RemoteBuffer, *verbs.MR) {
				return rdmacm.RemoteBufferOf(other.recvMR, 0, 64), other.recvMR
			}, true},
			{"read", "another connection's send buffers", func(*Conn) (rdmacm.RemoteBuffer, *verbs.MR) {
				return rdmacm.RemoteBufferOf(other.sendMR, 0, 64), other.sendMR
			}, true},
			{"read", "another connection's probe memory", func(*Conn) (rdmacm.RemoteBuffer, *verbs.MR) { return live, nil }, true},
			{"read", "a closed connection's probe memory (a stale key)", func(*Conn) (rdmacm.RemoteBuffer, *verbs.MR) { return stale, nil }, true},
			{"read", "a closed connection's receive buffers (a stale key)", func(*Conn) (rdmacm.RemoteBuffer, *verbs.MR) { return staleRecv, nil }, true},
			{"write", "another connection's receive buffers", func(*Conn) (rdmacm.RemoteBuffer, *verbs.MR) {
				return rdmacm.RemoteBufferOf(other.recvMR, 0, 64), other.recvMR
			}, true},
			{"write", "another connection's send buffers", func(*Conn) (rdmacm.RemoteBuffer, *verbs.MR) {
				return rdmacm.RemoteBufferOf(other.sendMR, 0, 64), other.sendMR
			}, true},
			{"read", "its own connection's receive buffers", func(c *Conn) (rdmacm.RemoteBuffer, *verbs.MR) {
				return rdmacm.RemoteBufferOf(c.recvMR, 0, 64), c.recvMR
			}, rxe},
			{"read", "its own connection's send buffers", func(c *Conn) (rdmacm.RemoteBuffer, *verbs.MR) {
				return rdmacm.RemoteBufferOf(c.sendMR, 0, 64), c.sendMR
			}, rxe},
			{"write", "its own connection's send buffers", func(c *Conn) (rdmacm.RemoteBuffer, *verbs.MR) {
				return rdmacm.RemoteBufferOf(c.sendMR, 0, 64), c.sendMR
			}, true},
		} {
			p, own := accept()
			target, mr := tc.target(own)
			n := int(target.Len)
			var before []byte
			if mr != nil {
				before = bytes.Clone(mr.Bytes()[:n])
			}
			local, err := p.rc.RegisterMemory(4096, verbs.AccessLocalWrite)
			require.NoError(t, err)
			for i := range n {
				local.Bytes()[i] = 0xa5
			}
			opCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if tc.op == "read" {
				err = p.rc.RDMARead(opCtx, local, 0, n, target)
			} else {
				err = p.rc.RDMAWrite(opCtx, local, 0, n, target)
			}
			cancel()
			t.Logf("%s: RDMA %s of %s with their key: %v", d.name, tc.op, tc.what, err)
			time.Sleep(200 * time.Millisecond) // an iWARP WRITE completes before the peer refuses it
			if mr != nil {
				assert.Equal(t, before, mr.Bytes()[:n], "RDMA %s of %s changed nothing there", tc.op, tc.what)
			}
			switch {
			case tc.mustFail && (tc.op == "read" || rxe):
				// iWARP's WRITE completes locally before the peer refuses it.
				var ce *verbs.CompletionError
				if assert.ErrorAs(t, err, &ce, "RDMA %s of %s", tc.op, tc.what) && rxe {
					assert.Equal(t, verbs.WCRemAccessErr, ce.WC.Status, "RDMA %s of %s: a remote access error", tc.op, tc.what)
				}
				if tc.op == "read" {
					assert.Equal(t, bytes.Repeat([]byte{0xa5}, n), local.Bytes()[:n], "RDMA read of %s read nothing", tc.what)
				}
			case tc.op == "read":
				// siw serves a read of this connection's own buffers: what
				// it gets is this connection's, byte for byte.
				require.NoError(t, err)
				assert.Equal(t, before, local.Bytes()[:n], "only this connection's memory")
			}
			require.NoError(t, own.Close())
			require.NoError(t, p.rc.Close())
		}
	})
}

// Idle connections cost one parked goroutine each and no CPU: completions
// are waited for on the runtime poller, never polled in a loop.
func TestIdleConnectionsCostOneGoroutineAndNoCPU(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 60*time.Second)
		const pairs = 4
		before := len(testbed.Goroutines())
		var conns []*Conn
		for range pairs {
			c, s := pair(t, d, nil, nil)
			// One message each way, so every goroutine has waited once.
			require.NoError(t, c.Send(ctx, []byte("x")))
			m, err := s.Recv(ctx)
			require.NoError(t, err)
			// Received without a copy: the message is in the registered
			// receive buffers the NIC wrote.
			at := uint64(uintptr(unsafe.Pointer(&m.Bytes()[0])))
			assert.True(t, at >= s.recvMR.Addr() && at < s.recvMR.Addr()+uint64(len(s.recvMR.Bytes())),
				"the message at %#x lies in the receive buffers", at)
			m.Release()
			conns = append(conns, c, s)
		}
		time.Sleep(200 * time.Millisecond)
		after := len(testbed.Goroutines())
		// One per connection, and one per listener (pair makes one each),
		// which takes the requests from the first Accept on.
		assert.LessOrEqual(t, after-before, len(conns)+pairs, "%d connections and %d listeners, %d more goroutines",
			len(conns), pairs, after-before)

		cpuOverASecond := func() time.Duration {
			var r0, r1 syscall.Rusage
			require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &r0))
			time.Sleep(time.Second)
			require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &r1))
			return time.Duration(r1.Utime.Nano()-r0.Utime.Nano()) + time.Duration(r1.Stime.Nano()-r0.Stime.Nano())
		}
		cpu := cpuOverASecond()
		t.Logf("%s: %d idle connections: %d more goroutines, %v of CPU in 1 s", d.name, len(conns), after-before, cpu)
		assert.Less(t, cpu, 100*time.Millisecond, "idle connections do not poll")

		// Blocked calls wait on the poller too: a Recv on every connection,
		// and a Send short of credit (a receiver that takes nothing).
		done := make(chan error, len(conns)+1)
		for _, c := range conns {
			go func() {
				_, err := c.Recv(ctx)
				done <- err
			}()
		}
		sc, sr := pair(t, d, nil, &Config{Credits: 2})
		go func() {
			for {
				if err := sc.Send(ctx, []byte("x")); err != nil {
					done <- err
					return
				}
			}
		}()
		time.Sleep(200 * time.Millisecond) // the Recvs wait, the Send ran out of credit
		cpu = cpuOverASecond()
		t.Logf("%s: %d blocked Recvs and a Send short of credit: %v of CPU in 1 s", d.name, len(conns), cpu)
		assert.Less(t, cpu, 100*time.Millisecond, "blocked calls do not poll")
		select {
		case err := <-done:
			t.Fatalf("a call that should still wait returned: %v", err)
		default:
		}
		// Each blocked call ends with a Close (pair's cleanup checks the
		// Close errors).
		for _, c := range append(conns, sr, sc) {
			c.Close()
		}
		for range len(conns) + 1 {
			<-done
		}
	})
}

// The smallest configuration, one credit and one send buffer each way:
// every message waits for its send completion and for a CREDIT frame, and
// still nothing is lost, reordered or refused.
func TestOneCreditOneBuffer(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		cfg := &Config{MaxMessageSize: 256, Credits: 1, SendBuffers: 1}
		client, server := pair(t, d, cfg, cfg)
		ctx := ctxFor(t, 60*time.Second)
		const n = 300
		var wg sync.WaitGroup
		for _, c := range []*Conn{client, server} {
			wg.Add(2)
			go func() {
				defer wg.Done()
				for i := range n {
					if err := c.Send(ctx, payload(i, 256)); err != nil {
						t.Errorf("send %d: %v", i, err)
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				for i := range n {
					m, err := c.Recv(ctx)
					if err != nil {
						t.Errorf("receive %d: %v", i, err)
						return
					}
					if !bytes.Equal(m.Bytes(), payload(i, 256)) {
						t.Errorf("message %d differs", i)
					}
					m.Release()
				}
			}()
		}
		wg.Wait()
	})
}

// A reader that holds every message past the writer's Close still gets
// the end of the stream after them: the last credit is kept for FIN, so
// a full window does not turn Close into an abort.
// Messages of a page or more go without a completion of their own, their
// buffers held until the reader releases them: the FIN still finds one.
func TestCloseReachesASlowReader(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		for _, size := range []int{100, 3 * unsignaledMin / 2} {
			t.Run(fmt.Sprintf("%dB", size), func(t *testing.T) {
				checkNoLeaks(t)
				cfg := &Config{MaxMessageSize: 2 * unsignaledMin, Credits: 2, SendBuffers: 2, CloseTimeout: 500 * time.Millisecond}
				client, server := pair(t, d, cfg, cfg)
				ctx := ctxFor(t, 30*time.Second)
				for i := range 2 {
					require.NoError(t, client.Send(ctx, fullPayload(i, size)))
				}
				// A Close that waited for the credit the reader holds would
				// give up after CloseTimeout and abort: the reader would see
				// the end (ErrEnded), not io.EOF after the messages.
				require.NoError(t, client.Close())
				time.Sleep(time.Second) // the reader is slow: longer than CloseTimeout
				for i := range 2 {
					m, err := server.Recv(ctx)
					require.NoError(t, err, "message %d", i)
					assert.Equal(t, fullPayload(i, size), m.Bytes())
					m.Release()
				}
				_, err := server.Recv(ctx)
				assert.ErrorIs(t, err, io.EOF, "the end of the stream, not an abort")
			})
		}
	})
}

// A send buffer whose message went without a completion of its own (a page
// or more) is reused only once the peer's grant shows the message arrived,
// not when a later send completes: on siw a completion means handed to TCP,
// which may still send the buffer's pages again. The peer holds every
// message, so no grant comes: those buffers stay taken until it releases.
func TestZeroCopyBuffersWaitForThePeer(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		const n, size = 4, 64 << 10
		cfg := &Config{MaxMessageSize: size, Credits: n, SendBuffers: n}
		client, server := pair(t, d, cfg, cfg)
		ctx := ctxFor(t, 30*time.Second)
		// noEarlyReuse: every free buffer that carried a message without
		// a completion of its own carried one the peer has granted.
		noEarlyReuse := func(when string) {
			t.Helper()
			client.mu.Lock()
			defer client.mu.Unlock()
			arrived := client.led.peerGrant - client.led.peerCredits
			for _, slot := range client.freeSend {
				if !client.signaled[slot] {
					assert.False(t, after(client.frameSeq[slot], arrived),
						"%s: buffer %d is free, its frame %d not granted (the peer's grant covers %d)", when, slot, client.frameSeq[slot], arrived)
				}
			}
		}
		for i := range n {
			require.NoError(t, client.Send(ctx, fullPayload(i, size)))
			noEarlyReuse(fmt.Sprintf("after send %d", i))
		}
		require.Eventually(t, func() bool {
			client.mu.Lock()
			defer client.mu.Unlock()
			client.reapLocked()
			return len(client.awaitGrant) > 0
		}, 10*time.Second, 10*time.Millisecond, "a send completed after sends that asked for no completion: their buffers wait for the grant")
		time.Sleep(100 * time.Millisecond) // a grant would have come by now
		noEarlyReuse("the peer holding every message")

		for i := range n {
			m, err := server.Recv(ctx)
			require.NoError(t, err, "message %d", i)
			require.Equal(t, fullPayload(i, size), m.Bytes(), "message %d", i)
			m.Release()
		}
		require.Eventually(t, func() bool {
			client.mu.Lock()
			defer client.mu.Unlock()
			return len(client.awaitGrant) == 0
		}, 10*time.Second, 10*time.Millisecond, "the peer's grant freed the buffers whose sends had completed")
		// And they carry the next messages whole.
		for i := range 4 * n {
			require.NoError(t, client.Send(ctx, fullPayload(n+i, size)))
			noEarlyReuse(fmt.Sprintf("after send %d", n+i))
			m, err := server.Recv(ctx)
			require.NoError(t, err)
			require.Equal(t, fullPayload(n+i, size), m.Bytes())
			m.Release()
		}
	})
}

// Sends from several goroutines, messages of a page or more, few buffers:
// every Send returns, and each goroutine's messages arrive whole and in
// its order. A Send waiting on the send CQ while a grant frees a buffer
// must still see a completion come: the posts made while it waits ask
// for one.
func TestConcurrentLargeSends(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		const senders, each, size = 4, 300, 2 * unsignaledMin
		cfg := &Config{MaxMessageSize: size, Credits: 3, SendBuffers: 3}
		client, server := pair(t, d, cfg, cfg)
		ctx := ctxFor(t, 90*time.Second)
		errs := make(chan error, senders)
		for g := range senders {
			go func() {
				for i := range each {
					p := fullPayload(g*each+i, size)
					p[0] = byte(g)
					if err := client.Send(ctx, p); err != nil {
						errs <- fmt.Errorf("sender %d, message %d: %w", g, i, err)
						return
					}
				}
				errs <- nil
			}()
		}
		next := make([]int, senders)
		for range senders * each {
			m, err := server.Recv(ctx)
			require.NoError(t, err, "received so far %v of %d each", next, each)
			b := m.Bytes()
			require.Len(t, b, size)
			g := int(b[0])
			require.Less(t, g, senders)
			want := fullPayload(g*each+next[g], size)
			want[0] = byte(g)
			require.Equal(t, want, b, "sender %d's message %d", g, next[g])
			next[g]++
			m.Release()
		}
		for range senders {
			require.NoError(t, <-errs)
		}
	})
}

// fullPayload is message i, size bytes long.
func fullPayload(i, size int) []byte {
	b := make([]byte, size)
	binary.BigEndian.PutUint64(b, uint64(i))
	for j := 8; j < size; j++ {
		b[j] = byte(i*31 + j)
	}
	return b
}

// Registered is what the connection holds registered in the kernel: the
// MRs a pair adds to this process are, by the kernel's own lengths, the
// two ends' Registered; with msg's defaults, about 1.2 MB each.
func TestRegisteredIsWhatTheKernelHolds(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		before, err := testbed.RegisteredBytes()
		require.NoError(t, err)
		client, server := pair(t, d, nil, nil)
		after, err := testbed.RegisteredBytes()
		require.NoError(t, err)
		assert.Equal(t, after-before, client.Registered()+server.Registered(), "by the kernel's MR lengths")
		assert.Equal(t, client.Registered(), server.Registered(), "the same defaults on both ends")
		assert.InDelta(t, 1.2e6, float64(client.Registered()), 0.1e6)
		t.Logf("%s: %d bytes registered per connection", d.name, client.Registered())
	})
}
