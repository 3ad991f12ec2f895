package verbs

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Transition is a QP state change; From == To for the modify-in-place
// transitions (INIT→INIT, RTS→RTS, SQD→SQD).
type Transition struct {
	From, To QPState
}

func (t Transition) String() string { return t.From.String() + "→" + t.To.String() }

// TransitionRule is what one transition needs and accepts.
type TransitionRule struct {
	Required AttrMask
	Optional AttrMask
}

// Accepted is every attribute the transition takes. STATE is always accepted
// (a modify-in-place may name the current state).
func (r TransitionRule) Accepted() AttrMask { return r.Required | r.Optional | AttrState }

const (
	connPathOpts = AttrAltPath | AttrPathMigState
)

// transitionTable holds the IBTA's rules for ibv_modify_qp per QP type
// (ibv_modify_qp(3) gives only the required attributes of RESET→INIT→RTR→
// RTS; the optional ones and the other transitions are the IBTA's), with
// the kernel's changes (kernelRules) made by init, which also adds
// Any→RESET and Any→ERR.
var transitionTable = map[QPType]map[Transition]TransitionRule{
	QPTypeUD: {
		{QPStateReset, QPStateInit}: {Required: AttrState | AttrPKeyIndex | AttrPort | AttrQKey},
		{QPStateInit, QPStateInit}:  {Optional: AttrPKeyIndex | AttrPort | AttrQKey},
		{QPStateInit, QPStateRTR}:   {Required: AttrState, Optional: AttrPKeyIndex | AttrQKey},
		{QPStateRTR, QPStateRTS}:    {Required: AttrState | AttrSQPSN, Optional: AttrCurState | AttrQKey},
		{QPStateRTS, QPStateRTS}:    {Optional: AttrCurState | AttrQKey},
		{QPStateRTS, QPStateSQD}:    {Required: AttrState, Optional: AttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}:    {Required: AttrState, Optional: AttrCurState | AttrQKey},
		{QPStateSQD, QPStateSQD}:    {Optional: AttrPKeyIndex | AttrQKey},
		{QPStateSQE, QPStateRTS}:    {Required: AttrState, Optional: AttrCurState | AttrQKey},
	},
	QPTypeUC: {
		{QPStateReset, QPStateInit}: {Required: AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateInit}:  {Optional: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateRTR}: {
			Required: AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			Optional: AttrPKeyIndex | AttrAccessFlags | AttrAltPath,
		},
		{QPStateRTR, QPStateRTS}: {Required: AttrState | AttrSQPSN, Optional: AttrCurState | AttrAccessFlags | connPathOpts},
		{QPStateRTS, QPStateRTS}: {Optional: AttrCurState | AttrAccessFlags | connPathOpts},
		{QPStateRTS, QPStateSQD}: {Required: AttrState, Optional: AttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}: {Required: AttrState, Optional: AttrCurState | AttrAccessFlags | connPathOpts},
		{QPStateSQD, QPStateSQD}: {Optional: AttrPKeyIndex | AttrAccessFlags | AttrAV | connPathOpts},
		{QPStateSQE, QPStateRTS}: {Required: AttrState, Optional: AttrCurState | AttrAccessFlags},
	},
	QPTypeRC: {
		{QPStateReset, QPStateInit}: {Required: AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateInit}:  {Optional: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateRTR}: {
			Required: AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
			Optional: AttrPKeyIndex | AttrAccessFlags | AttrAltPath,
		},
		{QPStateRTR, QPStateRTS}: {
			Required: AttrState | AttrSQPSN | AttrTimeout | AttrRetryCount | AttrRNRRetry | AttrMaxQPRdAtomic,
			Optional: AttrCurState | AttrAccessFlags | AttrMinRNRTimer | connPathOpts,
		},
		{QPStateRTS, QPStateRTS}: {Optional: AttrCurState | AttrAccessFlags | AttrMinRNRTimer | connPathOpts},
		{QPStateRTS, QPStateSQD}: {Required: AttrState, Optional: AttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}: {Required: AttrState, Optional: AttrCurState | AttrAccessFlags | AttrMinRNRTimer | connPathOpts},
		{QPStateSQD, QPStateSQD}: {Optional: AttrPKeyIndex | AttrPort | AttrAccessFlags | AttrAV | AttrMaxQPRdAtomic |
			AttrMinRNRTimer | AttrAltPath | AttrTimeout | AttrRetryCount | AttrRNRRetry | AttrMaxDestRdAtomic | AttrPathMigState},
	},
	// The man page gives a raw packet QP's required attributes only (PORT
	// to INIT, STATE alone after); these three types follow the kernel's
	// qp_state_table, which says the rest (RATE_LIMIT for RTR→RTS and
	// RTS→RTS; nothing else is accepted) and has the XRC types' rows.
	QPTypeRawPacket: {
		{QPStateReset, QPStateInit}: {Required: AttrState | AttrPort},
		{QPStateInit, QPStateInit}:  {},
		{QPStateInit, QPStateRTR}:   {Required: AttrState},
		{QPStateRTR, QPStateRTS}:    {Required: AttrState, Optional: AttrRateLimit},
		{QPStateRTS, QPStateRTS}:    {Optional: AttrRateLimit},
		{QPStateRTS, QPStateSQD}:    {Required: AttrState},
		{QPStateSQD, QPStateRTS}:    {Required: AttrState},
		{QPStateSQD, QPStateSQD}:    {},
		{QPStateSQE, QPStateRTS}:    {Required: AttrState},
	},
	QPTypeXRCSend: {
		{QPStateReset, QPStateInit}: {Required: AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateInit}:  {Optional: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateRTR}: {
			Required: AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			Optional: AttrPKeyIndex | AttrAccessFlags | AttrAltPath,
		},
		{QPStateRTR, QPStateRTS}: {
			Required: AttrState | AttrSQPSN | AttrTimeout | AttrRetryCount | AttrRNRRetry | AttrMaxQPRdAtomic,
			Optional: AttrCurState | AttrAccessFlags | connPathOpts,
		},
		{QPStateRTS, QPStateRTS}: {Optional: AttrCurState | AttrAccessFlags | connPathOpts},
		{QPStateRTS, QPStateSQD}: {Required: AttrState, Optional: AttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}: {Required: AttrState, Optional: AttrCurState | AttrAccessFlags | connPathOpts},
		{QPStateSQD, QPStateSQD}: {Optional: AttrPKeyIndex | AttrPort | AttrAccessFlags | AttrAV | AttrMaxQPRdAtomic |
			AttrAltPath | AttrTimeout | AttrRetryCount | AttrRNRRetry | AttrPathMigState},
		{QPStateSQE, QPStateRTS}: {Required: AttrState},
	},
	QPTypeXRCRecv: {
		{QPStateReset, QPStateInit}: {Required: AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateInit}:  {Optional: AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPStateInit, QPStateRTR}: {
			Required: AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
			Optional: AttrPKeyIndex | AttrAccessFlags | AttrAltPath,
		},
		{QPStateRTR, QPStateRTS}: {
			Required: AttrState | AttrSQPSN | AttrTimeout,
			Optional: AttrCurState | AttrAccessFlags | AttrMinRNRTimer | connPathOpts,
		},
		{QPStateRTS, QPStateRTS}: {Optional: AttrCurState | AttrAccessFlags | AttrMinRNRTimer | connPathOpts},
		{QPStateRTS, QPStateSQD}: {Required: AttrState, Optional: AttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}: {Required: AttrState, Optional: AttrCurState | AttrAccessFlags | AttrMinRNRTimer | connPathOpts},
		{QPStateSQD, QPStateSQD}: {Optional: AttrPKeyIndex | AttrPort | AttrAccessFlags | AttrAV | AttrMinRNRTimer |
			AttrAltPath | AttrTimeout | AttrMaxDestRdAtomic | AttrPathMigState},
		{QPStateSQE, QPStateRTS}: {Required: AttrState},
	},
}

