//go:build integration

package verbs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

// checkNoLeaks is every package's leak check: RDMA objects, descriptors
// (devices, completion channels) and goroutines (the event readers).
func checkNoLeaks(t *testing.T) { testbed.CheckNoLeaks(t) }

// endpointQP is one side of a hand-connected pair.
type endpointQP struct {
	qp *verbs.QP
	cq *verbs.CQ
	mr *verbs.MR
}

func gidIndexFor(t *testing.T, dev *verbs.Device, addr, netdev string) int {
	t.Helper()
	ifc, err := net.InterfaceByName(netdev)
	require.NoError(t, err)
	table, err := dev.GIDTable()
	require.NoError(t, err)
	want := verbs.GIDFromIP(netip.MustParseAddr(addr))
	for _, e := range table {
		if e.GID == want && e.NetdevIndex == ifc.Index && e.Type == verbs.GIDTypeRoCEv2 {
			return e.Index
		}
	}
	t.Fatalf("no RoCE v2 GID for %s on %s", addr, netdev)
	return -1
}

func newEndpoint(t *testing.T, dev *verbs.Device, pd *verbs.PD, qpType verbs.QPType) *endpointQP {
	t.Helper()
	cq, err := dev.CreateCQ(64)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cq.Close()) })
	mr, err := pd.RegisterMemory(1<<16, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, mr.Close()) })
	qp, err := pd.CreateQP(verbs.QPInit{Type: qpType, SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, qp.Close()) })
	return &endpointQP{qp: qp, cq: cq, mr: mr}
}

// waitWC polls (and waits through the completion channel) for one completion.
func waitWC(t *testing.T, cq *verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wcs := make([]verbs.WorkCompletion, 1)
	_, err := cq.PollWait(ctx, wcs)
	require.NoError(t, err, "no completion within 10 s")
	require.NoError(t, wcs[0].Err())
	return wcs[0]
}

