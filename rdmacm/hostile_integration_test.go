//go:build integration

package rdmacm_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// Hostile peers, driven through the thin layer (rdmacm.ID) as a C program
// would drive librdmacm: private data no rdmago peer sends, requests given
// up half-way, floods; and invalid addresses, options and sizes. Each gets
// an error or a refusal, the listener goes on serving, and nothing leaks.

// rawClient is a hostile dialer: an id resolved towards a listener, with a
// CM-moved QP of its own where the transport needs one to send a connect
// request (iWARP: the kernel looks the QP up by number). On RoCE it has
// none, and a request names a QP number that does not exist.
type rawClient struct {
	id     *rdmacm.ID
	qp     *verbs.QP
	cq     *verbs.CQ
	pd     *verbs.PD
	shared bool // cq and pd belong to someone else
}

// rawQPN numbers the QPs that raw clients without one name: the IB CM
// takes a request naming a QP it saw before (same QPN, same host) for a
// stale connection and rejects it.
var rawQPN atomic.Uint32

func init() { rawQPN.Store(uint32(os.Getpid()%4096) << 12) }

// rawParam is what a raw client offers; QPNum is ignored where the id has
// a QP.
func rawParam() rdmacm.ConnParam {
	return rdmacm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7, QPNum: rawQPN.Add(1) & 0xffffff}
}

// newRaw resolves a raw client towards dst; on iWARP it makes a QP, on pd
// and cq if they are given.
func newRaw(t *testing.T, ctx context.Context, d device, dst netip.AddrPort, pd *verbs.PD, cq *verbs.CQ) *rawClient {
	t.Helper()
	id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
	require.NoError(t, err)
	r := &rawClient{id: id}
	ok := false
	defer func() {
		if !ok {
			r.close(t)
		}
	}()
	require.NoError(t, id.ResolveAddr(netip.Addr{}, dst, 2*time.Second))
	event(t, ctx, id, rdmacm.EventAddrResolved)
	require.NoError(t, id.ResolveRoute(2*time.Second))
	event(t, ctx, id, rdmacm.EventRouteResolved)
	if d.iwarp {
		r.pd, r.cq, r.shared = pd, cq, pd != nil
		if !r.shared {
			dev, err := id.Device()
			require.NoError(t, err)
			r.pd, err = dev.AllocPD()
			require.NoError(t, err)
			r.cq, err = dev.CreateCQ(4)
			require.NoError(t, err)
		}
		r.qp, err = id.CreateQP(r.pd, verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: r.cq, RecvCQ: r.cq, Cap: verbsCap(1)})
		require.NoError(t, err)
	}
	ok = true
	return r
}

// close destroys the id (and its QP) without a word to the peer.
func (r *rawClient) close(t *testing.T) {
	assert.NoError(t, r.id.Close())
	if r.qp != nil {
		assert.NoError(t, r.qp.Close())
	}
	if !r.shared {
		if r.cq != nil {
			assert.NoError(t, r.cq.Close())
		}
		if r.pd != nil {
			assert.NoError(t, r.pd.Close())
		}
	}
}

// connectLimit is how many bytes of private data a connect request carries
// on d's transport.
func (d device) connectLimit() int {
	if d.iwarp {
		return rdmacm.MaxPrivateDataIWARP
	}
	return rdmacm.MaxConnectDataTCP
}

// refusalPrefix is the private data of an rdmago listener's own refusal.
func refusalPrefix(why rdmacm.Refusal) []byte { return []byte{0xd7, 0x81, byte(why), 0} }

// requireServes checks that l still accepts a well-behaved dialer.
func requireServes(t *testing.T, l *rdmacm.Listener, addr string) {
	t.Helper()
	client, server := connect(t, l.Accept, func(ctx context.Context) (*rdmacm.Conn, error) { return rdmacm.Dial(ctx, addr) })
	assert.Equal(t, client.LocalAddr(), server.RemoteAddr())
}

