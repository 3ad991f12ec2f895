package verbs

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"syscall"

	"github.com/rdmago/rdmago/internal/ibv"
)

// QP is a queue pair (struct ibv_qp). [QP.Modify] checks every transition in Go
// before the driver sees it; the QP remembers its state and port for that.
type QP struct {
	Type QPType
	QPN  uint32

	pd *PD

	mu    sync.Mutex // qp, state, port, and the QP's post scratch
	qp    *ibv.QP    // nil once closed
	state QPState
	port  int
	// adopted QPs were created by librdmacm, which moves and destroys
	// them: State queries the QP.
	adopted bool
	// cqs are the CQs the QP was made on, counted as their users until
	// it is destroyed.
	cqs cqUse
	// initDepth is the QP's initiator depth as the device reports it once
	// the QP is in RTS, or -1 until the first RDMA READ or atomic posted
	// since the last Modify asks (see initDepthProblem).
	initDepth int
}

// CreateQP creates a queue pair in RESET.
func (p *PD) CreateQP(init QPInit) (*QP, error) {
	if init.SendCQ == nil || init.RecvCQ == nil {
		return nil, &OpError{Op: "ibv_create_qp", Device: p.dev.Info.Name, Err: syscall.EINVAL, Hint: "SendCQ and RecvCQ are required"}
	}
	p.closeMu.RLock()
	defer p.closeMu.RUnlock()
	cqs, scq, rcq := useCQs(init.SendCQ, init.RecvCQ)
	if scq == nil || rcq == nil || p.pd == nil {
		cqs.unuse()
		return nil, &OpError{Op: "ibv_create_qp", Device: p.dev.Info.Name, Err: syscall.EBADF, Hint: "the PD or a CQ is closed"}
	}
	qp, err := p.pd.CreateQP(&ibv.QPInit{Type: int(init.Type), SendCQ: scq, RecvCQ: rcq, Cap: capToIBV(init.Cap), SignalAll: init.SignalAll})
	if err != nil {
		cqs.unuse()
		e := &OpError{Op: "ibv_create_qp", Device: p.dev.Info.Name, Detail: fmt.Sprintf("%v %+v", init.Type, init.Cap), Err: err}
		if p.dev.Info.Transport == TransportIWARP && init.Type != QPTypeRC {
			e.Hint = "iWARP supports RC QPs only"
		} else if errors.Is(err, syscall.EINVAL) {
			e.Hint = capOverLimit(p.dev, init.Cap)
		}
		return nil, e
	}
	return &QP{Type: init.Type, QPN: qp.Num(), pd: p, qp: qp, state: QPStateReset, cqs: cqs, initDepth: -1}, nil
}

// capOverLimit names the sizes of cap above the device's limits, for the
// hint of a QP the driver refused with EINVAL.
func capOverLimit(d *Device, cap QPCap) string {
	a, err := d.Query()
	if err != nil {
		return ""
	}
	var over []string
	for _, c := range []struct {
		name     string
		v, limit int
	}{
		{"MaxSendWR", int(cap.MaxSendWR), a.MaxQPWR}, {"MaxRecvWR", int(cap.MaxRecvWR), a.MaxQPWR},
		{"MaxSendSGE", int(cap.MaxSendSGE), a.MaxSGE}, {"MaxRecvSGE", int(cap.MaxRecvSGE), a.MaxSGE},
	} {
		if c.v > c.limit {
			over = append(over, fmt.Sprintf("Cap.%s %d is above the device's %d", c.name, c.v, c.limit))
		}
	}
	if len(over) == 0 {
		return "a size of Cap (MaxInlineData included) is more than the device takes: see Device.Query"
	}
	return strings.Join(over, "; ")
}

// use returns the CQ's handle for a QP about to be made on it, counted
// among its users, or nil if the CQ is closed.
func (c *CQ) use() *ibv.CQ {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cq != nil {
		c.users++
	}
	return c.cq
}

// unuse undoes a use: the QP was not made, or is destroyed.
func (c *CQ) unuse() {
	c.mu.Lock()
	c.users--
	c.mu.Unlock()
}

// cqUse is the CQs a QP is made on, each counted as a user while it lives.
type cqUse [2]*CQ

