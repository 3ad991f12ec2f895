package verbs

import "fmt"

// Opcode is a send work request's operation (enum ibv_wr_opcode).
type Opcode uint32

const (
	OpRDMAWrite        Opcode = 0
	OpRDMAWriteWithImm Opcode = 1
	OpSend             Opcode = 2
	OpSendWithImm      Opcode = 3
	OpRDMARead         Opcode = 4
	OpAtomicCmpAndSwp  Opcode = 5
	OpAtomicFetchAdd   Opcode = 6
)

var opcodeNames = [...]string{"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM", "RDMA_READ",
	"ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD"}

func (o Opcode) String() string {
	if int(o) < len(opcodeNames) {
		return opcodeNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint32(o))
}

// SendFlags modify a send work request (enum ibv_send_flags).
type SendFlags uint32

const (
	SendFence     SendFlags = 1 << 0
	SendSignaled  SendFlags = 1 << 1 // ask for a completion
	SendSolicited SendFlags = 1 << 2
	SendInline    SendFlags = 1 << 3 // copy the data into the WR: no MR needed, at most MaxInlineData bytes
)

// SGE is a scatter/gather element: a range of a registered memory region.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send work request (struct ibv_send_wr).
type SendWR struct {
	ID     uint64
	Opcode Opcode
	Flags  SendFlags
	SGEs   []SGE
	// Imm is the immediate data of *_WITH_IMM (host order; sent big-endian).
	Imm uint32
	// RemoteAddr and RKey address the peer's memory for RDMA and atomics.
	RemoteAddr uint64
	RKey       uint32
	// CompareAdd is the value to add (FETCH_AND_ADD) or compare (CMP_AND_SWP);
	// Swap the value swapped in. Atomics work on 8 aligned bytes.
	CompareAdd uint64
	Swap       uint64
	// UD only: where the datagram goes.
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
}

// RecvWR is a receive work request (struct ibv_recv_wr).
type RecvWR struct {
	ID   uint64
	SGEs []SGE
}

// WCStatus is a work completion's status (enum ibv_wc_status).
type WCStatus uint32

const (
	WCSuccess         WCStatus = 0
	WCLocLenErr       WCStatus = 1
	WCLocQPOpErr      WCStatus = 2
	WCLocProtErr      WCStatus = 4
	WCWRFlushErr      WCStatus = 5
	WCLocAccessErr    WCStatus = 8
	WCRemInvReqErr    WCStatus = 9
	WCRemAccessErr    WCStatus = 10
	WCRemOpErr        WCStatus = 11
	WCRetryExcErr     WCStatus = 12
	WCRNRRetryExcErr  WCStatus = 13
	WCRemAbortErr     WCStatus = 16
	WCFatalErr        WCStatus = 19
	WCRespTimeoutErr  WCStatus = 20
	WCGeneralErr      WCStatus = 21
	maxWCStatusString          = 23
)

var wcStatusNames = [...]string{"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR",
	"WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR",
	"REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR",
	"REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR",
	"TM_ERR", "TM_RNDV_INCOMPLETE"}

func (s WCStatus) String() string {
	if s <= maxWCStatusString {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", uint32(s))
}

// Hint says what usually causes a failed completion and what to check.
func (s WCStatus) Hint() string {
	switch s {
	case WCRetryExcErr:
		return "no ACK after RETRY_CNT retransmissions: the peer is gone, or the path is wrong " +
			"(GID index, RoCE v1 against v2, VLAN, link-local GID across subnets) or the path MTU exceeds the link"
	case WCRNRRetryExcErr:
		return "the peer had no receive posted after RNR_RETRY retries: post receives before the sender sends"
	case WCRemAccessErr:
		return "the peer's MR lacks the remote right (REMOTE_WRITE/READ/ATOMIC) or the rkey/address range is wrong"
	case WCLocLenErr:
		return "the message is longer than the receive buffer, or than the path MTU on UD"
	case WCLocProtErr:
		return "an SGE lies outside its MR, or the lkey is wrong"
	case WCWRFlushErr:
		return "the QP went to the error state; this request was flushed (look for the first error before it)"
	case WCRemInvReqErr:
		return "the peer refused the request: operation not enabled on its QP, or message too long"
	}
	return ""
}

// WCOpcode is what a completion completed (enum ibv_wc_opcode).
type WCOpcode uint32

const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCRecv            WCOpcode = 1 << 7
	WCRecvRDMAWithImm WCOpcode = WCRecv + 1
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCCompSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint32(o))
}

