package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"time"

	"github.com/rdmago/rdmago/rdmacm/msg"
	"github.com/rdmago/rdmago/rdmacm/stream"
)

// worker dials its device's current server again and again.
type worker struct {
	c   config
	d   *device
	rng *rand.Rand
}

// loop runs conn, one connection's life, until ctx ends.
func (w *worker) loop(ctx context.Context, conn func(ctx context.Context, s *server)) {
	for ctx.Err() == nil {
		conn(ctx, w.d.current(w.rng))
	}
}

// lifetime is a connection's random life.
func (w *worker) lifetime() time.Duration {
	return time.Duration(w.rng.Int64N(int64(w.c.lifetime)))
}

// pause waits a little after a failed dial, so that a dead server's ports
// are not dialed in a tight loop.
func (w *worker) pause() {
	time.Sleep(200*time.Millisecond + time.Duration(w.rng.Int64N(int64(500*time.Millisecond))))
}

// op is the context of one operation: past opTimeout it is a hang. It does
// not derive from the run's context, so that the operations under way when
// the run ends finish rather than fail.
func (w *worker) op() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), w.c.opTimeout)
}

// fail counts err, seen on a connection to s (or a dial); fatal kinds, and
// errors while s was alive, are also printed at once.
func (w *worker) fail(phase string, s *server, err error) {
	killed := s.killed.Load()
	kind := w.d.st.fail(phase, err, killed)
	if at := s.killedAt.Load(); killed && at != 0 && (phase == "msg" || phase == "stream") {
		since := time.Since(time.Unix(0, at))
		w.d.st.add(func(d *deviceStats) { d.SlowestNotice = max(d.SlowestNotice, since) })
	}
	if fatalKinds[kind] || !killed {
		fmt.Fprintf(os.Stderr, "soak: %s %s %s: %s, server %d alive: %v\n", time.Now().Format("15:04:05.000"),
			w.d.name, phase, kind, s.id, err)
	}
}

// bounded runs f, a close, and counts a hang if it takes longer than the
// operation timeout. It then waits ten times as long before it leaves f
// running: a close that never returns must not keep the run from ending
// with its report (the leak check counts what it holds).
func (w *worker) bounded(phase string, s *server, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(w.c.opTimeout):
		w.fail(phase, s, fmt.Errorf("%s still waiting after %v: %w", phase, w.c.opTimeout, context.DeadlineExceeded))
	}
	select {
	case <-done:
	case <-time.After(10 * w.c.opTimeout):
		w.fail(phase, s, fmt.Errorf("%s abandoned after %v", phase, 11*w.c.opTimeout))
	}
	return nil
}

