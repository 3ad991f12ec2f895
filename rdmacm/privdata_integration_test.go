//go:build integration

package rdmacm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
)

// privateDataCase is a transport and port space of the test bed, with or
// without rdmago's header.
type privateDataCase struct {
	d   device
	ud  bool
	raw bool
}

func (c privateDataCase) String() string {
	s := c.d.name + "/RC"
	if c.ud {
		s = c.d.name + "/UD"
	}
	if c.raw {
		return s + "/raw"
	}
	return s + "/framed"
}

func (c privateDataCase) config() rdmacm.ConnConfig {
	return rdmacm.ConnConfig{RawPrivateData: c.raw, ConnectTimeout: 5 * time.Second}
}

// endpoint is what these tests use of a connection, RC or UD.
type endpoint interface {
	PeerPrivateData() []byte
	Close() error
}

// request is a ConnRequest or a UDRequest.
type request struct {
	PrivateData []byte
	accept      func(ctx context.Context, data []byte) (endpoint, error)
	reject      func(data []byte) error
}

func (r *request) Accept(ctx context.Context, data []byte) (endpoint, error) {
	return r.accept(ctx, data)
}
func (r *request) Reject(data []byte) error { return r.reject(data) }

// anyListener is a Listener or a UDListener: what Request waits on.
type anyListener interface {
	next(ctx context.Context) (*request, error)
}

type rcListener struct{ *rdmacm.Listener }

func (l rcListener) next(ctx context.Context) (*request, error) {
	r, err := l.Request(ctx)
	if err != nil {
		return nil, err
	}
	return &request{PrivateData: r.PrivateData, reject: r.Reject, accept: func(ctx context.Context, data []byte) (endpoint, error) {
		c, err := r.Accept(ctx, data)
		if err != nil {
			return nil, err
		}
		return c, nil
	}}, nil
}

type udListener struct{ *rdmacm.UDListener }

func (l udListener) next(ctx context.Context) (*request, error) {
	r, err := l.Request(ctx)
	if err != nil {
		return nil, err
	}
	return &request{PrivateData: r.PrivateData, reject: r.Reject, accept: func(ctx context.Context, data []byte) (endpoint, error) {
		c, err := r.Accept(ctx, data)
		if err != nil {
			return nil, err
		}
		return c, nil
	}}, nil
}

// listen listens on a fresh port of c's device, RC or UD, until the test
// ends.
func (c privateDataCase) listen(t *testing.T) (anyListener, string) {
	t.Helper()
	if !c.ud {
		l, addr := listen(t, c.d, &rdmacm.ListenConfig{ConnConfig: c.config()})
		return rcListener{l}, addr
	}
	addr := c.d.at(port())
	l, err := (&rdmacm.ListenConfig{ConnConfig: c.config()}).ListenUD(context.Background(), addr)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return udListener{l}, addr
}

// dial dials addr, RC or UD, with data as the Dialer's PrivateData.
func (c privateDataCase) dial(ctx context.Context, addr string, data []byte) (endpoint, error) {
	d := &rdmacm.Dialer{ConnConfig: c.config(), PrivateData: data}
	if c.ud {
		u, err := d.DialUD(ctx, addr)
		if err != nil {
			return nil, err // not a nil *UDConn in an endpoint
		}
		return u, nil
	}
	rc, err := d.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	return rc, nil
}

// dialAsync is dial in the background.
func (c privateDataCase) dialAsync(ctx context.Context, addr string, data []byte) <-chan dialed {
	out := make(chan dialed, 1)
	go func() {
		e, err := c.dial(ctx, addr, data)
		out <- dialed{e, err}
	}()
	return out
}

// wire is how many bytes of private data each message carries on the
// wire, as the package documents it.
func (c privateDataCase) wire() (connect, accept, reject int) {
	switch {
	case c.d.iwarp:
		return rdmacm.MaxPrivateDataIWARP, rdmacm.MaxPrivateDataIWARP, rdmacm.MaxPrivateDataIWARP
	case c.ud:
		return rdmacm.MaxConnectDataUDP, rdmacm.MaxAcceptDataUDP, rdmacm.MaxRejectDataUDP
	}
	return rdmacm.MaxConnectDataTCP, rdmacm.MaxAcceptDataTCP, rdmacm.MaxRejectDataTCP
}

