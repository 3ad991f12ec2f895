package verbs

import (
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestACKTimeout(t *testing.T) {
	d, ok := ACKTimeout(14).Duration()
	require.True(t, ok)
	assert.Equal(t, 67108864*time.Nanosecond, d, "14 ≈ 67 ms")
	d, _ = ACKTimeout(1).Duration()
	assert.Equal(t, 8192*time.Nanosecond, d)
	d, _ = ACKTimeout(31).Duration()
	assert.InDelta(t, 8796.09, d.Seconds(), 0.01, "31 ≈ 8800 s")
	_, ok = ACKTimeoutInfinite.Duration()
	assert.False(t, ok, "0 is infinite")
	_, ok = ACKTimeout(32).Duration()
	assert.False(t, ok)
	assert.Contains(t, ACKTimeout(0).String(), "infinite")

	c, err := ACKTimeoutFor(67 * time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, ACKTimeout(14), c)
	c, err = ACKTimeoutFor(time.Nanosecond)
	require.NoError(t, err)
	assert.Equal(t, ACKTimeout(1), c)
	_, err = ACKTimeoutFor(0)
	assert.ErrorContains(t, err, "ACKTimeoutInfinite")
	_, err = ACKTimeoutFor(3 * time.Hour)
	assert.ErrorContains(t, err, "exceeds the largest code 31")
	for code := ACKTimeout(1); code <= MaxACKTimeout; code++ {
		d, _ := code.Duration()
		back, err := ACKTimeoutFor(d)
		require.NoError(t, err)
		assert.Equal(t, code, back, "round trip of %v", code)
	}
}

func TestRNRTimer(t *testing.T) {
	// The seed's table, in milliseconds.
	want := []float64{655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96,
		1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92, 122.88,
		163.84, 245.76, 327.68, 491.52}
	for code, ms := range want {
		d, ok := RNRTimer(code).Duration()
		require.True(t, ok)
		assert.InDelta(t, ms, float64(d)/float64(time.Millisecond), 1e-9, "code %d", code)
		back, err := RNRTimerFor(d)
		require.NoError(t, err)
		assert.Equal(t, RNRTimer(code), back, "round trip of code %d", code)
	}
	_, ok := RNRTimer(32).Duration()
	assert.False(t, ok)
	c, _ := RNRTimerFor(0)
	assert.Equal(t, RNRTimer(1), c, "the shortest delay is code 1, not 0")
	c, _ = RNRTimerFor(500 * time.Millisecond)
	assert.Equal(t, RNRTimer(0), c, "above 491.52 ms only code 0 (655.36 ms) is long enough")
	c, _ = RNRTimerFor(time.Millisecond)
	assert.Equal(t, RNRTimer(14), c, "1 ms rounds up to 1.28 ms")
	_, err := RNRTimerFor(time.Second)
	assert.Error(t, err)
	_, err = RNRTimerFor(-time.Second)
	assert.Error(t, err)
}

func validRTR() (*QPAttr, AttrMask) {
	a := &QPAttr{State: QPStateRTR, PathMTU: MTU1024, DestQPN: 0x12, RQPSN: 0xabc, MaxDestRdAtomic: 1, MinRNRTimer: 12,
		AH: AHAttr{IsGlobal: true, PortNum: 1, GRH: GlobalRoute{DGID: GIDFromIP(netip.MustParseAddr("10.0.0.2")), SGIDIndex: 1, HopLimit: 64}}}
	return a, AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer
}

func TestValidateAttrValues(t *testing.T) {
	a, m := validRTR()
	require.NoError(t, ValidateAttr(QPTypeRC, QPStateInit, QPStateRTR, a, m))

	cases := map[string]struct {
		edit func(*QPAttr)
		attr AttrMask
		says string
	}{
		"PSN over 24 bits":   {func(a *QPAttr) { a.RQPSN = 1 << 24 }, AttrRQPSN, "24 bits"},
		"QPN over 24 bits":   {func(a *QPAttr) { a.DestQPN = 1 << 24 }, AttrDestQPN, "24 bits"},
		"MTU 1500":           {func(a *QPAttr) { a.PathMTU = 1500 }, AttrPathMTU, "not a path MTU"},
		"RNR timer in ms":    {func(a *QPAttr) { a.MinRNRTimer = 100 }, AttrMinRNRTimer, "not milliseconds"},
		"SL over 4 bits":     {func(a *QPAttr) { a.AH.SL = 16 }, AttrAV, "4 bits"},
		"flow label 21 bits": {func(a *QPAttr) { a.AH.GRH.FlowLabel = 1 << 20 }, AttrAV, "20 bits"},
		"state mismatch":     {func(a *QPAttr) { a.State = QPStateRTS }, AttrState, "goes to RTR"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a, m := validRTR()
			tc.edit(a)
			err := ValidateAttr(QPTypeRC, QPStateInit, QPStateRTR, a, m)
			var ae *AttrError
			require.ErrorAs(t, err, &ae)
			require.Len(t, ae.Problems, 1)
			assert.Equal(t, tc.attr, ae.Problems[0].Attr)
			assert.Contains(t, err.Error(), tc.says)
		})
	}

	rts := &QPAttr{State: QPStateRTS, SQPSN: 1, Timeout: 32, RetryCount: 8, RNRRetry: 9, MaxRdAtomic: 1}
	err := ValidateAttr(QPTypeRC, QPStateRTR, QPStateRTS, rts,
		AttrState|AttrSQPSN|AttrTimeout|AttrRetryCount|AttrRNRRetry|AttrMaxQPRdAtomic)
	var ae *AttrError
	require.ErrorAs(t, err, &ae)
	assert.Len(t, ae.Problems, 3, "timeout, retry count and RNR retry are all reported: %v", err)

	init := &QPAttr{State: QPStateInit, PortNum: 0, AccessFlags: AccessRemoteWrite | AccessZeroBased | AccessHugeTLB}
	err = ValidateAttr(QPTypeRC, QPStateReset, QPStateInit, init, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags)
	assert.ErrorContains(t, err, "port numbers start at 1")
	assert.ErrorContains(t, err, "ZERO_BASED|HUGETLB are not QP access flags")

	// The flags an MR carries that rxe also takes on a QP (RXE_ACCESS_SUPPORTED_QP).
	init = &QPAttr{State: QPStateInit, PortNum: 1, AccessFlags: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead |
		AccessRemoteAtomic | AccessMWBind | AccessOnDemand | AccessFlushGlobal | AccessFlushPersistent | AccessRelaxedOrdering}
	assert.NoError(t, ValidateAttr(QPTypeRC, QPStateReset, QPStateInit, init, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags))
}

