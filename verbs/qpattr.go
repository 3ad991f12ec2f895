package verbs

import (
	"fmt"
	"math/bits"
	"strings"
)

// QPState is a queue pair's state (enum ibv_qp_state).
type QPState int

const (
	QPStateReset QPState = iota
	QPStateInit
	QPStateRTR // ready to receive
	QPStateRTS // ready to send
	QPStateSQD // send queue drained
	QPStateSQE // send queue error
	QPStateErr
	QPStateUnknown
)

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "UNKNOWN"}

func (s QPState) String() string {
	if s >= 0 && int(s) < len(qpStateNames) {
		return qpStateNames[s]
	}
	return fmt.Sprintf("QPState(%d)", int(s))
}

// valid reports one of the seven real states (not UNKNOWN).
func (s QPState) valid() bool { return s >= QPStateReset && s <= QPStateErr }

// QPType is a queue pair's transport service (enum ibv_qp_type).
type QPType int

const (
	QPTypeRC        QPType = 2 // reliable connected
	QPTypeUC        QPType = 3 // unreliable connected
	QPTypeUD        QPType = 4 // unreliable datagram
	QPTypeRawPacket QPType = 8
	QPTypeXRCSend   QPType = 9
	QPTypeXRCRecv   QPType = 10
	QPTypeDriver    QPType = 0xff
)

func (t QPType) String() string {
	switch t {
	case QPTypeRC:
		return "RC"
	case QPTypeUC:
		return "UC"
	case QPTypeUD:
		return "UD"
	case QPTypeRawPacket:
		return "RAW_PACKET"
	case QPTypeXRCSend:
		return "XRC_SEND"
	case QPTypeXRCRecv:
		return "XRC_RECV"
	case QPTypeDriver:
		return "DRIVER"
	}
	return fmt.Sprintf("QPType(%d)", int(t))
}

// MigState is the path migration state (enum ibv_mig_state).
type MigState int

const (
	MigMigrated MigState = 0
	MigRearm    MigState = 1
	MigArmed    MigState = 2
)

func (m MigState) String() string {
	switch m {
	case MigMigrated:
		return "MIGRATED"
	case MigRearm:
		return "REARM"
	case MigArmed:
		return "ARMED"
	}
	return fmt.Sprintf("MigState(%d)", int(m))
}

// AccessFlags are memory and QP access rights (enum ibv_access_flags). On a
// QP only the remote rights matter: REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC,
// and the FLUSH ones on kernels that have FLUSH (6.2 and later; Debian 12's
// rdma-core 44 does not name them). LOCAL_WRITE is a memory-region flag
// (needed for any MR a receive or an RDMA read writes into).
type AccessFlags uint32

const (
	AccessLocalWrite      AccessFlags = 1 << 0
	AccessRemoteWrite     AccessFlags = 1 << 1
	AccessRemoteRead      AccessFlags = 1 << 2
	AccessRemoteAtomic    AccessFlags = 1 << 3
	AccessMWBind          AccessFlags = 1 << 4
	AccessZeroBased       AccessFlags = 1 << 5
	AccessOnDemand        AccessFlags = 1 << 6
	AccessHugeTLB         AccessFlags = 1 << 7
	AccessFlushGlobal     AccessFlags = 1 << 8 // a FLUSH responder (kernel 6.2 and later)
	AccessFlushPersistent AccessFlags = 1 << 9
	AccessRelaxedOrdering AccessFlags = 1 << 20
)

var accessNames = map[AccessFlags]string{
	AccessLocalWrite: "LOCAL_WRITE", AccessRemoteWrite: "REMOTE_WRITE", AccessRemoteRead: "REMOTE_READ",
	AccessRemoteAtomic: "REMOTE_ATOMIC", AccessMWBind: "MW_BIND", AccessZeroBased: "ZERO_BASED",
	AccessOnDemand: "ON_DEMAND", AccessHugeTLB: "HUGETLB", AccessFlushGlobal: "FLUSH_GLOBAL",
	AccessFlushPersistent: "FLUSH_PERSISTENT", AccessRelaxedOrdering: "RELAXED_ORDERING",
}