// header is what rdmago's header takes of every message.
func (c privateDataCase) header() int {
	if c.raw {
		return 0
	}
	return 4
}

func (c privateDataCase) transport() string {
	if c.d.iwarp {
		return "iWARP"
	}
	return "InfiniBand/RoCE"
}

// forEachPrivateDataCase runs f on RC over rxe and siw and on UD over rxe
// (siw has no UD), framed and raw.
func forEachPrivateDataCase(t *testing.T, f func(t *testing.T, c privateDataCase)) {
	for _, c := range []privateDataCase{{d: rxe(t)}, {d: rxe(t), ud: true}, {d: siw(t)}} {
		for _, raw := range []bool{false, true} {
			c.raw = raw
			t.Run(c.String(), func(t *testing.T) { f(t, c) })
		}
	}
}

// data is n recognizable bytes, none zero (padding would show).
func data(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = (seed+byte(i)*13)%255 + 1
	}
	return b
}

// refusal is how an error refusing private data must read: the step, the
// device and transport it names, and its hint.
type refusal struct {
	op, device, transport, hint string
}

// refusedAt is the refusal of a message on c's device.
func (c privateDataCase) refusedAt(op, hint string) refusal {
	return refusal{op, c.d.name, c.transport(), hint}
}

// requireTooLong checks that err refused n bytes of message msg, at most
// limit fitting, and says so as want.
func requireTooLong(t *testing.T, c privateDataCase, err error, want refusal, msg string, n, limit int) {
	t.Helper()
	require.ErrorIs(t, err, rdmacm.ErrPrivateDataTooLong)
	var pe *rdmacm.PrivateDataError
	require.ErrorAs(t, err, &pe)
	ps := rdmacm.PortSpaceTCP
	if c.ud {
		ps = rdmacm.PortSpaceUDP
	}
	assert.Equal(t, rdmacm.PrivateDataError{Message: msg, Transport: want.transport, PortSpace: ps, Len: n, Limit: limit,
		Header: c.header()}, withoutWhy(*pe))
	var oe *rdmacm.OpError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, want.op, oe.Op)
	assert.Equal(t, want.device, oe.Device)
	text := err.Error()
	for _, s := range []string{c.d.addr, want.device, want.hint,
		fmt.Sprintf("%d bytes of %s private data, at most %d fit on %s", n, msg, limit, want.transport)} {
		assert.Contains(t, text, s)
	}
	if c.raw {
		assert.NotContains(t, text, "rdmago's")
	} else {
		assert.Contains(t, text, "less rdmago's 4-byte header")
	}
}

// pending is the hint of a refused Accept or Reject.
const pending = "nothing was sent and the request is still pending"

// withoutWhy drops the unexported explanation, which the text checks see.
func withoutWhy(pe rdmacm.PrivateDataError) rdmacm.PrivateDataError {
	return rdmacm.PrivateDataError{Message: pe.Message, Transport: pe.Transport, PortSpace: pe.PortSpace, Len: pe.Len,
		Limit: pe.Limit, Header: pe.Header}
}

// requireNoRequest checks that no connect request reaches l for a while.
func requireNoRequest(t *testing.T, l anyListener) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	r, err := l.next(ctx)
	if err == nil {
		r.Reject(nil)
		t.Fatalf("a request with %d bytes of private data reached the listener", len(r.PrivateData))
	}
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

type dialed struct {
	c   endpoint // nil on failure
	err error
}

// dialAsync dials an RC listener at addr with d in the background.
func dialAsync(ctx context.Context, addr string, d *rdmacm.Dialer) <-chan dialed {
	out := make(chan dialed, 1)
	go func() {
		c, err := d.Dial(ctx, addr)
		if err != nil {
			out <- dialed{nil, err}
			return
		}
		out <- dialed{c, nil}
	}()
	return out
}

