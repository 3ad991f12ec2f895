package verbs

import (
	"errors"
	"fmt"
	"strings"
)

// AttrError reports attribute values the hardware cannot encode or that
// contradict the port the QP uses. Each problem names the attribute.
type AttrError struct {
	QPType     QPType
	Transition Transition
	Problems   []AttrProblem
}

// AttrProblem is one bad attribute value.
type AttrProblem struct {
	Attr   AttrMask
	Reason string
}

func (e *AttrError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.Attr.String() + ": " + p.Reason
	}
	return fmt.Sprintf("verbs: %v QP %v: %s", e.QPType, e.Transition, strings.Join(parts, "; "))
}

const (
	max24 = 1<<24 - 1
	max20 = 1<<20 - 1
)

// ValidateAttr checks the mask (as [Validate] does) and then the values of the
// attributes the mask names: 24-bit PSNs and QP numbers, 3-bit retry counts,
// 5-bit timer codes, 20-bit flow label, 4-bit SL, a defined MTU and
// migration state, QP access flags only, the target state matching the
// transition. It returns a *[TransitionError] or an *[AttrError].
func ValidateAttr(t QPType, from, to QPState, attr *QPAttr, mask AttrMask) error {
	mask &^= KernelIgnored(t)
	if err := Validate(t, from, to, mask); err != nil {
		return err
	}
	var probs []AttrProblem
	bad := func(a AttrMask, format string, args ...any) {
		probs = append(probs, AttrProblem{Attr: a, Reason: fmt.Sprintf(format, args...)})
	}
	has := func(a AttrMask) bool { return mask&a != 0 }
	if has(AttrState) && attr.State != to {
		bad(AttrState, "State is %v but the transition goes to %v", attr.State, to)
	}
	if has(AttrCurState) && attr.CurState != from {
		bad(AttrCurState, "CurState is %v but the transition starts from %v", attr.CurState, from)
	}
	if has(AttrPathMTU) && !attr.PathMTU.Valid() {
		bad(AttrPathMTU, "%v is not a path MTU (use MTU256…MTU4096)", attr.PathMTU)
	}
	if has(AttrPathMigState) && (attr.PathMigState < MigMigrated || attr.PathMigState > MigArmed) {
		bad(AttrPathMigState, "%v is not a migration state", attr.PathMigState)
	}
	// Stricter than the kernel, which masks a PSN to 24 bits and logs a
	// warning: a PSN that does not fit is a bug on one side or the other.
	if has(AttrRQPSN) && attr.RQPSN > max24 {
		bad(AttrRQPSN, "%#x does not fit in 24 bits (the kernel would take %#x and log a warning): "+
			"mask it, and the PSN given to the peer, with 0xffffff", attr.RQPSN, attr.RQPSN&max24)
	}
	if has(AttrSQPSN) && attr.SQPSN > max24 {
		bad(AttrSQPSN, "%#x does not fit in 24 bits (the kernel would take %#x and log a warning): "+
			"mask it, and the PSN given to the peer, with 0xffffff", attr.SQPSN, attr.SQPSN&max24)
	}
	if has(AttrDestQPN) && attr.DestQPN > max24 {
		bad(AttrDestQPN, "%#x does not fit in 24 bits", attr.DestQPN)
	}
	if has(AttrRetryCount) && attr.RetryCount > 7 {
		bad(AttrRetryCount, "%d does not fit in 3 bits (0…7)", attr.RetryCount)
	}
	if has(AttrRNRRetry) && attr.RNRRetry > 7 {
		bad(AttrRNRRetry, "%d does not fit in 3 bits (0…7; 7 = retry forever)", attr.RNRRetry)
	}
	if has(AttrTimeout) && attr.Timeout > MaxACKTimeout {
		bad(AttrTimeout, "code %d does not fit in 5 bits (0…31; it is an exponent, not milliseconds: see ACKTimeoutFor)", attr.Timeout)
	}
	if has(AttrMinRNRTimer) && attr.MinRNRTimer > MaxRNRTimer {
		bad(AttrMinRNRTimer, "code %d does not fit in 5 bits (0…31; a table index, not milliseconds: see RNRTimerFor)", attr.MinRNRTimer)
	}
	if has(AttrAccessFlags) && attr.AccessFlags&^qpAccessFlags != 0 {
		bad(AttrAccessFlags, "%v are not QP access flags (a QP takes %v; newer rxe refuses the others with EINVAL)",
			attr.AccessFlags&^qpAccessFlags, AccessFlags(qpAccessFlags))
	}
	if has(AttrPort) && attr.PortNum == 0 {
		bad(AttrPort, "port numbers start at 1")
	}
	if has(AttrAV) {
		checkAH(&attr.AH, AttrAV, bad)
		if attr.AH.PortNum == 0 {
			bad(AttrAV, "AH.PortNum is 0: the kernel refuses an address vector without a port "+
				"(uverbs' modify_qp; the man page does not say): set it to the QP's port")
		} else if has(AttrPort) && attr.AH.PortNum != attr.PortNum {
			bad(AttrAV, "AH.PortNum %d differs from PortNum %d: the kernel refuses the two apart (uverbs' modify_qp)",
				attr.AH.PortNum, attr.PortNum)
		}
	}
	if has(AttrAltPath) {
		checkAH(&attr.AltAH, AttrAltPath, bad)
		if attr.AltTimeout > MaxACKTimeout {
			bad(AttrAltPath, "alternate timeout code %d does not fit in 5 bits", attr.AltTimeout)
		}
		if attr.AltPortNum == 0 || attr.AltAH.PortNum != attr.AltPortNum {
			bad(AttrAltPath, "AltPortNum %d and AltAH.PortNum %d: the kernel wants both set to the same port "+
				"(uverbs' modify_qp; the man page does not say)", attr.AltPortNum, attr.AltAH.PortNum)
		}
	}
	if len(probs) > 0 {
		return &AttrError{QPType: t, Transition: Transition{from, to}, Problems: probs}
	}
	return nil
}

