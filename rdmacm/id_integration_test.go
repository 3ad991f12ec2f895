//go:build integration

package rdmacm_test

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// event waits for id's next event and requires it to be want.
func event(t *testing.T, ctx context.Context, id *rdmacm.ID, want rdmacm.EventType) *rdmacm.Event {
	t.Helper()
	ev, err := id.Event(ctx)
	require.NoError(t, err)
	require.Equal(t, want, ev.Type, "status %d", ev.Status)
	return ev
}

// resolved makes an id whose address and route towards dst are resolved;
// the test closes it.
func resolved(t *testing.T, ctx context.Context, dst netip.AddrPort) *rdmacm.ID {
	t.Helper()
	id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, id.Close()) })
	require.NoError(t, id.ResolveAddr(netip.Addr{}, dst, 2*time.Second))
	event(t, ctx, id, rdmacm.EventAddrResolved)
	require.NoError(t, id.ResolveRoute(2*time.Second))
	event(t, ctx, id, rdmacm.EventRouteResolved)
	return id
}

// idQP makes a CM-moved QP for id on its device, with a PD and a CQ that
// the test releases after it.
func idQP(t *testing.T, id *rdmacm.ID) (*verbs.QP, *verbs.CQ, *verbs.PD) {
	t.Helper()
	return idQPOf(t, id, verbs.QPTypeRC)
}

// idQPOf is idQP with a QP of type qt; the QP, CQ and PD must close
// without error after the test (a CQ still used by a QP would not).
func idQPOf(t *testing.T, id *rdmacm.ID, qt verbs.QPType) (*verbs.QP, *verbs.CQ, *verbs.PD) {
	t.Helper()
	dev, err := id.Device()
	require.NoError(t, err)
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	cq, err := dev.CreateCQ(8)
	require.NoError(t, err)
	qp, err := id.CreateQP(pd, verbs.QPInit{Type: qt, SendCQ: cq, RecvCQ: cq, Cap: verbsCap(4)})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, qp.Close())
		assert.NoError(t, cq.Close())
		assert.NoError(t, pd.Close())
	})
	return qp, cq, pd
}

// A connection made by hand on the thin layer, both sides, carries data
// with private data passed through untouched, and ends with DISCONNECTED
// on both sides.
func TestIDConnectsStepByStep(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 20*time.Second)
		dst := netip.MustParseAddrPort(d.at(port()))

		l, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
		require.NoError(t, err)
		defer func() { assert.NoError(t, l.Close()) }()
		require.NoError(t, l.SetOption(rdmacm.OptionReuseAddr, 1))
		require.NoError(t, l.Bind(dst))
		require.NoError(t, l.Listen(8))
		assert.Equal(t, dst, l.LocalAddr())
		assert.Equal(t, d.name, l.DeviceName(), "bound to a device's address")

		c, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
		require.NoError(t, err)
		defer func() { assert.NoError(t, c.Close()) }()
		require.NoError(t, c.ResolveAddr(netip.Addr{}, dst, 2*time.Second))
		event(t, ctx, c, rdmacm.EventAddrResolved)
		assert.Equal(t, d.name, c.DeviceName())
		assert.Equal(t, 1, c.Port())
		require.NoError(t, c.ResolveRoute(2*time.Second))
		event(t, ctx, c, rdmacm.EventRouteResolved)
		cqp, ccq, cpd := idQP(t, c)
		if !d.iwarp {
			assert.Equal(t, verbs.QPStateInit, cqp.State(), "librdmacm takes a new IB/RoCE QP to INIT, the rest at connect")
		}

		hello := []byte("raw private data, no rdmago header")
		param := rdmacm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}
		require.NoError(t, c.Connect(param, hello))

		req := event(t, ctx, l, rdmacm.EventConnectRequest)
		require.NotNil(t, req.ID, "a request comes with its own id")
		s := req.ID
		defer func() { assert.NoError(t, s.Close()) }()
		assert.True(t, bytes.HasPrefix(req.PrivateData, hello), "private data as sent (padded on RoCE): %q", req.PrivateData)
		if d.iwarp {
			assert.Equal(t, hello, req.PrivateData, "iWARP carries the exact length")
		}
		assert.Equal(t, c.LocalAddr(), s.RemoteAddr())
		sqp, scq, spd := idQP(t, s)
		rbuf, err := spd.RegisterMemory(64, verbs.AccessLocalWrite)
		require.NoError(t, err)
		defer rbuf.Close()
		require.NoError(t, sqp.PostRecv(verbs.RecvWR{ID: 1, SGEs: []verbs.SGE{rbuf.SGE(0, 64)}}))
		require.NoError(t, s.Accept(param, []byte("welcome")))

		ev := event(t, ctx, c, rdmacm.EventEstablished)
		assert.True(t, bytes.HasPrefix(ev.PrivateData, []byte("welcome")))
		if !d.iwarp { // siw's query reports RESET for a connected QP
			assert.Equal(t, verbs.QPStateRTS, cqp.State())
		}
		event(t, ctx, s, rdmacm.EventEstablished)

		// A SEND crosses.
		sbuf, err := cpd.RegisterMemory(64, 0)
		require.NoError(t, err)
		defer sbuf.Close()
		copy(sbuf.Bytes(), "ping")
		require.NoError(t, cqp.PostSend(verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGEs: []verbs.SGE{sbuf.SGE(0, 4)}}))
		wcs := make([]verbs.WorkCompletion, 1)
		_, err = scq.PollWait(ctx, wcs)
		require.NoError(t, err)
		require.NoError(t, wcs[0].Err())
		assert.Equal(t, "ping", string(rbuf.Bytes()[:wcs[0].ByteLen]))
		_, err = ccq.PollWait(ctx, wcs)
		require.NoError(t, err)
		require.NoError(t, wcs[0].Err())

		// The peer's DISCONNECTED is answered with a Disconnect of our own:
		// on RoCE the side that began waits for that reply.
		require.NoError(t, c.Disconnect())
		event(t, ctx, s, rdmacm.EventDisconnected)
		require.NoError(t, s.Disconnect())
		event(t, ctx, c, rdmacm.EventDisconnected)
	})
}

