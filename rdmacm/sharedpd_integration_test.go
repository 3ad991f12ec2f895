//go:build integration

package rdmacm_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/oob"
	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// ownPD allocates a PD on librdmacm's context for the device, closed when
// the test ends (after its connections, which close in earlier cleanups).
func ownPD(t *testing.T, device string) *verbs.PD {
	t.Helper()
	dev, err := rdmacm.OpenDevice(device)
	require.NoError(t, err)
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pd.Close(), "the PD outlives its connections") })
	return pd
}

// One PD serves several connections, on both sides: memory registered once
// in it carries a message on each, and closing one connection leaves the PD
// to the others.
func TestSharedPD(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		pd := ownPD(t, d.name)
		cfg := rdmacm.ConnConfig{PD: pd}
		c1, s1 := pair(t, d, cfg)
		c2, s2 := pair(t, d, cfg)
		for _, c := range []*rdmacm.Conn{c1, s1, c2, s2} {
			assert.Same(t, pd, c.PD())
		}

		ctx := ctxFor(t, 20*time.Second)
		mr, err := pd.RegisterMemory(4096, access)
		require.NoError(t, err)
		defer func() { assert.NoError(t, mr.Close()) }()
		msg := "one region, every connection"
		copy(mr.Bytes(), msg)
		roundTrip := func(client, server *rdmacm.Conn, at int) {
			t.Helper()
			require.NoError(t, server.PostRecv(mr, at, 64))
			require.NoError(t, client.Send(ctx, mr, 0, len(msg)))
			wc, err := server.Recv(ctx)
			require.NoError(t, err)
			assert.Equal(t, msg, string(mr.Bytes()[at:at+int(wc.ByteLen)]))
		}
		roundTrip(c1, s1, 1024)
		roundTrip(c2, s2, 2048)

		require.NoError(t, c1.Close())
		roundTrip(c2, s2, 3072)
	})
}

// A PD or CQ that cannot serve the connection's QP is refused before any
// QP exists, on either side, naming the ConnConfig field and what to do.
func TestLentObjectsRefused(t *testing.T) {
	r, s := rxe(t), siw(t)
	checkNoLeaks(t)
	ctx := ctxFor(t, 20*time.Second)

	vdev, err := verbs.Open(r.name)
	require.NoError(t, err)
	t.Cleanup(func() { vdev.Close() })
	otherPD, err := vdev.AllocPD()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, otherPD.Close()) })
	otherCQ, err := vdev.CreateCQ(4)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, otherCQ.Close()) })
	rdev, err := rdmacm.OpenDevice(r.name)
	require.NoError(t, err)
	closedPD, err := rdev.AllocPD()
	require.NoError(t, err)
	require.NoError(t, closedPD.Close())
	closedCQ, err := rdev.CreateCQ(4)
	require.NoError(t, err)
	require.NoError(t, closedCQ.Close())

	for _, tc := range []struct {
		name       string
		cfg        rdmacm.ConnConfig
		field      string
		want, hint string
	}{
		{"PD of verbs.Open", rdmacm.ConnConfig{PD: otherPD}, "PD",
			"allocated on a context of rxe0 other than librdmacm's", `allocate the PD on rdmacm.OpenDevice("rxe0")`},
		{"PD of another device", rdmacm.ConnConfig{PD: ownPD(t, s.name)}, "PD",
			"belongs to siw0, but the connection goes through rxe0", `rdmacm.OpenDevice("rxe0")`},
		{"closed PD", rdmacm.ConnConfig{PD: closedPD}, "PD", "ConnConfig.PD is closed", "after the last connection and MR"},
		{"CQ of verbs.Open", rdmacm.ConnConfig{SendCQ: otherCQ}, "SendCQ",
			"created on a context of rxe0 other than librdmacm's", `create the CQ on rdmacm.OpenDevice("rxe0")`},
		{"CQ of another device", rdmacm.ConnConfig{RecvCQ: ownCQ(t, s.name, 4)}, "RecvCQ",
			"belongs to siw0, but the connection goes through rxe0", `rdmacm.OpenDevice("rxe0")`},
		{"closed CQ", rdmacm.ConnConfig{RecvCQ: closedCQ}, "RecvCQ", "ConnConfig.RecvCQ is closed", "after the last connection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check := func(err error) {
				t.Helper()
				var oe *rdmacm.OpError
				require.ErrorAs(t, err, &oe)
				assert.Equal(t, "use ConnConfig."+tc.field, oe.Op)
				assert.Equal(t, "rxe0", oe.Device)
				assert.Contains(t, oe.Error(), tc.want)
				assert.Contains(t, oe.Hint, tc.hint)
			}
			_, err := (&rdmacm.Dialer{ConnConfig: tc.cfg}).Dial(ctx, r.at(port()))
			check(err)

			// The listener refuses the request, and the dialer hears so.
			l, addr := listen(t, r, &rdmacm.ListenConfig{ConnConfig: tc.cfg})
			accepted := make(chan error, 1)
			go func() {
				_, err := l.Accept(ctx)
				accepted <- err
			}()
			_, err = rdmacm.Dial(ctx, addr)
			assert.ErrorIs(t, err, rdmacm.ErrRejected)
			check(<-accepted)
		})
	}

	_, err = rdmacm.OpenDevice("nosuch0")
	require.ErrorIs(t, err, syscall.ENODEV)
	assert.Contains(t, err.Error(), "rxe0", "the error lists the devices there are")
}

// oob.Connect creates the QP itself, so a PD on any context of the device
// will do.
func TestOOBConnectWithSharedPD(t *testing.T) {
	checkNoLeaks(t)
	d := rxe(t)
	dev, err := verbs.Open(d.name)
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pd.Close(), "the PD outlives its connections") })

	client, server := overTCP(t, d, &oob.Config{PD: pd})
	assert.Same(t, pd, client.PD())
	assert.Same(t, pd, server.PD())
	exchange(t, client.Conn, server.Conn)
	require.NoError(t, client.Close())
	require.NoError(t, server.Close())

	// On another device it is refused, naming both.
	other := ownPD(t, siw(t).name)
	a, b := tcpPair(t, d)
	defer a.Close() // a failed oob.Connect leaves the socket to its caller
	defer b.Close()
	_, err = oob.Connect(ctxFor(t, 20*time.Second), a, &oob.Config{PD: other})
	var oe *rdmacm.OpError
	require.ErrorAs(t, err, &oe)
	assert.Contains(t, oe.Error(), "Config.PD belongs to siw0, but the path goes through rxe0")
}