func TestValidateForPort(t *testing.T) {
	roce := PortInfo{Device: "rxe0", Port: 1, Transport: TransportIB,
		Attr: PortAttr{State: PortActive, LinkLayer: LinkLayerEthernet, ActiveMTU: MTU1024, MaxMTU: MTU4096, GIDTableLen: 16}}
	a, m := validRTR()
	require.NoError(t, ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m, roce))

	a.AH.IsGlobal = false
	err := ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m, roce)
	assert.ErrorContains(t, err, "RoCE needs a GRH")

	a, m = validRTR()
	a.AH.GRH.SGIDIndex = 16
	assert.ErrorContains(t, ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m, roce), "outside the port's table of 16")

	a, m = validRTR()
	a.PathMTU = MTU4096
	err = ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m, roce)
	assert.ErrorContains(t, err, "path MTU 4096 exceeds the port's active MTU 1024")

	a, m = validRTR()
	peer := roce
	peer.RemoteActiveMTU = MTU512
	assert.ErrorContains(t, ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m, peer), "peer's active MTU 512")

	ib := roce
	ib.Attr.LinkLayer = LinkLayerInfiniBand
	a, m = validRTR()
	a.AH.IsGlobal = false
	assert.NoError(t, ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m, ib), "IB within a subnet needs no GRH")

	// An InfiniBand port may demand a GRH too (IBV_QPF_GRH_REQUIRED).
	grh := ib
	grh.Attr.GRHRequired = true
	err = ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m, grh)
	assert.ErrorContains(t, err, "rxe0 port 1 requires a GRH on every address vector (its port flag GRH_REQUIRED")
	a, m = validRTR()
	assert.NoError(t, ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m, grh))

	// Ports the device lacks, each named with what carried it.
	two := ib
	two.PortCount = 2
	a, m = validRTR()
	a.AH.PortNum = 3
	err = ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m, two)
	assert.ErrorContains(t, err, "AH.PortNum 3: rxe0 has no such port (its ports are 1 to 2)")
	err = ValidateForPort(QPTypeRC, QPStateReset, QPStateInit, &QPAttr{State: QPStateInit, PortNum: 3},
		AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags, two)
	assert.ErrorContains(t, err, "PortNum 3: rxe0 has no such port")

	// The alternate path (InfiniBand): its port, P_Key index and GRH.
	alt := &QPAttr{AltAH: AHAttr{PortNum: 3}, AltPortNum: 3, AltPKeyIndex: 0, AltTimeout: 14}
	err = ValidateForPort(QPTypeRC, QPStateRTS, QPStateRTS, alt, AttrAltPath, two)
	assert.ErrorContains(t, err, "AltPortNum 3: rxe0 has no such port")
	alt.AltAH.PortNum, alt.AltPortNum = 2, 2
	require.NoError(t, ValidateForPort(QPTypeRC, QPStateRTS, QPStateRTS, alt, AttrAltPath, two))
	two.AltAttr = PortAttr{LinkLayer: LinkLayerInfiniBand, PKeyTableLen: 64, GRHRequired: true}
	alt.AltPKeyIndex = 64
	err = ValidateForPort(QPTypeRC, QPStateRTS, QPStateRTS, alt, AttrAltPath, two)
	assert.ErrorContains(t, err, "alternate P_Key index 64 is outside port 2's table of 64 entries")
	assert.ErrorContains(t, err, "alternate port 2 requires a GRH")
	alt.AltPKeyIndex, alt.AltAH.IsGlobal = 63, true
	assert.NoError(t, ValidateForPort(QPTypeRC, QPStateRTS, QPStateRTS, alt, AttrAltPath, two))
	two.AltAttr.LinkLayer = LinkLayerEthernet
	assert.ErrorContains(t, ValidateForPort(QPTypeRC, QPStateRTS, QPStateRTS, alt, AttrAltPath, two),
		"alternate port 2 is an Ethernet (RoCE) port")

	iwarp := PortInfo{Device: "siw0", Port: 1, Transport: TransportIWARP, Attr: PortAttr{LinkLayer: LinkLayerEthernet, ActiveMTU: MTU1024}}
	a, m = validRTR()
	err = ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m, iwarp)
	assert.ErrorIs(t, err, ErrIWARPManual)
	assert.ErrorContains(t, err, "siw0 port 1")
	assert.NoError(t, ValidateForPort(QPTypeRC, QPStateReset, QPStateInit,
		&QPAttr{State: QPStateInit, PortNum: 1}, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags, iwarp),
		"RESET→INIT is the user's on iWARP too")
	assert.NoError(t, ValidateForPort(QPTypeRC, QPStateRTS, QPStateErr, &QPAttr{State: QPStateErr}, AttrState, iwarp))
}