// useCQs counts a QP about to be made among the users of its CQs and
// returns their handles; a closed CQ's handle is nil, and it is not counted.
func useCQs(send, recv *CQ) (u cqUse, s, r *ibv.CQ) {
	if s = send.use(); s != nil {
		u[0] = send
	}
	if r = recv.use(); r != nil {
		u[1] = recv
	}
	return u, s, r
}

// unuse ends the count: the QP was not made, or is destroyed.
func (u *cqUse) unuse() {
	for i, c := range u {
		if c != nil {
			c.unuse()
			u[i] = nil
		}
	}
}

func (c *CQ) handle() *ibv.CQ {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cq
}

// adoptQP wraps a QP that librdmacm created on pd and moves through its
// states: State queries the QP, and Close has librdmacm destroy it.
func adoptQP(pd *PD, qp *ibv.QP, t QPType, cqs cqUse) *QP {
	return &QP{Type: t, QPN: qp.Num(), pd: pd, qp: qp, state: QPState(qp.State()), adopted: true, cqs: cqs, initDepth: -1}
}

// State is the state the last successful [QP.Modify] left the QP in. The device
// may since have moved it to SQE or ERR; [QP.Query] tells.
func (q *QP) State() QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.adopted && q.qp != nil {
		if s, err := q.qp.QueryState(); err == nil {
			q.tookKernelState(QPState(s))
		}
	}
	return q.state
}

// tookKernelState records the state the kernel reports for an adopted QP.
// A RESET is not taken over a state known here: librdmacm never moves its
// QPs back to RESET (only Modify does, which records it), and siw in
// Linux 6.1 (the test bed's) leaves the state out of its query, which then
// reads as RESET.
func (q *QP) tookKernelState(s QPState) {
	if s != QPStateReset || q.state == QPStateReset {
		q.state = s
	}
}

