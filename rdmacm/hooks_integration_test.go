//go:build integration

package rdmacm_test

import (
	"errors"
	"io"
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
// unmatched SEND would end the connection) as well. (The dialer's QP takes
// the RNR retry count of the listener's accept: both sides ask for none.)
func TestBeforeConnectPostsReceivesInTime(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		var serverMR *verbs.MR
		// A Route read before the connection is up (no GID yet) must not
		// stand in for the one read once it is.
		var early *rdmacm.Route
		serverConfig := &rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{RNRRetryCount: -1, BeforeConnect: func(s rdmacm.Setup) error {
			route := s.Route()
			early = &route
			if _, ok := s.(io.Closer); ok {
				return errors.New("BeforeConnect's Setup can be closed")
			}
			var err error
			if serverMR, err = s.RegisterMemory(4096, verbs.AccessLocalWrite); err != nil {
				return err
			}
			return s.PostRecv(serverMR, 0, 4096)
		}}}
		l, addr := listen(t, d, serverConfig)
		ctx := ctxFor(t, 20*time.Second)
		accepted := make(chan *rdmacm.Conn, 1)
		go func() {
			c, err := l.Accept(ctx)
			assert.NoError(t, err)
			accepted <- c
		}()
		noRNRRetries := &rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{RNRRetryCount: -1}}
		client, err := noRNRRetries.Dial(ctx, addr)
		require.NoError(t, err)
		defer client.Close()
		if !d.iwarp { // siw's query reports a connected QP as RESET; iWARP has no RNR
			a, err := client.QP().Query(verbs.AttrRNRRetry)
			require.NoError(t, err)
			require.Zero(t, a.RNRRetry, "the dialer sends without RNR retries")
		}
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

		// The Route seen early does not stand in for the one once connected.
		require.NotNil(t, early, "BeforeConnect did not run")
		assert.Equal(t, -1, early.GIDIndex)
		assert.Equal(t, d.name, early.Device, "the early route names the device")
		want := verbs.KindIWARP
		if !d.iwarp {
			want = verbs.KindRoCE
			assert.Equal(t, verbs.GIDTypeRoCEv2, server.Route().GIDType)
		}
		assert.Equal(t, want, server.Route().Kind)
	})
}

// An error from BeforeConnect aborts the dial and the accept, and what the
// hook registered is released (checkNoLeaks counts MRs).
func TestBeforeConnectErrorAborts(t *testing.T) {
	checkNoLeaks(t)
	d := rxe(t)
	refuse := errors.New("not today")
	register := func(s rdmacm.Setup) error {
		if _, err := s.RegisterMemory(4096, verbs.AccessLocalWrite); err != nil {
			return err
		}
		return refuse
	}
	l, addr := listen(t, d, &rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{BeforeConnect: register}})
	ctx := ctxFor(t, 20*time.Second)
	acceptErr := make(chan error, 1)
	go func() {
		_, err := l.Accept(ctx)
		acceptErr <- err
	}()
	_, err := rdmacm.Dial(ctx, addr)
	require.ErrorIs(t, err, rdmacm.ErrRejected)
	require.ErrorIs(t, <-acceptErr, refuse)

	_, err = (&rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{BeforeConnect: register}}).Dial(ctx, addr)
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
			l, addr := listen(t, rxe(t), &rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{Mode: mode}})
			ctx := ctxFor(t, 20*time.Second)
			go func() {
				if c, err := l.Accept(ctx); err == nil {
					<-c.Done()
					c.Close()
				}
			}()
			dl := &rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{Mode: mode, Trace: func(s rdmacm.Step, start time.Time, d time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				assert.False(t, start.IsZero())
				assert.GreaterOrEqual(t, d, time.Duration(0))
				steps = append(steps, s)
			}}}
			c, err := dl.Dial(ctx, addr)
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
