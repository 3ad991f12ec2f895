package rdmacm

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/verbs"
)

// The limits the kernel enforces (see privdata.go for the sources; the
// integration tests check each against the kernel on rxe and siw).
func TestPrivateDataLimits(t *testing.T) {
	for _, tc := range []struct {
		cm        cmKind
		ps        PortSpace
		kind      messageKind
		wire      int
		wireWords string // what the error says of the message
	}{
		{cmIB, PortSpaceTCP, msgConnect, 56, "IB CM REQ carries 92, of which rdma_cm's address header takes 36"},
		{cmIB, PortSpaceTCP, msgAccept, 196, "IB CM REP carries 196"},
		{cmIB, PortSpaceTCP, msgReject, 148, "IB CM REJ carries 148"},
		{cmIB, PortSpaceUDP, msgConnect, 180, "IB CM SIDR REQ carries 216, of which rdma_cm's address header takes 36"},
		{cmIB, PortSpaceUDP, msgAccept, 136, "IB CM SIDR REP carries 136"},
		{cmIB, PortSpaceUDP, msgReject, 136, "SIDR REP (status REJECT) carries 136"},
		{cmIWARP, PortSpaceTCP, msgConnect, 251, "MPA request carries 251"},
		{cmIWARP, PortSpaceTCP, msgAccept, 251, "MPA reply carries 251"},
		{cmIWARP, PortSpaceTCP, msgReject, 251, "MPA reject carries 251"},
		// Before address resolution: the most any transport carries.
		{cmUnknown, PortSpaceTCP, msgConnect, 251, "no transport carries more than iWARP's 251 (InfiniBand and RoCE: 56)"},
		{cmUnknown, PortSpaceTCP, msgAccept, 251, "InfiniBand and RoCE: 196"},
		{cmUnknown, PortSpaceUDP, msgConnect, 180, "SIDR REQ carries 216"}, // no UD on iWARP
	} {
		for _, raw := range []bool{true, false} {
			name := fmt.Sprintf("%v %v %v raw=%v", tc.cm, tc.ps, tc.kind, raw)
			want := tc.wire
			if !raw {
				want -= headerLen
			}
			assert.Equal(t, want, privateDataLimit(tc.cm, tc.ps, tc.kind, raw), name)
			assert.Nil(t, checkPrivateData(tc.cm, tc.ps, tc.kind, raw, make([]byte, want)), name)
			pe := checkPrivateData(tc.cm, tc.ps, tc.kind, raw, make([]byte, want+1))
			if !assert.NotNil(t, pe, name) {
				continue
			}
			var err error = pe
			assert.ErrorIs(t, err, ErrPrivateDataTooLong, name)
			transport := tc.cm.String()
			if tc.cm == cmUnknown && tc.ps == PortSpaceUDP {
				transport = "InfiniBand/RoCE" // the only one with UD
			}
			assert.Equal(t, PrivateDataError{Message: tc.kind.String(), Transport: transport, PortSpace: tc.ps,
				Len: want + 1, Limit: want, Header: tc.wire - want, why: pe.why}, *pe, name)
			msg := pe.Error()
			for _, w := range []string{fmt.Sprintf("%d bytes of %v private data, at most %d fit on %v (%v)", want+1, tc.kind, want, transport, tc.ps),
				tc.wireWords} {
				assert.Contains(t, msg, w, name)
			}
			if raw {
				assert.NotContains(t, msg, "rdmago's", name)
			} else {
				assert.Contains(t, msg, "less rdmago's 4-byte header (ConnConfig.RawPrivateData leaves it out)", name)
			}
		}
	}
	// The exported constants are the table's.
	assert.Equal(t, []int{56, 196, 148, 180, 136, 136, 251}, []int{MaxConnectDataTCP, MaxAcceptDataTCP, MaxRejectDataTCP,
		MaxConnectDataUDP, MaxAcceptDataUDP, MaxRejectDataUDP, MaxPrivateDataIWARP})
	// Every limit fits librdmacm's 8-bit lengths, header included.
	for _, n := range []int{MaxConnectDataTCP, MaxAcceptDataTCP, MaxRejectDataTCP, MaxConnectDataUDP, MaxAcceptDataUDP,
		MaxRejectDataUDP, MaxPrivateDataIWARP} {
		assert.LessOrEqual(t, n, 255)
	}
	assert.Equal(t, cmIWARP, cmKindOf(verbs.TransportIWARP))
	assert.Equal(t, cmIB, cmKindOf(verbs.TransportIB))
	assert.Equal(t, cmIB, cmKindOf(verbs.TransportUSNIC), "unknown transports get the smaller limits")
}