// qpAccessFlags are the flags a QP's access-flags attribute can carry:
// those the strictest driver check (rxe's RXE_ACCESS_SUPPORTED_QP, which
// newer kernels have) lets through. The core passes the attribute on
// unchecked and other drivers ignore the flags they do not use, so code
// that gives a QP its MRs' flags works; ZERO_BASED and HUGETLB, which
// only describe memory, rxe refuses. (The kernels whose rxe checked QP
// flags before RELAXED_ORDERING joined its mask refuse that one too.)
const qpAccessFlags = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic |
	AccessMWBind | AccessOnDemand | AccessFlushGlobal | AccessFlushPersistent | AccessRelaxedOrdering

func (f AccessFlags) String() string {
	return flagString(uint32(f), func(bit uint32) string { return accessNames[AccessFlags(bit)] })
}

// AttrMask says which fields of a [QPAttr] a modify or query uses (enum
// ibv_qp_attr_mask). It prints as STATE|AV|PATH_MTU.
type AttrMask uint32

const (
	AttrState            AttrMask = 1 << 0
	AttrCurState         AttrMask = 1 << 1
	AttrEnSQDAsyncNotify AttrMask = 1 << 2
	AttrAccessFlags      AttrMask = 1 << 3
	AttrPKeyIndex        AttrMask = 1 << 4
	AttrPort             AttrMask = 1 << 5
	AttrQKey             AttrMask = 1 << 6
	AttrAV               AttrMask = 1 << 7
	AttrPathMTU          AttrMask = 1 << 8
	AttrTimeout          AttrMask = 1 << 9
	AttrRetryCount       AttrMask = 1 << 10
	AttrRNRRetry         AttrMask = 1 << 11
	AttrRQPSN            AttrMask = 1 << 12
	AttrMaxQPRdAtomic    AttrMask = 1 << 13
	AttrAltPath          AttrMask = 1 << 14
	AttrMinRNRTimer      AttrMask = 1 << 15
	AttrSQPSN            AttrMask = 1 << 16
	AttrMaxDestRdAtomic  AttrMask = 1 << 17
	AttrPathMigState     AttrMask = 1 << 18
	AttrCap              AttrMask = 1 << 19
	AttrDestQPN          AttrMask = 1 << 20
	AttrRateLimit        AttrMask = 1 << 25
)

var attrNames = map[AttrMask]string{
	AttrState: "STATE", AttrCurState: "CUR_STATE", AttrEnSQDAsyncNotify: "EN_SQD_ASYNC_NOTIFY",
	AttrAccessFlags: "ACCESS_FLAGS", AttrPKeyIndex: "PKEY_INDEX", AttrPort: "PORT", AttrQKey: "QKEY",
	AttrAV: "AV", AttrPathMTU: "PATH_MTU", AttrTimeout: "TIMEOUT", AttrRetryCount: "RETRY_CNT",
	AttrRNRRetry: "RNR_RETRY", AttrRQPSN: "RQ_PSN", AttrMaxQPRdAtomic: "MAX_QP_RD_ATOMIC",
	AttrAltPath: "ALT_PATH", AttrMinRNRTimer: "MIN_RNR_TIMER", AttrSQPSN: "SQ_PSN",
	AttrMaxDestRdAtomic: "MAX_DEST_RD_ATOMIC", AttrPathMigState: "PATH_MIG_STATE", AttrCap: "CAP",
	AttrDestQPN: "DEST_QPN", AttrRateLimit: "RATE_LIMIT",
}

// String lists the bits by their libibverbs names without the IBV_QP_ prefix,
// lowest bit first: STATE|AV|PATH_MTU. The empty mask prints as 0.
func (m AttrMask) String() string {
	return flagString(uint32(m), func(bit uint32) string { return attrNames[AttrMask(bit)] })
}

