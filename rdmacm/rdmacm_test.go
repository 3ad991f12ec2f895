package rdmacm

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/verbs"
)

func TestPrivateDataLimits(t *testing.T) {
	for _, tc := range []struct {
		ps   PortSpace
		kind messageKind
		raw  bool
		want int
	}{
		{PortSpaceTCP, msgConnect, true, 56}, {PortSpaceTCP, msgAccept, true, 196}, {PortSpaceTCP, msgReject, true, 196},
		{PortSpaceUDP, msgConnect, true, 180}, {PortSpaceUDP, msgAccept, true, 136},
		{PortSpaceTCP, msgConnect, false, 52}, {PortSpaceTCP, msgAccept, false, 192}, {PortSpaceUDP, msgConnect, false, 176},
	} {
		assert.Equal(t, tc.want, privateDataLimit(tc.ps, tc.kind, tc.raw), "%v %v raw=%v", tc.ps, tc.kind, tc.raw)
		_, err := encodePrivateData(tc.ps, tc.kind, tc.raw, 0, make([]byte, tc.want))
		assert.NoError(t, err)
		_, err = encodePrivateData(tc.ps, tc.kind, tc.raw, 0, make([]byte, tc.want+1))
		assert.ErrorIs(t, err, ErrPrivateDataTooLong)
	}
}

func TestPrivateDataRoundTrip(t *testing.T) {
	data := []byte("who goes there")
	wire, err := encodePrivateData(PortSpaceTCP, msgConnect, false, verbs.MTU4096, data)
	require.NoError(t, err)
	// The receiver sees the field padded to its full size.
	padded := append(wire, make([]byte, MaxConnectDataTCP-len(wire))...)
	got, mtu := decodePrivateData(padded, false)
	assert.Equal(t, data, got)
	assert.Equal(t, verbs.MTU4096, mtu)

	empty, err := encodePrivateData(PortSpaceTCP, msgAccept, false, verbs.MTU1024, nil)
	require.NoError(t, err)
	got, mtu = decodePrivateData(append(empty, 0, 0, 0), false)
	assert.Empty(t, got)
	assert.Equal(t, verbs.MTU1024, mtu)

	// A peer that is not rdmago: its bytes come through whole.
	foreign := []byte{1, 2, 3, 4, 5, 6}
	got, mtu = decodePrivateData(foreign, false)
	assert.Equal(t, foreign, got)
	assert.Zero(t, mtu)
	// A header whose length exceeds what arrived is not ours either.
	bogus := []byte{headerMagic, headerVersion, 200, 3, 9}
	got, _ = decodePrivateData(bogus, false)
	assert.Equal(t, bogus, got)
	// Raw mode never strips.
	got, _ = decodePrivateData(padded, true)
	assert.Equal(t, padded, got)
}

func FuzzDecodePrivateData(f *testing.F) {
	f.Add([]byte{headerMagic, headerVersion, 2, 3, 'h', 'i'})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		data, mtu := decodePrivateData(b, false)
		if len(data) > len(b) || (mtu != 0 && !mtu.Valid()) {
			t.Fatalf("decode(%x) = %x, %v", b, data, mtu)
		}
		if len(data) <= privateDataLimit(PortSpaceTCP, msgAccept, false) {
			wire, err := encodePrivateData(PortSpaceTCP, msgAccept, false, verbs.MTU2048, data)
			if err != nil {
				t.Fatal(err)
			}
			again, m := decodePrivateData(wire, false)
			if !bytes.Equal(again, data) || m != verbs.MTU2048 {
				t.Fatalf("round trip of %x gave %x, %v", data, again, m)
			}
		}
	})
}

func TestRefusalRoundTrip(t *testing.T) {
	for _, why := range []Refusal{RefusalBacklogFull, RefusalListenerClosed} {
		wire := encodeRefusal(why)
		assert.LessOrEqual(t, len(wire), privateDataLimit(PortSpaceUDP, msgReject, true), "fits every reject")
		padded := append(wire, make([]byte, 144)...) // as an IB CM REJ arrives
		assert.Equal(t, why, decodeRefusal(padded))
	}
	// An application's reject, a C peer's data, or a refusal this version
	// does not know, is no refusal.
	appReject, err := encodePrivateData(PortSpaceTCP, msgReject, false, 0, []byte{byte(RefusalBacklogFull)})
	require.NoError(t, err)
	for _, b := range [][]byte{appReject, nil, []byte("busy"), {headerMagic, refusalVersion, 99, 0}, {headerMagic, refusalVersion}} {
		assert.Equal(t, RefusalNone, decodeRefusal(b), "%x", b)
	}
}

