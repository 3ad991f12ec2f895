package rdmacm

import (
	"bytes"
	"context"
	"math"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/verbs"
)

// Zero, negative and huge values of every size and duration a Dialer or a
// ListenConfig takes: zero is the default, and a value the library cannot
// use is refused before anything is made, by an error that names the
// field. A huge Backlog used to reach make(chan) (a crash: the process
// ran out of memory or panicked), and huge resolve timeouts and CQ sizes
// wrapped in C ints.
func TestHostileSizesAreRefusedByName(t *testing.T) {
	huge := []int{math.MaxInt32 + 1, 1 << 40, math.MaxInt}
	for _, v := range huge {
		_, err := (&ListenConfig{Backlog: v}).settings(verbs.QPTypeRC)
		assert.ErrorContains(t, err, "Backlog", "%d", v)
		_, err = (&Dialer{ConnConfig: ConnConfig{CQEntries: v}}).settings(verbs.QPTypeRC)
		assert.ErrorContains(t, err, "CQEntries", "%d", v)
		for _, name := range []string{"RetryCount", "RNRRetryCount", "ResponderResources", "InitiatorDepth"} {
			var c ConnConfig
			switch name {
			case "RetryCount":
				c.RetryCount = v
			case "RNRRetryCount":
				c.RNRRetryCount = v
			case "ResponderResources":
				c.ResponderResources = v
			case "InitiatorDepth":
				c.InitiatorDepth = v
			}
			_, err := (&Dialer{ConnConfig: c}).settings(verbs.QPTypeRC)
			assert.ErrorContains(t, err, name, "%d", v)
		}
	}
	l, err := (&ListenConfig{Backlog: maxBacklog}).settings(verbs.QPTypeRC)
	require.NoError(t, err)
	assert.Equal(t, maxBacklog, l.Backlog, "the largest Backlog is taken")
	_, err = (&ListenConfig{Backlog: maxBacklog + 1}).settings(verbs.QPTypeRC)
	assert.ErrorContains(t, err, "Backlog is 65537, more than 65536")
	_, err = (&Dialer{ConnConfig: ConnConfig{CQEntries: -5}}).settings(verbs.QPTypeRC)
	assert.ErrorContains(t, err, "CQEntries is -5")

	for _, d := range []time.Duration{maxCMTimeout + time.Millisecond, time.Duration(math.MaxInt64)} {
		_, err := (&Dialer{ResolveAddrTimeout: d}).settings(verbs.QPTypeRC)
		assert.ErrorContains(t, err, "ResolveAddrTimeout", "%v", d)
		_, err = (&Dialer{ResolveRouteTimeout: d}).settings(verbs.QPTypeRC)
		assert.ErrorContains(t, err, "ResolveRouteTimeout", "%v", d)
	}
	o, err := (&Dialer{ResolveAddrTimeout: maxCMTimeout}).settings(verbs.QPTypeRC)
	require.NoError(t, err)
	assert.Equal(t, maxCMTimeout, o.ResolveAddrTimeout, "the longest timeout the CM takes is taken")
	for _, d := range []time.Duration{-1, time.Duration(math.MinInt64)} {
		for _, c := range []ConnConfig{{ConnectTimeout: d}, {CloseTimeout: d}} {
			_, err := (&Dialer{ConnConfig: c}).settings(verbs.QPTypeRC)
			assert.ErrorContains(t, err, "Timeout is", "%+v", c)
		}
	}
	// Huge step timeouts that are only Go timers are taken.
	o, err = (&Dialer{ConnConfig: ConnConfig{ConnectTimeout: math.MaxInt64, CloseTimeout: math.MaxInt64}}).settings(verbs.QPTypeRC)
	require.NoError(t, err)
	assert.Equal(t, time.Duration(math.MaxInt64), o.ConnectTimeout)

	ms, err := timeoutMS(maxCMTimeout)
	require.NoError(t, err)
	assert.Equal(t, math.MaxInt32, ms)
	for _, d := range []time.Duration{-time.Millisecond, maxCMTimeout + time.Millisecond} {
		_, err := timeoutMS(d)
		assert.ErrorContains(t, err, "timeout", "%v", d)
	}
	// Rounded up: a positive timeout never becomes zero, no time at all.
	for d, want := range map[time.Duration]int{0: 0, time.Nanosecond: 1, 500 * time.Microsecond: 1, time.Millisecond: 1,
		1500 * time.Microsecond: 2, 2 * time.Second: 2000} {
		ms, err := timeoutMS(d)
		require.NoError(t, err)
		assert.Equal(t, want, ms, "%v", d)
	}
}

