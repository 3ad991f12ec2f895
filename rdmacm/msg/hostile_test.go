package msg

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Zero takes the default; negative and huge sizes are refused before
// anything is made, by an error that names the field.
func TestHostileConfigSizesAreRefusedByName(t *testing.T) {
	for _, tc := range []struct {
		field string
		set   func(c *Config, v int)
		max   int
	}{
		{"MaxMessageSize", func(c *Config, v int) { c.MaxMessageSize = v }, maxMessageCap},
		{"Credits", func(c *Config, v int) { c.Credits = v }, maxCredits - 1},
		{"SendBuffers", func(c *Config, v int) { c.SendBuffers = v }, maxCredits},
	} {
		for _, v := range []int{-1, math.MinInt, tc.max + 1, math.MaxInt32 + 1, math.MaxInt} {
			var c Config
			tc.set(&c, v)
			_, err := c.resolve()
			assert.ErrorContains(t, err, "Config."+tc.field, "%d", v)
		}
		var c Config
		tc.set(&c, tc.max)
		_, err := c.resolve()
		assert.NoError(t, err, "%s %d is the largest taken", tc.field, tc.max)
	}
	for _, tc := range []struct {
		field string
		c     Config
	}{
		{"CloseTimeout", Config{CloseTimeout: math.MinInt64}},
		{"KeepAlive", Config{KeepAlive: -time.Nanosecond}},
		{"KeepAliveTimeout", Config{KeepAlive: time.Second, KeepAliveTimeout: math.MinInt64}},
	} {
		_, err := tc.c.resolve()
		assert.ErrorContains(t, err, "Config."+tc.field)
	}
	// A hello never announces more than a peer takes: the largest
	// configuration's passes the peer's check.
	o, err := (&Config{MaxMessageSize: maxMessageCap, Credits: maxCredits - 1, SendBuffers: maxCredits}).resolve()
	require.NoError(t, err)
	_, err = parseHello(o.hello().marshal())
	assert.NoError(t, err)
}

// Whatever a peer puts where its hello goes, parseHello returns an error
// or a hello within the bounds that size this side's buffers, and never
// reads past what arrived.
func FuzzParseHello(f *testing.F) {
	f.Add(hello{version: Version, replySlots: 4, credits: 33, maxMessage: 16384}.marshal())
	f.Add([]byte("rmsg"))
	f.Add([]byte{})
	f.Add(append([]byte("rmsg\x01\x00\xff\xff"), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if len(b) < helloSize || string(b[:4]) != "rmsg" || h.version != Version || b[5] != 0 {
			t.Fatalf("accepted %x as %+v", b, h)
		}
		if h.credits < 2 || h.credits > maxCredits || h.replySlots < 1 || h.replySlots > maxReplySlots ||
			h.maxMessage < 1 || h.maxMessage > maxMessageCap {
			t.Fatalf("accepted %x announcing %+v, out of bounds", b, h)
		}
		if h.replySlots != binary.BigEndian.Uint16(b[6:]) || h.credits != binary.BigEndian.Uint32(b[8:]) ||
			h.maxMessage != binary.BigEndian.Uint32(b[12:]) {
			t.Fatalf("%x read as %+v", b, h)
		}
	})
}