func TestQKeyHint(t *testing.T) {
	wrapped := fmt.Errorf("ibv_modify_qp: %w", syscall.EPERM)
	priv := &QPAttr{QKey: PrivilegedQKey | 7}
	assert.Contains(t, qkeyHint(wrapped, priv, AttrState|AttrQKey), "Q_Key 0x80000007 has bit 31 set")
	assert.Empty(t, qkeyHint(syscall.EINVAL, priv, AttrQKey), "another error")
	assert.Empty(t, qkeyHint(wrapped, &QPAttr{QKey: 7}, AttrQKey), "an unprivileged Q_Key")
	assert.Empty(t, qkeyHint(wrapped, priv, AttrState), "no Q_Key in the mask")
}

func TestWarnings(t *testing.T) {
	rts := &QPAttr{State: QPStateRTS, Timeout: 0, RetryCount: 0, RNRRetry: 0}
	w := Warnings(QPTypeRC, rts, AttrTimeout|AttrRetryCount|AttrRNRRetry)
	assert.Len(t, w, 3)
	assert.Contains(t, w[0], "stalls the QP forever")
	rts = &QPAttr{State: QPStateRTS, Timeout: 14, RetryCount: 7, RNRRetry: 7}
	assert.Empty(t, Warnings(QPTypeRC, rts, AttrTimeout|AttrRetryCount|AttrRNRRetry))
	assert.Empty(t, Warnings(QPTypeUD, &QPAttr{}, AttrTimeout))
	assert.Len(t, Warnings(QPTypeXRCSend, &QPAttr{}, AttrTimeout|AttrRetryCount), 2, "an XRC initiator retransmits as RC does")
}