// Modify runs one ibv_modify_qp. The transition (from the QP's state to
// attr.State, or a modify in place without [AttrState]) is checked first with
// [ValidateForPort]: a missing or unaccepted attribute, an unencodable value,
// RoCE without GRH, a GID index of an empty slot, a path MTU above the
// port's active MTU, manual transitions on iWARP, and what the kernel and
// the drivers refuse beyond the IBTA tables (an alternate path outside
// InfiniBand, a port the device lacks, a P_Key index outside the table,
// MaxRdAtomic or MaxDestRdAtomic above the device's limits, leaving SQD on
// rxe before the send queue has drained) never reach the driver. A QP that
// librdmacm created is checked from the state the kernel reports, as
// librdmacm and the iWARP CM move it without this package.
func (q *QP) Modify(attr *QPAttr, mask AttrMask) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.closedError("modify QP"); err != nil {
		return err
	}
	// Any state goes to RESET or ERR with STATE alone: no need to look.
	toAnyState := mask == AttrState && (attr.State == QPStateErr || attr.State == QPStateReset)
	if q.adopted && !toAnyState {
		// librdmacm, or the iWARP CM in the kernel, moved this QP since
		// the last look: check the transition from where it is.
		if qa, err := q.qp.Query(uint32(AttrState | AttrPort)); err == nil {
			a := attrFromIBV(&qa)
			q.tookKernelState(a.State)
			if a.PortNum != 0 {
				q.port = int(a.PortNum)
			}
		}
	}
	// As the kernel and the drivers do, a CUR_STATE in the mask says which
	// state the QP leaves (the device may have moved it to SQE since the
	// last modify); without STATE the QP stays there.
	from := q.state
	if mask&AttrCurState != 0 {
		from = attr.CurState
	}
	to := from
	if mask&AttrState != 0 {
		to = attr.State
	}
	port := q.port
	switch {
	case mask&AttrPort != 0:
		port = int(attr.PortNum)
	case mask&AttrAV != 0 && !(mask&AttrState != 0 && attr.State == QPStateRTR) && attr.AH.PortNum != 0:
		// uverbs' modify_qp takes an address vector without PORT outside
		// RTR (SQD→SQD) as a move to the vector's port.
		port = int(attr.AH.PortNum)
	}
	dev := q.pd.dev
	var err error
	portExists := false // for the GID hint below
	if port > 0 {
		info := PortInfo{Device: dev.Info.Name, Port: port, Transport: dev.Info.Transport}
		info.Attr, err = dev.QueryPort(port)
		portExists = err == nil
		if err != nil || mask&(AttrMaxQPRdAtomic|AttrMaxDestRdAtomic|AttrAltPath) != 0 ||
			mask&AttrAV != 0 && int(attr.AH.PortNum) != port {
			if da, derr := dev.Query(); derr == nil {
				info.PortCount = da.PhysicalPortCount
				info.MaxRdAtomic, info.MaxDestRdAtomic = da.MaxQPRdAtom, da.MaxQPInitRdAtom
			}
		}
		if err != nil && info.PortCount > 0 && port > info.PortCount {
			err = nil // ValidateForPort names the port the device lacks
		}
		if err == nil && mask&AttrAltPath != 0 && attr.AltPortNum != 0 && int(attr.AltPortNum) <= info.PortCount {
			info.AltAttr, _ = dev.QueryPort(int(attr.AltPortNum)) // unknown, it is left zero: unchecked
		}
		if err == nil {
			err = ValidateForPort(q.Type, from, to, attr, mask, info)
		}
		if err == nil && from == QPStateSQD && mask&AttrState != 0 && to != QPStateErr {
			err = q.drainingError(dev, to)
		}
		if err == nil && mask&AttrAV != 0 && attr.AH.IsGlobal {
			if _, gerr := dev.queryGID(port, int(attr.AH.GRH.SGIDIndex)); gerr != nil {
				err = &AttrError{QPType: q.Type, Transition: Transition{from, to}, Problems: []AttrProblem{{Attr: AttrAV,
					Reason: fmt.Sprintf("source GID index %d of %s port %d is an empty slot (%v): pick the entry of the local source address",
						attr.AH.GRH.SGIDIndex, dev.Info.Name, port, gerr)}}}
			}
		}
	} else {
		err = ValidateAttr(q.Type, from, to, attr, mask)
	}
	if err != nil {
		e := &OpError{Op: "modify QP", Device: dev.Info.Name, Port: port, QPN: q.QPN,
			Detail: Transition{from, to}.String(), Err: err}
		var ae *AttrError
		if errors.As(err, &ae) && mask&AttrAV != 0 && portExists {
			e.Hint = gidSuggestions(dev, port)
		}
		return e
	}
	ca := attrToIBV(attr)
	if err := q.qp.Modify(&ca, uint32(mask)); err != nil {
		e := &OpError{Op: "ibv_modify_qp", Device: dev.Info.Name, Port: port, QPN: q.QPN,
			Detail: fmt.Sprintf("%v %v mask %v", q.Type, Transition{from, to}, mask), Err: err}
		e.Hint = driverHint(e.Err)
		if h := qkeyHint(e.Err, attr, mask); h != "" {
			e.Hint = h
		}
		// A failed modify leaves the QP as it was, unless the device moved it.
		if s, err := q.qp.QueryState(); err == nil {
			q.state = QPState(s)
		}
		return e
	}
	q.state, q.port = to, port
	q.initDepth = -1
	return nil
}

// PrivilegedQKey is the bit of a Q_Key that makes it privileged
// (IB_QP_SET_QKEY): since Linux 6.4 (and in stable kernels that took the
// change, the test bed's Debian 6.1 among them) the kernel sets such a
// Q_Key only for a process with CAP_NET_RAW, or in the RDMA subsystem's
// privileged-qkey mode (6.5 and later: rdma system set privileged-qkey
// on); otherwise ibv_modify_qp fails with EPERM.
const PrivilegedQKey = 1 << 31

// qkeyHint explains the EPERM of a modify that set a privileged Q_Key.
func qkeyHint(err error, attr *QPAttr, mask AttrMask) string {
	if !errors.Is(err, syscall.EPERM) || mask&AttrQKey == 0 || attr.QKey&PrivilegedQKey == 0 {
		return ""
	}
	return fmt.Sprintf("Q_Key %#x has bit 31 set, which makes it privileged: the kernel sets it only for a process "+
		"with CAP_NET_RAW, or with the RDMA subsystem's privileged-qkey mode on (kernel 6.5 and later: "+
		"rdma system set privileged-qkey on); use a Q_Key below 0x80000000", attr.QKey)
}