// A connect request takes its transport's limit, exactly as sent; one byte
// more is refused before anything is sent.
func TestPrivateDataConnectLimit(t *testing.T) {
	forEachPrivateDataCase(t, func(t *testing.T, c privateDataCase) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 30*time.Second)
		wire, _, _ := c.wire()
		limit := wire - c.header()
		l, addr := c.listen(t)

		// Dial refuses at once what no transport's connect request carries
		// (and PS_UDP's, which only InfiniBand and RoCE have), else once
		// the address is resolved to a device.
		want := c.refusedAt("connect", "nothing was sent")
		switch {
		case c.ud:
			want = refusal{"dial", "", "InfiniBand/RoCE", ""}
		case limit+1 > rdmacm.MaxPrivateDataIWARP-c.header():
			want = refusal{"dial", "", "any transport", "which one applies is known once the address is resolved"}
		}
		_, err := c.dial(ctx, addr, data(limit+1, 1))
		requireTooLong(t, c, err, want, "connect", limit+1, limit)
		requireNoRequest(t, l)

		sent := data(limit, 2)
		got := c.dialAsync(ctx, addr, sent)
		r, err := l.next(ctx)
		require.NoError(t, err)
		assert.Equal(t, sent, r.PrivateData, "the request carries exactly what was sent")
		s, err := r.Accept(ctx, nil)
		require.NoError(t, err)
		defer s.Close()
		assert.Equal(t, sent, s.PeerPrivateData())
		res := <-got
		require.NoError(t, res.err)
		res.c.Close()
	})
}

// An accept takes its transport's limit, exactly as sent. One byte more is
// refused before anything is sent, and the request is still pending: the
// next Accept answers it, and the dialer sees only that one's data.
func TestPrivateDataAcceptLimit(t *testing.T) {
	forEachPrivateDataCase(t, func(t *testing.T, c privateDataCase) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 30*time.Second)
		_, wire, _ := c.wire()
		limit := wire - c.header()
		l, addr := c.listen(t)
		got := c.dialAsync(ctx, addr, nil)
		r, err := l.next(ctx)
		require.NoError(t, err)

		_, err = r.Accept(ctx, data(limit+1, 3))
		requireTooLong(t, c, err, c.refusedAt("accept", pending), "accept", limit+1, limit)

		sent := data(limit, 4)
		s, err := r.Accept(ctx, sent)
		require.NoError(t, err, "the refused Accept left the request pending")
		defer s.Close()
		res := <-got
		require.NoError(t, res.err)
		defer res.c.Close()
		assert.Equal(t, sent, res.c.PeerPrivateData(), "the dialer gets exactly what the accept sent")
	})
}

// A reject takes its transport's limit, exactly as sent (on InfiniBand and
// RoCE less than an accept). One byte more is refused before anything is
// sent, and the request is still pending: the next Reject answers it, and
// the dialer sees only that one's data.
func TestPrivateDataRejectLimit(t *testing.T) {
	forEachPrivateDataCase(t, func(t *testing.T, c privateDataCase) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 30*time.Second)
		_, _, wire := c.wire()
		limit := wire - c.header()
		l, addr := c.listen(t)
		got := c.dialAsync(ctx, addr, nil)
		r, err := l.next(ctx)
		require.NoError(t, err)

		err = r.Reject(data(limit+1, 5))
		requireTooLong(t, c, err, c.refusedAt("reject", pending), "reject", limit+1, limit)

		sent := data(limit, 6)
		require.NoError(t, r.Reject(sent), "the refused Reject left the request pending")
		res := <-got
		if res.c != nil {
			res.c.Close()
		}
		require.ErrorIs(t, res.err, rdmacm.ErrRejected)
		var rej *rdmacm.RejectedError
		require.ErrorAs(t, res.err, &rej)
		assert.True(t, rej.ConsumerReject())
		assert.Equal(t, sent, rej.PrivateData, "the dialer gets exactly what the reject sent")
		assert.Contains(t, res.err.Error(), fmt.Sprintf("%d bytes of private data", limit))
	})
}