// What Dial, Listen and JoinMulticast refuse before they ask the kernel
// anything is an *OpError too, as their docs say, naming the operation.
func TestRefusedSettingsAndAddressesAreOpErrors(t *testing.T) {
	ctx := context.Background()
	var oe *OpError
	_, err := Dial(ctx, "localhost:7471")
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "dial", oe.Op)
	assert.ErrorContains(t, err, "want a numeric host:port")
	_, err = (&Dialer{ConnConfig: ConnConfig{RetryCount: 9}}).Dial(ctx, "10.0.0.1:7471")
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, netip.MustParseAddrPort("10.0.0.1:7471"), oe.Remote)
	assert.ErrorContains(t, err, "RetryCount is a 3-bit count")
	_, err = (&Dialer{ConnConfig: ConnConfig{ACKTimeout: 40}}).DialUD(ctx, "10.0.0.1:7471")
	require.ErrorAs(t, err, &oe)
	_, err = Listen("x")
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "listen", oe.Op)
	_, err = (&ListenConfig{Backlog: -1}).Listen(ctx, "10.0.0.1:7471")
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, netip.MustParseAddrPort("10.0.0.1:7471"), oe.Local)
	_, err = (&Dialer{ConnConfig: ConnConfig{Mode: 9}}).JoinMulticast(ctx, netip.MustParseAddr("239.0.0.1"))
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "join multicast", oe.Op)
	assert.Equal(t, "rdmacm: join multicast -> 239.0.0.1:0: unknown mode Mode(9)", err.Error())

	// NewID takes the port spaces this package knows.
	_, err = NewID(PortSpace(0x0002)) // RDMA_PS_IPOIB
	require.ErrorAs(t, err, &oe)
	assert.ErrorIs(t, err, syscall.EINVAL)
	assert.ErrorContains(t, err, "port space PortSpace(0x2): rdmacm takes RDMA_PS_TCP")
}

// Addresses that are not numeric host:port pairs are refused with the
// form wanted, never resolved or crashed on.
func TestHostileAddressesAreRefused(t *testing.T) {
	for _, s := range []string{"", ":", "10.0.0.1", "10.0.0.1:", "10.0.0.1:65536", "10.0.0.1:-1", "10.0.0.1:http",
		"[::1", "::1:7471", "10.0.0.256:1", "\x00:1", "localhost:7471", string(bytes.Repeat([]byte("9"), 4096))} {
		_, err := parseAddr(s)
		assert.ErrorContains(t, err, "want a numeric host:port", "%q", s)
	}
	_, err := sockaddrOf(netip.AddrPort{})
	assert.ErrorContains(t, err, "no address")
	_, err = sockaddrOf(netip.MustParseAddrPort("[fe80::1%no-such-interface-here]:1"))
	assert.Error(t, err, "an unknown zone")
}

// Whatever a peer puts in the private data of a request, an accept or a
// reject, a receiver decodes it without a panic and reports no more than
// arrived; an rdmago refusal is recognized only in its own exact form.
func FuzzReceivedPrivateData(f *testing.F) {
	f.Add(encodePrivateData(false, verbs.MTU1024, []byte("hi")), false, false, 28)
	f.Add(encodeRefusal(RefusalBacklogFull), false, true, rejectIWARPMPA)
	f.Add(append(encodeRefusal(RefusalListenerClosed), make([]byte, 144)...), true, false, rejectConsumer)
	f.Add([]byte{headerMagic, headerVersion, 255, 0}, false, false, 8)
	f.Add([]byte{headerMagic, refusalVersion, 0xff, 0}, false, false, 28)
	f.Add(make([]byte, MaxConnectDataTCP), false, false, 28)
	f.Fuzz(func(t *testing.T, b []byte, raw, iwarp bool, status int) {
		data, mtu := receivedData(b, raw, iwarp)
		if len(data) > len(b) || (mtu != 0 && !mtu.Valid()) {
			t.Fatalf("receivedData(%x) = %x, %v", b, data, mtu)
		}
		if raw && !bytes.Equal(data, b) {
			t.Fatalf("raw receivedData(%x) = %x, want it whole", b, data)
		}
		why := decodeRefusal(b)
		if why != RefusalNone && (len(b) < headerLen || b[1] != refusalVersion) {
			t.Fatalf("%x taken for refusal %v", b, why)
		}
		rdata, rwhy := rejectData(b, &RejectedError{Status: status}, iwarp, raw)
		if rwhy != why || (rwhy != RefusalNone && rdata != nil) || len(rdata) > len(b) {
			t.Fatalf("rejectData(%x) = %x, %v; decodeRefusal gave %v", b, rdata, rwhy, why)
		}
	})
}

// A peer's description of its buffer decodes to what it encoded, or to an
// error when it is short; longer input is read no further.
func FuzzParseRemoteBuffer(f *testing.F) {
	f.Add(RemoteBuffer{Addr: 1 << 40, RKey: 7, Len: 4096}.Marshal())
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		rb, err := ParseRemoteBuffer(b)
		if len(b) < RemoteBufferSize {
			if err == nil {
				t.Fatalf("%x: %d bytes taken for a buffer", b, len(b))
			}
			return
		}
		if err != nil || !bytes.Equal(rb.Marshal(), b[:RemoteBufferSize]) {
			t.Fatalf("%x decoded to %v, %v", b, rb, err)
		}
	})
}