// Private data no rdmago peer sends (random bytes up to the transport's
// limit, rdmago headers cut short, of another version, with a length past
// what arrived or an MTU that does not exist, a forged listener refusal)
// reaches the application whole, as a C peer's data, never decoded from a
// header that does not hold; the application's reject reaches the raw
// client with its reason. One byte past the limit is refused by the thin
// layer before anything is sent. The listener then serves a normal dialer.
func TestHostileRequestData(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 60*time.Second)
		l, addr := listen(t, d, &rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{ConnectTimeout: 2 * time.Second}})
		dst := netip.MustParseAddrPort(addr)
		limit := d.connectLimit()
		rnd := rand.New(rand.NewPCG(28, 4))
		random := make([]byte, limit)
		for i := range random {
			random[i] = byte(rnd.UintN(255)) + 1 // no zeros: padding would show
		}
		for _, tc := range []struct {
			name string
			data []byte
			// decoded is what the application gets when it is not the
			// bytes whole: a real header's data.
			decoded []byte
			// onRoCE: decoded only on RoCE, where the IB CM's zero
			// padding completes a header cut short into a valid one
			// (the wire holds the same bytes as that header's).
			onRoCE bool
		}{
			{"random bytes at the limit", random, nil, false},
			{"the magic alone", []byte{0xd7}, nil, false},
			{"a header cut short", []byte{0xd7, 1, 4}, []byte{0, 0, 0, 0}, true},
			{"a length past what arrived", []byte{0xd7, 1, 200, 3, 'x'}, nil, false},
			{"another version", []byte{0xd7, 2, 2, 3, 'h', 'i'}, nil, false},
			{"an MTU that does not exist", []byte{0xd7, 1, 2, 99, 'h', 'i'}, nil, false},
			{"a forged refusal", refusalPrefix(rdmacm.RefusalBacklogFull), nil, false},
			{"a header claiming all of a limit-sized field", append([]byte{0xd7, 1, byte(limit - 4), 3}, random[:limit-4]...),
				random[:limit-4], false},
		} {
			r := newRaw(t, ctx, d, dst, nil, nil)
			require.NoError(t, r.id.Connect(rawParam(), tc.data), tc.name)
			req, err := l.Request(ctx)
			require.NoError(t, err, tc.name)
			want := tc.data
			if tc.decoded != nil && (!tc.onRoCE || !d.iwarp) {
				want = tc.decoded
			}
			if d.iwarp {
				assert.Equal(t, want, req.PrivateData, "%s: iWARP carries the exact bytes", tc.name)
			} else {
				require.True(t, bytes.HasPrefix(req.PrivateData, want), "%s: %x", tc.name, req.PrivateData)
				assert.Equal(t, make([]byte, len(req.PrivateData)-len(want)), req.PrivateData[len(want):], "%s: only padding follows", tc.name)
			}
			reason := []byte("refused: " + tc.name)
			require.NoError(t, req.Reject(reason))
			ev, err := r.id.Event(ctx)
			require.NoError(t, err, tc.name)
			require.Equal(t, rdmacm.EventRejected, ev.Type, tc.name)
			require.ErrorIs(t, ev.Err(), rdmacm.ErrRejected)
			assert.True(t, bytes.HasPrefix(ev.PrivateData, append([]byte{0xd7, 1, byte(len(reason)), 0}, reason...)),
				"%s: the raw client sees the reason in rdmago's header: %q", tc.name, ev.PrivateData)
			r.close(t)
		}

		r := newRaw(t, ctx, d, dst, nil, nil)
		defer r.close(t)
		err := r.id.Connect(rawParam(), random[:0:0])
		require.NoError(t, err, "no private data at all")
		req, err := l.Request(ctx)
		require.NoError(t, err)
		assert.Empty(t, req.PrivateData)
		require.NoError(t, req.Reject(nil))
		event(t, ctx, r.id, rdmacm.EventRejected)

		r2 := newRaw(t, ctx, d, dst, nil, nil)
		defer r2.close(t)
		err = r2.id.Connect(rawParam(), append(random, 1))
		require.ErrorIs(t, err, rdmacm.ErrPrivateDataTooLong, "one byte past the limit")
		var pe *rdmacm.PrivateDataError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, limit+1, pe.Len)
		assert.Equal(t, limit, pe.Limit)
		nctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = l.Request(nctx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "nothing was sent")

		requireServes(t, l, addr)
	})
}

