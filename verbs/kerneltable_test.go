package verbs

import (
	"fmt"
	"testing"
)

// The kernel's own table for ibv_modify_qp: qp_state_table and
// ib_modify_qp_is_ok in drivers/infiniband/core/verbs.c (RC, UC and UD read
// in a 5.1x mainline tree, raw packet and XRC in Debian's 6.1, which the
// test bed runs and which agrees on the first three), transcribed here apart
// from the model, for TestValidateFollowsTheKernelTable and, on rxe, for
// TestModifyModelAgreesWithKernel to walk. STATE is not in it: the kernel
// takes the target state from STATE and otherwise stays in the current one.
type kernelRow struct{ req, opt AttrMask }

var kernelValid = map[QPState][]QPState{
	QPStateReset: {QPStateReset, QPStateInit},
	QPStateInit:  {QPStateReset, QPStateErr, QPStateInit, QPStateRTR},
	QPStateRTR:   {QPStateReset, QPStateErr, QPStateRTS},
	QPStateRTS:   {QPStateReset, QPStateErr, QPStateRTS, QPStateSQD},
	QPStateSQD:   {QPStateReset, QPStateErr, QPStateRTS, QPStateSQD},
	QPStateSQE:   {QPStateReset, QPStateErr, QPStateRTS},
	QPStateErr:   {QPStateReset, QPStateErr},
}

var kernelTable = map[QPType]map[Transition]kernelRow{
	QPTypeUD: {
		{QPStateReset, QPStateInit}: {req: AttrPKeyIndex | AttrPort | AttrQKey},
		{QPStateInit, QPStateInit}:  {opt: AttrPKeyIndex | AttrPort | AttrQKey},
		{QPStateInit, QPStateRTR}:   {opt: AttrPKeyIndex | AttrQKey},
		{QPStateRTR, QPStateRTS}:    {req: AttrSQPSN, opt: AttrCurState | AttrQKey},
		{QPStateRTS, QPStateRTS}:    {opt: AttrCurState | AttrQKey},
		{QPStateRTS, QPStateSQD}:    {opt: AttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}:    {opt: AttrCurState | AttrQKey},
		{QPStateSQD, QPStateSQD}:    {opt: AttrPKeyIndex | AttrQKey},
		{QPStateSQE, QPStateRTS}:    {opt: AttrCurState | AttrQKey},
	},
	QPTypeUC: {
		{QPStateReset, QPStateInit}: {req: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateInit}:  {opt: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateRTR}: {req: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			opt: AttrAltPath | AttrAccessFlags | AttrPKeyIndex},
		{QPStateRTR, QPStateRTS}: {req: AttrSQPSN, opt: AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState},
		{QPStateRTS, QPStateRTS}: {opt: AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState},
		{QPStateRTS, QPStateSQD}: {opt: AttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}: {opt: AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState},
		{QPStateSQD, QPStateSQD}: {opt: AttrAV | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrPathMigState},
		{QPStateSQE, QPStateRTS}: {opt: AttrCurState | AttrAccessFlags},
	},
	QPTypeRC: {
		{QPStateReset, QPStateInit}: {req: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateInit}:  {opt: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateRTR}: {req: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
			opt: AttrAltPath | AttrAccessFlags | AttrPKeyIndex},
		{QPStateRTR, QPStateRTS}: {req: AttrTimeout | AttrRetryCount | AttrRNRRetry | AttrSQPSN | AttrMaxQPRdAtomic,
			opt: AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState},
		{QPStateRTS, QPStateRTS}: {opt: AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState | AttrMinRNRTimer},
		{QPStateRTS, QPStateSQD}: {opt: AttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}: {opt: AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState},
		{QPStateSQD, QPStateSQD}: {opt: AttrPort | AttrAV | AttrTimeout | AttrRetryCount | AttrRNRRetry | AttrMaxQPRdAtomic |
			AttrMaxDestRdAtomic | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrMinRNRTimer | AttrPathMigState},
		// The table's valid bit is per transition, not per type: RC
		// SQE→RTS passes with STATE alone (an RC QP never reaches SQE).
	},
	QPTypeRawPacket: {
		{QPStateReset, QPStateInit}: {req: AttrPort},
		{QPStateRTR, QPStateRTS}:    {opt: AttrRateLimit},
		{QPStateRTS, QPStateRTS}:    {opt: AttrRateLimit},
	},
	QPTypeXRCSend: { // IB_QPT_XRC_INI
		{QPStateReset, QPStateInit}: {req: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateInit}:  {opt: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateRTR}: {req: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			opt: AttrAltPath | AttrAccessFlags | AttrPKeyIndex},
		{QPStateRTR, QPStateRTS}: {req: AttrTimeout | AttrRetryCount | AttrRNRRetry | AttrSQPSN | AttrMaxQPRdAtomic,
			opt: AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState},
		{QPStateRTS, QPStateRTS}: {opt: AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState},
		{QPStateRTS, QPStateSQD}: {opt: AttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}: {opt: AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState},
		{QPStateSQD, QPStateSQD}: {opt: AttrPort | AttrAV | AttrTimeout | AttrRetryCount | AttrRNRRetry | AttrMaxQPRdAtomic |
			AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrPathMigState},
	},
	QPTypeXRCRecv: { // IB_QPT_XRC_TGT
		{QPStateReset, QPStateInit}: {req: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateInit}:  {opt: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateRTR}: {req: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
			opt: AttrAltPath | AttrAccessFlags | AttrPKeyIndex},
		{QPStateRTR, QPStateRTS}: {req: AttrTimeout | AttrSQPSN,
			opt: AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState},
		{QPStateRTS, QPStateRTS}: {opt: AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState | AttrMinRNRTimer},
		{QPStateRTS, QPStateSQD}: {opt: AttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}: {opt: AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState},
		{QPStateSQD, QPStateSQD}: {opt: AttrPort | AttrAV | AttrTimeout | AttrMaxDestRdAtomic | AttrAltPath |
			AttrAccessFlags | AttrPKeyIndex | AttrMinRNRTimer | AttrPathMigState},
	},
}

