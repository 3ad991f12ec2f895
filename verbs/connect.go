package verbs

import "fmt"

// Step is one ibv_modify_qp call: the transition, the attributes and the mask.
type Step struct {
	Transition
	Attr QPAttr
	Mask AttrMask
}

// Remote is what a connected QP must know of its peer: exchanged out of band
// (a TCP socket, the CM's private data) or taken from rdma_init_qp_attr.
type Remote struct {
	QPN uint32 // the peer's QP number
	PSN uint32 // the first PSN the peer sends (our RQ PSN)
	GID GID    // the peer's GID (RoCE, and InfiniBand across subnets)
	LID uint16 // the peer's LID (InfiniBand)
	// ActiveMTU is the peer port's active MTU, if known: the path MTU is
	// the smaller of both ends'.
	ActiveMTU MTU
}

// PathAttr says how packets reach the peer.
type PathAttr struct {
	// Global puts a GRH on the address vector: always on RoCE, across subnets on IB.
	Global       bool
	SGIDIndex    uint8 // local GID entry (RoCE: picks source IP, version and VLAN)
	HopLimit     uint8 // default 64 when Global
	TrafficClass uint8
	FlowLabel    uint32
	SL           uint8
	// MTU is the path MTU; 0 means the smaller of the local and remote
	// active MTUs (the local one is required then).
	MTU MTU
	// LocalActiveMTU is this port's active MTU.
	LocalActiveMTU MTU
}

// QPSetup describes a QP's way from RESET to RTS. Zero fields take the
// defaults noted; every step is checked with [ValidateAttr] before it is returned,
// and a caller may still adjust Step.Attr (and must keep Step.Mask in step).
type QPSetup struct {
	Type      QPType
	Port      uint8  // port number, from 1
	PKeyIndex uint16 // usually 0
	// Access are the remote rights (RC, UC): REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC.
	Access AccessFlags
	QKey   uint32 // UD: the QP's Q_Key
	// SQPSN is the first PSN this QP sends (24 bits). CM-managed peers
	// assign PSNs themselves: use the ones rdma_init_qp_attr returns.
	SQPSN    uint32
	Remote   Remote   // RC, UC
	PathAttr PathAttr // RC, UC

	// RC reliability: defaults Timeout 14 (≈67 ms), RetryCount 7, RNRRetry 7
	// (infinite), MinRNRTimer 12 (0.64 ms). Code 0 of Timeout cannot be
	// asked for here (it is the "default" marker): set it on the returned
	// step if a QP must never retransmit.
	Timeout     ACKTimeout
	RetryCount  uint8
	RNRRetry    uint8
	MinRNRTimer RNRTimer
	// Outstanding RDMA reads and atomics, as initiator (MaxRdAtomic) and
	// responder (MaxDestRdAtomic). Default 1 each; the drivers bound them by
	// the device's MaxQPRdAtom and MaxQPInitRdAtom, in that order (see
	// PortInfo.MaxRdAtomic).
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
}

// Steps returns the three modifies RESET→INIT→RTR→RTS for the QP type, as the
// ibv_modify_qp reference shows them, with exactly the required attributes
// (plus ACCESS_FLAGS where the type takes them).
func (p QPSetup) Steps() ([]Step, error) {
	if p.Port == 0 {
		return nil, fmt.Errorf("verbs: %v QP: QPSetup.Port is required (ports are numbered from 1)", p.Type)
	}
	var steps []Step
	switch p.Type {
	case QPTypeUD:
		steps = []Step{
			{Transition: Transition{QPStateReset, QPStateInit},
				Attr: QPAttr{State: QPStateInit, PKeyIndex: p.PKeyIndex, PortNum: p.Port, QKey: p.QKey},
				Mask: AttrState | AttrPKeyIndex | AttrPort | AttrQKey},
			{Transition: Transition{QPStateInit, QPStateRTR}, Attr: QPAttr{State: QPStateRTR}, Mask: AttrState},
			{Transition: Transition{QPStateRTR, QPStateRTS},
				Attr: QPAttr{State: QPStateRTS, SQPSN: p.SQPSN}, Mask: AttrState | AttrSQPSN},
		}
	case QPTypeUC, QPTypeRC:
		ah, mtu, err := p.addressVector()
		if err != nil {
			return nil, err
		}
		init := Step{Transition: Transition{QPStateReset, QPStateInit},
			Attr: QPAttr{State: QPStateInit, PKeyIndex: p.PKeyIndex, PortNum: p.Port, AccessFlags: p.Access},
			Mask: AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags}
		rtr := Step{Transition: Transition{QPStateInit, QPStateRTR},
			Attr: QPAttr{State: QPStateRTR, AH: ah, PathMTU: mtu, DestQPN: p.Remote.QPN, RQPSN: p.Remote.PSN},
			Mask: AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN}
		rts := Step{Transition: Transition{QPStateRTR, QPStateRTS},
			Attr: QPAttr{State: QPStateRTS, SQPSN: p.SQPSN}, Mask: AttrState | AttrSQPSN}
		if p.Type == QPTypeRC {
			rtr.Attr.MaxDestRdAtomic = orDefault(p.MaxDestRdAtomic, 1)
			rtr.Attr.MinRNRTimer = RNRTimer(orDefault(uint8(p.MinRNRTimer), 12))
			rtr.Mask |= AttrMaxDestRdAtomic | AttrMinRNRTimer
			rts.Attr.Timeout = ACKTimeout(orDefault(uint8(p.Timeout), 14))
			rts.Attr.RetryCount = orDefault(p.RetryCount, 7)
			rts.Attr.RNRRetry = orDefault(p.RNRRetry, RNRRetryInfinite)
			rts.Attr.MaxRdAtomic = orDefault(p.MaxRdAtomic, 1)
			rts.Mask |= AttrTimeout | AttrRetryCount | AttrRNRRetry | AttrMaxQPRdAtomic
		}
		steps = []Step{init, rtr, rts}
	default:
		return nil, fmt.Errorf("%w: Steps builds RC, UC and UD connections, not %v", ErrUnsupportedQPType, p.Type)
	}
	for _, s := range steps {
		if err := ValidateAttr(p.Type, s.From, s.To, &s.Attr, s.Mask); err != nil {
			return nil, err
		}
	}
	return steps, nil
}

func (p QPSetup) addressVector() (AHAttr, MTU, error) {
	mtu := p.PathAttr.MTU
	if mtu == 0 {
		if !p.PathAttr.LocalActiveMTU.Valid() {
			return AHAttr{}, 0, fmt.Errorf("verbs: %v QP: set PathAttr.MTU, or PathAttr.LocalActiveMTU to negotiate it", p.Type)
		}
		mtu = p.PathAttr.LocalActiveMTU
		if p.Remote.ActiveMTU.Valid() && p.Remote.ActiveMTU < mtu {
			mtu = p.Remote.ActiveMTU
		}
	}
	ah := AHAttr{DLID: p.Remote.LID, SL: p.PathAttr.SL, IsGlobal: p.PathAttr.Global, PortNum: p.Port}
	if p.PathAttr.Global {
		ah.GRH = GlobalRoute{
			DGID:         p.Remote.GID,
			SGIDIndex:    p.PathAttr.SGIDIndex,
			HopLimit:     orDefault(p.PathAttr.HopLimit, 64),
			TrafficClass: p.PathAttr.TrafficClass,
			FlowLabel:    p.PathAttr.FlowLabel,
		}
	}
	return ah, mtu, nil
}

func orDefault(v, def uint8) uint8 {
	if v == 0 {
		return def
	}
	return v
}