// abandonEnv makes the test binary a hostile process: it sends a connect
// request to the address the variable holds, says so on stdout, destroys
// its id without waiting for an answer, and exits.
const abandonEnv = "RDMACM_HOSTILE_ABANDON"

func init() {
	if addr := os.Getenv(abandonEnv); addr != "" {
		os.Exit(abandonMain(netip.MustParseAddrPort(addr)))
	}
}

func abandonMain(dst netip.AddrPort) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fail := func(what string, err error) int {
		fmt.Println(what+":", err)
		return 1
	}
	id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
	if err != nil {
		return fail("new id", err)
	}
	if err := id.ResolveAddr(netip.Addr{}, dst, 2*time.Second); err != nil {
		return fail("resolve address", err)
	}
	if ev, err := id.Event(ctx); err != nil || ev.Type != rdmacm.EventAddrResolved {
		return fail("address", errors.Join(err, ev.Err()))
	}
	if err := id.ResolveRoute(2 * time.Second); err != nil {
		return fail("resolve route", err)
	}
	if ev, err := id.Event(ctx); err != nil || ev.Type != rdmacm.EventRouteResolved {
		return fail("route", errors.Join(err, ev.Err()))
	}
	dev, err := id.Device()
	if err != nil {
		return fail("device", err)
	}
	if dev.Info.Transport == verbs.TransportIWARP {
		// Its QP, PD and CQ go with the process.
		pd, err := dev.AllocPD()
		if err != nil {
			return fail("PD", err)
		}
		cq, err := dev.CreateCQ(4)
		if err != nil {
			return fail("CQ", err)
		}
		if _, err := id.CreateQP(pd, verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, Cap: verbsCap(1)}); err != nil {
			return fail("QP", err)
		}
	}
	if err := id.Connect(rawParam(), []byte("bye")); err != nil {
		return fail("connect", err)
	}
	fmt.Println("sent")
	id.Close()
	return 0
}

// A request given up half-way does not hold the listener: a process that
// destroys its id right after sending the request, and (RoCE) a raw client
// that never answers the accept with its RTU. Accept returns within its
// ConnectTimeout either way, and the listener serves the next dialer, at
// once.
func TestHostileAbandonedRequests(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 60*time.Second)
		const connectTimeout = time.Second
		l, addr := listen(t, d, &rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{ConnectTimeout: connectTimeout}})
		dst := netip.MustParseAddrPort(addr)

		// Destroyed at once, by another process, as a hostile peer is
		// (TestHostileAbandonedInProcess has one in the listener's).
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), abandonEnv+"="+addr)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		go func() {
			line, _ := bufio.NewReader(out).ReadString('\n')
			if line != "sent\n" {
				t.Errorf("the hostile process: %q", line)
			}
			io.Copy(io.Discard, out)
			exited <- cmd.Wait()
		}()
		actx, cancel := context.WithTimeout(ctx, connectTimeout+5*time.Second)
		start := time.Now()
		c, err := l.Accept(actx)
		cancel()
		took := time.Since(start)
		t.Logf("%s: Accept of a request whose id was destroyed: %v after %v", d.name, err, took.Round(time.Millisecond))
		if err == nil {
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				t.Error("the connection of a destroyed peer did not end")
			}
			assert.NoError(t, c.Close())
		} else {
			assert.NotErrorIs(t, err, context.DeadlineExceeded, "Accept waited for more than ConnectTimeout")
			assert.Less(t, took, connectTimeout+2*time.Second, "Accept gave up on the request within its ConnectTimeout")
		}
		start = time.Now()
		requireServes(t, l, addr)
		t.Logf("%s: the next dialer served in %v", d.name, time.Since(start).Round(time.Millisecond))
		select {
		case err := <-exited:
			require.NoError(t, err, "the hostile process")
		case <-time.After(20 * time.Second):
			t.Fatal("the hostile process hangs")
		}

		if d.iwarp {
			return // the iWARP CM completes the handshake without the dialer's application
		}
		// Never answers: the CONNECT_RESPONSE comes, no RTU goes back.
		r := newRaw(t, ctx, d, dst, nil, nil)
		defer r.close(t)
		require.NoError(t, r.id.Connect(rawParam(), nil))
		start = time.Now()
		_, err = l.Accept(ctx)
		took = time.Since(start)
		require.Error(t, err)
		t.Logf("%s: Accept of a dialer that never answered: %v after %v", d.name, err, took.Round(time.Millisecond))
		assert.Less(t, took, connectTimeout+2*time.Second, "Accept is bounded by ConnectTimeout")
		event(t, ctx, r.id, rdmacm.EventConnectResponse)
		requireServes(t, l, addr)
	})
}