func TestRCByHandOnRXE(t *testing.T) {
	checkNoLeaks(t)
	dev, pd, port, gid, gidIndex := openRXE(t)
	a, b := newEndpoint(t, dev, pd, verbs.QPTypeRC), newEndpoint(t, dev, pd, verbs.QPTypeRC)

	// The seed's pitfalls, refused in Go before the driver sees them.
	t.Run("pitfalls", func(t *testing.T) {
		init := verbs.QPAttr{State: verbs.QPStateInit, PortNum: 1, AccessFlags: verbs.AccessRemoteWrite}
		require.NoError(t, a.qp.Modify(&init, verbs.AttrState|verbs.AttrPKeyIndex|verbs.AttrPort|verbs.AttrAccessFlags))
		rtr := verbs.QPAttr{State: verbs.QPStateRTR, PathMTU: port.ActiveMTU, DestQPN: b.qp.QPN, RQPSN: 1,
			MaxDestRdAtomic: 1, MinRNRTimer: 12,
			AH: verbs.AHAttr{PortNum: 1, IsGlobal: false, GRH: verbs.GlobalRoute{DGID: gid, SGIDIndex: uint8(gidIndex)}}}
		mask := verbs.AttrState | verbs.AttrAV | verbs.AttrPathMTU | verbs.AttrDestQPN | verbs.AttrRQPSN |
			verbs.AttrMaxDestRdAtomic | verbs.AttrMinRNRTimer
		err := a.qp.Modify(&rtr, mask)
		assert.ErrorContains(t, err, "RoCE needs a GRH")
		assert.ErrorContains(t, err, fmt.Sprintf("GID indexes of this port by source address: %d (%v, RoCE v2, veth-rxe)",
			gidIndex, gid.IP()), "the error suggests the GID index of each address")
		assert.ErrorContains(t, err, "device rxe0, port 1")
		assert.ErrorContains(t, err, fmt.Sprintf("QP %#x", a.qp.QPN))

		rtr.AH.IsGlobal = true
		rtr.PathMTU = verbs.MTU4096
		err = a.qp.Modify(&rtr, mask)
		assert.ErrorContains(t, err, "exceeds the port's active MTU", "rxe would accept 4096 and stall")

		rtr.PathMTU = port.ActiveMTU
		var te *verbs.TransitionError
		assert.ErrorAs(t, a.qp.Modify(&rtr, mask&^verbs.AttrMinRNRTimer), &te)
		assert.Equal(t, verbs.AttrMinRNRTimer, te.Missing)

		rtr.AH.GRH.SGIDIndex = uint8(port.GIDTableLen - 1)
		assert.ErrorContains(t, a.qp.Modify(&rtr, mask), "empty slot")
		assert.Equal(t, verbs.QPStateInit, a.qp.State(), "a refused modify leaves the QP where it was")

		reset := verbs.QPAttr{State: verbs.QPStateReset}
		require.NoError(t, a.qp.Modify(&reset, verbs.AttrState))
	})

	connectByHand(t, verbs.QPTypeRC, a, b.qp.QPN, 100, 200, gid, gidIndex, port.ActiveMTU)
	connectByHand(t, verbs.QPTypeRC, b, a.qp.QPN, 200, 100, gid, gidIndex, port.ActiveMTU)
	q, err := a.qp.Query(verbs.AttrPathMTU | verbs.AttrDestQPN | verbs.AttrAV)
	require.NoError(t, err)
	assert.Equal(t, verbs.QPStateRTS, q.State)
	assert.Equal(t, b.qp.QPN, q.DestQPN)
	assert.Equal(t, port.ActiveMTU, q.PathMTU)

	abuf, bbuf := a.mr.Bytes(), b.mr.Bytes()
	t.Run("send/recv", func(t *testing.T) {
		copy(abuf, "hello over rxe")
		require.NoError(t, b.qp.PostRecv(verbs.RecvWR{ID: 1, SGEs: []verbs.SGE{b.mr.SGE(0, 64)}}))
		require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
			SGEs: []verbs.SGE{a.mr.SGE(0, 14)}}))
		assert.Equal(t, verbs.WCSend, waitWC(t, a.cq).Opcode)
		wc := waitWC(t, b.cq)
		assert.Equal(t, verbs.WCRecv, wc.Opcode)
		assert.Equal(t, uint32(14), wc.ByteLen)
		assert.Equal(t, "hello over rxe", string(bbuf[:14]))
	})
	t.Run("write, write with immediate, read", func(t *testing.T) {
		copy(abuf[1024:], bytes.Repeat([]byte("W"), 4096))
		require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: 3, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGEs: []verbs.SGE{a.mr.SGE(1024, 4096)}, RemoteAddr: b.mr.Addr() + 8192, RKey: b.mr.RKey}))
		assert.Equal(t, verbs.WCRDMAWrite, waitWC(t, a.cq).Opcode)
		assert.Equal(t, bytes.Repeat([]byte("W"), 4096), bbuf[8192:8192+4096], "4 KiB spans several 1 KiB packets")

		require.NoError(t, b.qp.PostRecv(verbs.RecvWR{ID: 4}))
		require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: 5, Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled,
			SGEs: []verbs.SGE{a.mr.SGE(0, 5)}, RemoteAddr: b.mr.Addr() + 100, RKey: b.mr.RKey, Imm: 0xdeadbeef}))
		waitWC(t, a.cq)
		wc := waitWC(t, b.cq)
		assert.Equal(t, verbs.WCRecvRDMAWithImm, wc.Opcode)
		assert.Equal(t, uint32(0xdeadbeef), wc.Imm)
		assert.Equal(t, "hello", string(bbuf[100:105]))

		copy(bbuf[20000:], "remote data to read")
		require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: 6, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
			SGEs: []verbs.SGE{a.mr.SGE(30000, 19)}, RemoteAddr: b.mr.Addr() + 20000, RKey: b.mr.RKey}))
		assert.Equal(t, verbs.WCRDMARead, waitWC(t, a.cq).Opcode)
		assert.Equal(t, "remote data to read", string(abuf[30000:30019]))
	})
	t.Run("atomics", func(t *testing.T) {
		binary.LittleEndian.PutUint64(bbuf[40000:], 41)
		require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: 7, Opcode: verbs.OpAtomicFetchAdd, Flags: verbs.SendSignaled,
			SGEs: []verbs.SGE{a.mr.SGE(40000, 8)}, RemoteAddr: b.mr.Addr() + 40000, RKey: b.mr.RKey, CompareAdd: 1}))
		waitWC(t, a.cq)
		assert.Equal(t, uint64(41), binary.LittleEndian.Uint64(abuf[40000:]), "fetch returns the old value")
		assert.Equal(t, uint64(42), binary.LittleEndian.Uint64(bbuf[40000:]))
		require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: 8, Opcode: verbs.OpAtomicCmpAndSwp, Flags: verbs.SendSignaled,
			SGEs: []verbs.SGE{a.mr.SGE(40008, 8)}, RemoteAddr: b.mr.Addr() + 40000, RKey: b.mr.RKey, CompareAdd: 42, Swap: 7}))
		waitWC(t, a.cq)
		assert.Equal(t, uint64(42), binary.LittleEndian.Uint64(abuf[40008:]))
		assert.Equal(t, uint64(7), binary.LittleEndian.Uint64(bbuf[40000:]))
	})
	t.Run("batch of sends in one post", func(t *testing.T) {
		var recvs []verbs.RecvWR
		var sends []verbs.SendWR
		for i := range 8 {
			recvs = append(recvs, verbs.RecvWR{ID: uint64(100 + i), SGEs: []verbs.SGE{b.mr.SGE(50000+64*i, 64)}})
			abuf[50000+i] = byte('a' + i)
			sends = append(sends, verbs.SendWR{ID: uint64(200 + i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
				SGEs: []verbs.SGE{a.mr.SGE(50000+i, 1)}})
		}
		require.NoError(t, b.qp.PostRecv(recvs...))
		require.NoError(t, a.qp.PostSend(sends...))
		for i := range 8 {
			wc := waitWC(t, b.cq)
			assert.Equal(t, uint64(100+i), wc.ID, "receives complete in order")
			assert.Equal(t, byte('a'+i), bbuf[50000+64*i])
			waitWC(t, a.cq)
		}
	})
	t.Run("inline send", func(t *testing.T) {
		// Inline data is copied into the work request at post time: the
		// buffer may be reused at once.
		copy(abuf[60000:], "inline!")
		require.NoError(t, b.qp.PostRecv(verbs.RecvWR{ID: 9, SGEs: []verbs.SGE{b.mr.SGE(61000, 64)}}))
		require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: 10, Opcode: verbs.OpSend, Flags: verbs.SendSignaled | verbs.SendInline,
			SGEs: []verbs.SGE{a.mr.SGE(60000, 7)}}))
		copy(abuf[60000:], "changed")
		waitWC(t, a.cq)
		assert.Equal(t, uint32(7), waitWC(t, b.cq).ByteLen)
		assert.Equal(t, "inline!", string(bbuf[61000:61007]))
	})
	t.Run("wait honours context", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := b.cq.Wait(ctx)
		assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
		assert.Less(t, time.Since(start), 2*time.Second)
		// A cancelled wait leaves no deadline behind: the next one blocks
		// until a completion arrives.
		require.NoError(t, b.qp.PostRecv(verbs.RecvWR{ID: 11, SGEs: []verbs.SGE{b.mr.SGE(62000, 64)}}))
		go func() {
			time.Sleep(200 * time.Millisecond)
			a.qp.PostSend(verbs.SendWR{ID: 12, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGEs: []verbs.SGE{a.mr.SGE(0, 4)}})
		}()
		ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel2()
		start = time.Now()
		require.NoError(t, b.cq.Wait(ctx2), "a wait after a cancelled one still works")
		assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "and really waited for the completion")
		assert.Equal(t, uint64(11), waitWC(t, b.cq).ID)
		assert.Equal(t, uint64(12), waitWC(t, a.cq).ID)
	})
}