func TestOptionsDefaultsAndChecks(t *testing.T) {
	o := (*Options)(nil).withDefaults()
	assert.Equal(t, verbs.QPTypeRC, o.QPType)
	assert.Equal(t, PortSpaceTCP, o.portSpace())
	assert.Equal(t, 2*time.Second, o.ResolveAddrTimeout)
	assert.Equal(t, 2*time.Second, o.ConnectTimeout)
	assert.Equal(t, defaultRetries, o.ResolveRetries)
	assert.Equal(t, uint32(16), o.Cap.MaxSendWR)
	assert.Equal(t, uint8(7), orSeven(o.RetryCount))
	assert.NoError(t, o.check())

	none := (&Options{ResolveRetries: -1, QPType: verbs.QPTypeUD}).withDefaults()
	assert.Zero(t, none.ResolveRetries)
	assert.Equal(t, PortSpaceUDP, none.portSpace())

	eight := uint8(8)
	for _, bad := range []Options{{QPType: verbs.QPTypeUC}, {RetryCount: &eight}, {ACKTimeout: 32}, {Mode: 7}} {
		b := bad.withDefaults()
		assert.Error(t, b.check(), "%+v", bad)
	}
}

func TestParseAddr(t *testing.T) {
	ap, err := parseAddr("10.0.0.1:7471")
	require.NoError(t, err)
	assert.Equal(t, netip.MustParseAddrPort("10.0.0.1:7471"), ap)
	ap, err = parseAddr("[fe80::1%eth0]:7471")
	require.NoError(t, err)
	assert.Equal(t, "eth0", ap.Addr().Zone())
	_, err = parseAddr("server.example:7471")
	assert.ErrorContains(t, err, "numeric host:port")
}

func TestErrors(t *testing.T) {
	rej := &OpError{Op: "connect", Local: netip.MustParseAddrPort("10.0.0.2:40000"), Remote: netip.MustParseAddrPort("10.0.0.1:7471"),
		Device: "rxe0", Port: 1, QPN: 0x11, Event: "REJECTED", Status: 28, Err: &RejectedError{Status: 28, PrivateData: []byte("busy")}}
	assert.ErrorIs(t, rej, ErrRejected)
	var re *RejectedError
	require.ErrorAs(t, rej, &re)
	assert.True(t, re.ConsumerReject())
	assert.Equal(t, []byte("busy"), re.PrivateData)
	msg := rej.Error()
	for _, want := range []string{"connect", "10.0.0.2:40000", "10.0.0.1:7471", "rxe0", "port 1", "QP 0x11", "REJECTED", "status 28", "rejected"} {
		assert.Contains(t, msg, want)
	}

	timeout := &OpError{Op: "resolve address", Kind: ErrAddrResolution, Err: syscall.ETIMEDOUT, Event: "ADDR_ERROR", Status: -110,
		Hint: hintFor(EventAddrError, -110, false)}
	assert.ErrorIs(t, timeout, ErrAddrResolution)
	assert.ErrorIs(t, timeout, syscall.ETIMEDOUT)
	assert.True(t, timeout.Timeout())
	assert.Contains(t, timeout.Error(), "neighbour")
	assert.False(t, (&OpError{Kind: ErrRejected}).Timeout())

	for status, meaning := range map[int]string{8: "no listener", 28: "application rejected", -111: "refused", -104: "MPA"} {
		assert.Contains(t, (&RejectedError{Status: status}).Error(), meaning)
	}
	assert.False(t, (&RejectedError{Status: 8}).ConsumerReject())
	assert.True(t, errors.Is(&RejectedError{}, ErrRejected))
	busy := &OpError{Op: "dial", Err: &RejectedError{Status: 28, Refusal: RefusalBacklogFull}, Hint: RefusalBacklogFull.hint()}
	assert.ErrorIs(t, busy, ErrBacklogFull)
	assert.ErrorIs(t, busy, ErrRejected)
	assert.Contains(t, busy.Error(), "backlog was full")
	assert.Contains(t, busy.Error(), "Options.Backlog")
	closed := &RejectedError{Status: -104, Refusal: RefusalListenerClosed}
	assert.NotErrorIs(t, closed, ErrBacklogFull)
	assert.Contains(t, closed.Error(), "listener closed")
	assert.NotErrorIs(t, &RejectedError{Status: 28}, ErrBacklogFull)
	assert.Contains(t, hintFor(EventAddrError, -19, false), "not on an RDMA netdev")
}