// Destroying an id whose connect is still pending, in the listener's own
// process, holds up no other id. On iWARP the destroy of its QP waits for
// the MPA exchange to end (up to about 10 s on siw); it used to hold the
// lock that every CM event of the process is read under, so that the
// listener never saw the request until the wait ran out, and other ids'
// address resolutions stalled with it.
func TestHostileAbandonedInProcess(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 60*time.Second)
		l, addr := listen(t, d, &rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{ConnectTimeout: time.Second}})
		dst := netip.MustParseAddrPort(addr)
		r := newRaw(t, ctx, d, dst, nil, nil)
		require.NoError(t, r.id.Connect(rawParam(), []byte("bye")))
		closed := make(chan time.Duration, 1)
		go func() {
			start := time.Now()
			r.close(t)
			closed <- time.Since(start)
		}()
		time.Sleep(100 * time.Millisecond) // the destroy is under way

		id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
		require.NoError(t, err)
		defer id.Close()
		start := time.Now()
		require.NoError(t, id.ResolveAddr(netip.Addr{}, dst, 2*time.Second))
		event(t, ctx, id, rdmacm.EventAddrResolved)
		assert.Less(t, time.Since(start), time.Second, "another id's address resolution")
		if d.iwarp {
			assert.Empty(t, closed, "the destroy waits for the listener's answer meanwhile")
		}

		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := l.Accept(actx)
		cancel()
		t.Logf("%s: Accept of the request: %v", d.name, err)
		if err == nil {
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				t.Error("the connection of a destroyed peer did not end")
			}
			assert.NoError(t, c.Close())
		} else {
			assert.NotErrorIs(t, err, context.DeadlineExceeded, "the request reaches the listener")
		}
		select {
		case took := <-closed:
			t.Logf("%s: the raw client's Close took %v", d.name, took.Round(time.Millisecond))
		case <-time.After(15 * time.Second):
			t.Fatal("the raw client's Close hangs")
		}
		requireServes(t, l, addr)
	})
}

