//go:build integration

package msg

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// Hostile dialers of a message listener, driven through rdmacm's thin layer
// (rdmacm.ID): hellos that are garbage, cut short, of another magic or
// version, or announcing what no peer may; and handshakes given up
// half-way. Each is refused with a reason the dialer can read, or ends
// without holding the listener, which then serves a real dialer.

// rawID is a hostile dialer: an id resolved towards a listener, with a
// CM-moved QP when withQP (an iWARP connect request needs one).
type rawID struct {
	id *rdmacm.ID
	qp *verbs.QP
	cq *verbs.CQ
	pd *verbs.PD
}

var rawQPN atomic.Uint32

func rawParam() rdmacm.ConnParam {
	// A QP number the IB CM has not seen from this host, or it takes the
	// request for a stale connection.
	return rdmacm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7,
		QPNum: 0x800000 | rawQPN.Add(1)}
}

func newRawID(t *testing.T, ctx context.Context, dst netip.AddrPort, withQP bool) *rawID {
	t.Helper()
	id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
	require.NoError(t, err)
	r := &rawID{id: id}
	t.Cleanup(func() { r.close(t) })
	require.NoError(t, id.ResolveAddr(netip.Addr{}, dst, 2*time.Second))
	rawEvent(t, ctx, id, rdmacm.EventAddrResolved)
	require.NoError(t, id.ResolveRoute(2*time.Second))
	rawEvent(t, ctx, id, rdmacm.EventRouteResolved)
	if withQP {
		dev, err := id.Device()
		require.NoError(t, err)
		r.pd, err = dev.AllocPD()
		require.NoError(t, err)
		r.cq, err = dev.CreateCQ(4)
		require.NoError(t, err)
		r.qp, err = id.CreateQP(r.pd, verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: r.cq, RecvCQ: r.cq,
			Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
		require.NoError(t, err)
	}
	return r
}

// close destroys the id and its QP without a word to the peer; again does
// nothing.
func (r *rawID) close(t *testing.T) {
	if r.id == nil {
		return
	}
	assert.NoError(t, r.id.Close())
	if r.qp != nil {
		assert.NoError(t, r.qp.Close())
		assert.NoError(t, r.cq.Close())
		assert.NoError(t, r.pd.Close())
	}
	r.id = nil
}

func rawEvent(t *testing.T, ctx context.Context, id *rdmacm.ID, want rdmacm.EventType) *rdmacm.Event {
	t.Helper()
	ev, err := id.Event(ctx)
	require.NoError(t, err)
	require.Equal(t, want, ev.Type, "status %d", ev.Status)
	return ev
}

// framed puts rdmago's private data header (magic, version, length, MTU)
// in front of b, as an rdmago dialer sends it.
func framed(b []byte) []byte { return append([]byte{0xd7, 1, byte(len(b)), 3}, b...) }

// requireMessageServes checks that l still serves a real dialer: a message
// goes through.
func requireMessageServes(t *testing.T, ctx context.Context, l *Listener, addr string) {
	t.Helper()
	accepted := make(chan *Conn, 1)
	go func() {
		c, err := l.Accept(ctx)
		assert.NoError(t, err)
		accepted <- c
	}()
	c, err := Dial(ctx, nil, addr, nil)
	require.NoError(t, err)
	defer c.Close()
	s := <-accepted
	require.NotNil(t, s)
	defer s.Close()
	require.NoError(t, c.Send(ctx, []byte("still here")))
	m, err := s.Recv(ctx)
	require.NoError(t, err)
	assert.Equal(t, "still here", string(m.Bytes()))
	m.Release()
}

// Each bad hello is refused at the listener with a reason in the reject's
// private data (in rdmago's header), which a raw dialer reads; the
// listener's Accept goes on to the next request and serves a real dialer.
func TestHostileHellos(t *testing.T) {
	good := hello{version: Version, replySlots: 4, credits: 8, maxMessage: 4096}.marshal()
	with := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return framed(b)
	}
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 60*time.Second)
		l, addr := listen(t, d, nil)
		dst := netip.MustParseAddrPort(addr)
		limit := rdmacm.MaxConnectDataTCP
		if d.iwarp {
			limit = rdmacm.MaxPrivateDataIWARP
		}
		rnd := rand.New(rand.NewPCG(28, 4))
		random := make([]byte, limit)
		for i := range random {
			random[i] = byte(rnd.UintN(255)) + 1
		}
		// One Accept refuses every bad hello and returns the real dialer's
		// connection.
		served := make(chan *Conn, 1)
		go func() {
			c, err := l.Accept(ctx)
			assert.NoError(t, err)
			served <- c
		}()
		for _, tc := range []struct {
			name, want string
			data       []byte
		}{
			{"random bytes at the limit", "no rdmago message hello", random},
			{"no private data", "no rdmago message hello in the 0 bytes", nil},
			{"a hello cut short", "no rdmago message hello in the 10 bytes", framed(good[:10])},
			{"another magic", "no rdmago message hello", with(func(b []byte) { copy(b, "RMSG") })},
			{"a header of another version", "no rdmago message hello", append([]byte{0xd7, 2, helloSize, 3}, good...)},
			{"version 0", "the peer speaks version 0", with(func(b []byte) { b[4] = 0 })},
			{"unknown flags", "unknown flags 0x80", with(func(b []byte) { b[5] = 0x80 })},
			{"all the credits", "announcing 4294967295 credits", with(func(b []byte) { binary.BigEndian.PutUint32(b[8:], 1<<32-1) })},
			{"all the reply slots", "announcing 65535 reply slots", with(func(b []byte) { binary.BigEndian.PutUint16(b[6:], 1<<16-1) })},
			{"a 4 GiB message", "a 4294967295-byte maximum message", with(func(b []byte) { binary.BigEndian.PutUint32(b[12:], 1<<32-1) })},
		} {
			r := newRawID(t, ctx, dst, d.iwarp)
			require.NoError(t, r.id.Connect(rawParam(), tc.data), tc.name)
			ev := rawEvent(t, ctx, r.id, rdmacm.EventRejected)
			require.ErrorIs(t, ev.Err(), rdmacm.ErrRejected, tc.name)
			p := ev.PrivateData
			require.True(t, len(p) >= 4 && p[0] == 0xd7 && p[1] == 1 && int(p[2]) <= len(p)-4, "%s: %x", tc.name, p)
			reason := string(p[4 : 4+int(p[2])])
			assert.Contains(t, reason, tc.want, tc.name)
			t.Logf("%s: %s", tc.name, reason)
			r.close(t)
		}
		c, err := Dial(ctx, nil, addr, nil)
		require.NoError(t, err)
		defer c.Close()
		s := <-served
		require.NotNil(t, s)
		defer s.Close()
		require.NoError(t, c.Send(ctx, []byte("after the hostile ones")))
		m, err := s.Recv(ctx)
		require.NoError(t, err)
		assert.Equal(t, "after the hostile ones", string(m.Bytes()))
		m.Release()
	})
}