// Bits returns the mask's single-bit masks, lowest first.
func (m AttrMask) Bits() []AttrMask {
	var out []AttrMask
	for v := uint32(m); v != 0; v &= v - 1 {
		out = append(out, AttrMask(1)<<bits.TrailingZeros32(v))
	}
	return out
}

func flagString(v uint32, name func(uint32) string) string {
	if v == 0 {
		return "0"
	}
	var parts []string
	for ; v != 0; v &= v - 1 {
		bit := uint32(1) << bits.TrailingZeros32(v)
		if n := name(bit); n != "" {
			parts = append(parts, n)
		} else {
			parts = append(parts, fmt.Sprintf("%#x", bit))
		}
	}
	return strings.Join(parts, "|")
}

// GlobalRoute is the GRH part of an address vector (struct ibv_global_route).
// RoCE needs it on every address vector (AHAttr.IsGlobal); InfiniBand only
// across subnets.
type GlobalRoute struct {
	DGID GID // destination GID
	// FlowLabel is 20 bits.
	FlowLabel uint32
	// SGIDIndex is the index of the local GID table entry to send from: on
	// RoCE it picks the source IP, the RoCE version and the VLAN.
	SGIDIndex uint8
	// HopLimit: 0 or 1 keeps packets in the subnet; on RoCE the kernel
	// replaces it with the route's.
	HopLimit     uint8
	TrafficClass uint8
}

// AHAttr is an address vector (struct ibv_ah_attr).
type AHAttr struct {
	GRH         GlobalRoute
	DLID        uint16 // destination LID (InfiniBand)
	SL          uint8  // service level, 4 bits
	SrcPathBits uint8
	StaticRate  uint8
	IsGlobal    bool // a GRH is present: required on RoCE
	PortNum     uint8
}

// QPCap are a QP's queue sizes (struct ibv_qp_cap).
type QPCap struct {
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInlineData uint32
}

// QPAttr models every field of struct ibv_qp_attr. Which fields a modify uses
// is said by an [AttrMask]; start from the zero value (the C struct may grow, and
// unused fields must be zero).
type QPAttr struct {
	State        QPState  // AttrState: the state to move to
	CurState     QPState  // AttrCurState: the state the caller believes the QP is in
	PathMTU      MTU      // AttrPathMTU
	PathMigState MigState // AttrPathMigState
	QKey         uint32   // AttrQKey (UD); with bit 31 set (PrivilegedQKey) it needs CAP_NET_RAW
	RQPSN        uint32   // AttrRQPSN: first PSN expected from the peer, 24 bits
	SQPSN        uint32   // AttrSQPSN: first PSN sent, 24 bits
	DestQPN      uint32   // AttrDestQPN: the peer's QP number, 24 bits
	AccessFlags  AccessFlags
	Cap          QPCap
	AH           AHAttr // AttrAV: the primary path
	AltAH        AHAttr // AttrAltPath
	PKeyIndex    uint16
	AltPKeyIndex uint16
	// EnSQDAsyncNotify asks for an event when the send queue has drained (RTS→SQD).
	EnSQDAsyncNotify bool
	SQDraining       bool // query only
	// MaxRdAtomic (AttrMaxQPRdAtomic) is how many RDMA reads and atomics this
	// QP may have outstanding as initiator.
	MaxRdAtomic uint8
	// MaxDestRdAtomic (AttrMaxDestRdAtomic) is how many the QP accepts as
	// responder.
	MaxDestRdAtomic uint8
	MinRNRTimer     RNRTimer   // AttrMinRNRTimer: a 5-bit code, not milliseconds
	PortNum         uint8      // AttrPort
	Timeout         ACKTimeout // AttrTimeout: a 5-bit code; 0 = never retransmit
	RetryCount      uint8      // AttrRetryCount: 3 bits
	RNRRetry        uint8      // AttrRNRRetry: 3 bits, 7 = retry forever
	AltPortNum      uint8
	AltTimeout      ACKTimeout
	RateLimit       uint32 // AttrRateLimit, kbps (raw packet QPs)
}
