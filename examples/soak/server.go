package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/rdmacm/msg"
	"github.com/rdmago/rdmago/rdmacm/stream"
	"github.com/rdmago/rdmago/test/testbed"
)

// The message protocol between workers and servers. Every client message
// starts with a header: op, seed, reply size; its payload is pattern(seed).
// The server checks every payload; a request gets a reply that says how
// many messages arrived since the last reply and how many were corrupt,
// with a payload of its own.
const (
	opRequest = 'R' // answer with a reply of the size asked
	opOneWay  = 'B' // no answer: part of a burst
	opReply   = 'r'

	reqHeader   = 1 + 8 + 4     // op, seed, reply size
	replyHeader = 1 + 8 + 4 + 4 // op, seed, messages since the last reply, corrupt ones
)

// replySeed is the seed of a request's reply payload.
func replySeed(seed uint64) uint64 { return seed ^ 0x9e3779b97f4a7c15 }

// start is a xorshift state for seed: never zero, distinct for distinct seeds.
func start(seed uint64) uint64 {
	if x := seed ^ 0x2545f4914f6cdd1d; x != 0 {
		return x
	}
	return 1
}

// fill writes pattern(seed) into b: a xorshift sequence, 8 bytes a step.
func fill(b []byte, seed uint64) {
	x := start(seed)
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(w[:], x)
		copy(b[i:], w[:])
	}
}

// check says whether b is pattern(seed).
func check(b []byte, seed uint64) bool {
	x := start(seed)
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(w[:], x)
		if string(b[i:min(i+8, len(b))]) != string(w[:min(8, len(b)-i)]) {
			return false
		}
	}
	return true
}

// serve is the server role: a message listener and a stream listener, until
// standard input closes (the coordinator stopping it) or a signal; then it
// closes everything and prints its leaks. The coordinator kills it at random
// too, which is the point.
func serve(ctx context.Context, cfg config, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	// librdmacm opens every device on first use and keeps them: before the
	// leak snapshot.
	if _, err := rdmacm.OpenDevice(cfg.device); err != nil {
		return err
	}
	snap, err := testbed.TakeSnapshot()
	if err != nil {
		return err
	}
	kc := cfg.msgConfig()
	ml, err := msg.Listen(ctx, nil, cfg.serveMsg, &kc)
	if err != nil {
		return err
	}
	sl, err := stream.Listen(ctx, nil, cfg.serveStream, &kc)
	if err != nil {
		ml.Close()
		return err
	}
	fmt.Fprintln(out, "ready")

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[io.Closer]bool{}
	)
	track := func(c io.Closer) bool {
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() != nil {
			return false
		}
		conns[c] = true
		return true
	}
	untrack := func(c io.Closer) {
		mu.Lock()
		delete(conns, c)
		mu.Unlock()
		c.Close()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			c, err := ml.Accept(ctx)
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
					fmt.Fprintf(os.Stderr, "soak server: msg accept: %v\n", err)
					continue
				}
				return
			}
			if !track(c) {
				c.Close()
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer untrack(c)
				if err := serveMsg(ctx, c); err != nil && ctx.Err() == nil {
					logf(cfg, "msg %v", c.RemoteAddr(), err)
				}
			}()
		}
	}()
	go func() {
		defer wg.Done()
		for {
			c, err := sl.Accept()
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
					fmt.Fprintf(os.Stderr, "soak server: stream accept: %v\n", err)
					continue
				}
				return
			}
			if !track(c) {
				c.Close()
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer untrack(c)
				if _, err := io.Copy(c, c); err != nil && ctx.Err() == nil { // echo until the client is done
					logf(cfg, "stream %v", c.RemoteAddr(), err)
				}
			}()
		}
	}()

	<-ctx.Done()
	ml.Close()
	sl.Close()
	mu.Lock()
	for c := range conns {
		c.Close()
	}
	mu.Unlock()
	wg.Wait()
	if leaks := testbed.LeaksSince(snap, 5*time.Second); len(leaks) > 0 {
		fmt.Fprintf(out, "leaks: %s\n", strings.Join(leaks, "; "))
	} else {
		fmt.Fprintln(out, "leaks: none")
	}
	return nil
}

// logf reports a connection's failure on the server's side, which the
// client should see as a failure too.
func logf(cfg config, what string, remote any, err error) {
	fmt.Fprintf(os.Stderr, "soak server %s %s: %s %s: %s: %v\n", time.Now().Format("15:04:05.000"), cfg.device,
		fmt.Sprintf(what, remote), cfg.serveMsg, classify(err), err)
}

// serveMsg answers one message connection until it ends: the client's FIN
// (a nil error) or a failure.
func serveMsg(ctx context.Context, c *msg.Conn) error {
	var since, bad uint32
	reply := make([]byte, c.MaxMessageSize())
	for {
		m, err := c.Recv(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		b := m.Bytes()
		since++
		if len(b) < reqHeader || (b[0] != opRequest && b[0] != opOneWay) {
			bad++
			m.Release()
			continue
		}
		op, seed, size := b[0], binary.BigEndian.Uint64(b[1:]), int(binary.BigEndian.Uint32(b[9:]))
		if !check(b[reqHeader:], seed) {
			bad++
		}
		m.Release()
		if op != opRequest {
			continue
		}
		size = max(replyHeader, min(size, len(reply)))
		r := reply[:size]
		r[0] = opReply
		binary.BigEndian.PutUint64(r[1:], replySeed(seed))
		binary.BigEndian.PutUint32(r[9:], since)
		binary.BigEndian.PutUint32(r[13:], bad)
		fill(r[replyHeader:], replySeed(seed))
		since, bad = 0, 0
		if err := c.Send(ctx, r); err != nil {
			return err
		}
	}
}
