//go:build integration

package verbs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/test/testbed"
)

// kernelLab holds what the experiment reuses: one device, PD and CQ.
type kernelLab struct {
	t        *testing.T
	dev      *Device
	pd       *PD
	cq       *CQ
	port     PortAttr
	info     PortInfo
	gid      GID
	gidIndex uint8
}

func newKernelLab(t *testing.T) *kernelLab {
	rxe := testbed.Require(t).MustDevice(t, "rxe0")
	testbed.CheckNoLeaks(t)
	dev, err := Open(rxe.Name)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, dev.Close()) })
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pd.Close()) })
	cq, err := dev.CreateCQ(16)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, cq.Close()) })
	port, err := dev.QueryPort(1)
	require.NoError(t, err)
	lab := &kernelLab{t: t, dev: dev, pd: pd, cq: cq, port: port,
		info: PortInfo{Device: dev.Info.Name, Port: 1, Transport: dev.Info.Transport, Attr: port},
		gid:  GIDFromIP(netip.MustParseAddr(rxe.IPv4))}
	ifc, err := net.InterfaceByName(rxe.Netdev)
	require.NoError(t, err)
	table, err := dev.GIDTable()
	require.NoError(t, err)
	found := false
	for _, e := range table {
		if e.GID == lab.gid && e.NetdevIndex == ifc.Index && e.Type == GIDTypeRoCEv2 {
			lab.gidIndex, found = uint8(e.Index), true
		}
	}
	require.True(t, found, "a RoCE v2 GID for %s", rxe.IPv4)
	return lab
}

// attr has a valid value for every attribute: the port's active MTU, the
// GID entry of the device's address, PKey index 0, the QP's own number as
// the peer.
func (l *kernelLab) attr(qpn uint32, from, to QPState) QPAttr {
	ah := AHAttr{PortNum: 1, IsGlobal: true, GRH: GlobalRoute{DGID: l.gid, SGIDIndex: l.gidIndex, HopLimit: 64}}
	return QPAttr{State: to, CurState: from, PathMTU: l.port.ActiveMTU, PathMigState: MigMigrated, QKey: 0x11111111,
		RQPSN: 1, SQPSN: 1, DestQPN: qpn, AccessFlags: AccessRemoteWrite | AccessRemoteRead,
		Cap: QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}, AH: ah, AltAH: ah, EnSQDAsyncNotify: true,
		MaxRdAtomic: 1, MaxDestRdAtomic: 1, MinRNRTimer: 12, PortNum: 1, Timeout: 14, RetryCount: 7, RNRRetry: 7,
		AltPortNum: 1, AltTimeout: 14}
}

// raw is ibv_modify_qp with no check in Go.
func (l *kernelLab) raw(q *QP, from, to QPState, mask AttrMask) error {
	a := l.attr(q.QPN, from, to)
	ca := attrToIBV(&a)
	return q.qp.Modify(&ca, uint32(mask))
}

// pathTo is how a QP in RESET gets to a state, with the kernel's required
// attributes (the model's agree on these steps).
var pathTo = map[QPState][]QPState{
	QPStateReset: nil,
	QPStateInit:  {QPStateInit},
	QPStateRTR:   {QPStateInit, QPStateRTR},
	QPStateRTS:   {QPStateInit, QPStateRTR, QPStateRTS},
	QPStateSQD:   {QPStateInit, QPStateRTR, QPStateRTS, QPStateSQD},
	QPStateErr:   {QPStateInit, QPStateErr},
}

// bring resets q and walks it to state, waiting out an SQD drain (rxe
// refuses to leave SQD while the send queue drains).
func (l *kernelLab) bring(qt QPType, q *QP, state QPState) {
	t := l.t
	l.drained(q)
	require.NoError(t, l.raw(q, 0, QPStateReset, AttrState), "%v reset", qt)
	cur := QPStateReset
	for _, next := range pathTo[state] {
		row, _ := kernelTableRule(qt, Transition{cur, next})
		require.NoError(t, l.raw(q, cur, next, row.req|AttrState), "%v %v→%v on the way to %v", qt, cur, next, state)
		cur = next
	}
	if state == QPStateSQD {
		l.drained(q)
	}
}