// allAttrBits is every mask bit libibverbs defines.
var allAttrBits = []AttrMask{AttrState, AttrCurState, AttrEnSQDAsyncNotify, AttrAccessFlags, AttrPKeyIndex, AttrPort,
	AttrQKey, AttrAV, AttrPathMTU, AttrTimeout, AttrRetryCount, AttrRNRRetry, AttrRQPSN, AttrMaxQPRdAtomic, AttrAltPath,
	AttrMinRNRTimer, AttrSQPSN, AttrMaxDestRdAtomic, AttrPathMigState, AttrCap, AttrDestQPN, AttrRateLimit}

func kernelTableRule(t QPType, tr Transition) (kernelRow, bool) {
	for _, to := range kernelValid[tr.From] {
		if to == tr.To {
			return kernelTable[t][tr], true
		}
	}
	return kernelRow{}, false
}

// modifyCase is one ibv_modify_qp put to the kernel and to the model.
type modifyCase struct {
	from, to QPState // to is attr.State with STATE in the mask, else from
	mask     AttrMask
	what     string   // "required", "without X", "with optional X", "with X", "not in the table"
	bit      AttrMask // the attribute removed or added
}

// cases lists, for a type and a from state, every transition of the kernel's
// table with its required set, each required attribute removed, each
// optional and each other attribute added; and each transition the table
// lacks, with STATE alone.
func kernelCases(qt QPType, from QPState) []modifyCase {
	var out []modifyCase
	add := func(to QPState, mask AttrMask, what string, bit AttrMask) {
		if mask&AttrState == 0 {
			to = from // no STATE: the kernel stays in the current state
		}
		out = append(out, modifyCase{from: from, to: to, mask: mask, what: what, bit: bit})
	}
	for to := QPStateReset; to <= QPStateErr; to++ {
		row, ok := kernelTableRule(qt, Transition{from, to})
		if !ok {
			if from == to {
				add(to, 0, "not in the table", 0)
			} else {
				add(to, AttrState, "not in the table", 0)
			}
			continue
		}
		req := row.req
		if from != to {
			req |= AttrState
		}
		add(to, req, "required", 0)
		for _, b := range req.Bits() {
			add(to, req&^b, "without", b)
		}
		accepted := req | row.opt | AttrState
		for _, b := range (row.opt | (AttrState &^ req)).Bits() {
			add(to, req|b, "with optional", b)
		}
		for _, b := range allAttrBits {
			if accepted&b == 0 {
				add(to, req|b, "with", b)
			}
		}
	}
	return out
}

func (c modifyCase) String() string {
	s := fmt.Sprintf("%v→%v %s", c.from, c.to, c.what)
	if c.bit != 0 {
		s += " " + c.bit.String()
	}
	return s + " (mask " + c.mask.String() + ")"
}

// kernelAccepts is what uverbs' modify_qp and ib_modify_qp_is_ok decide
// about a mask, the CUR_STATE in it being from: an AV outside INIT→RTR
// brings PORT with it (uverbs), CUR_STATE is taken only when leaving RTR,
// RTS, SQD or SQE, and the table's row must have its required attributes
// and nothing beyond its optional ones and STATE.
func kernelAccepts(qt QPType, from, to QPState, mask AttrMask) bool {
	// uverbs' modify_qp_mask, before the table.
	switch qt {
	case QPTypeXRCSend:
		mask &^= AttrMaxDestRdAtomic | AttrMinRNRTimer
	case QPTypeXRCRecv:
		mask &^= AttrMaxQPRdAtomic | AttrRetryCount | AttrRNRRetry
	}
	if mask&AttrAV != 0 && !(mask&AttrState != 0 && to == QPStateRTR) {
		mask |= AttrPort
	}
	if mask&AttrCurState != 0 && from != QPStateRTR && from != QPStateRTS && from != QPStateSQD && from != QPStateSQE {
		return false
	}
	row, ok := kernelTableRule(qt, Transition{from, to})
	if !ok {
		return false
	}
	return mask&row.req == row.req && mask&^(row.req|row.opt|AttrState) == 0
}

// The model against the kernel's table, for every QP type it models and
// every from state (SQE too, which rxe cannot be put in by hand): each
// transition with its required attributes, each one removed, each optional
// and each other attribute added, and each transition the table lacks.
// Validate accepts exactly what the kernel does.
func TestValidateFollowsTheKernelTable(t *testing.T) {
	for _, qt := range kernelTypes {
		n := 0
		for from := QPStateReset; from <= QPStateErr; from++ {
			for _, c := range kernelCases(qt, from) {
				n++
				want := kernelAccepts(qt, c.from, c.to, c.mask)
				err := Validate(qt, c.from, c.to, c.mask)
				if want != (err == nil) {
					t.Errorf("%v %v: the kernel accepts: %v; the model says: %v", qt, c, want, err)
				}
			}
		}
		t.Logf("%v: %d modifies", qt, n)
	}
}
