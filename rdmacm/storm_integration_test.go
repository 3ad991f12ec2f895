//go:build integration

package rdmacm_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// Connection storms (issue #28, item 3): many dials at once against one
// listener with a small backlog. What users rely on: every dial returns
// within its context's timeout, either with a connection that carries a
// message to an accepted end (or, if the listener gave up on it, one that
// ends and says so) or with an *OpError that names the listener's address
// and matches one of the package's kinds; the listener keeps serving
// afterwards; and once everything is closed nothing is left behind.
//
// The dialers use 10 s steps. With the default 2 s, 1000 dials at once on
// the test bed's 2 emulated CPUs (under the race detector) starve each
// other of CPU: in four runs 0 or 1 connected, at most 101 were refused as
// backlog full, and the rest failed with ErrTimeout, more than half of
// them in address or route resolution, before the listener's backlog,
// which is what this test is about, had a say. The listener keeps its
// default 2 s ConnectTimeout: under the storm some of its accepts time out
// waiting for the dialer's RTU, after the dialer's Dial has returned, and
// those dialers must learn it (see TestDialerLearnsThatTheListenerGaveUp).
//
// A storm also loses CM messages, so that some dials get no answer within
// their step (with 15 s steps, from 1 to 364 of 1000 in four runs, and 812
// on a guest whose host was busy with other guests; likely causes, not
// measured here: rxe's MAD receive queue overflowing, and the kernel
// dropping requests past rdma_cm's backlog of unread events for the dialer
// to retry seconds later): those fail with ErrTimeout too, not a hang.

const (
	// stormDialTimeout is each dial's context: the dial must return by
	// then, plus stormMargin, connected or not. The dials of a storm start
	// together, so their contexts expire together too, and those still
	// waiting all release their CM id, QP, CQs and PD at once before they
	// return: with 182 of them on a guest whose host was busy, the last
	// returned 7.6 s after its deadline. A hang would not return at all.
	stormDialTimeout = 30 * time.Second
	stormMargin      = 15 * time.Second
	stormStep        = 10 * time.Second
	stormMessage     = "storm"
	// stormSettle bounds how long a connected dial waits for its accepted
	// end to take the message, or for its end.
	stormSettle = 10 * time.Second
)

// stormKinds are the kinds a failed dial may match, in the order they are
// counted: the first that matches names the failure.
var stormKinds = []struct {
	name string
	err  error
}{
	{"backlog full", rdmacm.ErrBacklogFull},
	{"rejected", rdmacm.ErrRejected},
	{"ended", rdmacm.ErrEnded},
	{"timed out", rdmacm.ErrTimeout},
	{"unreachable", rdmacm.ErrUnreachable},
	{"connect failed", rdmacm.ErrConnect},
	{"address resolution", rdmacm.ErrAddrResolution},
	{"route resolution", rdmacm.ErrRouteResolution},
	{"context", context.DeadlineExceeded},
	// siw: the process ran out of queue mappings (see TestStormSIW); only
	// with the hint that says so (checkClear).
	{"out of siw queues", syscall.EIO},
}

// stormOutcome is what a storm did.
type stormOutcome struct {
	dials, backlog int
	took           time.Duration // from the first dial to the last return
	slowest        time.Duration // the slowest single dial
	delivered      int           // connected, and the message reached an accepted end
	ended          int           // connected, then ended: the listener gave up on it
	failed         map[string]int
	failures       map[string]error // one of each kind, for the log
	acceptFailed   map[string]int
}

func (o stormOutcome) String() string {
	return fmt.Sprintf("%d dials at once, backlog %d: %d connected and delivered a message, %d connected and then ended "+
		"(the listener gave up), failed: %s; accepts failed: %s; all dials returned within %v (slowest %v)",
		o.dials, o.backlog, o.delivered, o.ended, counts(o.failed), counts(o.acceptFailed),
		o.took.Round(time.Millisecond), o.slowest.Round(time.Millisecond))
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var s []string
	for k, v := range m {
		s = append(s, fmt.Sprintf("%d %s", v, k))
	}
	sort.Strings(s)
	return strings.Join(s, ", ")
}