// A refused Reject or Accept leaves the request to the other, and what the
// dialer gets is what that one sent. An rdmago reject of 145 to 192 bytes
// on RoCE used to fail in the kernel and leave the dialer a reject with
// 148 bytes of private data nobody sent.
func TestRefusedReplyLeavesTheRequestPending(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 30*time.Second)
		l, addr := listen(t, d, nil)
		tooLong := data(rdmacm.MaxPrivateDataIWARP, 7) // fits no transport's reject or accept, header included

		// A reply too long for a reject, then an accept.
		got := dialAsync(ctx, addr, &rdmacm.Dialer{})
		r, err := l.Request(ctx)
		require.NoError(t, err)
		require.ErrorIs(t, r.Reject(tooLong), rdmacm.ErrPrivateDataTooLong)
		s, err := r.Accept(ctx, []byte("welcome"))
		require.NoError(t, err)
		defer s.Close()
		res := <-got
		require.NoError(t, res.err)
		defer res.c.Close()
		assert.Equal(t, []byte("welcome"), res.c.PeerPrivateData())

		// An accept too long, then a reject; the request cannot be
		// answered twice.
		got = dialAsync(ctx, addr, &rdmacm.Dialer{})
		r, err = l.Request(ctx)
		require.NoError(t, err)
		_, err = r.Accept(ctx, tooLong)
		require.ErrorIs(t, err, rdmacm.ErrPrivateDataTooLong)
		require.NoError(t, r.Reject([]byte("go away")))
		assert.ErrorIs(t, r.Reject(nil), rdmacm.ErrClosed)
		_, err = r.Accept(ctx, tooLong)
		assert.ErrorIs(t, err, rdmacm.ErrClosed, "a used request is closed, whatever the data")
		res = <-got
		var rej *rdmacm.RejectedError
		require.ErrorAs(t, res.err, &rej)
		assert.Equal(t, []byte("go away"), rej.PrivateData)
	})
}

// Listener.Accept sends ListenConfig.PrivateData: too much for every transport
// is refused at Listen; too much for the request's transport rejects the
// request (no one else would answer it) without data the application did
// not send.
func TestListenerPrivateDataTooLong(t *testing.T) {
	checkNoLeaks(t)
	ctx := ctxFor(t, 30*time.Second)
	d := rxe(t)
	_, err := (&rdmacm.ListenConfig{PrivateData: data(rdmacm.MaxPrivateDataIWARP-3, 8)}).Listen(ctx, d.at(port()))
	require.ErrorIs(t, err, rdmacm.ErrPrivateDataTooLong)
	assert.Contains(t, err.Error(), "ListenConfig.PrivateData")

	// On a wildcard address the transport is known request by request.
	addr := fmt.Sprintf("0.0.0.0:%d", port())
	l, err := (&rdmacm.ListenConfig{PrivateData: data(rdmacm.MaxAcceptDataTCP, 9)}).Listen(ctx, addr)
	require.NoError(t, err)
	defer l.Close()
	got := dialAsync(ctx, d.at(int(l.Addr().Port())), &rdmacm.Dialer{})
	_, err = l.Accept(ctx)
	c := privateDataCase{d: d}
	requireTooLong(t, c, err, c.refusedAt("accept", "the request was rejected"), "accept", rdmacm.MaxAcceptDataTCP, rdmacm.MaxAcceptDataTCP-4)
	res := <-got
	var rej *rdmacm.RejectedError
	require.ErrorAs(t, res.err, &rej)
	assert.Empty(t, rej.PrivateData)
	assert.NotContains(t, res.err.Error(), "private data")
}

