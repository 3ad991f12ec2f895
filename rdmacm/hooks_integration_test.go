//go:build integration

package rdmacm_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// A receive posted in BeforeConnect is there before the peer can send: the
// dialer sends at once, with no RNR retries at all, and on iWARP (where an
// unmatched SEND would end the connection) as well.
func TestBeforeConnectPostsReceivesInTime(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		zero := uint8(0)
		var serverMR *verbs.MR
		var early rdmacm.Path
		serverOpts := &rdmacm.Options{BeforeConnect: func(c *rdmacm.Conn) error {
			early = c.Path() // before the connection is up: no GID yet
			var err error
			if serverMR, err = c.RegisterMemory(4096, verbs.AccessLocalWrite); err != nil {
				return err
			}
			return c.PostRecv(serverMR, 0, 4096)
		}}
		l, addr := listen(t, d, serverOpts)
		ctx := ctxFor(t, 20*time.Second)
		accepted := make(chan *rdmacm.Conn, 1)
		go func() {
			c, err := l.Accept(ctx)
			assert.NoError(t, err)
			accepted <- c
		}()
		client, err := rdmacm.Dial(ctx, addr, &rdmacm.Options{RNRRetryCount: &zero})
		require.NoError(t, err)
		defer client.Close()
		mr, err := client.RegisterMemory(64, verbs.AccessLocalWrite)
		require.NoError(t, err)
		copy(mr.Bytes(), "first")
		require.NoError(t, client.Send(ctx, mr, 0, 5))
		server := <-accepted
		require.NotNil(t, server)
		defer server.Close()
		wc, err := server.Recv(ctx)
		require.NoError(t, err)
		assert.Equal(t, "first", string(serverMR.Bytes()[:wc.ByteLen]))

		// The Path seen early does not stand in for the one once connected.
		assert.Equal(t, -1, early.GIDIndex)
		want := verbs.KindIWARP
		if !d.iwarp {
			want = verbs.KindRoCE
			assert.Equal(t, verbs.GIDTypeRoCEv2, server.Path().GIDType)
		}
		assert.Equal(t, want, server.Path().Kind)
	})
}

// An error from BeforeConnect aborts the dial and the accept, and what the
// hook registered is released (checkNoLeaks counts MRs).
func TestBeforeConnectErrorAborts(t *testing.T) {
	checkNoLeaks(t)
	d := rxe(t)
	refuse := errors.New("not today")
	l, addr := listen(t, d, &rdmacm.Options{BeforeConnect: func(c *rdmacm.Conn) error {
		if _, err := c.RegisterMemory(4096, verbs.AccessLocalWrite); err != nil {
			return err
		}
		return refuse
	}})
	ctx := ctxFor(t, 20*time.Second)
	acceptErr := make(chan error, 1)
	go func() {
		_, err := l.Accept(ctx)
		acceptErr <- err
	}()
	_, err := rdmacm.Dial(ctx, addr, nil)
	require.ErrorIs(t, err, rdmacm.ErrRejected)
	require.ErrorIs(t, <-acceptErr, refuse)

	_, err = rdmacm.Dial(ctx, addr, &rdmacm.Options{BeforeConnect: func(c *rdmacm.Conn) error {
		if _, err := c.RegisterMemory(4096, verbs.AccessLocalWrite); err != nil {
			return err
		}
		return refuse
	}})
	require.ErrorIs(t, err, refuse)
	assert.Contains(t, err.Error(), "set up before connecting")
}

// Trace reports each step once, in order, with the QP transitions only
// where the QP is ours to move.
func TestTraceReportsEachStep(t *testing.T) {
	for _, mode := range []rdmacm.Mode{rdmacm.ModeCM, rdmacm.ModeManual} {
		t.Run(mode.String(), func(t *testing.T) {
			checkNoLeaks(t)
			var mu sync.Mutex
			var steps []rdmacm.Step
			l, addr := listen(t, rxe(t), &rdmacm.Options{Mode: mode})
			ctx := ctxFor(t, 20*time.Second)
			go func() {
				if c, err := l.Accept(ctx); err == nil {
					<-c.Done()
					c.Close()
				}
			}()
			c, err := rdmacm.Dial(ctx, addr, &rdmacm.Options{Mode: mode, Trace: func(s rdmacm.Step, start time.Time, d time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				assert.False(t, start.IsZero())
				assert.GreaterOrEqual(t, d, time.Duration(0))
				steps = append(steps, s)
			}})
			require.NoError(t, err)
			require.NoError(t, c.Close())
			want := []rdmacm.Step{rdmacm.StepCreateID, rdmacm.StepResolveAddr, rdmacm.StepResolveRoute, rdmacm.StepCreateQP,
				rdmacm.StepConnect, rdmacm.StepDisconnect, rdmacm.StepDestroyQP, rdmacm.StepDestroyID}
			if mode == rdmacm.ModeManual {
				want = []rdmacm.Step{rdmacm.StepCreateID, rdmacm.StepResolveAddr, rdmacm.StepResolveRoute, rdmacm.StepCreateQP,
					rdmacm.StepInitQP, rdmacm.StepConnect, rdmacm.StepInitQP, rdmacm.StepRTRQP, rdmacm.StepRTSQP, rdmacm.StepEstablish,
					rdmacm.StepDisconnect, rdmacm.StepDestroyQP, rdmacm.StepDestroyID}
			}
			mu.Lock()
			defer mu.Unlock()
			assert.Equal(t, want, steps)
		})
	}
}