// kindOf names err's kind, "" if it matches none of stormKinds.
func kindOf(err error) string {
	for _, k := range stormKinds {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return ""
}

// checkClear asserts that err is a clear error: an *OpError that names
// addr, matches a kind of the package and does not read librdmacm's -1
// as EPERM. It returns the kind and the step.
func checkClear(t *testing.T, err error, addr string) string {
	t.Helper()
	var oe *rdmacm.OpError
	if !assert.ErrorAs(t, err, &oe, "%v", err) {
		return "untyped"
	}
	assert.Contains(t, err.Error(), addr, "the error names the listener")
	assert.NotContains(t, err.Error(), "not permitted")
	if errors.Is(err, syscall.EIO) {
		assert.Contains(t, err.Error(), "queue mappings", "the hint says why siw ran out")
		assert.ErrorIs(t, err, rdmacm.ErrNoResources, "a server loop can tell it from a dialer's failure")
	}
	k := kindOf(err)
	if k == "" {
		t.Errorf("an error of no known kind: %v", err)
		return "unknown"
	}
	return k + " (" + oe.Op + ")"
}

// stormServer is a typical server loop: take a request, accept it (with a
// receive posted), hand the connection to a goroutine, take the next. Each
// goroutine receives one message, tells the dialer's side (receipt) and
// closes.
type stormServer struct {
	t    *testing.T
	l    *rdmacm.Listener
	addr string

	mu           sync.Mutex
	receipts     map[string]chan struct{} // by the dialer's address
	acceptFailed map[string]int
	served       sync.WaitGroup
	done         chan struct{}
}

func serveStorm(t *testing.T, ctx context.Context, l *rdmacm.Listener, addr string) *stormServer {
	s := &stormServer{t: t, l: l, addr: addr, receipts: map[string]chan struct{}{}, acceptFailed: map[string]int{},
		done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			r, err := l.Request(ctx)
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("the listener stopped serving: %v", err)
				}
				return
			}
			var mr *verbs.MR
			c, err := r.AcceptWith(ctx, nil, func(s rdmacm.Setup) (err error) {
				if mr, err = s.RegisterMemory(64, access); err != nil {
					return err
				}
				return s.PostRecv(mr, 0, 64)
			})
			if err != nil {
				// A failure of this request: its dialer learns of it
				// too, and the listener goes on.
				k := checkClear(t, err, addr)
				s.mu.Lock()
				s.acceptFailed[k]++
				s.mu.Unlock()
				continue
			}
			s.served.Add(1)
			go func() {
				defer s.served.Done()
				defer func() { assert.NoError(t, c.Close()) }()
				rctx, cancel := context.WithTimeout(ctx, stormSettle)
				defer cancel()
				wc, err := c.Recv(rctx)
				if err != nil {
					// Its dialer gave up after the accept, and counts it.
					s.mu.Lock()
					s.acceptFailed["accepted, then "+checkClear(t, err, addr)]++
					s.mu.Unlock()
					return
				}
				if assert.Equal(t, stormMessage, string(mr.Bytes()[:wc.ByteLen])) {
					close(s.receipt(c.RemoteAddr().String()))
				}
			}()
		}
	}()
	return s
}

// receipt is closed when the message of the dialer at addr has arrived.
func (s *stormServer) receipt(addr string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.receipts[addr]
	if ch == nil {
		ch = make(chan struct{})
		s.receipts[addr] = ch
	}
	return ch
}

// use sends the message on a dialed connection and waits until its
// accepted end has it or the connection ends, then closes it. It returns
// the end, or an error if neither came.
func (s *stormServer) use(ctx context.Context, c *rdmacm.Conn) (ended, err error) {
	defer func() { err = errors.Join(err, c.Close()) }()
	mr, err := c.RegisterMemory(64, access)
	if err != nil {
		return nil, err
	}
	n := copy(mr.Bytes(), stormMessage)
	if err := c.Send(ctx, mr, 0, n); err != nil {
		if errors.Is(err, rdmacm.ErrEnded) {
			return err, nil
		}
		return nil, err
	}
	receipt := s.receipt(c.LocalAddr().String())
	select {
	case <-receipt:
		return nil, nil
	case <-c.Done():
		select {
		case <-receipt: // the server closed it after the message
			return nil, nil
		default:
			return c.Err(), nil
		}
	case <-time.After(stormSettle):
		return nil, fmt.Errorf("%v: connected and sent, but after %v no accepted end has the message and the connection has not ended",
			c.LocalAddr(), stormSettle)
	}
}

