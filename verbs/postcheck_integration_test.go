//go:build integration

package verbs_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

// Work requests a QP cannot carry are refused in Go, naming the request
// and the rule, before the provider sees them: librxe reads a UD send's
// address handle unchecked (a nil one crashed the process), and an AH on
// an RC send took the place of the RDMA request's remote address.
func TestPostRefusesWhatTheQPCannotCarry(t *testing.T) {
	checkNoLeaks(t)
	dev, pd, _, gid, gidIndex := openRXE(t)
	rc, ud := newEndpoint(t, dev, pd, verbs.QPTypeRC), newEndpoint(t, dev, pd, verbs.QPTypeUD)
	uc := newEndpoint(t, dev, pd, verbs.QPTypeUC)
	ah, err := pd.CreateAH(verbs.AHAttr{PortNum: 1, IsGlobal: true,
		GRH: verbs.GlobalRoute{DGID: gid, SGIDIndex: uint8(gidIndex), HopLimit: 64}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ah.Close()) })

	send := verbs.SendWR{ID: 0x77, Opcode: verbs.OpSend, SGEs: []verbs.SGE{rc.mr.SGE(0, 8)}}
	withAH := send
	withAH.AH = ah
	write := verbs.SendWR{ID: 0x78, Opcode: verbs.OpRDMAWrite, SGEs: []verbs.SGE{rc.mr.SGE(0, 8)}, AH: ah,
		RemoteAddr: rc.mr.Addr(), RKey: rc.mr.RKey}
	read := verbs.SendWR{ID: 0x79, Opcode: verbs.OpRDMARead, SGEs: []verbs.SGE{uc.mr.SGE(0, 8)},
		RemoteAddr: uc.mr.Addr(), RKey: uc.mr.RKey}
	atomic := verbs.SendWR{ID: 0x7a, Opcode: verbs.OpAtomicFetchAdd, SGEs: []verbs.SGE{rc.mr.SGE(0, 8)},
		RemoteAddr: rc.mr.Addr() + 4, RKey: rc.mr.RKey}
	for _, c := range []struct {
		qp   *verbs.QP
		wrs  []verbs.SendWR
		want string
	}{
		{ud.qp, []verbs.SendWR{withAH, send}, "work request 1 (SEND, ID 0x77) of 2"},
		{ud.qp, []verbs.SendWR{send}, "a UD send needs an address handle (SendWR.AH)"},
		{ud.qp, []verbs.SendWR{{Opcode: verbs.OpRDMAWrite, AH: ah}}, "a UD QP sends SEND and SEND_WITH_IMM only, not RDMA_WRITE"},
		{rc.qp, []verbs.SendWR{write}, "only UD sends take an address handle (SendWR.AH); this QP is RC"},
		{uc.qp, []verbs.SendWR{read}, "a UC QP has no RDMA_READ"},
		{rc.qp, []verbs.SendWR{atomic}, "an atomic works on 8 aligned bytes"},
		{rc.qp, []verbs.SendWR{{Opcode: 9}}, "opcode Opcode(9) is not one this package posts"},
	} {
		err := c.qp.PostSend(c.wrs...)
		assert.ErrorIs(t, err, syscall.EINVAL, c.want)
		assert.ErrorContains(t, err, c.want)
		assert.ErrorContains(t, err, "nothing was posted", c.want)
	}
	// Nothing went out: the QPs are in RESET, and nothing was queued for
	// their first post in RTS.
	n, err := rc.cq.Poll(make([]verbs.WorkCompletion, 4))
	require.NoError(t, err)
	assert.Zero(t, n)

	// A receive before INIT names the state it needs.
	err = rc.qp.PostRecv(verbs.RecvWR{ID: 1, SGEs: []verbs.SGE{rc.mr.SGE(0, 64)}})
	assert.ErrorIs(t, err, syscall.EINVAL)
	assert.ErrorContains(t, err, "the QP is in RESET: receives can be posted from INIT on")
}

// iWARP has no immediate data and (on the devices here) no atomics: such a
// request is refused saying so, not with a bare EINVAL whose hint blamed
// the QP's state.
func TestPostRefusesImmediateDataOnIWARP(t *testing.T) {
	dev, pd := openSIW(t)
	e := newEndpoint(t, dev, pd, verbs.QPTypeRC)
	for op, want := range map[verbs.Opcode]string{
		verbs.OpRDMAWriteWithImm: "iWARP has no immediate data: RDMA_WRITE_WITH_IMM",
		verbs.OpSendWithImm:      "iWARP has no immediate data: SEND_WITH_IMM",
		verbs.OpAtomicCmpAndSwp:  "iWARP devices here have no atomics",
	} {
		err := e.qp.PostSend(verbs.SendWR{Opcode: op, SGEs: []verbs.SGE{e.mr.SGE(0, 8)}, RemoteAddr: e.mr.Addr(), RKey: e.mr.RKey})
		assert.ErrorIs(t, err, syscall.EINVAL, want)
		assert.ErrorContains(t, err, want)
	}
}