// rxeVendorID is the vendor ID rxe reports (RXE_VENDOR_ID).
const rxeVendorID = 0xffffff

// drainingError refuses, on rxe, a modify that names STATE in SQD while the
// send queue still drains: rxe_qp_chk_attr returns EINVAL for it unless the
// target is ERR. Other drivers are left to decide.
func (q *QP) drainingError(dev *Device, to QPState) error {
	if da, err := dev.Query(); err != nil || da.VendorID != rxeVendorID {
		return nil
	}
	if a, err := q.qp.Query(uint32(AttrState)); err != nil || !a.SQDraining {
		return nil
	}
	return &AttrError{QPType: q.Type, Transition: Transition{QPStateSQD, to}, Problems: []AttrProblem{{Attr: AttrState,
		Reason: "the send queue is still draining, and the kernel's rxe refuses to leave SQD (or to name STATE in it) " +
			"before it has drained, except towards ERR (rxe_qp_chk_attr): wait for the SQ_DRAINED event " +
			"(EnSQDAsyncNotify) or until Query reports SQDraining false"}}}
}

// Query reads the QP's attributes (ibv_query_qp). In ERR only the state can
// be trusted.
func (q *QP) Query(mask AttrMask) (QPAttr, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.closedError("ibv_query_qp"); err != nil {
		return QPAttr{}, err
	}
	qa, err := q.qp.Query(uint32(mask | AttrState))
	if err != nil {
		return QPAttr{}, &OpError{Op: "ibv_query_qp", Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: err}
	}
	a := attrFromIBV(&qa)
	q.state = a.State
	return a, nil
}

// closedError refuses op on a closed QP (whose handle C would dereference).
func (q *QP) closedError(op string) error {
	if q.qp == nil {
		return &OpError{Op: op, Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: syscall.EBADF, Hint: "the QP is closed"}
	}
	return nil
}

// PostSend posts send work requests as one batch: from Go on rxe and siw,
// otherwise in one crossing into C (see the package documentation). SGE
// addresses must be registered memory ([MR.SGE]), never the Go heap.
//
// A request the QP cannot carry (checked in Go first: the opcode for the
// QP type and transport, a UD send's AH, an atomic's 8 aligned bytes, an
// RDMA READ or atomic on a QP whose initiator depth is 0, which the device
// would never send: [ErrNoInitiatorDepth]) fails the call with nothing
// posted. When the provider takes only part
// of the batch, the error wraps a [*PostError] (errors.As): its first
// Posted requests were posted and will complete; post again from there.
func (q *QP) PostSend(wrs ...SendWR) error {
	if len(wrs) == 0 {
		return nil
	}
	for i := range wrs {
		if wrs[i].AH != nil {
			return q.postSendHoldingAHs(wrs)
		}
	}
	return q.postSend(wrs)
}

// postSendHoldingAHs posts with the AHs the requests name counted as in
// use, so that a Close on another goroutine does not free one under the
// provider's read.
func (q *QP) postSendHoldingAHs(wrs []SendWR) error {
	for i := range wrs {
		if a := wrs[i].AH; a != nil && !a.enter() {
			leaveAHs(wrs[:i])
			return &OpError{Op: "ibv_post_send", Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: syscall.EBADF,
				Detail: fmt.Sprintf("work request %d of %d", i, len(wrs)), Hint: "its AH is closed; nothing was posted"}
		}
	}
	err := q.postSend(wrs)
	leaveAHs(wrs)
	return err
}

func leaveAHs(wrs []SendWR) {
	for i := range wrs {
		if a := wrs[i].AH; a != nil {
			a.leave()
		}
	}
}