func checkAH(ah *AHAttr, a AttrMask, bad func(AttrMask, string, ...any)) {
	if ah.SL > 15 {
		bad(a, "service level %d does not fit in 4 bits", ah.SL)
	}
	if ah.IsGlobal && ah.GRH.FlowLabel > max20 {
		bad(a, "flow label %#x does not fit in 20 bits", ah.GRH.FlowLabel)
	}
}

// PortInfo is what the port-aware checks need to know of the local port.
type PortInfo struct {
	Device    string
	Port      int
	Transport Transport
	Attr      PortAttr
	// RemoteActiveMTU, when known, is the peer port's active MTU; the path
	// MTU must fit both.
	RemoteActiveMTU MTU
	// MaxRdAtomic and MaxDestRdAtomic, when known (not 0), are the
	// limits the drivers hold QPAttr.MaxRdAtomic and MaxDestRdAtomic to:
	// DeviceAttr.MaxQPRdAtom and MaxQPInitRdAtom, in that order, as rxe
	// (rxe_qp_chk_attr), mlx5 and bnxt_re compare them. A larger value is
	// refused with EINVAL. (librdmacm checks rdma_conn_param the other way
	// round, responder resources against MaxQPRdAtom; the two agree on
	// devices whose limits are equal, as rxe's and mlx5's usually are.)
	MaxRdAtomic, MaxDestRdAtomic int
	// PortCount, when known (not 0), is the device's number of ports: a
	// PORT, an address vector's port or an alternate port above it is
	// refused, as uverbs' modify_qp refuses it (EINVAL).
	PortCount int
	// AltAttr, when ALT_PATH is in the mask, is the alternate port's state
	// (zero when unknown): its P_Key table bounds AltPKeyIndex, and its
	// GRH flag applies to AltAH.
	AltAttr PortAttr
}

// Kind is the port's kind (RoCE, InfiniBand, iWARP).
func (p PortInfo) Kind() Kind { return KindOf(p.Transport, p.Attr.LinkLayer) }

// ErrIWARPManual is wrapped by the error for a manual transition beyond INIT on an
// iWARP port.
var ErrIWARPManual = errors.New("iWARP QPs are connected by the iWARP CM: the provider moves them to RTR and RTS " +
	"(siw turns a user RTS into EINVAL); connect them with rdmacm instead")

