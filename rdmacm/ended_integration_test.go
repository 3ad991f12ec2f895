//go:build integration

package rdmacm_test

import (
	"context"
	"errors"
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

// promptly is how long a call on an ended connection may take: no wait at
// all, but the guest's CPUs are emulated and shared.
const promptly = time.Second

// blocked runs f on a goroutine and returns where its error will arrive,
// after checking that it is still waiting a moment later.
func blocked(t *testing.T, what string, f func() error) <-chan error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- f() }()
	select {
	case err := <-errc:
		t.Fatalf("%s returned before the connection ended: %v", what, err)
	case <-time.After(300 * time.Millisecond):
	}
	return errc
}

// released waits for a blocked call's error, which the end of its
// connection must bring within a few seconds (the CM's event included).
func released(t *testing.T, what string, errc <-chan error, reason error) {
	t.Helper()
	select {
	case err := <-errc:
		assertEnded(t, what, err, reason)
	case <-time.After(5 * time.Second):
		t.Errorf("%s still waits 5 s after its connection ended", what)
	}
}

// assertEnded checks an ended connection's error as users check it: the
// kind, the reason, and a message that says so once.
func assertEnded(t *testing.T, what string, err, reason error) {
	t.Helper()
	if !assert.Error(t, err, what) {
		return
	}
	assert.ErrorIs(t, err, rdmacm.ErrEnded, what)
	assert.ErrorIs(t, err, reason, what)
	assert.Contains(t, err.Error(), "connection ended", what)
	assert.Equal(t, 1, strings.Count(err.Error(), "rdmacm:"), "%s: the place is said once: %v", what, err)
}

// everyCallFails makes every call that uses c, which has ended, and checks
// that each fails at once with ErrEnded and the reason.
func everyCallFails(t *testing.T, c *rdmacm.Conn, mr *verbs.MR, reason error) {
	t.Helper()
	ctx := ctxFor(t, 20*time.Second)
	remote := rdmacm.RemoteBufferOf(mr, 0, 64)
	calls := []struct {
		name string
		f    func() error
	}{
		{"PostRecv", func() error { return c.PostRecv(mr, 0, 64) }},
		{"Recv", func() error { _, err := c.Recv(ctx); return err }},
		{"Send", func() error { return c.Send(ctx, mr, 0, 64) }},
		{"RDMAWrite", func() error { return c.RDMAWrite(ctx, mr, 0, 64, remote) }},
		{"RDMARead", func() error { return c.RDMARead(ctx, mr, 64, 64, remote) }},
		{"RegisterMemory", func() error { _, err := c.RegisterMemory(4096, access); return err }},
	}
	for _, call := range calls {
		start := time.Now()
		err := call.f()
		assert.Less(t, time.Since(start), promptly, "%s on an ended connection waited", call.name)
		assertEnded(t, call.name, err, reason)
	}
	// Nothing left to end: Disconnect succeeds at once.
	start := time.Now()
	assert.NoError(t, c.Disconnect(ctx))
	assert.Less(t, time.Since(start), promptly, "Disconnect on an ended connection waited")
}

// The peer ends the connection: calls blocked on this side return, and
// every later call fails at once, saying the connection ended and why. The
// side that ended it sees the same; after Close, calls still fail that way
// (and touch none of the released objects).
func TestEndedConnectionFailsEveryCallAtOnce(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		client, server := pair(t, d, rdmacm.ConnConfig{})
		cmr, err := client.RegisterMemory(4096, access)
		require.NoError(t, err)
		smr, err := server.RegisterMemory(4096, access)
		require.NoError(t, err)

		// Nothing is posted, so only the end can wake these: one wait
		// without a deadline, one with.
		serverRecv := blocked(t, "the server's Recv", func() error {
			_, err := server.Recv(context.Background())
			return err
		})
		clientRecv := blocked(t, "the client's Recv", func() error {
			_, err := client.Recv(ctxFor(t, 30*time.Second))
			return err
		})

		require.NoError(t, client.Disconnect(ctxFor(t, 10*time.Second)))
		released(t, "the client's Recv (it disconnected)", clientRecv, rdmacm.ErrDisconnected)
		released(t, "the server's Recv (its peer disconnected)", serverRecv, rdmacm.ErrDisconnected)
		select {
		case <-server.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the server never learned that its peer disconnected")
		}
		assertEnded(t, "the server's Err", server.Err(), rdmacm.ErrDisconnected)
		assert.Contains(t, server.Err().Error(), "the peer disconnected")
		assertEnded(t, "the client's Err", client.Err(), rdmacm.ErrDisconnected)
		assert.Contains(t, client.Err().Error(), "this side disconnected")
		t.Log(server.Err())

		everyCallFails(t, server, smr, rdmacm.ErrDisconnected)
		everyCallFails(t, client, cmr, rdmacm.ErrDisconnected)

		require.NoError(t, server.Close())
		everyCallFails(t, server, smr, rdmacm.ErrDisconnected)
	})
}

