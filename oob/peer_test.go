package oob

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/internal/cmbridge"
	"github.com/rdmago/rdmago/resolver"
	"github.com/rdmago/rdmago/verbs"
)

// testExchange is one side's exchange on a RoCE v2 path of rxe0 with a
// netdev of 1500 bytes, before any QP exists.
func testExchange(o *Config) *exchange {
	retry, _ := retries("RetryCount", o.RetryCount)
	rnr, _ := retries("RNRRetryCount", o.RNRRetryCount)
	return &exchange{o: o, retry: retry, rnrRetry: rnr, res: &cmbridge.RC{},
		path: &resolver.Path{Device: "rxe0", Port: 1, Kind: verbs.KindRoCE, GIDIndex: 1, GIDType: verbs.GIDTypeRoCEv2,
			PathMTU: verbs.MTU1024},
		local: netip.MustParseAddrPort("10.0.0.1:5000"), remote: netip.MustParseAddrPort("10.0.0.2:6000")}
}

// peerLine is what a working peer announces.
func peerLine() line {
	return line{Version: version, QPN: 0x12, PSN: 0x345, GID: netip.MustParseAddr("::ffff:10.0.0.2"),
		GIDType: verbs.GIDTypeRoCEv2, Family: "IPv4", MTU: verbs.MTU1024}
}

// A peer's QP data is checked before it reaches a modify, and the error
// says the peer sent it; a peer's failure is told as its own.
func TestCheckPeer(t *testing.T) {
	x := testExchange(&Config{})
	me := peerLine()
	p := peerLine()
	require.NoError(t, x.checkPeer(me, &p))
	for want, change := range map[string]func(l *line){
		"version 0 of the exchange, this side 1":                   func(l *line) { l.Version = 0 },
		"the peer sent QP number 0x1: QP numbers":                  func(l *line) { l.QPN = 1 },
		"the peer sent QP number 0x1000000":                        func(l *line) { l.QPN = 1 << 24 },
		"the peer sent PSN 0x1000000, more than 24":                func(l *line) { l.PSN = 1 << 24 },
		"the peer sent no MTU (0)":                                 func(l *line) { l.MTU = 0 },
		`the peer sent GID "invalid IP"`:                           func(l *line) { l.GID = netip.Addr{} },
		`the peer sent GID "::", not the GID of a unicast address`: func(l *line) { l.GID = netip.IPv6Unspecified() },
		`the peer sent GID "ff02::1"`:                              func(l *line) { l.GID = netip.MustParseAddr("ff02::1") },
		`the peer sent GID "::ffff:0.0.0.0"`:                       func(l *line) { l.GID = netip.MustParseAddr("::ffff:0.0.0.0") },
		`the peer sent GID "::ffff:127.0.0.1"`:                     func(l *line) { l.GID = netip.MustParseAddr("::ffff:127.0.0.1") },
		`the peer sent GID "::ffff:255.255.255.255"`:               func(l *line) { l.GID = netip.MustParseAddr("::ffff:255.255.255.255") },
		`the peer sent GID "::1"`:                                  func(l *line) { l.GID = netip.IPv6Loopback() },
		"GID types differ: RoCE v2 here, RoCE v1":                  func(l *line) { l.GIDType = verbs.GIDTypeRoCEv1 },
		"address families differ: IPv4 here, IPv6":                 func(l *line) { l.Family = "IPv6" },
		"the peer failed its side: no memory for QP":               func(l *line) { *l = line{Version: version, Error: "no memory for QP"} },
	} {
		p := peerLine()
		change(&p)
		err := x.checkPeer(me, &p)
		assert.ErrorContains(t, err, want)
		assert.ErrorContains(t, err, "10.0.0.1:5000 -> 10.0.0.2:6000 (device rxe0, port 1)", want)
	}
	p = line{Version: version, Error: "x"}
	assert.ErrorIs(t, x.checkPeer(me, &p), ErrPeerFailed)

	// A peer's text reaches the error without its control characters.
	p = line{Version: version, Error: "bad\x1b[2J\nline\u202e\u2028end"}
	err := x.checkPeer(me, &p)
	assert.ErrorContains(t, err, "bad [2J line  end")
	assert.NotContains(t, err.Error(), "\n")
}