// storm dials n connections at once to one listener on d with the given
// backlog, and after the storm one more.
func storm(t *testing.T, d device, n, backlog int) stormOutcome {
	t.Helper()
	ctx := ctxFor(t, 3*time.Minute)
	l, addr := listen(t, d, &rdmacm.ListenConfig{Backlog: backlog})
	out := stormOutcome{dials: n, backlog: backlog, failed: map[string]int{}, failures: map[string]error{}}
	acceptCtx, stopAccepting := context.WithCancel(ctx)
	defer stopAccepting()
	srv := serveStorm(t, acceptCtx, l, addr)

	dl := &rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{ConnectTimeout: stormStep}, ResolveAddrTimeout: stormStep,
		ResolveRouteTimeout: stormStep}
	dialErrs := make([]error, n)
	useErrs := make([]error, n)
	ends := make([]error, n)
	took := make([]time.Duration, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dctx, cancel := context.WithTimeout(ctx, stormDialTimeout)
			defer cancel()
			t0 := time.Now()
			c, err := dl.Dial(dctx, addr)
			took[i] = time.Since(t0)
			if dialErrs[i] = err; err == nil {
				ends[i], useErrs[i] = srv.use(dctx, c)
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(stormDialTimeout + stormMargin + stormSettle + 10*time.Second):
		t.Fatalf("%d dials at once: some have not returned %v after they started, past their %v timeout",
			n, time.Since(start), stormDialTimeout)
	}

	for i, err := range dialErrs {
		out.slowest = max(out.slowest, took[i])
		assert.LessOrEqual(t, took[i], stormDialTimeout+stormMargin, "dial %d returned past its timeout: %v", i, err)
		switch {
		case err == nil && ends[i] != nil:
			// The listener gave up after the dialer's Dial returned: the
			// connection ends, saying so.
			assert.ErrorIs(t, ends[i], rdmacm.ErrEnded)
			checkClear(t, ends[i], addr)
			out.ended++
			out.failures["ended"] = ends[i]
		case err == nil:
			if assert.NoError(t, useErrs[i], "a connected dial carries a message") {
				out.delivered++
			}
		default:
			k := checkClear(t, err, addr)
			out.failed[k]++
			if out.failures[k] == nil {
				out.failures[k] = err
			}
		}
	}
	out.took = time.Since(start)

	// The listener keeps serving.
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	c, err := dl.Dial(fctx, addr)
	require.NoError(t, err, "a dial after the storm")
	ended, err := srv.use(fctx, c)
	require.NoError(t, err, "a dial after the storm carries a message")
	require.NoError(t, ended, "a dial after the storm carries a message")

	stopAccepting()
	<-srv.done
	srv.served.Wait()
	require.NoError(t, l.Close())
	out.acceptFailed = srv.acceptFailed
	for k, err := range out.failures {
		t.Logf("%s, for instance: %v", k, err)
	}
	t.Logf("storm on %s: %v", d.name, out)
	return out
}

// 1000 dials at once on RoCE against a backlog of 4.
// The mix of outcomes depends on how much CPU the guest gets. In four
// runs with the host less busy, most dials were refused as backlog full
// (626 to 992 of 1000) and 1 to 33 connected; in three runs with other
// guests busy on the host's 2 cores (load average 5 to 9), about 20
// requests reached the listener, after their dialers had given up, and
// every dial timed out (ErrTimeout, or its context). So the test asserts
// every dial's outcome (storm), not their mix; the siw storm below, small
// enough to be steady, asserts that the backlog overflows and refuses
// clearly.
func TestStormRXE(t *testing.T) {
	checkNoLeaks(t)
	storm(t, rxe(t), 1000, 4)
}

// siw, with both ends in this process: 18 dials at once, the most that
// can never run out. libsiw maps each queue (a CQ, a QP's send or receive
// queue: 4 pages a connection end) at an offset the kernel hands out per
// process and device context, and takes page 144 for invalid (see
// TestManyConcurrentDialsSIW): 144 pages, 36 ends, hold 18 connections even
// if every dial were accepted and alive at once. (With a backlog of 4 most
// are refused and release their queues at once, so 30 at once also passed,
// by timing; two processes, in siw-a and siw-b, would each have 144 pages,
// but the leak check and the counts are this process's.)
func TestStormSIW(t *testing.T) {
	checkNoLeaks(t)
	out := storm(t, siw(t), 18, 4)
	assert.NotZero(t, out.delivered, "some dials connect")
	assert.NotZero(t, out.failed["backlog full (connect)"], "the backlog overflowed")
	for k := range out.failed {
		assert.NotContains(t, k, "out of siw queues")
	}
}

// siw past its limit: 100 dials at once hold more queues than a process
// can map. The dials that run out must fail at once with an error that
// says why (and the accepts that run out reject their dialers); none may
// hang, and the listener serves the next dial once they are gone.
func TestStormSIWRunsOutClearly(t *testing.T) {
	checkNoLeaks(t)
	out := storm(t, siw(t), 100, 4)
	ranOut := 0
	for k, n := range out.failed {
		if strings.HasPrefix(k, "out of siw queues") {
			ranOut += n
		}
	}
	assert.NotZero(t, ranOut, "100 dials at once exceed what one process can map")
}