func TestPrivateDataRoundTrip(t *testing.T) {
	data := []byte("who goes there")
	wire := encodePrivateData(false, verbs.MTU4096, data)
	// The receiver sees the field padded to its full size.
	padded := append(wire, make([]byte, MaxConnectDataTCP-len(wire))...)
	got, mtu, framed := decodePrivateData(padded, false)
	assert.Equal(t, data, got)
	assert.Equal(t, verbs.MTU4096, mtu)
	assert.True(t, framed)

	got, mtu, framed = decodePrivateData(append(encodePrivateData(false, verbs.MTU1024, nil), 0, 0, 0), false)
	assert.Empty(t, got)
	assert.Equal(t, verbs.MTU1024, mtu)
	assert.True(t, framed)

	// A peer that is not rdmago: its bytes come through whole.
	for _, foreign := range [][]byte{
		{1, 2, 3, 4, 5, 6},
		{headerMagic, headerVersion, 200, 3, 9},      // a length past what arrived
		{headerMagic, headerVersion, 1, 3, 'x', 'y'}, // something other than padding after the data
		{headerMagic, headerVersion, 1, 9, 'x'},      // no MTU has code 9
	} {
		got, mtu, framed = decodePrivateData(foreign, false)
		assert.Equal(t, foreign, got)
		assert.Zero(t, mtu)
		assert.False(t, framed)
	}
	// Raw mode never strips.
	got, _, framed = decodePrivateData(padded, true)
	assert.Equal(t, padded, got)
	assert.False(t, framed)
	assert.Equal(t, data, encodePrivateData(true, verbs.MTU4096, data), "raw mode sends the data as it is")
}

func FuzzDecodePrivateData(f *testing.F) {
	f.Add([]byte{headerMagic, headerVersion, 2, 3, 'h', 'i'})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		data, mtu, framed := decodePrivateData(b, false)
		if len(data) > len(b) || (mtu != 0 && !mtu.Valid()) || (!framed && !bytes.Equal(data, b)) {
			t.Fatalf("decode(%x) = %x, %v, %v", b, data, mtu, framed)
		}
		if len(data) <= privateDataLimit(cmIWARP, PortSpaceTCP, msgAccept, false) {
			wire := encodePrivateData(false, verbs.MTU2048, data)
			again, m, framed := decodePrivateData(wire, false)
			if !bytes.Equal(again, data) || m != verbs.MTU2048 || !framed {
				t.Fatalf("round trip of %x gave %x, %v", data, again, m)
			}
		}
	})
}

func TestRefusalRoundTrip(t *testing.T) {
	for _, why := range []Refusal{RefusalBacklogFull, RefusalListenerClosed} {
		wire := encodeRefusal(why)
		assert.LessOrEqual(t, len(wire), privateDataLimit(cmIB, PortSpaceUDP, msgReject, true), "fits every reject")
		padded := append(wire, make([]byte, 144)...) // as an IB CM REJ arrives
		assert.Equal(t, why, decodeRefusal(padded))
	}
	// An application's reject, a C peer's data, or a refusal this version
	// does not know, is no refusal.
	appReject := encodePrivateData(false, 0, []byte{byte(RefusalBacklogFull)})
	for _, b := range [][]byte{appReject, nil, []byte("busy"), {headerMagic, refusalVersion, 99, 0}, {headerMagic, refusalVersion},
		{headerMagic, refusalVersion, byte(RefusalBacklogFull), 0, 'x'}} {
		assert.Equal(t, RefusalNone, decodeRefusal(b), "%x", b)
	}
}