// Close from another goroutine releases a call waiting on the connection
// before it destroys the CQ the call waits on.
func TestEndedByCloseReleasesWaitingCalls(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		_, server := pair(t, d, rdmacm.ConnConfig{})
		recv := blocked(t, "Recv", func() error {
			_, err := server.Recv(ctxFor(t, 30*time.Second))
			return err
		})
		require.NoError(t, server.Close())
		released(t, "Recv during Close", recv, rdmacm.ErrDisconnected)
	})
}

// A Send waiting for a receive the peer never posts (RoCE retries RNR
// forever by default) returns when the peer goes.
func TestEndedPeerReleasesAWaitingSend(t *testing.T) {
	checkNoLeaks(t)
	client, server := pair(t, rxe(t), rdmacm.ConnConfig{})
	mr, err := client.RegisterMemory(4096, access)
	require.NoError(t, err)
	send := blocked(t, "Send", func() error { return client.Send(context.Background(), mr, 0, 64) })
	require.NoError(t, server.Close())
	released(t, "Send", send, rdmacm.ErrDisconnected)
}

// What a connection storm found on RoCE: a listener's accept can time out
// waiting for the dialer's RTU after the dialer's Dial has returned. The
// listener's CM then rejects (or disconnects) the connection, and the
// dialer's connection must end, saying so, not look up with a dead QP
// (librdmacm moves it to the error state on the reject). A listener whose
// accepts time out at once gives up on most requests that way.
func TestDialerLearnsThatTheListenerGaveUp(t *testing.T) {
	checkNoLeaks(t)
	d := rxe(t)
	ctx := ctxFor(t, 60*time.Second)
	l, addr := listen(t, d, &rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{ConnectTimeout: time.Microsecond}})
	gaveUp := 0
	for range 8 {
		accepted := make(chan error, 1)
		go func() {
			c, err := l.Accept(ctx)
			if c != nil {
				c.Close()
			}
			accepted <- err
		}()
		c, err := rdmacm.Dial(ctx, addr)
		aerr := <-accepted
		if err != nil {
			// The listener's reject arrived before the RTU went out.
			var oe *rdmacm.OpError
			require.ErrorAs(t, err, &oe)
			assert.True(t, errors.Is(err, rdmacm.ErrRejected) || errors.Is(err, rdmacm.ErrConnect), "%v", err)
			assert.NotContains(t, err.Error(), "not permitted", "librdmacm's -1 is no errno")
			continue
		}
		if aerr == nil {
			require.NoError(t, c.Close())
			continue
		}
		require.ErrorIs(t, aerr, rdmacm.ErrTimeout)
		gaveUp++
		select {
		case <-c.Done():
			assert.ErrorIs(t, c.Err(), rdmacm.ErrEnded)
			assert.ErrorIs(t, c.Err(), rdmacm.ErrDisconnected)
			t.Log(c.Err())
		case <-time.After(5 * time.Second):
			t.Errorf("the listener gave up on %v (%v), but 5 s later the dialer's connection still looks up", c.LocalAddr(), aerr)
		}
		require.NoError(t, c.Close())
	}
	require.NotZero(t, gaveUp, "no accept timed out after its dial returned")
}