// Rejects that carry no data claim none: the IB CM's own (no listener),
// a raw listener's refusal and its Reject(nil). On RoCE each arrives padded
// to 148 bytes of zeros, which the dialer used to report as "148 bytes of
// private data". (TestKernelAcceptLimit shows the kernel's reject after a
// failed accept.)
func TestRejectsWithoutDataClaimNone(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		for _, raw := range []bool{false, true} {
			t.Run(fmt.Sprintf("raw=%v", raw), func(t *testing.T) {
				checkNoLeaks(t)
				ctx := ctxFor(t, 30*time.Second)
				dl := &rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{RawPrivateData: raw}}
				check := func(err error) {
					t.Helper()
					var rej *rdmacm.RejectedError
					require.ErrorAs(t, err, &rej)
					assert.NotContains(t, err.Error(), "private data", "no one sent any")
					if raw {
						for _, b := range rej.PrivateData {
							require.Zero(t, b, "a raw dialer sees the field as it arrived: padding alone")
						}
					} else {
						assert.Empty(t, rej.PrivateData)
					}
				}
				_, err := dl.Dial(ctx, d.at(port()))
				check(err)

				// A raw listener whose backlog is full refuses without data.
				l, addr := listen(t, d, &rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{RawPrivateData: true}, Backlog: 1})
				first := dialAsync(ctx, addr, dl)
				r, err := l.Request(ctx) // the backlog is empty again...
				require.NoError(t, err)
				second := dialAsync(ctx, addr, dl)
				third := dialAsync(ctx, addr, dl) // ...and one of these finds it full
				var refused error
				select {
				case res := <-second:
					refused = res.err
					third, second = second, third
				case res := <-third:
					refused = res.err
				}
				check(refused)
				require.NoError(t, r.Reject(nil))
				check((<-first).err)
				r, err = l.Request(ctx)
				require.NoError(t, err)
				require.NoError(t, r.Reject(nil))
				if res := <-second; !errors.Is(res.err, rdmacm.ErrRejected) {
					t.Fatalf("the request left in the backlog: %v", res.err)
				}
			})
		}
	})
}

// rdmago's header is on by default and talking to C programs needs no
// setting: C ucmatose, which sends no private data and reads none, connects
// both ways, and rdmago sees no data from it (on RoCE the IB CM's padding
// used to show as 56 or 196 bytes).
func TestZeroConfigTalksToCUcmatose(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		ucmatose := func(t *testing.T, ctx context.Context, args ...string) (wait func() string) {
			cmd := exec.CommandContext(ctx, "ucmatose", append(args, "-C", "0", "-c", "1")...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Start())
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			t.Cleanup(func() {
				cmd.Process.Kill()
				<-done
			})
			return func() string {
				t.Helper()
				select {
				case err := <-done:
					done <- err
					require.NoError(t, err, "ucmatose %v:\n%s", args, out.String())
				case <-ctx.Done():
					t.Fatalf("ucmatose %v did not end:\n%s", args, out.String())
				}
				return out.String()
			}
		}
		t.Run("C server", func(t *testing.T) {
			checkNoLeaks(t)
			ctx := ctxFor(t, 30*time.Second)
			ap := netip.MustParseAddrPort(d.at(port()))
			wait := ucmatose(t, ctx, "-b", ap.Addr().String(), "-p", fmt.Sprint(ap.Port()))
			require.NoError(t, testbed.WaitListening(ctx, ap))
			c, err := (&rdmacm.Dialer{PrivateData: []byte("hello")}).Dial(ctx, ap.String())
			require.NoError(t, err)
			assert.Empty(t, c.PeerPrivateData(), "ucmatose accepts without data")
			require.NoError(t, c.Close())
			wait()
		})
		t.Run("C client", func(t *testing.T) {
			checkNoLeaks(t)
			ctx := ctxFor(t, 30*time.Second)
			l, addr := listen(t, d, nil)
			ap := netip.MustParseAddrPort(addr)
			wait := ucmatose(t, ctx, "-s", ap.Addr().String(), "-p", fmt.Sprint(ap.Port()))
			r, err := l.Request(ctx)
			require.NoError(t, err)
			assert.Empty(t, r.PrivateData, "ucmatose connects without data")
			c, err := r.Accept(ctx, []byte("hello"))
			require.NoError(t, err)
			require.NoError(t, c.Close()) // ucmatose's client waits for the server to disconnect
			wait()
		})
	})
}
