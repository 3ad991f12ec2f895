package ibv

import (
	"sync/atomic"
	"syscall"
	"unsafe"
)

// The siw data path without cgo: siw (Soft-iWARP) maps its send, receive
// and completion rings into the process, and libsiw posts and polls them
// with plain stores and loads; only the send doorbell is a system call,
// and arming a CQ is a store. Go does the same here, so that a post, a
// poll or an arming does not enter C: each entry costs the runtime's
// syscall bookkeeping, and the wake-up of a sleeping sysmon, which in the
// cost model was most of what the event-mode round trip cost beyond C's
// (bench/notes.md, bench/cgofree.md).
//
// The layouts are the kernel's uapi, rdma/siw-abi.h; the rules are
// libsiw's (rdma-core 44, providers/siw/siw.c), which this follows step by
// step. The counters sq_put, rq_put and cq_get are libsiw's own, in its
// private structs: Go advances them in place, so C and Go never disagree
// on where the rings stand. The caller serialises the calls on one queue,
// as libsiw's spinlocks do (package verbs holds the QP's and the CQ's
// mutex around them); C's own post and poll are never called on a queue
// that goes through here.

const (
	siwSQESize = 120 // struct siw_sqe
	siwRQESize = 112 // struct siw_rqe
	siwCQESize = 32  // struct siw_cqe
	siwMaxSGE  = 6
	siwMaxInl  = 80 // SIW_MAX_INLINE: sge[1..5]

	// WQE flags (enum siw_wqe_flags), in the low half of the word at 8.
	siwValid     = 1
	siwInline    = 2
	siwSignalled = 4
	siwSolicited = 8
	siwReadFence = 16

	// The CQ's notify flags, SIW_NOTIFY_SOLICITED | SIW_NOTIFY_NEXT_COMPLETION.
	siwNotifyAll = 3
)

// ibv_wr_opcode, ibv_send_flags and ibv_wc_status values used below.
const (
	wrRDMAWrite   = 0
	wrSend        = 2
	wrRDMARead    = 4
	wrSendWithInv = 9

	sendFence     = 1
	sendSignaled  = 2
	sendSolicited = 4
	sendInline    = 8

	wcGeneralErr = 21
)

// siwSendOpcode maps an ibv_wr_opcode to siw's (enum siw_opcode), as
// libsiw's map_send_opcode does; -1 is not supported by siw.
func siwSendOpcode(op uint32) int {
	switch op {
	case wrRDMAWrite:
		return 0 // SIW_OP_WRITE
	case wrRDMARead:
		return 1 // SIW_OP_READ
	case wrSend:
		return 3 // SIW_OP_SEND
	case wrSendWithInv:
		return 5 // SIW_OP_SEND_REMOTE_INV
	}
	return -1
}

// siw's completion opcodes and statuses as ibv_wc_opcode and
// ibv_wc_status, by index (libsiw's map_cqe_opcode and map_cqe_status).
var (
	siwWCOpcode = [...]uint32{0: 1, 1: 2, 2: 2, 3: 0, 4: 0, 5: 0, 6: 4, 7: 3, 8: 128}
	siwWCStatus = [...]uint32{0, 1, 4, 2, 5, 7, 8, 10, 9, 21}
)

// siwQP is a siw QP's send and receive rings.
type siwQP struct {
	sq, rq         unsafe.Pointer // the mapped rings
	sqSize, rqSize uint32         // slots, powers of two
	sqPut, rqPut   *uint32        // libsiw's counters, in its struct siw_qp
	sigAll         bool           // the QP signals every send (sq_sig_all)
	// doorbell asks the kernel to process the send queue (libsiw's
	// siw_db, a write of a prebuilt POST_SEND command); 0 or the errno.
	doorbell func() syscall.Errno
	// owed: a doorbell failed (the QP was not in RTS yet) and left its
	// requests on the ring, where the rule of post would take them for
	// work under way and never ring for them again.
	owed bool
}

// post pushes the send requests d, whose SGEs follow each other in sges,
// onto the send queue and rings the doorbell if the kernel may be idle.
// On failure bad is the index of the request that was refused, or -1 when
// all were queued and the doorbell failed.
func (q *siwQP) post(d []SendDesc, sges []SGE) (bad int, err error) {
	put := *q.sqPut
	first := put
	bad, s := -1, 0
	for i := range d {
		slot := unsafe.Add(q.sq, uintptr(put&(q.sqSize-1))*siwSQESize)
		word := (*uint32)(unsafe.Add(slot, 8))
		if atomic.LoadUint32(word)&siwValid != 0 {
			bad, err = i, syscall.ENOMEM // the kernel has not taken it yet: the queue is full
			break
		}
		n := int(d[i].NumSGE)
		if n > len(sges)-s {
			bad, err = i, syscall.EINVAL
			break
		}
		w, e := q.fill(slot, &d[i], sges[s:s+n])
		if e != 0 {
			bad, err = i, e
			break
		}
		// One store publishes flags, num_sge and opcode together, after
		// the fields above (a locked exchange on amd64).
		atomic.StoreUint32(word, w)
		s += n
		put++
	}
	queued := put - first
	// libsiw's rule: when the slot before this batch is no longer valid,
	// the kernel has taken everything before it and may be idle, so ring;
	// when it is still valid, the kernel is busy on this queue and will
	// reach the new requests by itself. A batch that filled the whole
	// queue always rings. Unlike libsiw, a doorbell owed since one failed
	// is rung by the next post, even one that queued nothing (the queue may
	// be full of the requests it left).
	ring := q.owed || queued == q.sqSize
	if queued > 0 && !ring {
		prev := (*uint32)(unsafe.Add(q.sq, uintptr((first-1)&(q.sqSize-1))*siwSQESize+8))
		ring = atomic.LoadUint32(prev)&siwValid == 0
	}
	if ring {
		e := q.doorbell()
		q.owed = e != 0
		if e != 0 && err == nil {
			err = e
		}
	}
	if queued > 0 {
		*q.sqPut = put
	}
	return bad, err
}