// connectByHand takes self to RTS towards peer with QPSetup.
func connectByHand(t *testing.T, qpType verbs.QPType, self *endpointQP, peerQPN, psn, peerPSN uint32,
	gid verbs.GID, gidIndex int, mtu verbs.MTU) {
	t.Helper()
	steps, err := verbs.QPSetup{Type: qpType, Port: 1, QKey: udQKey,
		Access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic, SQPSN: psn,
		Remote:   verbs.Remote{QPN: peerQPN, PSN: peerPSN, GID: gid},
		PathAttr: verbs.PathAttr{Global: true, SGIDIndex: uint8(gidIndex), LocalActiveMTU: mtu},
	}.Steps()
	require.NoError(t, err)
	for _, s := range steps {
		require.NoError(t, self.qp.Modify(&s.Attr, s.Mask), "%v", s.Transition)
	}
	require.Equal(t, verbs.QPStateRTS, self.qp.State())
}

// pairOnRXE makes two QPs of qpType on rxe, connected to each other by
// hand, with send PSNs psnA and psnB.
func pairOnRXE(t *testing.T, qpType verbs.QPType, psnA, psnB uint32) (a, b *endpointQP) {
	t.Helper()
	dev, pd, port, gid, gidIndex := openRXE(t)
	a, b = newEndpoint(t, dev, pd, qpType), newEndpoint(t, dev, pd, qpType)
	connectByHand(t, qpType, a, b.qp.QPN, psnA, psnB, gid, gidIndex, port.ActiveMTU)
	connectByHand(t, qpType, b, a.qp.QPN, psnB, psnA, gid, gidIndex, port.ActiveMTU)
	return a, b
}

