// Package ibv is rdmago's only door into libibverbs: every call into the C
// library and every C handle of package verbs lives here, so that verbs
// itself is pure Go and has the same API in every build. Built without cgo
// (or off Linux), every constructor fails with ErrNoCgo.
//
// The types below carry what crosses the wall, in plain Go types; package
// verbs converts them to and from its own.
package ibv

import (
	"errors"
	"syscall"
)

// ErrReasonLost is a post the provider refused (it named a refused
// request) while returning success: libsiw 44 overwrites the error with
// its doorbell's result.
var ErrReasonLost = errors.New("refused by the provider, which returned success and no errno")

// ErrNoCgo is what every call returns in a build without libibverbs.
var ErrNoCgo = errors.New("built without cgo: libibverbs and librdmacm are not available " +
	"(build on Linux with CGO_ENABLED=1 and Debian's libibverbs-dev and librdmacm-dev)")

// DeviceInfo describes a device of the device list.
type DeviceInfo struct {
	Name                string
	Transport, NodeType int
	GUID                uint64 // host order
}

// DeviceAttr is struct ibv_device_attr, field for field as verbs.DeviceAttr
// (which converts it directly).
type DeviceAttr struct {
	FirmwareVersion    string
	NodeGUID           uint64
	SysImageGUID       uint64
	MaxMRSize          uint64
	PageSizeCap        uint64
	VendorID           uint32
	VendorPartID       uint32
	HardwareVersion    uint32
	MaxQP              int
	MaxQPWR            int
	MaxSGE             int
	MaxCQ              int
	MaxCQE             int
	MaxMR              int
	MaxPD              int
	MaxQPRdAtom        int
	MaxQPInitRdAtom    int
	MaxSRQ             int
	MaxSRQWR           int
	MaxAH              int
	AtomicCapable      bool
	PhysicalPortCount  int
	MaxMulticastGroups int
	MaxQPPerMulticast  int
	LocalCACKDelay     uint8
	MaxPKeys           int
	DeviceCapFlags     uint32
}

// PortAttr is struct ibv_port_attr.
type PortAttr struct {
	State, MaxMTU, ActiveMTU  int
	GIDTableLen, PKeyTableLen int
	PortCapFlags              uint32
	LID, SMLID                uint16
	LMC, ActiveWidth          uint8
	ActiveSpeed, PhysState    uint8
	LinkLayer                 uint8
	Flags                     uint8 // IBV_QPF_*
}

// GIDEntry is struct ibv_gid_entry.
type GIDEntry struct {
	Index, Port int
	GID         [16]byte
	Type        int
	NetdevIndex int
}

// AsyncEvent is struct ibv_async_event, reduced to what verbs reports.
type AsyncEvent struct {
	Type int
	Port int    // port events
	QPN  uint32 // QP events
}

// AHAttr is struct ibv_ah_attr.
type AHAttr struct {
	DGID                              [16]byte
	FlowLabel                         uint32
	SGIDIndex, HopLimit, TrafficClass uint8
	DLID                              uint16
	SL, SrcPathBits, StaticRate       uint8
	IsGlobal                          bool
	PortNum                           uint8
}

// QPCap is struct ibv_qp_cap.
type QPCap struct {
	MaxSendWR, MaxRecvWR, MaxSendSGE, MaxRecvSGE, MaxInlineData uint32
}

// QPAttr is struct ibv_qp_attr.
type QPAttr struct {
	State, CurState, PathMTU, PathMigState int
	QKey, RQPSN, SQPSN, DestQPN            uint32
	AccessFlags                            uint32
	Cap                                    QPCap
	AH, AltAH                              AHAttr
	PKeyIndex, AltPKeyIndex                uint16
	EnSQDAsyncNotify, SQDraining           bool
	MaxRdAtomic, MaxDestRdAtomic           uint8
	MinRNRTimer, PortNum, Timeout          uint8
	RetryCount, RNRRetry                   uint8
	AltPortNum, AltTimeout                 uint8
	RateLimit                              uint32
}

// QPInit is struct ibv_qp_init_attr.
type QPInit struct {
	Type           int
	SendCQ, RecvCQ *CQ
	Cap            QPCap
	SignalAll      bool
}

// WC is struct ibv_wc as verbs.WorkCompletion lays it out: the two have the
// same fields in the same order and of the same underlying types, so that
// Poll writes straight into the caller's slice (verbs checks the layout in
// a test).
type WC struct {
	ID        uint64
	Status    uint32
	Opcode    uint32
	VendorErr uint32
	ByteLen   uint32
	Imm       uint32 // host order
	QPN       uint32
	SrcQP     uint32
	Flags     uint32
	PKeyIndex uint16
	SLID      uint16
	SL        uint8
}

// SGE is struct ibv_sge, laid out as C lays it out (and as verbs.SGE).
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendDesc describes one send request in the QP's C scratch memory; the
// post links the batch into struct ibv_send_wr in one crossing. Its layout
// is C's struct rdmago_swr (checked when the package starts).
type SendDesc struct {
	ID, RemoteAddr, CompareAdd, Swap uint64
	AH                               uintptr // struct ibv_ah *, or 0
	Opcode, Flags, Imm, NumSGE       uint32
	RKey, RemoteQPN, RemoteQKey      uint32
}

// SetAH makes the request a UD send through ah.
func (d *SendDesc) SetAH(ah *AH) {
	d.AH = 0
	if ah != nil {
		d.AH = ah.handle()
	}
}

// RecvDesc describes one receive request; its layout is C's struct
// rdmago_rwr.
type RecvDesc struct {
	ID     uint64
	NumSGE uint32
}

// NotifyError is a failed ibv_req_notify_cq inside CQ.PollArm.
type NotifyError struct{ Err syscall.Errno }

func (e *NotifyError) Error() string { return "ibv_req_notify_cq: " + e.Err.Error() }
func (e *NotifyError) Unwrap() error { return e.Err }