// A burst of raw connect requests (120 on RoCE), far more than the listener's Backlog:
// each is answered at once (the ones past the backlog refused with the
// reason rdmago's refusal carries, or by the kernel), the queued ones are
// taken by Accept, and the listener serves a normal dialer after. siw
// holds few queues per process (see rdma-notes), so its burst is smaller
// and its raw clients share a PD and a CQ.
func TestHostileFlood(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 60*time.Second)
		const backlog = 8
		n := 120
		if d.iwarp {
			n = 24
		}
		l, addr := listen(t, d, &rdmacm.ListenConfig{Backlog: backlog, ConnConfig: rdmacm.ConnConfig{ConnectTimeout: time.Second}})
		dst := netip.MustParseAddrPort(addr)

		var pd *verbs.PD
		var cq *verbs.CQ
		if d.iwarp {
			dev, err := rdmacm.OpenDevice(d.name)
			require.NoError(t, err)
			pd, err = dev.AllocPD()
			require.NoError(t, err)
			defer pd.Close()
			cq, err = dev.CreateCQ(n + 1)
			require.NoError(t, err)
			defer cq.Close()
		}
		raws := make([]*rawClient, n)
		for i := range raws {
			raws[i] = newRaw(t, ctx, d, dst, pd, cq)
		}
		closeAll := sync.OnceFunc(func() {
			for _, r := range raws {
				r.close(t)
			}
		})
		defer closeAll()

		start := time.Now()
		for i, r := range raws {
			require.NoError(t, r.id.Connect(rawParam(), []byte{byte(i)}), "request %d", i)
		}
		type answer struct {
			i  int
			ev *rdmacm.Event
		}
		answers := make(chan answer, n)
		wctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for i, r := range raws {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if ev, err := r.id.Event(wctx); err == nil {
					answers <- answer{i, ev}
				}
			}()
		}
		refused, byKernel := 0, 0
		for refused+byKernel < n-backlog {
			select {
			case a := <-answers:
				require.Equal(t, rdmacm.EventRejected, a.ev.Type, "request %d: status %d", a.i, a.ev.Status)
				if bytes.HasPrefix(a.ev.PrivateData, refusalPrefix(rdmacm.RefusalBacklogFull)) {
					refused++
				} else {
					byKernel++
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%d of %d requests past the backlog answered", refused+byKernel, n-backlog)
			}
		}
		t.Logf("%s: %d requests in %v: %d refused with the reason, %d by the kernel", d.name, n,
			time.Since(start).Round(time.Millisecond), refused, byKernel)
		assert.Positive(t, refused, "the listener says why")

		if d.iwarp {
			// The iWARP CM connects the queued ones without their
			// application: Accept takes each.
			for range backlog {
				c, err := l.Accept(ctx)
				require.NoError(t, err)
				assert.NoError(t, c.Close())
			}
			cancel()
			wg.Wait()
		} else {
			// The queued ones give up: destroying a RoCE id whose
			// request is pending rejects it, and Accept says so at once.
			cancel()
			wg.Wait()
			closeAll()
			for range backlog {
				actx, cancel := context.WithTimeout(ctx, 3*time.Second)
				start := time.Now()
				_, err := l.Accept(actx)
				cancel()
				require.Error(t, err)
				assert.NotErrorIs(t, err, context.DeadlineExceeded, "a queued request of a dialer that gave up")
				assert.Less(t, time.Since(start), 2*time.Second)
				// The error is that request's, and says what happened.
				assert.ErrorIs(t, err, rdmacm.ErrConnect)
				assert.ErrorContains(t, err, "gave up")
				var oe *rdmacm.OpError
				require.ErrorAs(t, err, &oe)
				assert.True(t, oe.Remote.IsValid(), "it names the dialer: the listener goes on")
			}
		}
		closeAll()
		requireServes(t, l, addr)
	})
}