// kernelTypes are the QP types whose rows the kernel's generic rules
// below concern.
var kernelTypes = []QPType{QPTypeRC, QPTypeUC, QPTypeUD, QPTypeRawPacket, QPTypeXRCSend, QPTypeXRCRecv}

// kernelRule is a place where Linux decides otherwise than the IBTA rules:
// its own table (qp_state_table and ib_modify_qp_is_ok in
// drivers/infiniband/core/verbs.c) or a ban of its uverbs layer. The kernel
// decides what the user gets, so the model follows it and its errors say so.
type kernelRule struct {
	QPTypes    []QPType
	Transition Transition
	// Attrs are the attributes the rule concerns; 0 when it is about the
	// transition itself.
	Attrs AttrMask
	// apply changes the IBTA's rule into the kernel's; exists is false
	// when the kernel has no such transition.
	apply func(r TransitionRule) (rule TransitionRule, exists bool)
	Why   string
}

var kernelRules = []kernelRule{
	{
		QPTypes: kernelTypes, Transition: Transition{QPStateReset, QPStateErr},
		apply: func(TransitionRule) (TransitionRule, bool) { return TransitionRule{}, false },
		Why: "the kernel's table (qp_state_table, drivers/infiniband/core/verbs.c) has no RESET→ERR, " +
			"though the IBTA allows any state→ERR: a QP in RESET has nothing to flush (destroy it, or go to INIT first)",
	},
	{
		QPTypes: kernelTypes, Transition: Transition{QPStateReset, QPStateReset},
		Attrs: AttrState,
		apply: func(TransitionRule) (TransitionRule, bool) { return TransitionRule{}, true },
		Why:   "the kernel takes a modify without STATE as one in place, and RESET→RESET needs nothing",
	},
	{
		QPTypes: kernelTypes, Transition: Transition{QPStateErr, QPStateErr},
		Attrs: AttrState,
		apply: func(TransitionRule) (TransitionRule, bool) { return TransitionRule{}, true },
		Why:   "the kernel takes a modify without STATE as one in place, and ERR→ERR needs nothing",
	},
	{
		QPTypes: []QPType{QPTypeRC}, Transition: Transition{QPStateSQE, QPStateRTS},
		apply: func(TransitionRule) (TransitionRule, bool) { return TransitionRule{Required: AttrState}, true },
		Why: "the kernel's table marks SQE→RTS valid for every QP type (with nothing optional for RC), " +
			"though an RC QP goes to ERR, never SQE",
	},
	{
		QPTypes: []QPType{QPTypeUC}, Transition: Transition{QPStateSQD, QPStateSQD}, Attrs: AttrAV,
		apply: func(r TransitionRule) (TransitionRule, bool) { r.Optional &^= AttrAV; return r, true },
		Why: "the kernel refuses it although the IBTA allows it: uverbs (modify_qp, drivers/infiniband/core/uverbs_cmd.c) " +
			"adds PORT to an AV given in SQD, and a UC QP's SQD→SQD does not take PORT",
	},
}