// drained waits until q's send queue is not draining.
func (l *kernelLab) drained(q *QP) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		a, err := q.qp.Query(uint32(AttrState))
		require.NoError(l.t, err)
		if !a.SQDraining {
			return
		}
		require.True(l.t, time.Now().Before(deadline), "the empty send queue drains")
		time.Sleep(time.Millisecond)
	}
}

// TestModifyModelAgreesWithKernel puts every modify of the kernel's table
// (and every transition it lacks) to rxe with ibv_modify_qp directly, and
// to the model (ValidateForPort, as QP.Modify calls it). Nothing the kernel
// accepts may be refused in Go; everything it refuses must be refused in Go,
// by an error that names the attribute.
func TestModifyModelAgreesWithKernel(t *testing.T) {
	lab := newKernelLab(t)
	for _, qt := range []QPType{QPTypeRC, QPTypeUC, QPTypeUD} {
		t.Run(qt.String(), func(t *testing.T) {
			lab.t = t
			q, err := lab.pd.CreateQP(QPInit{Type: qt, SendCQ: lab.cq, RecvCQ: lab.cq,
				Cap: QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
			require.NoError(t, err)
			defer func() { require.NoError(t, q.Close()) }()
			var total, accepted, disagree int
			var beyondTable []string // refused though the kernel's table takes it
			for _, from := range []QPState{QPStateReset, QPStateInit, QPStateRTR, QPStateRTS, QPStateSQD, QPStateErr} {
				fresh := false
				for _, c := range kernelCases(qt, from) {
					if !fresh {
						lab.bring(qt, q, from)
						fresh = true
					}
					kerr := lab.raw(q, c.from, c.to, c.mask)
					a := lab.attr(q.QPN, c.from, c.to)
					merr := ValidateForPort(qt, c.from, c.to, &a, c.mask, lab.info)
					total++
					if kerr == nil {
						accepted++
						fresh = c.from == c.to // a QP that moved is reset for the next case
					} else if s, err := q.qp.QueryState(); err != nil || QPState(s) != from {
						fresh = false
					}
					if kerr != nil && (c.what == "required" || c.what == "with optional") {
						beyondTable = append(beyondTable, fmt.Sprintf("%v (%v)", c, kerr))
					}
					switch {
					case kerr == nil && merr != nil:
						disagree++
						t.Errorf("%v %v: the kernel accepts, Go refuses: %v", qt, c, merr)
					case kerr != nil && merr == nil:
						disagree++
						t.Errorf("%v %v: the kernel refuses (%v), Go lets it through", qt, c, kerr)
					case kerr != nil:
						checkNames(t, qt, c, merr)
					}
				}
			}
			t.Logf("%v on %s: %d modifies, the kernel accepted %d and refused %d; the model disagreed on %d",
				qt, lab.dev.Info.Name, total, accepted, total-accepted, disagree)
			require.Positive(t, accepted, "some modifies were put to the kernel and accepted")
			require.Positive(t, total-accepted, "and some refused")
			for _, b := range beyondTable {
				t.Logf("%v: refused beyond the kernel's table: %s", qt, b)
			}
		})
	}
}

// checkNames asserts that Go's refusal says what is wrong.
func checkNames(t *testing.T, qt QPType, c modifyCase, err error) {
	t.Helper()
	var te *TransitionError
	var ae *AttrError
	switch {
	case c.what == "not in the table":
		if !errors.As(err, &te) || !te.NoSuchTransition {
			t.Errorf("%v %v: refused, but not as a transition that does not exist: %v", qt, c, err)
		}
	case c.bit == 0 || c.bit == AttrState:
		// Without STATE the kernel (and QP.Modify) see a modify in place
		// with the other attributes: what the error names is those.
		if !errors.As(err, &te) && !errors.As(err, &ae) {
			t.Errorf("%v %v: refused with %T: %v", qt, c, err, err)
		}
	default:
		if !strings.Contains(err.Error(), c.bit.String()) {
			t.Errorf("%v %v: the refusal does not name %v: %v", qt, c, c.bit, err)
		}
	}
}

// The driver's bans beyond the kernel's table, with QP.Modify itself: rxe
// refuses a MaxRdAtomic above the device's limit, and any modify that names
// STATE in SQD while the send queue drains, but towards ERR
// (rxe_qp_chk_attr). Go refuses both first, naming the attribute.
func TestModifyDriverBansOnRXE(t *testing.T) {
	lab := newKernelLab(t)
	da, err := lab.dev.Query()
	require.NoError(t, err)
	require.Equal(t, uint32(rxeVendorID), da.VendorID, "rxe is told by its vendor ID")
	newQP := func() *QP {
		q, err := lab.pd.CreateQP(QPInit{Type: QPTypeRC, SendCQ: lab.cq, RecvCQ: lab.cq,
			Cap: QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, q.Close()) })
		return q
	}

	t.Run("max rd atomic", func(t *testing.T) {
		lab.t = t
		limit := da.MaxQPRdAtom // what rxe_qp_chk_attr compares with
		if limit >= 255 {
			t.Skipf("the device's limit %d fits in MaxRdAtomic's 8 bits", limit)
		}
		q := newQP()
		rts := func(n int) (goErr, kernelErr error) {
			lab.bring(QPTypeRC, q, QPStateRTR)
			q.state, q.port = QPStateRTR, 1
			a := lab.attr(q.QPN, QPStateRTR, QPStateRTS)
			a.MaxRdAtomic = uint8(n)
			row, _ := kernelTableRule(QPTypeRC, Transition{QPStateRTR, QPStateRTS})
			if goErr = q.Modify(&a, row.req|AttrState); goErr != nil {
				ca := attrToIBV(&a)
				kernelErr = q.qp.Modify(&ca, uint32(row.req|AttrState))
			}
			return goErr, kernelErr
		}
		goErr, _ := rts(limit)
		require.NoError(t, goErr, "MaxRdAtomic at the device's limit %d passes", limit)
		goErr, kernelErr := rts(limit + 1)
		require.Error(t, kernelErr, "rxe refuses MaxRdAtomic %d", limit+1)
		var ae *AttrError
		require.ErrorAs(t, goErr, &ae)
		require.Equal(t, AttrMaxQPRdAtomic, ae.Problems[0].Attr)
		require.ErrorContains(t, goErr, fmt.Sprintf("exceeds the device's limit of %d", limit))
	})

	t.Run("leaving SQD while draining", func(t *testing.T) {
		lab.t = t
		q := newQP()
		mr, err := lab.pd.RegisterMemory(64, AccessLocalWrite)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, mr.Close()) })
		// Connected to a QP number nobody has, with an ACK timeout of
		// about 4 s: a send waits for its ACK, and the queue drains no
		// sooner than that. (A peer's RNR NAK would not do: rxe rewinds the
		// send and counts the queue drained.)
		lab.bring(QPTypeRC, q, QPStateInit)
		row, _ := kernelTableRule(QPTypeRC, Transition{QPStateInit, QPStateRTR})
		a := lab.attr(0xfffff0, QPStateInit, QPStateRTR)
		ca := attrToIBV(&a)
		require.NoError(t, q.qp.Modify(&ca, uint32(row.req|AttrState)))
		row, _ = kernelTableRule(QPTypeRC, Transition{QPStateRTR, QPStateRTS})
		a = lab.attr(0xfffff0, QPStateRTR, QPStateRTS)
		a.Timeout, a.RetryCount = 20, 0
		ca = attrToIBV(&a)
		require.NoError(t, q.qp.Modify(&ca, uint32(row.req|AttrState)))
		q.state, q.port = QPStateRTS, 1
		require.NoError(t, q.PostSend(SendWR{ID: 1, Opcode: OpSend, Flags: SendSignaled, SGEs: []SGE{mr.SGE(0, 8)}}))
		require.NoError(t, lab.raw(q, QPStateRTS, QPStateSQD, AttrState))
		q.state = QPStateSQD
		qa, err := q.qp.Query(uint32(AttrState))
		require.NoError(t, err)
		require.True(t, qa.SQDraining, "a send waiting for its ACK keeps the queue draining")
		start := time.Now()

		for _, to := range []QPState{QPStateRTS, QPStateSQD, QPStateReset} {
			attr := lab.attr(q.QPN, QPStateSQD, to)
			goErr := q.Modify(&attr, AttrState)
			var ae *AttrError
			if assert.ErrorAs(t, goErr, &ae, "SQD→%v while draining", to) {
				assert.Equal(t, AttrState, ae.Problems[0].Attr)
				assert.ErrorContains(t, goErr, "still draining")
			}
			assert.Error(t, lab.raw(q, QPStateSQD, to, AttrState), "rxe refuses SQD→%v while draining", to)
		}
		attr := lab.attr(q.QPN, QPStateSQD, QPStateSQD)
		assert.NoError(t, q.Modify(&attr, AttrPKeyIndex), "a modify in place without STATE passes while draining")
		qa, err = q.qp.Query(uint32(AttrState))
		require.NoError(t, err)
		require.True(t, qa.SQDraining, "still draining after %v: the checks above saw a draining queue", time.Since(start))
		attr = lab.attr(q.QPN, QPStateSQD, QPStateErr)
		require.NoError(t, q.Modify(&attr, AttrState), "ERR is the way out while draining")
	})

	t.Run("a port the device lacks", func(t *testing.T) {
		lab.t = t
		q := newQP()
		a := lab.attr(q.QPN, QPStateReset, QPStateInit)
		a.PortNum = 2
		row, _ := kernelTableRule(QPTypeRC, Transition{QPStateReset, QPStateInit})
		goErr := q.Modify(&a, row.req|AttrState)
		var ae *AttrError
		require.ErrorAs(t, goErr, &ae, "the modify's error, naming PORT")
		assert.Equal(t, AttrPort, ae.Problems[0].Attr)
		assert.ErrorContains(t, goErr, "RC QP RESET→INIT")
		assert.ErrorContains(t, goErr, "PortNum 2: "+lab.dev.Info.Name+" has no such port (its ports are 1 to 1)")
		ca := attrToIBV(&a)
		assert.Error(t, q.qp.Modify(&ca, uint32(row.req|AttrState)), "the kernel refuses port 2 too")
	})
}