// Closing an id first takes the QP CreateQP made with it (librdmacm
// destroys it through the id); the QP's own Close is then harmless.
func TestIDCloseTakesItsQP(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 20*time.Second)
		id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
		require.NoError(t, err)
		require.NoError(t, id.ResolveAddr(netip.Addr{}, netip.MustParseAddrPort(d.at(port())), 2*time.Second))
		event(t, ctx, id, rdmacm.EventAddrResolved)
		dev, err := id.Device()
		require.NoError(t, err)
		pd, err := dev.AllocPD()
		require.NoError(t, err)
		cq, err := dev.CreateCQ(2)
		require.NoError(t, err)
		qp, err := id.CreateQP(pd, verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, Cap: verbsCap(1)})
		require.NoError(t, err)
		require.NoError(t, id.Close())
		assert.NoError(t, qp.Close(), "after its id")
		assert.NoError(t, cq.Close(), "no QP uses the CQ any more")
		assert.NoError(t, pd.Close())
	})
}

// An id closed while its QP is attached to a multicast group leaves the
// group first: a QP attached to one cannot be destroyed (EBUSY), and the
// QP, its CQ and PD would outlive the id. RoCE only: iWARP has no UD.
func TestIDCloseLeavesItsGroups(t *testing.T) {
	d := rxe(t)
	checkNoLeaks(t)
	ctx := ctxFor(t, 20*time.Second)
	id, err := rdmacm.NewID(rdmacm.PortSpaceUDP)
	require.NoError(t, err)
	require.NoError(t, id.Bind(netip.MustParseAddrPort(d.at(0))))
	idQPOf(t, id, verbs.QPTypeUD) // closed after the id, without EBUSY
	kept := netip.MustParseAddr("239.1.2.3")
	left := netip.MustParseAddr("239.1.2.4")
	for _, group := range []netip.Addr{kept, left} {
		require.NoError(t, id.JoinMulticast(group))
		event(t, ctx, id, rdmacm.EventMulticastJoin)
	}
	require.NoError(t, id.LeaveMulticast(left))
	require.NoError(t, id.Close(), "still in %v", kept)

	// An id bound to no device cannot join: the error says what comes first.
	unbound, err := rdmacm.NewID(rdmacm.PortSpaceUDP)
	require.NoError(t, err)
	defer unbound.Close()
	err = unbound.JoinMulticast(kept)
	assert.ErrorIs(t, err, syscall.EINVAL)
	assert.ErrorContains(t, err, "resolve the group's address first")
}