func (q *QP) postSend(wrs []SendWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.closedError("ibv_post_send"); err != nil {
		return err
	}
	total := 0
	iwarp := q.pd.dev.Info.Transport == TransportIWARP
	for i := range wrs {
		why, depth := sendWRProblem(q.Type, iwarp, &wrs[i]), false
		if why == "" && wrs[i].Opcode.readsOrAtomic() {
			why, depth = q.initDepthProblem(iwarp), true
		}
		if why != "" {
			reason := error(syscall.EINVAL)
			if depth {
				reason = ErrNoInitiatorDepth
			}
			return &OpError{Op: "ibv_post_send", Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: reason,
				Detail: fmt.Sprintf("work request %d (%v, ID %#x) of %d", i, wrs[i].Opcode, wrs[i].ID, len(wrs)), Hint: why + "; nothing was posted"}
		}
		total += len(wrs[i].SGEs)
	}
	desc, sges, err := q.qp.SendScratch(len(wrs), total)
	if err != nil {
		return &OpError{Op: "ibv_post_send", Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: err, Hint: "no memory for the batch's descriptors"}
	}
	s := 0
	for i, w := range wrs {
		d := &desc[i]
		*d = ibv.SendDesc{ID: w.ID, Opcode: uint32(w.Opcode), Flags: uint32(w.Flags), Imm: w.Imm,
			NumSGE: uint32(len(w.SGEs)), RemoteAddr: w.RemoteAddr, RKey: w.RKey, CompareAdd: w.CompareAdd,
			Swap: w.Swap, RemoteQPN: w.RemoteQPN, RemoteQKey: w.RemoteQKey}
		if w.AH != nil {
			h := w.AH.ah // entered by postSendHoldingAHs: Close waits
			if h == nil {
				return &OpError{Op: "ibv_post_send", Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: syscall.EBADF,
					Detail: fmt.Sprintf("work request %d of %d", i, len(wrs)), Hint: "its AH is closed"}
			}
			d.SetAH(h)
		}
		n, bytes := copySGEs(sges[s:], w.SGEs)
		if err := q.tooLong("ibv_post_send", i, len(wrs), bytes); err != nil {
			return err
		}
		s += n
	}
	if bad, err := q.qp.PostSend(len(wrs)); err != nil {
		e := &OpError{Op: "ibv_post_send", Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: err}
		if bad >= 0 && bad < len(wrs) {
			e.Detail = fmt.Sprintf("work request %d (%v, ID %#x) of %d", bad, wrs[bad].Opcode, wrs[bad].ID, len(wrs))
			e.Err = &PostError{Posted: bad, Err: err}
		}
		// A full queue is a full queue in any state (and needs no query).
		full := errors.Is(e.Err, syscall.ENOMEM)
		state := QPStateRTS
		if !full {
			state = q.stateNow()
		}
		switch {
		case full:
			e.Hint = "the send queue is full: poll completions first or raise Cap.MaxSendWR"
		case errors.Is(e.Err, ibv.ErrReasonLost):
			e.Hint = "the provider refused this request but returned success for the batch, as libsiw 44 does " +
				"when it rang the doorbell for the requests before it: an opcode the device lacks (siw has no " +
				"immediate data and no atomics) or a full send queue"
		case state != QPStateRTS:
			e.Hint = fmt.Sprintf("the QP is in %v: sends need RTS", state)
		}
		if bad < 0 {
			// The provider took every request and then failed to ring the
			// doorbell (rxe and siw do before RTS).
			e.Detail = fmt.Sprintf("the doorbell, after all %d work requests were queued", len(wrs))
			queued := "the requests stay queued, to go out with the doorbell of a later post in RTS or to be " +
				"flushed when the QP goes to ERR"
			if !q.qp.LaterPostRings() {
				queued = "the requests stay queued, and libsiw will not ring for them again (it rings only for " +
					"a send queue it finds idle): move the QP to ERR to flush them"
			}
			if e.Hint != "" {
				queued = e.Hint + "; " + queued
			}
			e.Hint = queued
		}
		return e
	}
	return nil
}

// stateNow is the QP's state for an error's hint, from the kernel: the
// state libibverbs keeps is not moved by librdmacm on iWARP, whose RTS the
// iWARP CM sets in the kernel alone.
func (q *QP) stateNow() QPState {
	if qa, err := q.qp.Query(uint32(AttrState)); err == nil {
		return attrFromIBV(&qa).State
	}
	return QPState(q.qp.State())
}

