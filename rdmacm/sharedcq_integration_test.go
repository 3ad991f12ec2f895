//go:build integration

package rdmacm_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/oob"
	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// ownCQ creates a CQ on librdmacm's context for the device, closed when the
// test ends: after its connections, which close in later-registered cleanups.
func ownCQ(t *testing.T, device string, entries int) *verbs.CQ {
	t.Helper()
	dev, err := rdmacm.OpenDevice(device)
	require.NoError(t, err)
	cq, err := dev.CreateCQ(entries)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cq.Close(), "the CQ outlives its connections, which leave it open") })
	return cq
}

// pollN polls cq until n completions have arrived, or fails the test.
func pollN(t *testing.T, ctx context.Context, cq *verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	var got []verbs.WorkCompletion
	wcs := make([]verbs.WorkCompletion, 8)
	for len(got) < n {
		k, err := cq.PollWait(ctx, wcs)
		require.NoError(t, err, "%d of %d completions", len(got), n)
		got = append(got, wcs[:k]...)
	}
	return got
}

// One CQ serves every QP of two connections, both ends of each: each
// completion lands there naming its QP, closing a connection leaves the CQ
// to the others, and the helpers that would take another connection's
// completions refuse, saying what to do instead.
func TestSharedCQ(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		cq := ownCQ(t, d.name, 64)
		pd := ownPD(t, d.name)
		cfg := rdmacm.ConnConfig{PD: pd, SendCQ: cq, RecvCQ: cq}
		c1, s1 := pair(t, d, cfg)
		c2, s2 := pair(t, d, cfg)
		for _, c := range []*rdmacm.Conn{c1, s1, c2, s2} {
			assert.Same(t, cq, c.SendCQ())
			assert.Same(t, cq, c.RecvCQ())
		}

		ctx := ctxFor(t, 20*time.Second)
		mr, err := pd.RegisterMemory(4096, access)
		require.NoError(t, err)
		defer func() { assert.NoError(t, mr.Close()) }()

		// Each client sends a message of its own length; the four
		// completions are told apart by QP number alone.
		exchangeOn := func(pairs ...[2]*rdmacm.Conn) {
			t.Helper()
			want := map[uint32]verbs.WorkCompletion{}
			for i, p := range pairs {
				client, server := p[0], p[1]
				n := 16 * (i + 1)
				require.NoError(t, server.QP().PostRecv(verbs.RecvWR{ID: uint64(100 + i), SGEs: []verbs.SGE{mr.SGE(1024*(i+1), 64)}}))
				require.NoError(t, client.QP().PostSend(verbs.SendWR{ID: uint64(200 + i), Opcode: verbs.OpSend,
					Flags: verbs.SendSignaled, SGEs: []verbs.SGE{mr.SGE(0, n)}}))
				want[server.QP().QPN] = verbs.WorkCompletion{ID: uint64(100 + i), Opcode: verbs.WCRecv, ByteLen: uint32(n)}
				want[client.QP().QPN] = verbs.WorkCompletion{ID: uint64(200 + i), Opcode: verbs.WCSend}
			}
			for _, wc := range pollN(t, ctx, cq, 2*len(pairs)) {
				require.Equal(t, verbs.WCSuccess, wc.Status, "QP %#x", wc.QPN)
				w, ok := want[wc.QPN]
				require.True(t, ok, "a completion of QP %#x, which is none of these connections'", wc.QPN)
				delete(want, wc.QPN)
				assert.Equal(t, w.ID, wc.ID, "QP %#x", wc.QPN)
				assert.Equal(t, w.Opcode, wc.Opcode, "QP %#x", wc.QPN)
				if w.Opcode == verbs.WCRecv {
					assert.Equal(t, w.ByteLen, wc.ByteLen, "QP %#x", wc.QPN)
				}
			}
			assert.Empty(t, want, "QPs without their completion")
		}
		exchangeOn([2]*rdmacm.Conn{c1, s1}, [2]*rdmacm.Conn{c2, s2})

		// The helpers refuse, before posting anything.
		for _, err := range []error{c1.Send(ctx, mr, 0, 8), c1.RDMAWrite(ctx, mr, 0, 8, rdmacm.RemoteBufferOf(mr, 0, 8))} {
			require.ErrorIs(t, err, rdmacm.ErrSharedCQ)
			var oe *rdmacm.OpError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, c1.QP().QPN, oe.QPN)
			assert.Contains(t, oe.Error(), "ConnConfig.SendCQ")
			assert.Contains(t, oe.Hint, "WorkCompletion.QPN")
		}
		_, err = s1.Recv(ctx)
		require.ErrorIs(t, err, rdmacm.ErrSharedCQ)
		assert.Contains(t, err.Error(), "ConnConfig.RecvCQ")

		// Closing one connection, both ends, leaves the CQ to the other.
		require.NoError(t, c1.Close())
		require.NoError(t, s1.Close())
		exchangeOn([2]*rdmacm.Conn{c2, s2})
	})
}

// oob.Connect creates the QP itself on the PD's context, so shared CQs
// need Config.PD, made on the same context.
func TestOOBConnectWithSharedCQ(t *testing.T) {
	checkNoLeaks(t)
	d := rxe(t)
	dev, err := verbs.Open(d.name)
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	cq, err := dev.CreateCQ(16)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cq.Close(), "the CQ outlives its connections") })

	refused := func(cfg *oob.Config, want string) {
		t.Helper()
		a, b := tcpPair(t, d)
		defer a.Close() // a failed oob.Connect leaves the socket to its caller
		defer b.Close()
		_, err := oob.Connect(ctxFor(t, 20*time.Second), a, cfg)
		var oe *rdmacm.OpError
		require.ErrorAs(t, err, &oe)
		assert.Contains(t, oe.Error(), want)
		assert.NotEmpty(t, oe.Hint)
	}
	refused(&oob.Config{SendCQ: cq}, "shared CQs need Config.PD")
	refused(&oob.Config{RecvCQ: cq, PD: ownPD(t, d.name)}, "the CQ in Config.RecvCQ and the PD in Config.PD were made on different contexts of rxe0")

	pd, err := dev.AllocPD()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pd.Close()) })
	client, server := overTCP(t, d, &oob.Config{PD: pd, RecvCQ: cq})
	assert.Same(t, cq, client.RecvCQ())
	assert.Same(t, cq, server.RecvCQ())
	assert.NotSame(t, cq, client.SendCQ(), "the send CQ is the connection's own")

	ctx := ctxFor(t, 20*time.Second)
	mr, err := pd.RegisterMemory(4096, access)
	require.NoError(t, err)
	defer func() { assert.NoError(t, mr.Close()) }()
	require.NoError(t, server.PostRecv(mr, 1024, 64))
	require.NoError(t, client.Send(ctx, mr, 0, 40), "the send CQ is not shared: Send works")
	wc := pollN(t, ctx, cq, 1)[0]
	assert.Equal(t, server.QP().QPN, wc.QPN)
	assert.Equal(t, uint32(40), wc.ByteLen)
	require.NoError(t, client.Close())
	require.NoError(t, server.Close())
}