// A receiver reports what the peer sent: the IB CM's padding alone, from a
// peer that sent nothing, is nothing.
func TestReceivedData(t *testing.T) {
	hello := encodePrivateData(false, verbs.MTU1024, []byte("hello"))
	for _, tc := range []struct {
		name       string
		b          []byte
		raw, iwarp bool
		want       []byte
		wantMTU    verbs.MTU
	}{
		{"framed, padded", append(hello, make([]byte, 20)...), false, false, []byte("hello"), verbs.MTU1024},
		{"framed, iWARP", hello, false, true, []byte("hello"), verbs.MTU1024},
		{"nothing sent, RoCE", make([]byte, MaxConnectDataTCP), false, false, nil, 0},
		{"nothing sent, RoCE, raw", make([]byte, MaxConnectDataTCP), true, false, make([]byte, MaxConnectDataTCP), 0},
		{"zeros sent, iWARP", make([]byte, 8), false, true, make([]byte, 8), 0},
		{"nothing sent, iWARP", nil, false, true, nil, 0},
		{"C peer's data", []byte("busy\x00\x00"), false, false, []byte("busy\x00\x00"), 0},
	} {
		got, mtu := receivedData(tc.b, tc.raw, tc.iwarp)
		assert.Equal(t, tc.want, got, tc.name)
		assert.Equal(t, tc.wantMTU, mtu, tc.name)
	}
}

// What a dialer reports of a reject's private data: exactly what the peer
// application sent, and nothing else.
func TestRejectData(t *testing.T) {
	pad := func(b []byte, n int) []byte { return append(append([]byte(nil), b...), make([]byte, n-len(b))...) }
	app := []byte("server full, try 10.0.0.9")
	framed := encodePrivateData(false, 0, app)
	consumer := &RejectedError{Status: rejectConsumer}
	for _, tc := range []struct {
		name        string
		b           []byte
		rej         *RejectedError
		iwarp, raw  bool
		want        []byte
		wantRefusal Refusal
	}{
		{"framed reject, RoCE", pad(framed, MaxRejectDataTCP), consumer, false, false, app, RefusalNone},
		{"framed reject, iWARP", framed, &RejectedError{Status: rejectIWARPMPA}, true, false, app, RefusalNone},
		{"framed reject, UD", pad(framed, MaxRejectDataUDP), &RejectedError{Status: sidrReject, ud: true}, false, false, app, RefusalNone},
		{"framed empty reject", pad(encodePrivateData(false, 0, nil), MaxRejectDataTCP), consumer, false, false, []byte{}, RefusalNone},
		// The IB CM's own reject (no listener): 148 bytes of padding.
		{"no listener", make([]byte, MaxRejectDataTCP), &RejectedError{Status: rejectNoListener}, false, false, nil, RefusalNone},
		{"no listener, raw dialer", make([]byte, MaxRejectDataTCP), &RejectedError{Status: rejectNoListener}, false, true, nil, RefusalNone},
		// A listener that rejected without data (a failed accept, the
		// kernel's reject after a failed rdma_accept).
		{"reject without data", make([]byte, MaxRejectDataTCP), consumer, false, false, nil, RefusalNone},
		{"UD reject without data", make([]byte, MaxRejectDataUDP), &RejectedError{Status: sidrReject, ud: true}, false, false, nil, RefusalNone},
		{"iWARP reject without data", nil, &RejectedError{Status: rejectIWARPMPA}, true, false, nil, RefusalNone},
		// A raw dialer gets the field as it arrived.
		{"raw dialer", pad(app, MaxRejectDataTCP), consumer, false, true, pad(app, MaxRejectDataTCP), RefusalNone},
		{"C peer's data", pad([]byte("busy"), MaxRejectDataTCP), consumer, false, false, pad([]byte("busy"), MaxRejectDataTCP), RefusalNone},
		// An rdmago listener's own refusal, raw dialer or not.
		{"refusal", pad(encodeRefusal(RefusalBacklogFull), MaxRejectDataTCP), consumer, false, false, nil, RefusalBacklogFull},
		{"refusal, raw dialer", pad(encodeRefusal(RefusalBacklogFull), MaxRejectDataTCP), consumer, false, true, nil, RefusalBacklogFull},
		{"refusal, iWARP", encodeRefusal(RefusalListenerClosed), &RejectedError{Status: rejectIWARPMPA}, true, false, nil, RefusalListenerClosed},
	} {
		data, why := rejectData(tc.b, tc.rej, tc.iwarp, tc.raw)
		assert.Equal(t, tc.want, data, tc.name)
		assert.Equal(t, tc.wantRefusal, why, tc.name)
	}
}