func init() {
	for _, rules := range transitionTable {
		for from := QPStateReset; from <= QPStateErr; from++ {
			rules[Transition{from, QPStateReset}] = TransitionRule{Required: AttrState}
			rules[Transition{from, QPStateErr}] = TransitionRule{Required: AttrState}
		}
	}
	for _, k := range kernelRules {
		for _, t := range k.QPTypes {
			r, ok := k.apply(transitionTable[t][k.Transition])
			if ok {
				transitionTable[t][k.Transition] = r
			} else {
				delete(transitionTable[t], k.Transition)
			}
		}
	}
}

// kernelWhy is why the kernel's rule refused e, or "".
func kernelWhy(e *TransitionError) string {
	for _, k := range kernelRules {
		if k.Transition != e.Transition || !slices.Contains(k.QPTypes, e.QPType) {
			continue
		}
		if (k.Attrs == 0 && e.NoSuchTransition) || (k.Attrs&(e.Missing|e.NotAccepted) != 0) {
			return k.Why
		}
	}
	return ""
}

// Rule returns what a transition requires and accepts for a QP type, and false
// when the transition does not exist for that type (e.g. RTS→RTR, or
// RESET→ERR, which the kernel lacks).
func Rule(t QPType, tr Transition) (TransitionRule, bool) {
	r, ok := transitionTable[t][tr]
	return r, ok
}

// Transitions lists the transitions a QP type has, in state order.
func Transitions(t QPType) []Transition {
	var out []Transition
	for from := QPStateReset; from <= QPStateErr; from++ {
		for to := QPStateReset; to <= QPStateErr; to++ {
			if _, ok := transitionTable[t][Transition{from, to}]; ok {
				out = append(out, Transition{from, to})
			}
		}
	}
	return out
}

