package msg

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
)

func frame(h header, payload []byte) []byte {
	h.length = uint32(len(payload))
	b := make([]byte, HeaderSize+len(payload))
	h.put(b)
	copy(b[HeaderSize:], payload)
	return b
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []header{
		{typ: frameData, flags: flagSlot, grant: 0xfffffffe},
		{typ: frameHello, grant: 32},
		{typ: frameCredit, grant: 7},
		{typ: frameFin, flags: flagSlot, grant: 1},
	} {
		var payload []byte
		if h.typ == frameData {
			payload = []byte("a message")
		}
		b := frame(h, payload)
		assert.Equal(t, []byte{0x6d, 1, byte(h.typ), h.flags}, b[:4], "magic, version, type, flags")
		assert.Equal(t, h.grant, binary.BigEndian.Uint32(b[4:]), "grant, big-endian")
		got, p, err := decodeFrame(b, 64)
		require.NoError(t, err)
		h.length = uint32(len(payload))
		assert.Equal(t, h, got)
		assert.Equal(t, string(payload), string(p))
	}
}

// Every way a frame can be wrong is refused with an error naming it.
func TestDecodeFrameRefuses(t *testing.T) {
	good := frame(header{typ: frameData, grant: 3}, []byte("0123456789"))
	mod := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for _, tc := range []struct {
		name, want string
		b          []byte
		max        int
	}{
		{"short", "shorter than the 12-byte header", good[:11], 64},
		{"empty", "a 0-byte frame", nil, 64},
		{"magic", "magic byte 0x6d (got 0x00)", mod(func(b []byte) []byte { b[0] = 0; return b }), 64},
		{"version", "version 2 (this side speaks 1)", mod(func(b []byte) []byte { b[1] = 2; return b }), 64},
		{"type", "unknown type 9", mod(func(b []byte) []byte { b[2] = 9; return b }), 64},
		{"flags", "unknown flags 0x82", mod(func(b []byte) []byte { b[3] = 0x82; return b }), 64},
		{"length", "header says 11 bytes of payload, with 10", mod(func(b []byte) []byte { b[11] = 11; return b }), 64},
		{"truncated", "header says 10 bytes of payload, with 9", good[:len(good)-1], 64},
		{"too large", "a 10-byte message, larger than the 9 bytes agreed", good, 9},
		{"credit with payload", "a CREDIT frame with 10 bytes of payload", mod(func(b []byte) []byte { b[2] = byte(frameCredit); return b }), 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := decodeFrame(tc.b, tc.max)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestHello(t *testing.T) {
	h := hello{version: Version, replySlots: 4, credits: 32, maxMessage: 16384}
	b := h.marshal()
	require.Len(t, b, helloSize)
	assert.LessOrEqual(t, len(b), 52, "fits a RoCE connect request after rdmago's header")
	assert.Equal(t, "rmsg", string(b[:4]))
	got, err := parseHello(append(b, 1, 2, 3)) // later versions may add fields
	require.NoError(t, err)
	assert.Equal(t, h, got)

	// The probes' memory follows: key and address, as the peer's probes
	// need them; a hello without (an older rdmago) has probe false.
	bp := h.marshalProbe()
	require.Len(t, bp, helloProbeSize)
	assert.LessOrEqual(t, len(bp), 52, "fits a RoCE connect request after rdmago's header")
	putProbe(bp, 0x1234abcd, 0x7f0011223344)
	got, err = parseHello(bp)
	require.NoError(t, err)
	want := h
	want.probe, want.probeKey, want.probeAddr = true, 0x1234abcd, 0x7f0011223344
	assert.Equal(t, want, got)

	for _, tc := range []struct {
		name, want string
		f          func(b []byte) []byte
	}{
		{"none", "no rdmago message hello in the 0 bytes", func([]byte) []byte { return nil }},
		{"short", "no rdmago message hello in the 15 bytes", func(b []byte) []byte { return b[:15] }},
		{"magic", "no rdmago message hello", func(b []byte) []byte { b[0] = 'x'; return b }},
		{"version", "the peer speaks version 9 of the message protocol, this side 1", func(b []byte) []byte { b[4] = 9; return b }},
		{"flags", "unknown flags 0x01", func(b []byte) []byte { b[5] = 1; return b }},
		{"no credits", "announcing 0 credits", func(b []byte) []byte { binary.BigEndian.PutUint32(b[8:], 0); return b }},
		{"no slots", "announcing 0 reply slots", func(b []byte) []byte { binary.BigEndian.PutUint16(b[6:], 0); return b }},
		{"no size", "a 0-byte maximum message", func(b []byte) []byte { binary.BigEndian.PutUint32(b[12:], 0); return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseHello(tc.f(h.marshal()))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestConfigDefaultsAndLimits(t *testing.T) {
	o, err := (*Config)(nil).resolve()
	require.NoError(t, err)
	assert.Equal(t, 16<<10, o.MaxMessageSize)
	assert.Equal(t, 32, o.Credits)
	assert.Equal(t, 32, o.SendBuffers)
	c := o.qpCap()
	assert.EqualValues(t, 32+1+replySlots, c.MaxRecvWR, "a receive for every credit, FIN's and every reply slot")
	assert.EqualValues(t, 33, o.hello().credits, "the hello counts FIN's buffer")
	assert.EqualValues(t, 32+replySlots+1, c.MaxSendWR, "a send for every buffer, CREDIT frame and the keepalive probe")
	assert.Zero(t, o.KeepAlive, "no probes by default")
	for _, bad := range []Config{{MaxMessageSize: -1}, {Credits: maxCredits}, {SendBuffers: -2}, {CloseTimeout: -1},
		{KeepAlive: -1}, {KeepAlive: time.Second, KeepAliveTimeout: -1}, {KeepAliveTimeout: time.Second}} {
		_, err := bad.resolve()
		assert.Error(t, err, "%+v", bad)
	}
	o, err = (&Config{KeepAlive: 3 * time.Second}).resolve()
	require.NoError(t, err)
	assert.Equal(t, 3*time.Second, o.KeepAliveTimeout, "the answer's wait defaults to the period")
	assert.Error(t, checkKeepalive(&o, &rdmacm.ConnConfig{InitiatorDepth: -1}), "a probe needs a READ")
	assert.NoError(t, checkKeepalive(&o, &rdmacm.ConnConfig{}))
	assert.Equal(t, 0, slotSize(100)%slotAlign)
	assert.GreaterOrEqual(t, slotSize(100), HeaderSize+100)
}

// FuzzDecodeFrame: whatever a peer sends, the decoder returns an error or a
// frame whose payload is exactly what the header says and fits the limit.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(frame(header{typ: frameData, flags: flagSlot, grant: 5}, []byte("payload")), 16)
	f.Add(frame(header{typ: frameCredit, grant: 9}, nil), 0)
	f.Add([]byte{0x6d, 1, 2, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff}, 100)
	f.Add([]byte("garbage, not a frame"), 64)
	f.Fuzz(func(t *testing.T, b []byte, max int) {
		h, p, err := decodeFrame(b, max)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if len(b) < HeaderSize || int(h.length) != len(p) || len(p) > max || len(p) != len(b)-HeaderSize {
			t.Fatalf("accepted %x as %+v with %d bytes of payload (max %d)", b, h, len(p), max)
		}
		if h.typ != frameData && len(p) != 0 {
			t.Fatalf("a %v frame with a payload", h.typ)
		}
		if !bytes.Equal(frame(h, p), b) {
			t.Fatalf("%x does not encode back the same", b)
		}
	})
}

// An error names the operation and the addresses it has, once: a dial
// that has no local address yet says only where it went.
func TestOpErrorNamesItsAddresses(t *testing.T) {
	local, remote := netip.MustParseAddrPort("10.0.0.2:40000"), netip.MustParseAddrPort("10.0.0.1:7471")
	cause := errors.New("refused")
	assert.Equal(t, "msg: dial to 10.0.0.1:7471: refused", (&OpError{Op: "dial", Remote: remote, Err: cause}).Error())
	assert.Equal(t, "msg: send 10.0.0.2:40000 -> 10.0.0.1:7471: refused", (&OpError{Op: "send", Local: local, Remote: remote, Err: cause}).Error())
	assert.Equal(t, "msg: listen on 10.0.0.2:40000: refused", (&OpError{Op: "listen", Local: local, Err: cause}).Error())
	assert.Equal(t, "msg: close: refused", (&OpError{Op: "close", Err: cause}).Error())
	assert.ErrorIs(t, &OpError{Op: "dial", Err: cause}, cause)
}

// A call that ran out of time says so as a net.Error does, also wrapped in
// a net.OpError by package stream's dialer.
func TestOpErrorTimeout(t *testing.T) {
	assert.True(t, (&OpError{Op: "dial", Err: context.DeadlineExceeded}).Timeout())
	assert.True(t, (&OpError{Op: "send", Err: fmt.Errorf("waiting: %w", os.ErrDeadlineExceeded)}).Timeout())
	assert.False(t, (&OpError{Op: "dial", Err: context.Canceled}).Timeout())
	var ne net.Error = &net.OpError{Op: "dial", Net: "rdma", Err: &OpError{Op: "dial", Err: context.DeadlineExceeded}}
	assert.True(t, ne.Timeout())
}
