//go:build integration

package rdmacm_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
)

func threads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no Threads line in /proc/self/status")
	return 0
}

// manyConnections dials n connections at once to one listener, accepts
// them all, checks each with a message, and closes them. It returns how
// many dials failed, every failure of either side, and the peak OS thread count.
func manyConnections(t *testing.T, d device, n int) (failed int, failures []error, peakThreads int) {
	ctx := ctxFor(t, 120*time.Second)
	cfg := rdmacm.ConnConfig{ConnectTimeout: 30 * time.Second, Cap: verbsCap(4)}
	dl := &rdmacm.Dialer{ConnConfig: cfg, ResolveAddrTimeout: 10 * time.Second, ResolveRouteTimeout: 10 * time.Second}
	l, addr := listen(t, d, &rdmacm.ListenConfig{ConnConfig: cfg, Backlog: n})

	var mu sync.Mutex
	var servers []*rdmacm.Conn
	acceptDone := make(chan struct{})
	acceptCtx, stopAccepting := context.WithCancel(ctx)
	defer stopAccepting()
	go func() {
		defer close(acceptDone)
		for {
			c, err := l.Accept(acceptCtx)
			if err != nil {
				if acceptCtx.Err() != nil {
					return
				}
				mu.Lock()
				failures = append(failures, err) // its dialer is refused too
				mu.Unlock()
				continue
			}
			mu.Lock()
			servers = append(servers, c)
			mu.Unlock()
		}
	}()

	clients := make([]*rdmacm.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	stopSampling := make(chan struct{})
	sampled := make(chan int)
	go func() {
		peak := 0
		for {
			peak = max(peak, threads(t))
			select {
			case <-stopSampling:
				sampled <- peak
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			clients[i], errs[i] = dl.Dial(ctx, addr)
		}()
	}
	wg.Wait()
	close(stopSampling)
	peakThreads = <-sampled

	ok := 0
	for _, err := range errs {
		if err != nil {
			failed++
			mu.Lock()
			failures = append(failures, err)
			mu.Unlock()
			continue
		}
		ok++
	}
	// Wait until every successful dial has its accepted end.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		got := len(servers)
		mu.Unlock()
		if got >= ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopAccepting()
	<-acceptDone
	assert.Len(t, servers, ok, "every established dial was accepted")
	// Each accepted end is the far end of exactly one dialed connection.
	ends := map[string]bool{}
	for _, c := range clients {
		if c != nil {
			ends[c.LocalAddr().String()+" "+c.RemoteAddr().String()] = true
		}
	}
	for _, s := range servers {
		key := s.RemoteAddr().String() + " " + s.LocalAddr().String()
		assert.True(t, ends[key], "accepted %s has a dialer", key)
		delete(ends, key)
	}

	var cw sync.WaitGroup
	for _, c := range append(clients, servers...) {
		if c == nil {
			continue
		}
		cw.Add(1)
		go func() {
			defer cw.Done()
			assert.NoError(t, c.Close())
		}()
	}
	cw.Wait()
	return failed, failures, peakThreads
}

func TestManyConcurrentDialsRXE(t *testing.T) {
	checkNoLeaks(t)
	before := threads(t)
	failed, errs, peak := manyConnections(t, rxe(t), 200)
	assert.Zero(t, failed, "failures: %v", errs)
	t.Logf("200 connections: OS threads %d before, %d at peak", before, peak)
	assert.Less(t, peak, before+64, "connections must not each hold an OS thread")
}

// siw: C ucmatose gives up beyond 36 connection ends per process, and so
// would we. The limit is not a resource: each siw queue (a CQ, a QP's send
// and receive queue) is mmap'd at an offset the kernel hands out page by
// page per device context, and rdma-core 44's libsiw takes offset 0x90000
// (page 144, SIW_INVAL_UOBJ_KEY) for "invalid" and fails the creation with
// EIO. The freed slot is handed out again, so every later creation fails
// too. Nothing in the test bed can raise that; at 4 pages per connection end
// (two CQs, two queues) a process holds about 35 ends. So: 16 concurrent
// connections (32 ends in this process) must all work, and the next ones
// must fail with the explanation, leaving nothing behind.
func TestManyConcurrentDialsSIW(t *testing.T) {
	checkNoLeaks(t)
	failed, errs, _ := manyConnections(t, siw(t), 16)
	assert.Zero(t, failed, "failures: %v", errs)

	failed, errs, _ = manyConnections(t, siw(t), 24)
	require.NotZero(t, failed, "48 ends exceed the per-process limit of libsiw")
	t.Logf("%d of 24 dials failed", failed)
	explained := 0
	for _, err := range errs {
		// The side that ran out says why; its peer sees a reject.
		if errors.Is(err, syscall.EIO) {
			assert.Contains(t, err.Error(), "SIW_INVAL_UOBJ_KEY")
			explained++
		} else {
			assert.ErrorIs(t, err, rdmacm.ErrRejected)
		}
	}
	assert.NotZero(t, explained, "%v", errs)
	t.Log(errs[0])
}