// The modifies take the smaller side's MTU, the retry counts as configured
// ("none" is zero on the QP, not Steps' default of 7) and the read depths.
func TestSteps(t *testing.T) {
	port := verbs.PortAttr{ActiveMTU: verbs.MTU4096, State: verbs.PortActive}
	rts := func(o *Config, me, peer line) verbs.QPAttr {
		x := testExchange(o)
		steps, err := x.steps(port, me, &peer)
		require.NoError(t, err)
		require.Len(t, steps, 3)
		assert.Equal(t, min(me.MTU, peer.MTU), steps[1].Attr.PathMTU)
		assert.Equal(t, peer.QPN, steps[1].Attr.DestQPN)
		assert.Equal(t, peer.PSN, steps[1].Attr.RQPSN)
		assert.Equal(t, verbs.GID(peer.GID.As16()), steps[1].Attr.AH.GRH.DGID)
		assert.Equal(t, me.PSN, steps[2].Attr.SQPSN)
		return steps[2].Attr
	}
	me, peer := peerLine(), peerLine()
	me.MTU, peer.MTU = verbs.MTU1024, verbs.MTU512
	a := rts(&Config{}, me, peer)
	assert.Equal(t, uint8(7), a.RetryCount)
	assert.Equal(t, uint8(7), a.RNRRetry)
	assert.Equal(t, uint8(1), a.MaxRdAtomic)

	me.MTU, peer.MTU = verbs.MTU512, verbs.MTU1024
	a = rts(&Config{RetryCount: -1, RNRRetryCount: -1, InitiatorDepth: 4}, me, peer)
	assert.Equal(t, uint8(0), a.RetryCount, "RetryCount -1 is none")
	assert.Equal(t, uint8(0), a.RNRRetry, "RNRRetryCount -1 is none, not forever")
	assert.Equal(t, uint8(4), a.MaxRdAtomic)

	a = rts(&Config{RetryCount: 3, RNRRetryCount: 2}, me, peer)
	assert.Equal(t, uint8(3), a.RetryCount)
	assert.Equal(t, uint8(2), a.RNRRetry)

	// As the CM pairs them: no more reads out than the peer answers.
	peer.ResponderResources = 2
	a = rts(&Config{InitiatorDepth: 4}, me, peer)
	assert.Equal(t, uint8(2), a.MaxRdAtomic, "lowered to the peer's ResponderResources")
	a = rts(&Config{InitiatorDepth: 1}, me, peer)
	assert.Equal(t, uint8(1), a.MaxRdAtomic, "never raised")
	steps, err := testExchange(&Config{ResponderResources: 3}).steps(port, me, &peer)
	require.NoError(t, err)
	assert.Equal(t, uint8(3), steps[1].Attr.MaxDestRdAtomic, "this side's own ResponderResources")
	peer.InitiatorDepth = 2
	steps, err = testExchange(&Config{ResponderResources: 3}).steps(port, me, &peer)
	require.NoError(t, err)
	assert.Equal(t, uint8(2), steps[1].Attr.MaxDestRdAtomic, "lowered to the peer's InitiatorDepth")
	peer.InitiatorDepth = 0
	peer.ResponderResources = 0 // a peer older than the field: the depth as configured
	a = rts(&Config{InitiatorDepth: 4}, me, peer)
	assert.Equal(t, uint8(4), a.MaxRdAtomic)

	_, err = testExchange(&Config{ResponderResources: 256}).steps(port, me, &peer)
	assert.ErrorContains(t, err, "ResponderResources is a count of 1 to 255")
}