// WCFlags (enum ibv_wc_flags).
type WCFlags uint32

const (
	WCWithGRH WCFlags = 1 << 0 // a UD receive starts with the 40-byte GRH
	WCWithImm WCFlags = 1 << 1 // Imm is valid
)

// WorkCompletion is one completion (struct ibv_wc).
type WorkCompletion struct {
	ID        uint64
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32
	Imm       uint32 // host order, valid with WCWithImm
	QPN       uint32
	SrcQP     uint32 // UD: the sender's QP number
	Flags     WCFlags
	PKeyIndex uint16
	SLID      uint16
	SL        uint8
}

// Err returns nil for a successful completion and an error naming the status
// and its usual cause otherwise.
func (wc *WorkCompletion) Err() error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &CompletionError{WC: *wc}
}

// CompletionError is a failed work completion.
type CompletionError struct {
	WC WorkCompletion
	// Hint, when set, replaces the status's own ([WCStatus.Hint]) in Error:
	// a caller that knows what the work request was for can say more.
	Hint string
}

func (e *CompletionError) Error() string {
	wc := &e.WC
	msg := fmt.Sprintf("verbs: work request %d on QP %#x completed with %v (vendor error %#x)", wc.ID, wc.QPN, wc.Status, wc.VendorErr)
	h := e.Hint
	if h == "" {
		h = wc.Status.Hint()
	}
	if h != "" {
		msg += ": " + h
	}
	return msg
}

// QPInit describes a QP to create (struct ibv_qp_init_attr).
type QPInit struct {
	Type   QPType
	SendCQ *CQ
	RecvCQ *CQ
	Cap    QPCap
	// SignalAll makes every send request produce a completion; otherwise
	// only those with SendSignaled do.
	SignalAll bool
}

// sendWRProblem says why a QP of type t (on an iWARP device if iwarp)
// cannot carry w, or returns "". The providers trust these rules: librxe
// reads a UD send's AH without a check, and in struct ibv_send_wr a UD
// send's AH shares its place with an RDMA request's remote address, so an
// AH on an RC send would become the address written to.
func sendWRProblem(t QPType, iwarp bool, w *SendWR) string {
	op := w.Opcode
	atomic := op == OpAtomicCmpAndSwp || op == OpAtomicFetchAdd
	switch {
	case op > OpAtomicFetchAdd:
		return fmt.Sprintf("opcode %v is not one this package posts (RDMA_WRITE to ATOMIC_FETCH_AND_ADD)", op)
	case t == QPTypeUD && op != OpSend && op != OpSendWithImm:
		return fmt.Sprintf("a UD QP sends SEND and SEND_WITH_IMM only, not %v", op)
	case t == QPTypeUD && w.AH == nil:
		return "a UD send needs an address handle (SendWR.AH)"
	case t != QPTypeUD && w.AH != nil:
		return fmt.Sprintf("only UD sends take an address handle (SendWR.AH); this QP is %v", t)
	case t == QPTypeUC && (op == OpRDMARead || atomic):
		return fmt.Sprintf("a UC QP has no %v (RDMA_READ and atomics need RC)", op)
	case iwarp && (op == OpSendWithImm || op == OpRDMAWriteWithImm):
		return fmt.Sprintf("iWARP has no immediate data: %v is not carried (send the value in the message instead)", op)
	case iwarp && atomic:
		return fmt.Sprintf("iWARP devices here have no atomics (%v)", op)
	case w.Flags&SendInline != 0 && op != OpSend && op != OpSendWithImm && op != OpRDMAWrite && op != OpRDMAWriteWithImm:
		return fmt.Sprintf("inline data (SendInline) goes with SEND and RDMA_WRITE only, not %v", op)
	case iwarp && op == OpRDMARead && w.Flags&SendFence != 0:
		// siw_activate_tx refuses it without taking it off the queue:
		// every request behind it would wait for ever.
		return "an RDMA_READ on iWARP takes no fence (SendFence): siw refuses it, and its send queue stops behind it"
	case atomic && (len(w.SGEs) != 1 || w.SGEs[0].Length != 8 || w.RemoteAddr%8 != 0):
		return "an atomic works on 8 aligned bytes: one SGE of 8 bytes, and RemoteAddr a multiple of 8"
	}
	return ""
}