// ValidateForPort adds the checks that need the port to [ValidateAttr]: the
// seed's pitfalls that the driver reports as a bare EINVAL, or worse accepts
// and then stalls.
//   - RoCE, and a port with the flag GRH_REQUIRED: an address vector
//     without a GRH is refused (EINVAL); the source GID index must be
//     inside the port's table.
//   - A path MTU above the port's active MTU (or the peer's): rxe checks only
//     max_mtu, so the QP would connect and then stall.
//   - iWARP: the CM moves the QP; a manual INIT→RTR or RTR→RTS is refused.
//   - The kernel's bans the man page does not list: an alternate path
//     (ALT_PATH) anywhere but on InfiniBand, an address vector into RTR
//     whose port is not the QP's, a port the device lacks (PORT, the
//     address vector's or the alternate one), a MaxRdAtomic or
//     MaxDestRdAtomic above the device's, and a P_Key index (or alternate
//     P_Key index) outside the port's table.
func ValidateForPort(t QPType, from, to QPState, attr *QPAttr, mask AttrMask, port PortInfo) error {
	if err := ValidateAttr(t, from, to, attr, mask); err != nil {
		return err
	}
	mask &^= KernelIgnored(t)
	where := fmt.Sprintf("%v QP %v on %s port %d", t, Transition{from, to}, port.Device, port.Port)
	if port.Kind() == KindIWARP && (to == QPStateRTR || to == QPStateRTS) && from != to && from != QPStateSQD && from != QPStateSQE {
		return fmt.Errorf("verbs: %s: %w", where, ErrIWARPManual)
	}
	var probs []AttrProblem
	bad := func(a AttrMask, format string, args ...any) {
		probs = append(probs, AttrProblem{Attr: a, Reason: fmt.Sprintf(format, args...)})
	}
	if mask&AttrAV != 0 && (port.Kind() == KindRoCE || port.Attr.GRHRequired) {
		switch {
		case !attr.AH.IsGlobal && port.Kind() == KindRoCE:
			bad(AttrAV, "RoCE needs a GRH on every address vector: set AH.IsGlobal with GRH.DGID "+
				"(the peer's GID) and GRH.SGIDIndex (the local GID entry for the source address; the resolver picks it)")
		case !attr.AH.IsGlobal:
			bad(AttrAV, "%s port %d requires a GRH on every address vector (its port flag GRH_REQUIRED; "+
				"the kernel's rdma_check_ah_attr refuses one without): set AH.IsGlobal with GRH.DGID and GRH.SGIDIndex",
				port.Device, port.Port)
		case port.Attr.GIDTableLen > 0 && int(attr.AH.GRH.SGIDIndex) >= port.Attr.GIDTableLen:
			bad(AttrAV, "source GID index %d is outside the port's table of %d entries",
				attr.AH.GRH.SGIDIndex, port.Attr.GIDTableLen)
		}
	}
	if k := port.Kind(); mask&AttrAltPath != 0 && (k == KindRoCE || k == KindIWARP) {
		bad(AttrAltPath, "the kernel refuses alternate paths on %v: the core handles them (APM) for InfiniBand only "+
			"(_ib_modify_qp, drivers/infiniband/core/verbs.c), though the IBTA allows ALT_PATH there", port.Kind())
	} else if mask&AttrAltPath != 0 {
		if port.AltAttr.LinkLayer == LinkLayerEthernet {
			bad(AttrAltPath, "alternate port %d is an Ethernet (RoCE) port: the kernel takes an alternate path only "+
				"between InfiniBand ports (_ib_modify_qp)", attr.AltPortNum)
		}
		if port.AltAttr.GRHRequired && !attr.AltAH.IsGlobal {
			bad(AttrAltPath, "alternate port %d requires a GRH on every address vector (its port flag GRH_REQUIRED): "+
				"set AltAH.IsGlobal with GRH.DGID and GRH.SGIDIndex", attr.AltPortNum)
		}
		if n := port.AltAttr.PKeyTableLen; n > 0 && int(attr.AltPKeyIndex) >= n {
			bad(AttrAltPath, "alternate P_Key index %d is outside port %d's table of %d entries: the core's P_Key check "+
				"refuses it", attr.AltPKeyIndex, attr.AltPortNum, n)
		}
	}
	if n := port.PortCount; n > 0 {
		noPort := func(a AttrMask, what string, p uint8) {
			if int(p) > n {
				bad(a, "%s %d: %s has no such port (its ports are 1 to %d)", what, p, port.Device, n)
			}
		}
		if mask&AttrPort != 0 {
			noPort(AttrPort, "PortNum", attr.PortNum)
		}
		if mask&AttrAV != 0 {
			noPort(AttrAV, "AH.PortNum", attr.AH.PortNum)
		}
		if mask&AttrAltPath != 0 {
			noPort(AttrAltPath, "AltPortNum", attr.AltPortNum)
		}
	}
	if mask&AttrAV != 0 && mask&AttrState != 0 && to == QPStateRTR && attr.AH.PortNum != 0 && int(attr.AH.PortNum) != port.Port {
		bad(AttrAV, "AH.PortNum %d is not the QP's port %d: the kernel refuses it into RTR (uverbs' modify_qp)",
			attr.AH.PortNum, port.Port)
	}
	if mask&AttrMaxQPRdAtomic != 0 && port.MaxRdAtomic > 0 && int(attr.MaxRdAtomic) > port.MaxRdAtomic {
		bad(AttrMaxQPRdAtomic, "%d exceeds the device's limit of %d (max_qp_rd_atom, which rxe_qp_chk_attr and mlx5 "+
			"compare it with): the driver refuses it", attr.MaxRdAtomic, port.MaxRdAtomic)
	}
	if mask&AttrMaxDestRdAtomic != 0 && port.MaxDestRdAtomic > 0 && int(attr.MaxDestRdAtomic) > port.MaxDestRdAtomic {
		bad(AttrMaxDestRdAtomic, "%d exceeds the device's limit of %d (max_qp_init_rd_atom, which mlx5 and bnxt_re "+
			"compare it with): hardware drivers refuse it", attr.MaxDestRdAtomic, port.MaxDestRdAtomic)
	}
	if mask&AttrPKeyIndex != 0 && port.Attr.PKeyTableLen > 0 && int(attr.PKeyIndex) >= port.Attr.PKeyTableLen {
		bad(AttrPKeyIndex, "P_Key index %d is outside the port's table of %d entries: hardware drivers (mlx5) refuse it, "+
			"and on InfiniBand so does the core's P_Key check; index 0 holds the default P_Key", attr.PKeyIndex, port.Attr.PKeyTableLen)
	}
	if mask&AttrPathMTU != 0 && attr.PathMTU.Valid() {
		if port.Attr.ActiveMTU.Valid() && attr.PathMTU > port.Attr.ActiveMTU {
			bad(AttrPathMTU, "path MTU %v exceeds the port's active MTU %v (max MTU %v is what the device could do, "+
				"not what the link carries): use min(local, remote active MTU)", attr.PathMTU, port.Attr.ActiveMTU, port.Attr.MaxMTU)
		}
		if port.RemoteActiveMTU.Valid() && attr.PathMTU > port.RemoteActiveMTU {
			bad(AttrPathMTU, "path MTU %v exceeds the peer's active MTU %v", attr.PathMTU, port.RemoteActiveMTU)
		}
	}
	if len(probs) > 0 {
		return &AttrError{QPType: t, Transition: Transition{from, to}, Problems: probs}
	}
	return nil
}