func TestConnectErrorHintNamesIWARPsFirstMessageRule(t *testing.T) {
	assert.Contains(t, hintFor(EventConnectError, -22, true), "dialing side must send first")
	other := hintFor(EventConnectError, -22, false)
	assert.Contains(t, other, "could not move the QP", "RoCE, or the accepting side")
	assert.NotContains(t, other, "send first")
	assert.Contains(t, hintFor(EventRejected, -104, true), "rejected the MPA request", "other events keep their hint")
}

func TestRetryable(t *testing.T) {
	assert.True(t, retryable(-int(syscall.ETIMEDOUT)))
	assert.False(t, retryable(-int(syscall.ENODEV)))
	assert.False(t, retryable(-int(syscall.ENETUNREACH)))
}

func TestEventNames(t *testing.T) {
	assert.Equal(t, "ADDR_RESOLVED", EventAddrResolved.String())
	assert.Equal(t, "TIMEWAIT_EXIT", EventTimewaitExit.String())
	assert.Equal(t, "EventType(99)", EventType(99).String())
	assert.Equal(t, "RDMA_PS_UDP", PortSpaceUDP.String())
	assert.Equal(t, "manual", ModeManual.String())
}

func TestRemoteBuffer(t *testing.T) {
	b := RemoteBuffer{Addr: 0x7f0000001000, RKey: 0xabcd, Len: 4096}
	got, err := ParseRemoteBuffer(b.Marshal())
	require.NoError(t, err)
	assert.Equal(t, b, got)
	_, err = ParseRemoteBuffer(make([]byte, 8))
	assert.Error(t, err)
}

func TestStepNames(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range Steps() {
		name := s.String()
		assert.NotContains(t, name, "Step(", "step %d has no name", int(s))
		assert.False(t, seen[name], "two steps are called %q", name)
		seen[name] = true
	}
	assert.Equal(t, "Step(99)", Step(99).String())
}

// An error of a call that wraps the connection's own error (Err) names the
// connection once, as the call's, and keeps the inner error's event and
// hint; an OpError of another place keeps its own prefix.
func TestOpErrorNamesItsConnectionOnce(t *testing.T) {
	local, remote := netip.MustParseAddrPort("10.0.0.2:40000"), netip.MustParseAddrPort("10.0.0.1:7471")
	conn := &OpError{Op: "connection", Local: local, Remote: remote, Device: "rxe0", Port: 1, QPN: 0x11,
		Kind: ErrDisconnected, Event: "DISCONNECTED", Hint: "the peer went away"}
	recv := &OpError{Op: "receive", Local: local, Remote: remote, Device: "rxe0", Port: 1, QPN: 0x11,
		Kind: conn, Err: &CompletionError{Status: verbs.WCWRFlushErr}}
	assert.Equal(t, "rdmacm: receive 10.0.0.2:40000 -> 10.0.0.1:7471 (device rxe0, port 1, QP 0x11): "+
		"disconnected [event DISCONNECTED, status 0]: completion status WR_FLUSH_ERR (vendor error 0x0): "+
		verbs.WCWRFlushErr.Hint()+"; the peer went away", recv.Error())
	assert.Equal(t, 1, strings.Count(recv.Error(), "rdmacm:"))
	assert.ErrorIs(t, recv, ErrDisconnected)

	// The inner step is named when it is not the connection itself.
	disc := &OpError{Op: "disconnect", Local: local, Remote: remote, Device: "rxe0", Port: 1, QPN: 0x11, Kind: ErrTimeout}
	outer := &OpError{Op: "close", Local: local, Remote: remote, Device: "rxe0", Port: 1, QPN: 0x11, Err: disc}
	assert.Equal(t, "rdmacm: close 10.0.0.2:40000 -> 10.0.0.1:7471 (device rxe0, port 1, QP 0x11): disconnect: timed out", outer.Error())

	// Another connection's error is quoted whole.
	other := &OpError{Op: "connection", Local: local, Remote: netip.MustParseAddrPort("10.0.0.3:7471"), Kind: ErrDisconnected}
	wrapped := &OpError{Op: "receive", Local: local, Remote: remote, Err: other}
	assert.Equal(t, "rdmacm: receive 10.0.0.2:40000 -> 10.0.0.1:7471: rdmacm: connection 10.0.0.2:40000 -> 10.0.0.3:7471: disconnected",
		wrapped.Error())
}