const udQKey = 0x11111111

func openRXE(t *testing.T) (dev *verbs.Device, pd *verbs.PD, port verbs.PortAttr, gid verbs.GID, gidIndex int) {
	t.Helper()
	rxe := testbed.Require(t).MustDevice(t, "rxe0")
	dev, err := verbs.Open(rxe.Name)
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	pd, err = dev.AllocPD()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pd.Close()) })
	port, err = dev.QueryPort(1)
	require.NoError(t, err)
	return dev, pd, port, verbs.GIDFromIP(netip.MustParseAddr(rxe.IPv4)), gidIndexFor(t, dev, rxe.IPv4, rxe.Netdev)
}

// openSIW opens siw0 and a PD on it, both closed at the test's end
// (the device last: it refuses to close under an open PD or CQ).
func openSIW(t *testing.T) (*verbs.Device, *verbs.PD) {
	t.Helper()
	siw := testbed.Require(t).MustDevice(t, "siw0")
	checkNoLeaks(t)
	dev, err := verbs.Open(siw.Name)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, dev.Close()) })
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pd.Close()) })
	return dev, pd
}

func TestUCByHandOnRXE(t *testing.T) {
	checkNoLeaks(t)
	a, b := pairOnRXE(t, verbs.QPTypeUC, 7, 9)

	copy(a.mr.Bytes(), "unreliable but connected")
	require.NoError(t, b.qp.PostRecv(verbs.RecvWR{ID: 1, SGEs: []verbs.SGE{b.mr.SGE(0, 64)}}))
	require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGEs: []verbs.SGE{a.mr.SGE(0, 24)}}))
	waitWC(t, a.cq)
	assert.Equal(t, uint32(24), waitWC(t, b.cq).ByteLen)
	assert.Equal(t, "unreliable but connected", string(b.mr.Bytes()[:24]))

	require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: 3, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGEs: []verbs.SGE{a.mr.SGE(0, 10)}, RemoteAddr: b.mr.Addr() + 1000, RKey: b.mr.RKey}))
	assert.Equal(t, verbs.WCRDMAWrite, waitWC(t, a.cq).Opcode)
	assert.Eventually(t, func() bool { return string(b.mr.Bytes()[1000:1010]) == "unreliabl"+"e" },
		5*time.Second, 10*time.Millisecond, "UC writes land without a completion at the target")
}