func TestRejectedErrorText(t *testing.T) {
	// A raw dialer's padded reject without data claims no private data.
	// Reason 28 without data is also what the peer's CM sends when the
	// port has a listener but not for the address dialed, or when an id
	// is destroyed in the middle of the handshake.
	e := &RejectedError{Status: rejectConsumer, PrivateData: make([]byte, MaxRejectDataTCP)}
	assert.Equal(t, "rejected with status 28 (the peer application rejected the request, or the peer's CM did "+
		"without data: no listener for that address (one on the port bound to another), or the peer's id "+
		"destroyed mid-handshake)", e.Error())
	e.PrivateData = []byte("no")
	assert.Equal(t, "rejected with status 28 (the peer application rejected the request), 2 bytes of private data", e.Error())
	e = &RejectedError{Status: rejectNoListener}
	assert.Equal(t, "rejected with status 8 (no listener on that address and port)", e.Error())
	e = &RejectedError{Status: sidrReject, ud: true}
	assert.Equal(t, "rejected with status 2 (UD: the peer rejected the service ID request, or its rdma_cm found "+
		"no listener for that address (one on the port bound to another))", e.Error())
	assert.True(t, e.ConsumerReject())
	assert.False(t, (&RejectedError{Status: sidrReject}).ConsumerReject(), "status 2 of a REJ is no consumer reject")
	e = &RejectedError{Status: sidrNoListener, ud: true}
	assert.Equal(t, "rejected with status 1 (UD: no listener on that address and port at the peer "+
		"(SIDR status 1, service ID unsupported))", e.Error())
	assert.False(t, e.ConsumerReject())
}

// UD's UNREACHABLE with a positive status is the peer's SIDR answer, not a
// timeout: a rejection, saying which; librdmacm's own CONNECT_ERROR (-1) is
// not EPERM.
func TestEventErrKinds(t *testing.T) {
	noListener := (&Event{Type: EventUnreachable, Status: sidrNoListener, UD: true}).Err()
	assert.ErrorIs(t, noListener, ErrRejected)
	assert.NotErrorIs(t, noListener, ErrUnreachable)
	assert.ErrorContains(t, noListener, "no listener on that address and port at the peer")
	assert.NotContains(t, noListener.Error(), "timed out")

	timeout := (&Event{Type: EventUnreachable, Status: -int(syscall.ETIMEDOUT), UD: true}).Err()
	assert.ErrorIs(t, timeout, ErrUnreachable)
	assert.ErrorIs(t, timeout, syscall.ETIMEDOUT)
	assert.ErrorContains(t, timeout, "timed out")

	connErr := (&Event{Type: EventConnectError, Status: -1}).Err()
	assert.ErrorIs(t, connErr, ErrConnect)
	assert.NotErrorIs(t, connErr, syscall.EPERM)
	assert.ErrorContains(t, connErr, "librdmacm could not act on the peer's reply")
	assert.ErrorIs(t, (&Event{Type: EventConnectError, Status: -int(syscall.ENOMEM)}).Err(), syscall.ENOMEM)
}