// The seed's three example programs (RC, UC, UD to RTS), in Go.
func TestSeedExamples(t *testing.T) {
	remote := Remote{QPN: 0x1234, PSN: 0x5678, GID: GIDFromIP(netip.MustParseAddr("10.0.0.2"))}
	path := PathAttr{Global: true, SGIDIndex: 3, LocalActiveMTU: MTU1024}

	rc, err := QPSetup{Type: QPTypeRC, Port: 1, Access: AccessRemoteWrite | AccessRemoteRead, SQPSN: 0x42,
		Remote: remote, PathAttr: path}.Steps()
	require.NoError(t, err)
	require.Len(t, rc, 3)
	assert.Equal(t, "STATE|ACCESS_FLAGS|PKEY_INDEX|PORT", rc[0].Mask.String())
	assert.Equal(t, "STATE|AV|PATH_MTU|RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN", rc[1].Mask.String())
	assert.Equal(t, "STATE|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC|SQ_PSN", rc[2].Mask.String())
	assert.Equal(t, uint32(0x1234), rc[1].Attr.DestQPN)
	assert.Equal(t, uint32(0x5678), rc[1].Attr.RQPSN)
	assert.Equal(t, uint8(3), rc[1].Attr.AH.GRH.SGIDIndex)
	assert.True(t, rc[1].Attr.AH.IsGlobal)
	assert.Equal(t, MTU1024, rc[1].Attr.PathMTU)
	assert.Equal(t, ACKTimeout(14), rc[2].Attr.Timeout)
	assert.Equal(t, uint8(7), rc[2].Attr.RetryCount)
	assert.Equal(t, RNRRetryInfinite, rc[2].Attr.RNRRetry)
	assert.Equal(t, RNRTimer(12), rc[1].Attr.MinRNRTimer)
	assert.Empty(t, Warnings(QPTypeRC, &rc[2].Attr, rc[2].Mask), "the defaults are production settings")

	uc, err := QPSetup{Type: QPTypeUC, Port: 1, Access: AccessRemoteWrite, Remote: remote, PathAttr: path}.Steps()
	require.NoError(t, err)
	assert.Equal(t, "STATE|AV|PATH_MTU|RQ_PSN|DEST_QPN", uc[1].Mask.String())
	assert.Equal(t, "STATE|SQ_PSN", uc[2].Mask.String())

	ud, err := QPSetup{Type: QPTypeUD, Port: 1, QKey: 0x11111111}.Steps()
	require.NoError(t, err)
	assert.Equal(t, "STATE|PKEY_INDEX|PORT|QKEY", ud[0].Mask.String())
	assert.Equal(t, "STATE", ud[1].Mask.String())
	assert.Equal(t, "STATE|SQ_PSN", ud[2].Mask.String())

	// MTU: the smaller of both ends' active MTUs.
	withPeer := remote
	withPeer.ActiveMTU = MTU512
	rc, err = QPSetup{Type: QPTypeRC, Port: 1, Remote: withPeer, PathAttr: path}.Steps()
	require.NoError(t, err)
	assert.Equal(t, MTU512, rc[1].Attr.PathMTU)

	_, err = QPSetup{Type: QPTypeRC, Port: 1, Remote: remote}.Steps()
	assert.ErrorContains(t, err, "PathAttr.MTU")
	_, err = QPSetup{Type: QPTypeRC, Remote: remote, PathAttr: path}.Steps()
	assert.ErrorContains(t, err, "Port is required")
	_, err = QPSetup{Type: QPTypeRC, Port: 1, Remote: Remote{QPN: 1 << 24}, PathAttr: path}.Steps()
	assert.ErrorContains(t, err, "DEST_QPN")
}