// An SGE outside its region panics, as the slice expression it stands for
// would: inline sends copy from its address without a key check, so it
// would send (or fault on) memory the region does not own.
func TestSGEOutsideTheRegionPanics(t *testing.T) {
	checkNoLeaks(t)
	_, pd, _, _, _ := openRXE(t)
	mr, err := pd.RegisterMemory(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	assert.Equal(t, uint32(4096), mr.SGE(0, 4096).Length)
	assert.Equal(t, mr.Addr()+4096, mr.SGE(4096, 0).Addr)
	for _, r := range [][2]int{{4000, 200}, {-8, 16}, {0, -1}, {4097, 0}} {
		assert.Panics(t, func() { mr.SGE(r[0], r[1]) }, "SGE(%d, %d)", r[0], r[1])
	}
	require.NoError(t, mr.Close())
	assert.Panics(t, func() { mr.SGE(0, 8) }, "a closed region has no bytes")

	_, err = pd.RegisterMemory(4096, verbs.AccessRemoteWrite)
	assert.ErrorIs(t, err, syscall.EINVAL)
	assert.ErrorContains(t, err, "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too")
}

// A device with PDs or CQs still open refuses to close: ibv_close_device
// would free the context under them, and their later calls (and the Go
// data path's doorbells, on a descriptor number the process may reuse)
// would use freed memory.
func TestDeviceCloseRefusedWhileInUse(t *testing.T) {
	checkNoLeaks(t)
	rxe := testbed.Require(t).MustDevice(t, "rxe0")
	dev, err := verbs.Open(rxe.Name)
	require.NoError(t, err)
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	cq, err := dev.CreateCQ(4)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := dev.Events(ctx)
	require.NoError(t, err)

	err = dev.Close()
	assert.ErrorIs(t, err, syscall.EBUSY)
	assert.ErrorContains(t, err, "with 1 PD and 1 CQ made from it still open")
	select {
	case _, ok := <-events:
		assert.True(t, ok, "a refused close leaves the event reader running")
	default:
	}
	require.NoError(t, cq.Close())
	require.NoError(t, cq.Close(), "a second close does not count twice")
	err = dev.Close()
	assert.ErrorContains(t, err, "with 1 PD and 0 CQs made from it still open")
	_, err = dev.QueryPort(1)
	require.NoError(t, err, "a refused close leaves the device open")
	require.NoError(t, pd.Close())
	require.NoError(t, dev.Close())
	require.NoError(t, dev.Close())
}

// A PD closed while other goroutines register memory in it is never freed
// under a registration: each one either finishes first (and the close
// waits for its MR to go) or is refused, saying the PD is closed.
func TestPDCloseAgainstRegistration(t *testing.T) {
	checkNoLeaks(t)
	rxe := testbed.Require(t).MustDevice(t, "rxe0")
	dev, err := verbs.Open(rxe.Name)
	require.NoError(t, err)
	defer dev.Close()
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mr, err := pd.RegisterMemory(4096, verbs.AccessLocalWrite)
				if err != nil {
					errs <- err
					return
				}
				if err := mr.Close(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	for {
		err := pd.Close()
		if err == nil {
			break
		}
		require.ErrorIs(t, err, syscall.EBUSY, "only its MRs of the moment keep it")
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.ErrorIs(t, err, syscall.EBADF)
		assert.ErrorContains(t, err, "the PD is closed")
	}
}

// Sizes above the device's limits, which the driver refuses with a bare
// EINVAL, are named with the limit.
func TestSizesAboveTheDeviceSayWhich(t *testing.T) {
	checkNoLeaks(t)
	dev, pd, _, _, _ := openRXE(t)
	attr, err := dev.Query()
	require.NoError(t, err)
	_, err = dev.CreateCQ(attr.MaxCQE + 1)
	assert.ErrorIs(t, err, syscall.EINVAL)
	assert.ErrorContains(t, err, fmt.Sprintf("the device holds at most %d entries per CQ", attr.MaxCQE))

	cq, err := dev.CreateCQ(16)
	require.NoError(t, err)
	defer cq.Close()
	_, err = pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: uint32(attr.MaxQPWR) + 1, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: uint32(attr.MaxSGE) + 1}})
	assert.ErrorIs(t, err, syscall.EINVAL)
	assert.ErrorContains(t, err, fmt.Sprintf("Cap.MaxSendWR %d is above the device's %d", attr.MaxQPWR+1, attr.MaxQPWR))
	assert.ErrorContains(t, err, fmt.Sprintf("Cap.MaxRecvSGE %d is above the device's %d", attr.MaxSGE+1, attr.MaxSGE))
}