func TestUDOnRXE(t *testing.T) {
	checkNoLeaks(t)
	dev, pd, _, gid, gidIndex := openRXE(t)
	a, b := newEndpoint(t, dev, pd, verbs.QPTypeUD), newEndpoint(t, dev, pd, verbs.QPTypeUD)
	connectByHand(t, verbs.QPTypeUD, a, 0, 1, 0, gid, gidIndex, 0)
	connectByHand(t, verbs.QPTypeUD, b, 0, 2, 0, gid, gidIndex, 0)

	_, err := pd.CreateAH(verbs.AHAttr{PortNum: 1, GRH: verbs.GlobalRoute{DGID: gid, SGIDIndex: uint8(gidIndex)}})
	assert.ErrorContains(t, err, "RoCE needs a GRH", "an AH without GRH is refused on RoCE")
	ah, err := pd.CreateAH(verbs.AHAttr{PortNum: 1, IsGlobal: true,
		GRH: verbs.GlobalRoute{DGID: gid, SGIDIndex: uint8(gidIndex), HopLimit: 64}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ah.Close()) })

	copy(a.mr.Bytes(), "datagram")
	// A UD receive buffer starts with room for the 40-byte GRH.
	require.NoError(t, b.qp.PostRecv(verbs.RecvWR{ID: 1, SGEs: []verbs.SGE{b.mr.SGE(0, 40+64)}}))
	require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGEs: []verbs.SGE{a.mr.SGE(0, 8)}, AH: ah, RemoteQPN: b.qp.QPN, RemoteQKey: udQKey}))
	waitWC(t, a.cq)
	wc := waitWC(t, b.cq)
	assert.Equal(t, uint32(40+8), wc.ByteLen)
	assert.Equal(t, a.qp.QPN, wc.SrcQP)
	assert.NotZero(t, wc.Flags&verbs.WCWithGRH)
	assert.Equal(t, "datagram", string(b.mr.Bytes()[40:48]))

	// A wrong Q_Key is dropped by the receiver: the receive posted takes
	// the next datagram with the right one instead, and nothing else comes.
	require.NoError(t, b.qp.PostRecv(verbs.RecvWR{ID: 3, SGEs: []verbs.SGE{b.mr.SGE(0, 40+64)}}))
	copy(a.mr.Bytes()[64:], "wrong key")
	require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: 4, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGEs: []verbs.SGE{a.mr.SGE(64, 9)}, AH: ah, RemoteQPN: b.qp.QPN, RemoteQKey: udQKey + 1}))
	waitWC(t, a.cq)
	copy(a.mr.Bytes()[128:], "right key")
	require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: 5, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGEs: []verbs.SGE{a.mr.SGE(128, 9)}, AH: ah, RemoteQPN: b.qp.QPN, RemoteQKey: udQKey}))
	waitWC(t, a.cq)
	wc = waitWC(t, b.cq)
	assert.Equal(t, uint64(3), wc.ID)
	assert.Equal(t, "right key", string(b.mr.Bytes()[40:49]), "a datagram with the wrong Q_Key is not delivered")
	n, err := b.cq.Poll(make([]verbs.WorkCompletion, 1))
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestManualTransitionsRefusedOnSIW(t *testing.T) {
	dev, pd := openSIW(t)
	e := newEndpoint(t, dev, pd, verbs.QPTypeRC)
	steps, err := verbs.QPSetup{Type: verbs.QPTypeRC, Port: 1, Remote: verbs.Remote{QPN: e.qp.QPN},
		PathAttr: verbs.PathAttr{LocalActiveMTU: verbs.MTU1024}}.Steps()
	require.NoError(t, err)
	require.NoError(t, e.qp.Modify(&steps[0].Attr, steps[0].Mask), "RESET→INIT is allowed on iWARP")
	err = e.qp.Modify(&steps[1].Attr, steps[1].Mask)
	assert.ErrorIs(t, err, verbs.ErrIWARPManual)
	assert.ErrorContains(t, err, "rdmacm")

	_, err = pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeUD, SendCQ: e.cq, RecvCQ: e.cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	assert.ErrorContains(t, err, "iWARP supports RC QPs only")
}

// Posting and polling are the hot path: they must not allocate, or a busy
// connection feeds the garbage collector on every message.
func TestPostAndPollAllocateNothing(t *testing.T) {
	checkNoLeaks(t)
	a, b := pairOnRXE(t, verbs.QPTypeRC, 11, 13)

	recv := []verbs.RecvWR{{ID: 1, SGEs: []verbs.SGE{b.mr.SGE(0, 64)}}}
	send := []verbs.SendWR{{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGEs: []verbs.SGE{a.mr.SGE(0, 64)}}}
	wcs := make([]verbs.WorkCompletion, 4)
	var failure error
	roundTrip := func() {
		if err := b.qp.PostRecv(recv...); err != nil {
			failure = err
			return
		}
		if err := a.qp.PostSend(send...); err != nil {
			failure = err
			return
		}
		// Built at the call, as callers do: the request and its SGEs stay
		// on the caller's stack only while PostSend lets nothing of them
		// escape (an AH lock once made every post allocate).
		if err := a.qp.PostSend(verbs.SendWR{ID: 3, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGEs: []verbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.mr.Addr() + 1024, RKey: b.mr.RKey}); err != nil {
			failure = err
			return
		}
		for _, cq := range []*verbs.CQ{a.cq, a.cq, b.cq} {
			for deadline := time.Now().Add(5 * time.Second); ; {
				n, err := cq.Poll(wcs[:1])
				if err != nil || n == 1 && wcs[0].Status != verbs.WCSuccess {
					failure = fmt.Errorf("poll: %v, status %v", err, wcs[0].Status)
					return
				}
				if n == 1 {
					break
				}
				if time.Now().After(deadline) {
					failure = errors.New("no completion within 5 s")
					return
				}
			}
		}
	}
	roundTrip() // the scratch memory is allocated (in C) on first use
	require.NoError(t, failure)
	allocs := testing.AllocsPerRun(200, roundTrip)
	require.NoError(t, failure)
	assert.Zero(t, allocs, "heap allocations per post, post and two polls")
}