// Addresses no connection can use, and options and sizes out of range:
// each is refused with an error that says what, within the resolve
// timeouts, and leaves nothing behind.
func TestHostileAddressesAndSizes(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 60*time.Second)
		dl := &rdmacm.Dialer{ResolveAddrTimeout: 500 * time.Millisecond, ResolveRouteTimeout: 500 * time.Millisecond,
			ResolveRetries: -1, ConnConfig: rdmacm.ConnConfig{ConnectTimeout: time.Second}}
		addrs := []string{"127.0.0.1:7471", "0.0.0.0:7471", "224.0.0.1:7471", "255.255.255.255:7471", "[::1]:7471", d.addr + ":0"}
		if !d.iwarp {
			// A silent host on the link: its neighbour never answers.
			// (On siw the dummy netdev needs no neighbour, and siw's
			// rdma_connect blocks in the kernel until TCP gives up, about
			// 2 minutes, whatever the context: not tested here.)
			addrs = append(addrs, d.addr[:len(d.addr)-1]+"77:7471")
		}
		for _, a := range addrs {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			start := time.Now()
			c, err := dl.Dial(dctx, a)
			cancel()
			if c != nil {
				c.Close()
			}
			require.Error(t, err, a)
			assert.NotErrorIs(t, err, context.DeadlineExceeded, "%s: no answer within the resolve timeouts", a)
			t.Logf("%s: %v (%v)", a, err, time.Since(start).Round(time.Millisecond))
		}
		_, err := (&rdmacm.Dialer{Source: mustAddr("10.99.0.1")}).Dial(ctx, d.at(7471))
		require.Error(t, err, "a source address that is not local")
		t.Logf("foreign source: %v", err)
		for _, a := range []string{"10.99.99.99:7471", "224.0.0.1:7471"} {
			_, err := rdmacm.Listen(a)
			require.Error(t, err, a)
			t.Logf("listen %s: %v", a, err)
		}

		// Sizes past the device's, named.
		l, addr := listen(t, d, nil)
		go func() {
			if c, err := l.Accept(ctx); err == nil {
				c.Close()
			}
		}()
		for _, tc := range []struct {
			field string
			cc    rdmacm.ConnConfig
		}{
			{"Cap.MaxSendWR", rdmacm.ConnConfig{Cap: verbs.QPCap{MaxSendWR: math.MaxUint32}}},
			{"Cap.MaxRecvWR", rdmacm.ConnConfig{Cap: verbs.QPCap{MaxRecvWR: 1 << 30}}},
			{"Cap.MaxSendSGE", rdmacm.ConnConfig{Cap: verbs.QPCap{MaxSendSGE: 1 << 16}}},
			{"Cap.MaxRecvSGE", rdmacm.ConnConfig{Cap: verbs.QPCap{MaxRecvSGE: math.MaxUint32}}},
			{"CQEntries", rdmacm.ConnConfig{CQEntries: math.MaxInt32}},
		} {
			_, err := (&rdmacm.Dialer{ConnConfig: tc.cc}).Dial(ctx, addr)
			require.ErrorIs(t, err, syscall.EINVAL, tc.field)
			assert.ErrorContains(t, err, "ConnConfig."+tc.field)
			assert.ErrorContains(t, err, d.name)
		}
		for _, bad := range []*rdmacm.ListenConfig{{Backlog: math.MaxInt}, {Backlog: -1}, {ConnConfig: rdmacm.ConnConfig{CQEntries: -1}}} {
			_, err := bad.Listen(ctx, d.at(port()))
			require.Error(t, err, "%+v", bad)
		}

		// The thin layer and verbs, given zero, negative and huge values.
		r := newRaw(t, ctx, d, netip.MustParseAddrPort(addr), nil, nil)
		defer r.close(t)
		id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
		require.NoError(t, err)
		defer id.Close()
		for _, to := range []time.Duration{-time.Millisecond, math.MaxInt64} {
			err := id.ResolveAddr(netip.Addr{}, netip.MustParseAddrPort(addr), to)
			require.ErrorIs(t, err, syscall.EINVAL, "%v", to)
			assert.ErrorContains(t, err, "timeout")
			err = r.id.ResolveRoute(to)
			require.ErrorIs(t, err, syscall.EINVAL, "%v", to)
			assert.ErrorContains(t, err, "timeout")
		}
		for _, b := range []int{-1, math.MaxInt32 + 1, math.MaxInt} {
			err := id.Listen(b)
			require.ErrorIs(t, err, syscall.EINVAL, "backlog %d", b)
			assert.ErrorContains(t, err, "backlog")
		}
		require.ErrorContains(t, id.Bind(netip.AddrPort{}), "no address")
		for _, v := range []int{-1, 256, math.MaxInt} {
			assert.ErrorIs(t, id.SetOption(rdmacm.OptionTOS, v), syscall.EINVAL, "%d", v)
			assert.ErrorIs(t, id.SetOption(rdmacm.OptionReuseAddr, v), syscall.EINVAL, "%d", v)
		}
		assert.ErrorIs(t, id.SetOption(rdmacm.Option(12345), 1), syscall.EINVAL)

		dev, err := r.id.Device()
		require.NoError(t, err)
		for _, e := range []int{0, -1, math.MinInt, math.MaxInt32 + 1, math.MaxInt} {
			cq, err := dev.CreateCQ(e)
			if cq != nil {
				cq.Close()
			}
			require.ErrorIs(t, err, syscall.EINVAL, "%d entries", e)
			assert.ErrorContains(t, err, "entries")
		}
		pd, err := dev.AllocPD()
		require.NoError(t, err)
		defer pd.Close()
		for _, n := range []int{0, -1, math.MinInt} {
			mr, err := pd.RegisterMemory(n, verbs.AccessLocalWrite)
			if mr != nil {
				mr.Close()
			}
			require.ErrorIs(t, err, syscall.EINVAL, "%d bytes", n)
		}
		mr, err := pd.RegisterMemory(1<<50, verbs.AccessLocalWrite)
		if mr != nil {
			mr.Close()
		}
		require.Error(t, err, "a petabyte")
		t.Logf("a petabyte: %v", err)
		cq, err := dev.CreateCQ(4)
		require.NoError(t, err)
		defer cq.Close()
		for _, c := range []verbs.QPCap{{}, {MaxSendWR: math.MaxUint32, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1},
			{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: math.MaxUint32, MaxRecvSGE: 1},
			{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: math.MaxUint32}} {
			qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, Cap: c})
			if qp != nil {
				qp.Close()
				if c == (verbs.QPCap{}) {
					continue // a QP with no queues is the driver's to allow
				}
			}
			require.Error(t, err, "%+v", c)
			var oe *verbs.OpError
			require.True(t, errors.As(err, &oe), "%T", err)
			t.Logf("%+v: %v", c, err)
		}
	})
}