// The zero configs are ready to use, and every field follows one
// convention: zero is the default, a negative count is none.
func TestConfigDefaultsAndChecks(t *testing.T) {
	o, err := (*Dialer)(nil).settings(verbs.QPTypeRC)
	require.NoError(t, err)
	assert.Equal(t, PortSpaceTCP, o.portSpace())
	assert.Equal(t, 2*time.Second, o.ResolveAddrTimeout)
	assert.Equal(t, 2*time.Second, o.ResolveRouteTimeout)
	assert.Equal(t, 2*time.Second, o.ConnectTimeout)
	assert.Equal(t, 2*time.Second, o.CloseTimeout)
	assert.Equal(t, defaultRetries, o.ResolveRetries)
	assert.Equal(t, verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}, o.Cap)
	assert.Equal(t, uint8(7), o.RetryCount)
	assert.Equal(t, uint8(7), o.RNRRetryCount)
	assert.Equal(t, -1, o.ResponderResources, "zero leaves the device's maximum")
	assert.Equal(t, -1, o.InitiatorDepth)

	none, err := (&Dialer{ResolveRetries: -1, ConnConfig: ConnConfig{RetryCount: -1, RNRRetryCount: -3,
		ResponderResources: -1, InitiatorDepth: -1}}).settings(verbs.QPTypeUD)
	require.NoError(t, err)
	assert.Zero(t, none.ResolveRetries)
	assert.Zero(t, none.RetryCount)
	assert.Zero(t, none.RNRRetryCount)
	assert.Zero(t, none.ResponderResources)
	assert.Zero(t, none.InitiatorDepth)
	assert.Equal(t, PortSpaceUDP, none.portSpace())

	set, err := (&Dialer{ResolveRetries: 5, ConnConfig: ConnConfig{RetryCount: 3, ResponderResources: 4,
		ConnectTimeout: time.Second}}).settings(verbs.QPTypeRC)
	require.NoError(t, err)
	assert.Equal(t, 5, set.ResolveRetries)
	assert.Equal(t, uint8(3), set.RetryCount)
	assert.Equal(t, 4, set.ResponderResources)
	assert.Equal(t, time.Second, set.ConnectTimeout)

	l, err := (*ListenConfig)(nil).settings(verbs.QPTypeRC)
	require.NoError(t, err)
	assert.Equal(t, defaultBacklog, l.Backlog)

	for _, bad := range []ConnConfig{{RetryCount: 8}, {RNRRetryCount: 8}, {ACKTimeout: 32}, {Mode: 7},
		{ResponderResources: 256}, {ConnectTimeout: -time.Second}, {CQEntries: -1}} {
		_, err := (&Dialer{ConnConfig: bad}).settings(verbs.QPTypeRC)
		assert.Error(t, err, "%+v", bad)
	}
	_, err = (&Dialer{ResolveAddrTimeout: -1}).settings(verbs.QPTypeRC)
	assert.ErrorContains(t, err, "ResolveAddrTimeout")
	_, err = (&ListenConfig{Backlog: -1}).settings(verbs.QPTypeRC)
	assert.ErrorContains(t, err, "Backlog")
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
	assert.Contains(t, busy.Error(), "ListenConfig.Backlog")
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
		Kind: conn, Err: &verbs.CompletionError{WC: verbs.WorkCompletion{ID: 7, QPN: 0x11, Status: verbs.WCWRFlushErr}}}
	assert.Equal(t, "rdmacm: receive 10.0.0.2:40000 -> 10.0.0.1:7471 (device rxe0, port 1, QP 0x11): "+
		"disconnected [event DISCONNECTED, status 0]: verbs: work request 7 on QP 0x11 completed with WR_FLUSH_ERR (vendor error 0x0): "+
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