// A closed QP or CQ refuses every use with EBADF: the handle is gone, and
// C must never see it.
func TestClosedQPAndCQRefuseUse(t *testing.T) {
	checkNoLeaks(t)
	dev, pd, _, _, _ := openRXE(t)
	cq, err := dev.CreateCQ(4)
	require.NoError(t, err)
	defer cq.Close()
	qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	require.NoError(t, qp.Close())
	require.NoError(t, qp.Close(), "closing twice is harmless")

	uses := map[string]error{
		"post send": qp.PostSend(verbs.SendWR{Opcode: verbs.OpSend}),
		"post recv": qp.PostRecv(verbs.RecvWR{}),
		"modify":    qp.Modify(&verbs.QPAttr{State: verbs.QPStateInit}, verbs.AttrState),
	}
	_, uses["query"] = qp.Query(verbs.AttrState)
	require.NoError(t, cq.Close())
	_, uses["poll"] = cq.Poll(make([]verbs.WorkCompletion, 1))
	for use, err := range uses {
		assert.ErrorIs(t, err, syscall.EBADF, use)
		assert.ErrorContains(t, err, "is closed", use)
	}
}

// A work request whose SGEs add up to more than its 32-bit length is
// refused before the provider, which would add them in 32 bits and move
// the wrapped, smaller length.
func TestWorkRequestOver4GiBIsRefused(t *testing.T) {
	checkNoLeaks(t)
	dev, pd, _, _, _ := openRXE(t)
	e := newEndpoint(t, dev, pd, verbs.QPTypeRC)
	base := e.mr.SGE(0, 16)
	sges := []verbs.SGE{{Addr: base.Addr, Length: 0xfffffff0, LKey: base.LKey}, {Addr: base.Addr, Length: 0x20, LKey: base.LKey}}
	errs := map[string]error{
		"send": e.qp.PostSend(verbs.SendWR{ID: 1, Opcode: verbs.OpSend}, verbs.SendWR{ID: 2, Opcode: verbs.OpSend, SGEs: sges}),
		"recv": e.qp.PostRecv(verbs.RecvWR{ID: 1}, verbs.RecvWR{ID: 2, SGEs: sges}),
	}
	for op, err := range errs {
		assert.ErrorIs(t, err, syscall.EINVAL, op)
		assert.ErrorContains(t, err, "work request 1 of 2", op)
		assert.ErrorContains(t, err, "its SGEs add up to 4294967312 bytes", op)
	}
}

// Close against calls on other goroutines: a device's Close waits for the
// calls in progress (ibv_close_device frees the context and closes its
// descriptors, whose numbers the process may reuse at once), and the calls
// after it fail, saying so; an MR, PD or AH closed twice at once is
// released once, and a closed MR's memory is gone from its Bytes.
func TestCloseAgainstConcurrentUse(t *testing.T) {
	checkNoLeaks(t)
	rxe := testbed.Require(t).MustDevice(t, "rxe0")
	dev, err := verbs.Open(rxe.Name)
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				var err error
				if i%2 == 0 {
					_, err = dev.QueryPort(1)
				} else {
					_, err = dev.GIDTable()
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, dev.Close())
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.ErrorIs(t, err, syscall.EBADF)
		assert.ErrorContains(t, err, "the device is closed")
	}

	dev, err = verbs.Open(rxe.Name)
	require.NoError(t, err)
	defer dev.Close()
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	mr, err := pd.RegisterMemory(1<<16, verbs.AccessLocalWrite)
	require.NoError(t, err)
	addr := mr.Addr()
	twice := func(close func() error) {
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() { defer wg.Done(); assert.NoError(t, close()) }()
		}
		wg.Wait()
	}
	twice(mr.Close)
	assert.Nil(t, mr.Bytes(), "the memory is unmapped")
	assert.Equal(t, addr, mr.Addr(), "the address stays, for what names it")
	twice(pd.Close)
}