// copySGEs copies a work request's SGEs and adds up their bytes.
func copySGEs(dst []ibv.SGE, src []SGE) (n int, bytes uint64) {
	for i, s := range src {
		dst[i] = ibv.SGE(s)
		bytes += uint64(s.Length)
	}
	return len(src), bytes
}

// tooLong refuses a work request whose SGEs add up to more than its
// 32-bit length holds: the providers add them in 32 bits, and a sum that
// wraps would move fewer bytes than asked, silently.
func (q *QP) tooLong(op string, i, n int, bytes uint64) error {
	if bytes <= math.MaxUint32 {
		return nil
	}
	return &OpError{Op: op, Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: syscall.EINVAL,
		Detail: fmt.Sprintf("work request %d of %d", i, n),
		Hint:   fmt.Sprintf("its SGEs add up to %d bytes; a work request carries at most 4 GiB - 1 (and the device's MaxMsgSize)", bytes)}
}

// PostRecv posts receive work requests as one batch, as PostSend does; a
// batch taken only in part fails with a [*PostError] too.
func (q *QP) PostRecv(wrs ...RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.closedError("ibv_post_recv"); err != nil {
		return err
	}
	total := 0
	for _, w := range wrs {
		total += len(w.SGEs)
	}
	desc, sges, err := q.qp.RecvScratch(len(wrs), total)
	if err != nil {
		return &OpError{Op: "ibv_post_recv", Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: err, Hint: "no memory for the batch's descriptors"}
	}
	s := 0
	for i, w := range wrs {
		desc[i] = ibv.RecvDesc{ID: w.ID, NumSGE: uint32(len(w.SGEs))}
		n, bytes := copySGEs(sges[s:], w.SGEs)
		if err := q.tooLong("ibv_post_recv", i, len(wrs), bytes); err != nil {
			return err
		}
		s += n
	}
	if bad, err := q.qp.PostRecv(len(wrs)); err != nil {
		e := &OpError{Op: "ibv_post_recv", Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: err}
		if bad >= 0 && bad < len(wrs) {
			e.Detail = fmt.Sprintf("work request %d (ID %#x) of %d", bad, wrs[bad].ID, len(wrs))
			e.Err = &PostError{Posted: bad, Err: err}
		}
		switch {
		case errors.Is(err, syscall.ENOMEM):
			e.Hint = "the receive queue is full: raise Cap.MaxRecvWR"
		case q.stateNow() == QPStateReset:
			e.Hint = "the QP is in RESET: receives can be posted from INIT on"
		}
		return e
	}
	return nil
}

// Close destroys the QP and frees its scratch memory.
func (q *QP) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.qp == nil {
		return nil
	}
	if err := q.qp.Destroy(); err != nil {
		oe := &OpError{Op: "ibv_destroy_qp", Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: err}
		if !q.qp.KeptOnFailedDestroy() {
			// The provider let go of the queues before the kernel refused:
			// the QP is closed here, as a post would fault. The kernel's
			// QP stays, and with it the CQs' use.
			q.qp = nil
			oe.Hint = "the provider released the QP's queues before the kernel refused; the QP cannot be used again"
		}
		return oe
	}
	q.qp = nil
	q.cqs.unuse()
	return nil
}

// gidSuggestions lists a port's routable RoCE GID entries, for errors about
// the address vector. The right one is the entry of the source address on
// the egress netdev (what the kernel CM and our resolver choose).
func gidSuggestions(dev *Device, port int) string {
	table, err := dev.GIDTable()
	if err != nil {
		return ""
	}
	var cands []string
	for _, e := range table {
		ip := e.GID.IP()
		if e.Port != port || ip.IsLinkLocalUnicast() || (e.Type != GIDTypeRoCEv2 && e.Type != GIDTypeRoCEv1) {
			continue
		}
		netdev := e.Netdev
		if netdev == "" {
			netdev = "?"
		}
		cands = append(cands, fmt.Sprintf("%d (%v, %v, %s)", e.Index, ip, e.Type, netdev))
	}
	if len(cands) == 0 {
		return "the port's GID table has no routable RoCE entry: does its netdev have an IP address?"
	}
	if len(cands) > 6 {
		cands = append(cands[:6], "…")
	}
	return "GID indexes of this port by source address: " + strings.Join(cands, ", ")
}