// Calls the CM refuses, and calls on a closed id, fail with errors that say
// which call and where; a wait ends with its context.
func TestIDRefusals(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
		require.NoError(t, err)

		_, err = id.Device()
		assert.ErrorContains(t, err, "bound to no RDMA device yet")
		assert.ErrorIs(t, id.SetOption(rdmacm.OptionACKTimeout, 32), syscall.EINVAL)
		assert.ErrorIs(t, id.SetOption(rdmacm.OptionReuseAddr, 2), syscall.EINVAL)
		assert.ErrorIs(t, id.ResolveAddr(netip.Addr{}, netip.AddrPort{}, time.Second), syscall.EINVAL)
		err = id.ResolveRoute(time.Second)
		assert.ErrorIs(t, err, syscall.EINVAL, "no route before an address (librdmacm would crash)")
		assert.ErrorContains(t, err, "rdma_resolve_route")
		assert.ErrorIs(t, id.Connect(rdmacm.ConnParam{}, nil), syscall.EINVAL, "no connect before a route (likewise)")
		assert.ErrorIs(t, id.Accept(rdmacm.ConnParam{}, nil), syscall.EINVAL, "no accept on an unbound id (likewise)")
		_, _, err = id.InitQPAttr(verbs.QPStateRTR)
		assert.ErrorContains(t, err, "rdma_init_qp_attr")

		// A PD of verbs.Open's context is not librdmacm's.
		r, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
		require.NoError(t, err)
		defer r.Close()
		require.NoError(t, r.ResolveAddr(netip.Addr{}, netip.MustParseAddrPort(d.at(port())), 2*time.Second))
		event(t, ctxFor(t, 10*time.Second), r, rdmacm.EventAddrResolved)
		dev, err := verbs.Open(d.name)
		require.NoError(t, err)
		defer dev.Close()
		pd, err := dev.AllocPD()
		require.NoError(t, err)
		defer pd.Close()
		cq, err := dev.CreateCQ(2)
		require.NoError(t, err)
		defer cq.Close()
		_, err = r.CreateQP(pd, verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, Cap: verbsCap(1)})
		assert.ErrorIs(t, err, syscall.EINVAL)
		assert.ErrorContains(t, err, "ID.Device()")

		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err = id.Event(ctx)
		assert.ErrorIs(t, err, context.DeadlineExceeded)

		require.NoError(t, id.Close())
		assert.NoError(t, id.Close(), "twice")
		assert.ErrorIs(t, id.ResolveRoute(time.Second), rdmacm.ErrClosed)
		assert.ErrorIs(t, id.Connect(rdmacm.ConnParam{}, nil), rdmacm.ErrClosed)
		_, err = id.Event(context.Background())
		assert.ErrorIs(t, err, rdmacm.ErrClosed)
		assert.Equal(t, netip.AddrPort{}, id.LocalAddr())
	})
}

// Connecting where nobody listens ends in REJECTED on RoCE; on iWARP,
// whose connect opens its TCP stream at once, rdma_connect itself may
// refuse, or CONNECT_ERROR or REJECTED follows.
func TestIDConnectWithoutListener(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 20*time.Second)
		c := resolved(t, ctx, netip.MustParseAddrPort(d.at(port())))
		idQP(t, c)
		err := c.Connect(rdmacm.ConnParam{RetryCount: 7, RNRRetryCount: 7}, nil)
		if d.iwarp && err != nil {
			assert.ErrorIs(t, err, syscall.ECONNREFUSED)
			var oe *rdmacm.OpError
			require.True(t, errors.As(err, &oe))
			assert.Equal(t, "rdma_connect", oe.Op)
			assert.Equal(t, d.name, oe.Device)
			return
		}
		require.NoError(t, err)
		ev, err := c.Event(ctx)
		require.NoError(t, err)
		if d.iwarp {
			assert.Contains(t, []rdmacm.EventType{rdmacm.EventRejected, rdmacm.EventConnectError}, ev.Type)
		} else {
			assert.Equal(t, rdmacm.EventRejected, ev.Type)
		}
	})
}

// Dial reports each of its steps once through ConnConfig.Trace, and Disconnect
// ends both sides without releasing anything.
func TestDialTracesItsSteps(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 20*time.Second)
		l, addr := listen(t, d, nil)
		accepted := make(chan *rdmacm.Conn, 1)
		go func() {
			c, err := l.Accept(ctx)
			assert.NoError(t, err)
			accepted <- c
		}()
		var steps []rdmacm.Step
		dl := &rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{Trace: func(s rdmacm.Step, _ time.Time, _ time.Duration) { steps = append(steps, s) }}}
		client, err := dl.Dial(ctx, addr)
		require.NoError(t, err)
		server := <-accepted
		require.NotNil(t, server)
		exchange(t, client, server)
		assert.Equal(t, []rdmacm.Step{rdmacm.StepCreateID, rdmacm.StepResolveAddr, rdmacm.StepResolveRoute,
			rdmacm.StepCreateQP, rdmacm.StepConnect}, steps)

		require.NoError(t, client.Disconnect(ctx))
		assert.Equal(t, rdmacm.StepDisconnect, steps[len(steps)-1])
		select {
		case <-client.Done():
		default:
			t.Fatal("Done is open after Disconnect returned")
		}
		assert.ErrorIs(t, client.Err(), rdmacm.ErrDisconnected)
		select {
		case <-server.Done():
		case <-ctx.Done():
			t.Fatal("the server never saw the disconnect")
		}
		assert.NoError(t, client.Disconnect(ctx), "a second Disconnect")
		assert.NoError(t, server.Disconnect(ctx), "Disconnect after the peer's")
		assert.NoError(t, client.Close())
		assert.NoError(t, server.Close())
		assert.Equal(t, []rdmacm.Step{rdmacm.StepDisconnect, rdmacm.StepDestroyQP, rdmacm.StepDestroyID}, steps[5:])
	})
}