// The kernel's bans on attribute values that the man page does not list
// (found on rxe by TestModifyModelAgreesWithKernel): each is refused in Go
// with an error that names the attribute and says the rule is the kernel's.
func TestKernelAttrBans(t *testing.T) {
	roce := PortInfo{Device: "rxe0", Port: 1, Transport: TransportIB,
		Attr: PortAttr{State: PortActive, LinkLayer: LinkLayerEthernet, ActiveMTU: MTU1024, MaxMTU: MTU4096, GIDTableLen: 16}}
	ib := roce
	ib.Attr.LinkLayer = LinkLayerInfiniBand
	iwarp := PortInfo{Device: "siw0", Port: 1, Transport: TransportIWARP, Attr: PortAttr{LinkLayer: LinkLayerEthernet, ActiveMTU: MTU1024}}
	problem := func(t *testing.T, err error, attr AttrMask, says string) {
		t.Helper()
		var ae *AttrError
		if assert.ErrorAs(t, err, &ae) && assert.Len(t, ae.Problems, 1, "%v", err) {
			assert.Equal(t, attr, ae.Problems[0].Attr)
			assert.Contains(t, err.Error(), says)
		}
	}

	// ALT_PATH: the core (_ib_modify_qp) refuses it unless both ports are InfiniBand.
	alt := &QPAttr{AltAH: AHAttr{PortNum: 1, IsGlobal: true}, AltPortNum: 1, AltTimeout: 14}
	require.NoError(t, ValidateForPort(QPTypeRC, QPStateRTS, QPStateRTS, alt, AttrAltPath, ib), "IB takes an alternate path")
	problem(t, ValidateForPort(QPTypeRC, QPStateRTS, QPStateRTS, alt, AttrAltPath, roce), AttrAltPath,
		"ALT_PATH: the kernel refuses alternate paths on RoCE")
	problem(t, ValidateForPort(QPTypeUC, QPStateRTS, QPStateRTS, alt, AttrAltPath, iwarp), AttrAltPath,
		"the kernel refuses alternate paths on iWARP")
	assert.NoError(t, ValidateAttr(QPTypeRC, QPStateRTS, QPStateRTS, alt, AttrAltPath), "without a port the kind is unknown")

	// The alternate path's two port numbers: uverbs wants them valid and equal.
	bad := *alt
	bad.AltPortNum = 0
	problem(t, ValidateForPort(QPTypeRC, QPStateRTS, QPStateRTS, &bad, AttrAltPath, ib), AttrAltPath, "the kernel wants both set to the same port")
	bad = *alt
	bad.AltAH.PortNum = 2
	problem(t, ValidateForPort(QPTypeRC, QPStateRTS, QPStateRTS, &bad, AttrAltPath, ib), AttrAltPath, "AltPortNum 1 and AltAH.PortNum 2")

	// The primary AV: a port, and into RTR the QP's own.
	a, m := validRTR()
	a.AH.PortNum = 0
	problem(t, ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m, roce), AttrAV, "AH.PortNum is 0: the kernel refuses")
	a, m = validRTR()
	a.AH.PortNum = 2
	problem(t, ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m, roce), AttrAV, "AH.PortNum 2 is not the QP's port 1")
	sqd := &QPAttr{PortNum: 2, AH: AHAttr{PortNum: 2}}
	assert.NoError(t, ValidateAttr(QPTypeRC, QPStateSQD, QPStateSQD, sqd, AttrAV|AttrPort),
		"in SQD an RC QP may move to another port with its AV")
	sqd.PortNum = 1
	problem(t, ValidateAttr(QPTypeRC, QPStateSQD, QPStateSQD, sqd, AttrAV|AttrPort), AttrAV, "AH.PortNum 2 differs from PortNum 1")

	// MaxRdAtomic above the device's limit: the driver refuses it (rxe_qp_chk_attr).
	rts := &QPAttr{State: QPStateRTS, MaxRdAtomic: 129, Timeout: 14, RetryCount: 7, RNRRetry: 7}
	rtsMask := AttrState | AttrSQPSN | AttrTimeout | AttrRetryCount | AttrRNRRetry | AttrMaxQPRdAtomic
	limited := roce
	limited.MaxRdAtomic = 128
	problem(t, ValidateForPort(QPTypeRC, QPStateRTR, QPStateRTS, rts, rtsMask, limited), AttrMaxQPRdAtomic,
		"129 exceeds the device's limit of 128")
	assert.NoError(t, ValidateForPort(QPTypeRC, QPStateRTR, QPStateRTS, rts, rtsMask, roce), "no limit known, no refusal")
	rts.MaxRdAtomic = 128
	assert.NoError(t, ValidateForPort(QPTypeRC, QPStateRTR, QPStateRTS, rts, rtsMask, limited), "the limit itself passes")

	// MaxDestRdAtomic against max_qp_init_rd_atom (mlx5, bnxt_re).
	a, m = validRTR()
	a.MaxDestRdAtomic = 17
	limited.MaxDestRdAtomic = 16
	problem(t, ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m|AttrMaxDestRdAtomic, limited), AttrMaxDestRdAtomic,
		"17 exceeds the device's limit of 16 (max_qp_init_rd_atom")
	assert.NoError(t, ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m|AttrMaxDestRdAtomic, roce), "no limit known")
	a.MaxDestRdAtomic = 16
	assert.NoError(t, ValidateForPort(QPTypeRC, QPStateInit, QPStateRTR, a, m|AttrMaxDestRdAtomic, limited))

	// A P_Key index outside the port's table.
	init := &QPAttr{State: QPStateInit, PKeyIndex: 1, PortNum: 1, AccessFlags: AccessRemoteWrite | AccessLocalWrite}
	initMask := AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags
	onePKey := roce
	onePKey.Attr.PKeyTableLen = 1
	problem(t, ValidateForPort(QPTypeRC, QPStateReset, QPStateInit, init, initMask, onePKey), AttrPKeyIndex,
		"P_Key index 1 is outside the port's table of 1 entries")
	init.PKeyIndex = 0
	assert.NoError(t, ValidateForPort(QPTypeRC, QPStateReset, QPStateInit, init, initMask, onePKey))
}