// fill writes one send request into its slot and returns the word that
// publishes it.
func (q *siwQP) fill(slot unsafe.Pointer, d *SendDesc, sges []SGE) (uint32, syscall.Errno) {
	op := siwSendOpcode(d.Opcode)
	if op < 0 {
		return 0, syscall.EINVAL
	}
	flags := uint32(siwValid)
	if d.Flags&sendSignaled != 0 || q.sigAll {
		flags |= siwSignalled
	}
	if d.Flags&sendSolicited != 0 {
		flags |= siwSolicited
	}
	if d.Flags&sendFence != 0 {
		flags |= siwReadFence
	}
	var raddr uint64
	var rkey uint32
	if d.Opcode == wrRDMAWrite || d.Opcode == wrRDMARead {
		raddr, rkey = d.RemoteAddr, d.RKey
	}
	*(*uint64)(slot) = d.ID
	*(*uint32)(unsafe.Add(slot, 12)) = rkey
	*(*uint64)(unsafe.Add(slot, 16)) = raddr
	if d.Flags&sendInline != 0 {
		flags |= siwInline
		// The data goes where sge[1] starts, its length in sge[0].
		dst := unsafe.Slice((*byte)(unsafe.Add(slot, 40)), siwMaxInl)
		total := 0
		for _, g := range sges {
			if int(g.Length) > siwMaxInl-total {
				return 0, syscall.EINVAL
			}
			total += copy(dst[total:], unsafe.Slice((*byte)(addrPointer(g.Addr)), g.Length))
		}
		*(*uint32)(unsafe.Add(slot, 32)) = uint32(total)
	} else {
		if len(sges) > siwMaxSGE {
			return 0, syscall.EINVAL
		}
		copy(unsafe.Slice((*SGE)(unsafe.Add(slot, 24)), siwMaxSGE), sges)
	}
	return flags | uint32(uint8(len(sges)))<<16 | uint32(op)<<24, 0
}

// postRecv pushes receive requests onto the receive queue; there is no
// doorbell. On failure bad is the index of the refused request.
func (q *siwQP) postRecv(d []RecvDesc, sges []SGE) (bad int, err error) {
	put := *q.rqPut
	bad, s := -1, 0
	for i := range d {
		slot := unsafe.Add(q.rq, uintptr(put&(q.rqSize-1))*siwRQESize)
		word := (*uint32)(unsafe.Add(slot, 8))
		if atomic.LoadUint32(word)&siwValid != 0 {
			bad, err = i, syscall.ENOMEM
			break
		}
		n := int(d[i].NumSGE)
		if n < 1 || n > siwMaxSGE || n > len(sges)-s {
			bad, err = i, syscall.EINVAL
			break
		}
		*(*uint64)(slot) = d[i].ID
		copy(unsafe.Slice((*SGE)(unsafe.Add(slot, 16)), siwMaxSGE), sges[s:s+n])
		// The kernel takes a receive only when its flags are exactly VALID.
		atomic.StoreUint32(word, siwValid|uint32(n)<<16)
		s += n
		put++
	}
	*q.rqPut = put
	return bad, err
}

// siwCQ is a siw CQ's ring and its notify word, which follows the ring.
type siwCQ struct {
	ring unsafe.Pointer
	size uint32  // slots, a power of two
	get  *uint32 // libsiw's cq_get, in its struct siw_cq
	ctrl *uint32 // struct siw_cq_ctrl's flags
}

// poll moves up to len(out) completions into out, as libsiw's
// siw_poll_cq does; the fields siw does not report are zero.
func (c *siwCQ) poll(out []WC) int {
	get := *c.get
	n := 0
	for ; n < len(out); n++ {
		cqe := unsafe.Add(c.ring, uintptr(get&(c.size-1))*siwCQESize)
		word := (*uint32)(unsafe.Add(cqe, 8)) // flags, opcode, status
		w := atomic.LoadUint32(word)
		if w&siwValid == 0 {
			break
		}
		op, st := (w>>8)&0xff, w>>16
		wc := WC{ID: *(*uint64)(cqe), ByteLen: *(*uint32)(unsafe.Add(cqe, 12)),
			QPN: uint32(*(*uint64)(unsafe.Add(cqe, 24))), Status: wcGeneralErr, VendorErr: w >> 8}
		if int(op) < len(siwWCOpcode) && int(st) < len(siwWCStatus) {
			// A CQE outside siw's tables (which libsiw would index
			// blindly) comes out as a general error with the raw
			// opcode and status in VendorErr.
			wc.Opcode, wc.Status, wc.VendorErr = siwWCOpcode[op], siwWCStatus[st], 0
		}
		out[n] = wc
		// The slot is free again; the kernel writes a CQE only where
		// the flags are 0, and it rewrites every field.
		atomic.StoreUint32(word, 0)
		get++
	}
	*c.get = get
	return n
}

// arm asks for an event at the next completion. It is a store: the
// kernel reads the word after it published a CQE, and clears it when it
// fires. The store is a locked exchange, so the poll after it sees any
// CQE published before the kernel read the word.
func (c *siwCQ) arm() error {
	atomic.StoreUint32(c.ctrl, siwNotifyAll)
	return nil
}

// addrPointer is the pointer an SGE's address holds (registered memory
// outside the Go heap).
func addrPointer(a uint64) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&a))
}