// What the kernel refuses by a value (not by the mask), refused in Go too;
// and where Go is stricter than the kernel on purpose, pinned so that a
// change on either side shows.
func TestModifyValuesAgainstKernelOnRXE(t *testing.T) {
	lab := newKernelLab(t)
	q, err := lab.pd.CreateQP(QPInit{Type: QPTypeRC, SendCQ: lab.cq, RecvCQ: lab.cq,
		Cap: QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	try := func(from, to QPState, edit func(*QPAttr)) (goErr, kernelErr error) {
		lab.bring(QPTypeRC, q, from)
		q.state, q.port = from, 1
		row, _ := kernelTableRule(QPTypeRC, Transition{from, to})
		a := lab.attr(q.QPN, from, to)
		edit(&a)
		goErr = q.Modify(&a, row.req|AttrState)
		lab.bring(QPTypeRC, q, from)
		ca := attrToIBV(&a)
		return goErr, q.qp.Modify(&ca, uint32(row.req|AttrState))
	}

	goErr, kernelErr := try(QPStateInit, QPStateRTR, func(a *QPAttr) { a.AH.PortNum = 0 })
	assert.Error(t, kernelErr, "uverbs refuses an AV without a port")
	assert.ErrorContains(t, goErr, "AH.PortNum is 0: the kernel refuses")

	// Stricter on purpose: the kernel masks a PSN to 24 bits with a warning
	// in its log (_ib_modify_qp), and rxe takes a path MTU up to the port's
	// max MTU, above the active one, where the QP connects and then stalls.
	goErr, kernelErr = try(QPStateRTR, QPStateRTS, func(a *QPAttr) { a.SQPSN = 1<<24 | 5 })
	assert.NoError(t, kernelErr, "the kernel takes a 25-bit PSN and masks it")
	assert.ErrorContains(t, goErr, "does not fit in 24 bits")
	if lab.port.ActiveMTU < lab.port.MaxMTU {
		goErr, kernelErr = try(QPStateInit, QPStateRTR, func(a *QPAttr) { a.PathMTU = lab.port.MaxMTU })
		assert.NoError(t, kernelErr, "rxe takes a path MTU up to its max MTU")
		assert.ErrorContains(t, goErr, "exceeds the port's active MTU")
	} else {
		t.Logf("active MTU %v is the max: no path MTU between them to try", lab.port.ActiveMTU)
	}

	// A QP takes the flags code copies from its MRs (rxe lets them through;
	// other drivers ignore what they do not use).
	mrFlags := AccessRemoteWrite | AccessMWBind | AccessOnDemand | AccessRelaxedOrdering
	goErr, kernelErr = try(QPStateReset, QPStateInit, func(a *QPAttr) { a.AccessFlags = mrFlags })
	assert.NoError(t, kernelErr, "the kernel takes %v on a QP", mrFlags)
	assert.NoError(t, goErr, "%v on a QP", mrFlags)

	// An address vector outside RTR without PORT moves the QP to the
	// vector's port (uverbs' modify_qp): one the device lacks is refused
	// by uverbs, and in Go by name.
	lab.bring(QPTypeRC, q, QPStateSQD)
	q.state, q.port = QPStateSQD, 1
	a := lab.attr(q.QPN, QPStateSQD, QPStateSQD)
	a.AH.PortNum = 9
	goErr = q.Modify(&a, AttrAV)
	assert.ErrorContains(t, goErr, "AH.PortNum 9: rxe0 has no such port")
	ca := attrToIBV(&a)
	assert.Error(t, q.qp.Modify(&ca, uint32(AttrAV)), "the kernel refuses the address vector's port 9")
	a.AH.PortNum = 1
	require.NoError(t, q.Modify(&a, AttrAV), "SQD→SQD with a new address vector on the QP's port")
}

// A Q_Key with bit 31 set is privileged: without CAP_NET_RAW the kernel
// refuses it (EPERM), and the error says why. Capabilities belong to a
// thread, so the test drops CAP_NET_RAW on its own locked thread, which
// exits with the goroutine.
func TestModifyPrivilegedQKeyNeedsCapNetRaw(t *testing.T) {
	lab := newKernelLab(t)
	q, err := lab.pd.CreateQP(QPInit{Type: QPTypeUD, SendCQ: lab.cq, RecvCQ: lab.cq,
		Cap: QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	init := &QPAttr{State: QPStateInit, PortNum: 1, QKey: PrivilegedQKey | 0x1234}
	mask := AttrState | AttrPKeyIndex | AttrPort | AttrQKey

	done := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			done <- fmt.Errorf("capget: %w", err)
			return
		}
		data[0].Effective &^= 1 << unix.CAP_NET_RAW
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			done <- fmt.Errorf("capset: %w", err)
			return
		}
		done <- q.Modify(init, mask)
	}()
	err = <-done
	require.Error(t, err, "a privileged Q_Key without CAP_NET_RAW")
	assert.ErrorIs(t, err, syscall.EPERM)
	assert.ErrorContains(t, err, "Q_Key 0x80001234 has bit 31 set, which makes it privileged")
	assert.Equal(t, QPStateReset, q.State())

	require.NoError(t, q.Modify(init, mask), "with CAP_NET_RAW (the tests run as root)")
	assert.Equal(t, QPStateInit, q.State())
}

// A CUR_STATE in the mask names the state the QP leaves, as the kernel and
// the drivers take it: the recovery from SQE, which the device reaches on
// its own (the QP's last modify having left it in RTS), goes to the driver,
// and rxe takes it. Where the kernel refuses CUR_STATE (leaving INIT), Go
// refuses it first, naming it.
func TestModifyTakesCurStateAsTheStateLeft(t *testing.T) {
	lab := newKernelLab(t)
	q, err := lab.pd.CreateQP(QPInit{Type: QPTypeUD, SendCQ: lab.cq, RecvCQ: lab.cq,
		Cap: QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	lab.bring(QPTypeUD, q, QPStateRTS)
	q.state, q.port = QPStateRTS, 1

	err = q.Modify(&QPAttr{State: QPStateRTS, CurState: QPStateSQE}, AttrState|AttrCurState)
	require.NoError(t, err, "SQE→RTS named by CUR_STATE")
	assert.Equal(t, QPStateRTS, q.State())

	lab.bring(QPTypeUD, q, QPStateInit)
	q.state = QPStateInit
	err = q.Modify(&QPAttr{State: QPStateInit, CurState: QPStateInit}, AttrState|AttrCurState)
	var te *TransitionError
	require.ErrorAs(t, err, &te, "refused in Go")
	assert.ErrorContains(t, err, "CUR_STATE")
	assert.Error(t, lab.raw(q, QPStateInit, QPStateInit, AttrState|AttrCurState), "the kernel refuses it too")
}