func TestDialBadInput(t *testing.T) {
	checkNoLeaks(t)
	ctx := ctxFor(t, 5*time.Second)
	_, err := rdmacm.Dial(ctx, "nowhere")
	assert.ErrorContains(t, err, "nowhere")
	_, err = (&rdmacm.Dialer{PrivateData: make([]byte, 1000)}).Dial(ctx, "10.0.0.1:1")
	assert.ErrorIs(t, err, rdmacm.ErrPrivateDataTooLong)
}

// The thin layer passes private data through as it is, but refuses what
// the message cannot carry on the id's transport, before the wire: on
// RoCE the kernel would refuse it with a bare EINVAL, on iWARP siw sends
// it and the peer loses it.
func TestIDRefusesPrivateDataPastTheLimit(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 20*time.Second)
		connectMax, rejectMax := rdmacm.MaxConnectDataTCP, rdmacm.MaxRejectDataTCP
		if d.iwarp {
			connectMax, rejectMax = rdmacm.MaxPrivateDataIWARP, rdmacm.MaxPrivateDataIWARP
		}
		dst := netip.MustParseAddrPort(d.at(port()))
		l, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
		require.NoError(t, err)
		defer l.Close()
		require.NoError(t, l.Bind(dst))
		require.NoError(t, l.Listen(4))

		c := resolved(t, ctx, dst)
		idQP(t, c)
		param := rdmacm.ConnParam{RetryCount: 7, RNRRetryCount: 7}
		err = c.Connect(param, make([]byte, connectMax+1))
		require.ErrorIs(t, err, rdmacm.ErrPrivateDataTooLong)
		var pe *rdmacm.PrivateDataError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, connectMax, pe.Limit)
		require.NoError(t, c.Connect(param, make([]byte, connectMax)), "at the limit")

		req := event(t, ctx, l, rdmacm.EventConnectRequest)
		defer req.ID.Close()
		assert.ErrorIs(t, req.ID.Reject(make([]byte, rejectMax+1)), rdmacm.ErrPrivateDataTooLong)
		want := bytes.Repeat([]byte{7}, rejectMax)
		require.NoError(t, req.ID.Reject(want), "the request is still pending")
		ev := event(t, ctx, c, rdmacm.EventRejected)
		assert.True(t, bytes.HasPrefix(ev.PrivateData, want), "the reject carries what was sent")
	})
}

// rdma_disconnect moves the id's QP (to ERR, or SQD on iWARP) inside
// librdmacm; a connection's Close may destroy that QP on another goroutine
// at the same moment (the dispatcher answering a peer's disconnect while
// the application closes). Neither may see the QP freed under it: this
// crashed the process (SIGSEGV in rdma_disconnect) in a soak and in
// streambench before the two were serialized. Not connected here, so that
// the race itself is all a round costs: the disconnect fails on its own.
func TestIDDisconnectMeetsQPClose(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 60*time.Second)
		dst := netip.MustParseAddrPort(d.at(port()))
		dev, err := resolved(t, ctx, dst).Device()
		require.NoError(t, err)
		pd, err := dev.AllocPD()
		require.NoError(t, err)
		cq, err := dev.CreateCQ(8)
		require.NoError(t, err)
		defer func() {
			assert.NoError(t, cq.Close())
			assert.NoError(t, pd.Close())
		}()
		for i := range 500 {
			id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
			require.NoError(t, err)
			require.NoError(t, id.ResolveAddr(netip.Addr{}, dst, 2*time.Second))
			event(t, ctx, id, rdmacm.EventAddrResolved)
			qp, err := id.CreateQP(pd, verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, Cap: verbsCap(1)})
			require.NoError(t, err, "round %d", i)
			start := make(chan struct{})
			closed := make(chan error, 1)
			go func() {
				<-start
				closed <- qp.Close()
			}()
			close(start)
			id.Disconnect() // fails: not connected; its QP move is what counts
			require.NoError(t, <-closed, "round %d: the QP's Close", i)
			require.NoError(t, id.Close(), "round %d", i)
		}
	})
}