// A dialer that stops half-way does not hold the listener: one whose
// connection comes up (its hello was good) but that never sends its HELLO
// frame holds CloseSend up for CloseTimeout at most, and once it vanishes
// the accepted connection ends (Recv and Close return); on RoCE, one that
// never answers the accept (no RTU) fails Accept within ConnectTimeout.
// The listener then serves a real dialer.
func TestHostileHalfHandshake(t *testing.T) {
	hel := framed(hello{version: Version, replySlots: 4, credits: 8, maxMessage: 4096}.marshal())
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 60*time.Second)
		const connectTimeout = time.Second
		addr := d.at(port())
		l, err := Listen(ctx, &rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{ConnectTimeout: connectTimeout}}, addr,
			&Config{CloseTimeout: time.Second})
		require.NoError(t, err)
		defer l.Close()
		dst := netip.MustParseAddrPort(addr)

		r := newRawID(t, ctx, dst, true)
		require.NoError(t, r.id.Connect(rawParam(), hel))
		s, err := l.Accept(ctx)
		require.NoError(t, err)
		rawEvent(t, ctx, r.id, rdmacm.EventEstablished)
		start := time.Now()
		err = s.CloseSend(ctx)
		assert.ErrorContains(t, err, "the peer's HELLO frame did not come within Config.CloseTimeout (1s)")
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Less(t, time.Since(start), 3*time.Second, "CloseSend waits for the HELLO at most CloseTimeout")
		r.close(t) // no HELLO frame, no disconnect
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		start = time.Now()
		_, err = s.Recv(rctx)
		cancel()
		require.Error(t, err)
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "Recv waits on a dialer that is gone")
		t.Logf("%s: Recv from a dialer gone before its HELLO: %v after %v", d.name, err, time.Since(start).Round(time.Millisecond))
		start = time.Now()
		s.Close()
		assert.Less(t, time.Since(start), 5*time.Second, "Close")
		requireMessageServes(t, ctx, l, addr)

		if d.iwarp {
			return // the iWARP CM completes the handshake without the dialer's application
		}
		r = newRawID(t, ctx, dst, false)
		require.NoError(t, r.id.Connect(rawParam(), hel))
		start = time.Now()
		_, err = l.Accept(ctx)
		took := time.Since(start)
		require.Error(t, err)
		t.Logf("%s: Accept of a dialer that never answered: %v after %v", d.name, err, took.Round(time.Millisecond))
		assert.Less(t, took, connectTimeout+2*time.Second, "Accept is bounded by ConnectTimeout")
		ev := rawEvent(t, ctx, r.id, rdmacm.EventConnectResponse)
		_, err = parseHello(ev.PrivateData[4:])
		assert.NoError(t, err, "the listener's hello came with its accept")
		r.close(t)
		requireMessageServes(t, ctx, l, addr)
	})
}