// TransitionError reports a modify that the IBTA rules refuse: the driver
// would return EINVAL. It names what is missing and what is not accepted.
type TransitionError struct {
	QPType     QPType
	Transition Transition
	Mask       AttrMask
	// NoSuchTransition is set when the QP type cannot make this transition
	// at all; Missing and NotAccepted are then empty.
	NoSuchTransition bool
	Missing          AttrMask // required attributes absent from Mask
	NotAccepted      AttrMask // attributes in Mask the transition does not take
	// Kernel, when set, says that the rule that refused the modify is the
	// kernel's rather than the IBTA's, and why.
	Kernel string
}

func (e *TransitionError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "verbs: %v QP %v", e.QPType, e.Transition)
	if e.NoSuchTransition {
		fmt.Fprintf(&b, " is not a valid transition (from %v a %v QP can go to: %s)",
			e.Transition.From, e.QPType, strings.Join(targets(e.QPType, e.Transition.From), ", "))
		if e.Kernel != "" {
			b.WriteString("; " + e.Kernel)
		}
		return b.String()
	}
	var parts []string
	if e.Missing != 0 {
		parts = append(parts, "missing required attributes "+e.Missing.String())
	}
	if e.NotAccepted != 0 {
		parts = append(parts, "attributes not accepted by this transition "+e.NotAccepted.String())
	}
	b.WriteString(": " + strings.Join(parts, "; "))
	r, _ := Rule(e.QPType, e.Transition)
	fmt.Fprintf(&b, " (required: %v; optional: %v)", r.Required, r.Optional)
	if e.Kernel != "" {
		b.WriteString("; " + e.Kernel)
	}
	return b.String()
}

func targets(t QPType, from QPState) []string {
	var out []string
	for _, tr := range Transitions(t) {
		if tr.From == from {
			out = append(out, tr.To.String())
		}
	}
	return out
}

// KernelIgnored returns the attributes that uverbs removes from a modify's
// mask for QP type t before anything checks or applies them (modify_qp_mask
// in drivers/infiniband/core/uverbs_cmd.c): an XRC initiator has no
// receiving side (MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER), an XRC target no
// sending side (MAX_QP_RD_ATOMIC, RETRY_CNT, RNR_RETRY). Code that reuses
// an RC mask on XRC QPs passes them; they are accepted and have no effect.
func KernelIgnored(t QPType) AttrMask {
	switch t {
	case QPTypeXRCSend:
		return AttrMaxDestRdAtomic | AttrMinRNRTimer
	case QPTypeXRCRecv:
		return AttrMaxQPRdAtomic | AttrRetryCount | AttrRNRRetry
	}
	return 0
}

// ErrUnsupportedQPType is returned for QP types without a transition table here
// (driver QPs, whose rules are their driver's).
var ErrUnsupportedQPType = errors.New("verbs: QP type not modelled here")

// Validate checks a modify's attribute mask against the transition rules of
// the QP type: every required attribute present, nothing the transition does
// not accept. It returns a *TransitionError naming both, or nil.
//
// For XRC QPs the attributes the kernel drops from the mask before its own
// check ([KernelIgnored]) are dropped here too.
func Validate(t QPType, from, to QPState, mask AttrMask) error {
	given := mask // as the caller gave it, for the error
	mask &^= KernelIgnored(t)
	rules, ok := transitionTable[t]
	if !ok {
		return fmt.Errorf("%w: %v has no transition rules here (RC, UC, UD, raw packet and XRC have)", ErrUnsupportedQPType, t)
	}
	if !from.valid() || !to.valid() {
		return fmt.Errorf("verbs: %v QP %v→%v: not a QP state", t, from, to)
	}
	tr := Transition{from, to}
	r, ok := rules[tr]
	if !ok {
		e := &TransitionError{QPType: t, Transition: tr, Mask: given, NoSuchTransition: true}
		e.Kernel = kernelWhy(e)
		return e
	}
	missing := r.Required &^ mask
	extra := mask &^ r.Accepted()
	if missing == 0 && extra == 0 {
		return nil
	}
	e := &TransitionError{QPType: t, Transition: tr, Mask: given, Missing: missing, NotAccepted: extra}
	e.Kernel = kernelWhy(e)
	return e
}