// A QP taken to RTS with an initiator depth of 0 (MaxRdAtomic) refuses an
// RDMA READ or atomic at the post: rxe would keep it at the head of the
// send queue for ever, and every request after it. The depth is read again
// after a Modify, so once it is raised (SQD→SQD) the READ goes.
func TestReadWithoutInitiatorDepthIsRefused(t *testing.T) {
	checkNoLeaks(t)
	dev, pd, port, gid, gidIndex := openRXE(t)
	a, b := newEndpoint(t, dev, pd, verbs.QPTypeRC), newEndpoint(t, dev, pd, verbs.QPTypeRC)
	steps, err := verbs.QPSetup{Type: verbs.QPTypeRC, Port: 1, SQPSN: 1,
		Access:   verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic,
		Remote:   verbs.Remote{QPN: b.qp.QPN, PSN: 2, GID: gid},
		PathAttr: verbs.PathAttr{Global: true, SGIDIndex: uint8(gidIndex), LocalActiveMTU: port.ActiveMTU},
	}.Steps()
	require.NoError(t, err)
	steps[2].Attr.MaxRdAtomic = 0 // RTR→RTS: the depth given as 0
	for _, s := range steps {
		require.NoError(t, a.qp.Modify(&s.Attr, s.Mask), "%v", s.Transition)
	}
	connectByHand(t, verbs.QPTypeRC, b, a.qp.QPN, 2, 1, gid, gidIndex, port.ActiveMTU)
	q, err := a.qp.Query(verbs.AttrMaxQPRdAtomic)
	require.NoError(t, err)
	require.Zero(t, q.MaxRdAtomic)

	copy(b.mr.Bytes()[256:], "bytes to read")
	read := verbs.SendWR{ID: 0x81, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGEs: []verbs.SGE{a.mr.SGE(128, 13)}, RemoteAddr: b.mr.Addr() + 256, RKey: b.mr.RKey}
	atomic := verbs.SendWR{ID: 0x82, Opcode: verbs.OpAtomicFetchAdd, Flags: verbs.SendSignaled,
		SGEs: []verbs.SGE{a.mr.SGE(512, 8)}, RemoteAddr: b.mr.Addr() + 512, RKey: b.mr.RKey, CompareAdd: 1}
	send := verbs.SendWR{ID: 0x83, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGEs: []verbs.SGE{a.mr.SGE(0, 8)}}
	for _, wrs := range [][]verbs.SendWR{{read}, {atomic}, {send, read}} {
		err := a.qp.PostSend(wrs...)
		assert.ErrorIs(t, err, syscall.EINVAL)
		assert.ErrorIs(t, err, verbs.ErrNoInitiatorDepth)
		assert.ErrorContains(t, err, fmt.Sprintf("work request %d (%v, ID %#x) of %d", len(wrs)-1, wrs[len(wrs)-1].Opcode,
			wrs[len(wrs)-1].ID, len(wrs)))
		assert.ErrorContains(t, err, "the QP's initiator depth is 0")
		assert.ErrorContains(t, err, "rxe keeps it at the head of the send queue")
		assert.ErrorContains(t, err, "MaxRdAtomic of at least 1 at RTR→RTS")
		assert.ErrorContains(t, err, "nothing was posted")
	}

	// Nothing was queued: a send goes out and completes.
	require.NoError(t, b.qp.PostRecv(verbs.RecvWR{ID: 1, SGEs: []verbs.SGE{b.mr.SGE(0, 64)}}))
	require.NoError(t, a.qp.PostSend(send))
	assert.Equal(t, uint64(0x83), waitWC(t, a.cq).ID)
	assert.Equal(t, uint64(1), waitWC(t, b.cq).ID)

	// Raised in SQD, the depth is read again and the READ goes.
	require.NoError(t, a.qp.Modify(&verbs.QPAttr{State: verbs.QPStateSQD}, verbs.AttrState))
	deadline := time.Now().Add(5 * time.Second)
	for {
		q, err := a.qp.Query(verbs.AttrState)
		require.NoError(t, err)
		if !q.SQDraining {
			break
		}
		require.True(t, time.Now().Before(deadline), "the send queue drains")
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, a.qp.Modify(&verbs.QPAttr{MaxRdAtomic: 1}, verbs.AttrMaxQPRdAtomic))
	require.NoError(t, a.qp.Modify(&verbs.QPAttr{State: verbs.QPStateRTS}, verbs.AttrState))
	require.NoError(t, a.qp.PostSend(read))
	assert.Equal(t, verbs.WCRDMARead, waitWC(t, a.cq).Opcode)
	assert.Equal(t, "bytes to read", string(a.mr.Bytes()[128:141]))
}