// Warnings returns legal settings of a QP that retransmits (RC, and an XRC
// initiator) that usually surprise: an infinite ACK timeout (a lost packet
// stalls the QP forever) and zero retry counts (the first loss or RNR fails
// the QP: useful to surface races during development, wrong in production).
// An infinite RNR retry (7) is no warning: it is what rdma_cm sets, and
// waits for ever only on a receiver that never posts, which the QP's
// settings cannot tell.
func Warnings(t QPType, attr *QPAttr, mask AttrMask) []string {
	var w []string
	if t != QPTypeRC && t != QPTypeXRCSend {
		return nil
	}
	if mask&AttrTimeout != 0 && attr.Timeout == ACKTimeoutInfinite {
		w = append(w, "TIMEOUT 0 never retransmits: one lost packet stalls the QP forever (14 ≈ 67 ms is common)")
	}
	if mask&AttrRetryCount != 0 && attr.RetryCount == 0 {
		w = append(w, "RETRY_CNT 0: the first lost packet fails the QP with RETRY_EXC_ERR (7 is common outside development)")
	}
	if mask&AttrRNRRetry != 0 && attr.RNRRetry == 0 {
		w = append(w, "RNR_RETRY 0: a send that arrives before the peer posted a receive fails the QP with RNR_RETRY_EXC_ERR")
	}
	return w
}