// msgConn is one message connection's life: requests of varying sizes and
// bursts of one-way messages, every byte checked both ways, then a close,
// graceful (CloseSend, the server's FIN) or abrupt.
func (w *worker) msgConn(ctx context.Context, s *server) {
	octx, cancel := w.op()
	cfg := w.c.msgConfig()
	c, err := msg.Dial(octx, nil, s.msgAddr, &cfg)
	cancel()
	w.d.st.add(func(d *deviceStats) { d.Dials++ })
	if err != nil {
		w.d.st.add(func(d *deviceStats) { d.DialErrors++ })
		w.fail("dial msg", s, err)
		w.pause()
		return
	}
	max := c.MaxMessageSize()
	buf := make([]byte, max)
	var pending, pendingBytes int64 // one-way messages not yet confirmed by a reply
	end := time.Now().Add(w.lifetime())
	for ctx.Err() == nil && time.Now().Before(end) {
		octx, cancel := w.op()
		if w.rng.IntN(3) == 0 {
			n := 1 + w.rng.IntN(64)
			for i := 0; i < n && err == nil; i++ {
				m := w.message(buf, opOneWay, 0)
				if err = c.Send(octx, m); err == nil {
					pending++
					pendingBytes += int64(len(m) - reqHeader)
				}
			}
		} else {
			var got int64
			if got, err = w.request(octx, c, buf, pending); err == nil {
				count := pending
				w.d.st.add(func(d *deviceStats) { d.Requests++; d.OneWay += count; d.Bytes += got + pendingBytes })
				pending, pendingBytes = 0, 0
			}
		}
		cancel()
		if err != nil {
			w.fail("msg", s, err)
			w.bounded("msg close", s, c.Close)
			return
		}
	}
	if w.rng.IntN(2) == 0 {
		// Graceful: the server answers the FIN with its own.
		err = w.bounded("msg close", s, func() error {
			octx, cancel := w.op()
			defer cancel()
			if err := c.CloseSend(octx); err != nil {
				return err
			}
			m, err := c.Recv(octx)
			if err == nil {
				m.Release()
				return fmt.Errorf("a message after CloseSend: %w", errCorrupt)
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		})
		if err != nil {
			w.fail("msg close", s, err)
		}
	}
	w.bounded("msg close", s, c.Close)
	w.d.st.add(func(d *deviceStats) { d.Closes++ })
}

// message fills buf with a client message: op, a fresh seed, a reply size
// and a payload of pattern(seed), of random size.
func (w *worker) message(buf []byte, op byte, reply int) []byte {
	n := reqHeader + w.size(len(buf)-reqHeader)
	m := buf[:n]
	m[0] = op
	seed := w.rng.Uint64()
	binary.BigEndian.PutUint64(m[1:], seed)
	binary.BigEndian.PutUint32(m[9:], uint32(reply))
	fill(m[reqHeader:], seed)
	return m
}

// size is a random payload size up to max: small ones as often as large.
func (w *worker) size(max int) int {
	if w.rng.IntN(2) == 0 {
		return w.rng.IntN(min(64, max) + 1)
	}
	return w.rng.IntN(max + 1)
}

// request sends a request and checks its reply: the server saw pending
// one-way messages and this one, none corrupt, and the reply's payload is
// intact. It returns the payload bytes checked.
func (w *worker) request(ctx context.Context, c *msg.Conn, buf []byte, pending int64) (int64, error) {
	replySize := replyHeader + w.size(len(buf)-replyHeader)
	m := w.message(buf, opRequest, replySize)
	seed := binary.BigEndian.Uint64(m[1:])
	if err := c.Send(ctx, m); err != nil {
		return 0, err
	}
	r, err := c.Recv(ctx)
	if err != nil {
		return 0, err
	}
	defer r.Release()
	b := r.Bytes()
	switch {
	case len(b) != replySize:
		return 0, fmt.Errorf("a reply of %d bytes, %d asked: %w", len(b), replySize, errCorrupt)
	case b[0] != opReply || binary.BigEndian.Uint64(b[1:]) != replySeed(seed):
		return 0, fmt.Errorf("a reply to another request: %w", errCorrupt)
	case int64(binary.BigEndian.Uint32(b[9:])) != pending+1:
		return 0, fmt.Errorf("the server got %d messages, %d were sent: %w", binary.BigEndian.Uint32(b[9:]), pending+1, errCorrupt)
	case binary.BigEndian.Uint32(b[13:]) != 0:
		return 0, fmt.Errorf("the server got %d corrupt messages: %w", binary.BigEndian.Uint32(b[13:]), errCorrupt)
	case !check(b[replyHeader:], replySeed(seed)):
		return 0, fmt.Errorf("a reply's payload is not what was sent: %w", errCorrupt)
	}
	return int64(len(m) - reqHeader + len(b) - replyHeader), nil
}

// streamConn is one stream connection's life: rounds of writing random
// bytes in random pieces while reading the server's echo and checking it,
// then a close, graceful (CloseWrite, the server's end of stream) or abrupt.
func (w *worker) streamConn(ctx context.Context, s *server) {
	octx, cancel := w.op()
	d := stream.Dialer{Config: w.c.msgConfig()}
	c, err := d.DialContext(octx, stream.Network, s.streamAddr)
	cancel()
	w.d.st.add(func(d *deviceStats) { d.Dials++ })
	if err != nil {
		w.d.st.add(func(d *deviceStats) { d.DialErrors++ })
		w.fail("dial stream", s, err)
		w.pause()
		return
	}
	end := time.Now().Add(w.lifetime())
	for ctx.Err() == nil && time.Now().Before(end) {
		n := 1 + w.rng.IntN(256<<10)
		if err := w.round(c, n); err != nil {
			w.fail("stream", s, err)
			w.bounded("stream close", s, c.Close)
			return
		}
		w.d.st.add(func(d *deviceStats) { d.StreamRounds++; d.Bytes += 2 * int64(n) })
	}
	if w.rng.IntN(2) == 0 {
		err = w.bounded("stream close", s, func() error {
			c.SetDeadline(time.Now().Add(w.c.opTimeout))
			if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
				return err
			}
			var b [1]byte
			n, err := c.Read(b[:])
			switch {
			case n > 0:
				return fmt.Errorf("bytes after the echo: %w", errCorrupt)
			case errors.Is(err, io.EOF):
				return nil
			}
			return err
		})
		if err != nil {
			w.fail("stream close", s, err)
		}
	}
	w.bounded("stream close", s, c.Close)
	w.d.st.add(func(d *deviceStats) { d.Closes++ })
}

// round writes n random bytes in random pieces and reads them back.
func (w *worker) round(c net.Conn, n int) error {
	sent := make([]byte, n)
	fill(sent, w.rng.Uint64())
	pieces := []int{}
	for left := n; left > 0; {
		p := min(left, 1+w.rng.IntN(64<<10))
		pieces = append(pieces, p)
		left -= p
	}
	c.SetDeadline(time.Now().Add(w.c.opTimeout))
	wrote := make(chan error, 1)
	go func() {
		off := 0
		for _, p := range pieces {
			if _, err := c.Write(sent[off : off+p]); err != nil {
				wrote <- err
				return
			}
			off += p
		}
		wrote <- nil
	}()
	got := make([]byte, n)
	_, err := io.ReadFull(c, got)
	if err == nil && string(got) != string(sent) {
		err = fmt.Errorf("the echo of %d bytes differs: %w", n, errCorrupt)
	}
	if err != nil {
		c.Close() // the writer may wait for credit the server will never give
	}
	if werr := <-wrote; err == nil {
		err = werr
	}
	return err
}