// Both ends closing at once, many times over, this side in half the rounds
// woken by the flush of its receive and giving up its own disconnect at
// once: the dispatcher then answers the peer's disconnect (rdma_disconnect
// moves the QP) while this side's Close destroys the QP. Neither may
// crash, fail or leak. (The race inside, which crashed a soak under
// rdmacm/msg, is pinned down by TestIDDisconnectMeetsQPClose.)
func TestClosingWhileThePeerCloses(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		l, addr := listen(t, d, nil)
		gaveUp, cancel := context.WithCancel(context.Background())
		cancel()
		for i := range 100 {
			client, server := connect(t, l.Accept, func(ctx context.Context) (*rdmacm.Conn, error) {
				return (&rdmacm.Dialer{}).Dial(ctx, addr)
			})
			mr, err := client.RegisterMemory(4096, access)
			require.NoError(t, err)
			require.NoError(t, client.PostRecv(mr, 0, 64))
			recv := make(chan error, 1)
			go func() {
				_, err := client.Recv(ctxFor(t, 30*time.Second))
				recv <- err
			}()
			serverErr := make(chan error, 1)
			go func() { serverErr <- server.Close() }()
			var recvErr error
			if i%2 == 0 {
				recvErr = <-recv // the peer's disconnect flushed it
				client.Disconnect(gaveUp)
			}
			require.NoError(t, client.Close(), "round %d: the client's Close", i)
			require.NoError(t, <-serverErr, "round %d: the server's Close", i)
			if i%2 == 1 {
				recvErr = <-recv
			}
			require.Error(t, recvErr, "round %d: the client's Recv", i)
		}
	})
}

// Close on one goroutine while others post through the helpers: each call
// fails with the connection's end, none crashes (the helpers built their
// SGE with MR.SGE, which panics on the region Close unmapped meanwhile).
func TestHelpersAgainstClose(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		for range 5 {
			client, server := pair(t, d, rdmacm.ConnConfig{})
			ctx := ctxFor(t, 20*time.Second)
			mr, err := client.RegisterMemory(4096, access)
			require.NoError(t, err)
			smr, err := server.RegisterMemory(4096, access)
			require.NoError(t, err)
			remote := rdmacm.RemoteBufferOf(smr, 0, 4096)
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			for i := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						var err error
						if i == 0 {
							err = client.PostRecv(mr, 0, 64)
						} else {
							err = client.RDMAWrite(ctx, mr, 64, 64, remote)
						}
						if errors.Is(err, syscall.ENOMEM) {
							continue // the receive queue is full until the end flushes it
						}
						if err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			time.Sleep(5 * time.Millisecond)
			require.NoError(t, client.Close())
			wg.Wait()
			close(errs)
			for err := range errs {
				assert.ErrorIs(t, err, rdmacm.ErrEnded)
			}
			require.NoError(t, server.Close())
		}
	})
}

// A disconnect reaches the peer whatever state the QP is in. librdmacm's
// rdma_disconnect first moves the QP (to ERR on RoCE, SQD on iWARP) and
// gives up, the CM's disconnect unsent, when that move is refused: a QP in
// RESET cannot go to ERR. The peer then learned of the end only at this
// side's Close (or by its own timeouts).
func TestDisconnectReachesThePeerFromAResetQP(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		client, server := pair(t, d, rdmacm.ConnConfig{})
		require.NoError(t, client.QP().Modify(&verbs.QPAttr{State: verbs.QPStateReset}, verbs.AttrState))
		require.NoError(t, client.Disconnect(ctxFor(t, 10*time.Second)), "the disconnect is sent without the QP's move")
		select {
		case <-server.Done():
			assert.ErrorIs(t, server.Err(), rdmacm.ErrDisconnected)
		case <-time.After(10 * time.Second):
			t.Fatal("the peer has not learned of the disconnect 10 s later")
		}
		require.NoError(t, client.Close())
		require.NoError(t, server.Close())
	})
}