// The data path given zero, negative and huge sizes, offsets and lengths:
// each is refused before anything is posted, by an error that says what,
// and the connection goes on. (An RDMA WRITE or READ of a negative length
// used to be refused as not fitting the peer's buffer.)
func TestHostileConnSizes(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		client, server := pair(t, d, rdmacm.ConnConfig{})
		ctx := ctxFor(t, 20*time.Second)
		for _, n := range []int{0, -1, math.MinInt} {
			_, err := client.RegisterMemory(n, access)
			require.ErrorIs(t, err, syscall.EINVAL, "%d bytes", n)
		}
		mr, err := client.RegisterMemory(4096, access)
		require.NoError(t, err)
		smr, err := server.RegisterMemory(4096, access)
		require.NoError(t, err)
		rb := rdmacm.RemoteBufferOf(smr, 0, 4096)
		const outside = "do not lie within the 4096-byte memory region"
		for _, r := range []struct{ off, n int }{{-1, 1}, {0, -1}, {0, 4097}, {4096, 1}, {1, math.MaxInt}, {math.MaxInt, 1},
			{math.MinInt, 0}, {0, math.MinInt}} {
			assert.ErrorContains(t, client.Send(ctx, mr, r.off, r.n), outside, "send %+v", r)
			assert.ErrorContains(t, client.PostRecv(mr, r.off, r.n), outside, "receive %+v", r)
			assert.ErrorContains(t, client.RDMAWrite(ctx, mr, r.off, r.n, rb), outside, "write %+v", r)
			assert.ErrorContains(t, client.RDMARead(ctx, mr, r.off, r.n, rb), outside, "read %+v", r)
		}
		assert.ErrorContains(t, client.Send(ctx, nil, 0, 1), "the memory region is nil")
		assert.ErrorContains(t, client.PostRecv(nil, 0, 1), "the memory region is nil")
		small := rdmacm.RemoteBufferOf(smr, 0, 16)
		assert.ErrorContains(t, client.RDMAWrite(ctx, mr, 0, 17, small), "17 bytes do not fit the peer's 16-byte buffer")
		assert.ErrorContains(t, client.RDMARead(ctx, mr, 0, 17, small), "17 bytes exceed the peer's 16-byte buffer")

		require.NoError(t, server.PostRecv(smr, 0, 4096))
		copy(mr.Bytes(), "still")
		require.NoError(t, client.Send(ctx, mr, 0, 5))
		wc, err := server.Recv(ctx)
		require.NoError(t, err)
		assert.Equal(t, "still", string(smr.Bytes()[:wc.ByteLen]))
	})
}
