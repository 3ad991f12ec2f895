package ibv

import (
	"math/bits"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// The rxe data path without cgo (see siwring.go for why). rxe (Soft-RoCE)
// maps each queue into the process as a struct rxe_queue_buf
// (rdma/rdma_user_rxe.h): its element size and index mask, a producer and
// a consumer index on cache lines of their own, then the slots. One side
// produces, the other consumes; each reads the other's index with acquire
// and publishes its own with release, and the kernel masks what it reads
// and keeps private copies of the sizes. Posting a receive and polling a
// completion are stores and loads; the send doorbell and the arming of a
// CQ are system calls, made raw. The rules are librxe's (rdma-core 44,
// providers/rxe/rxe.c), step by step.

const (
	rxeProducer = 128 // offsets in struct rxe_queue_buf
	rxeConsumer = 256
	rxeData     = 384

	// struct rxe_send_wqe: the request as the provider fills it (struct
	// rxe_send_wr, whose 144 bytes it clears first), then what the kernel
	// keeps in the slot while it works on it, then the SGEs or the inline
	// data.
	rxeSendWRSize   = 144
	rxeSendState    = 148
	rxeSendIOVA     = 152
	rxeSendSSN      = 176
	rxeSendDMA      = 184 // struct rxe_dma_info
	rxeSendSGE      = 208
	rxeRecvDMA      = 16
	rxeRecvSGE      = 40
	rxeCQESize      = 48 // struct ib_uverbs_wc
	rxeWCWithImm    = 1 << 1
	wrAtomicCmpSwap = 5
	wrAtomicFetch   = 6
	qpsReset        = 0
)

// rxeQueue is one mapped queue.
type rxeQueue struct {
	buf  unsafe.Pointer // struct rxe_queue_buf
	log2 uint32         // of the slot size
	mask uint32         // slots - 1
}

func (q *rxeQueue) producer() *uint32 { return (*uint32)(unsafe.Add(q.buf, rxeProducer)) }
func (q *rxeQueue) consumer() *uint32 { return (*uint32)(unsafe.Add(q.buf, rxeConsumer)) }
func (q *rxeQueue) slot(i uint32) unsafe.Pointer {
	return unsafe.Add(q.buf, rxeData+uintptr(i&q.mask)<<q.log2)
}

// rxeQP is an RC or UC rxe QP's send and receive queues.
type rxeQP struct {
	sq, rq           rxeQueue
	sqMaxSGE, maxInl uint32
	rqMaxSGE         uint32
	// ssn numbers the send requests, as librxe's own counter would (its
	// place in struct rxe_qp moved after rdma-core 44; the kernel does
	// not read it for a user QP).
	ssn      uint32
	state    *uint32 // struct ibv_qp's state, which libibverbs keeps
	doorbell func() syscall.Errno
	// owed: a doorbell failed (rxe refuses it before RTS) and left its
	// requests on the ring; the kernel does not look at them until the
	// next doorbell, which the next post rings even if it queued nothing.
	owed bool
}

// post queues the send requests d, whose SGEs follow each other in sges,
// and rings the doorbell, in which the kernel sends them. On failure bad
// is the index of the refused request, or -1 when the doorbell failed.
func (q *rxeQP) post(d []SendDesc, sges []SGE) (bad int, err error) {
	bad, s, queued := -1, 0, 0
	prod := atomic.LoadUint32(q.sq.producer()) // ours: no one else moves it
	for i := range d {
		n := int(d[i].NumSGE)
		if n > len(sges)-s {
			bad, err = i, syscall.EINVAL
			break
		}
		if e := q.check(&d[i], sges[s:s+n]); e != 0 {
			bad, err = i, e
			break
		}
		if atomic.LoadUint32(q.sq.consumer()) == (prod+1)&q.sq.mask {
			bad, err = i, syscall.ENOMEM // the kernel frees a slot only at its completion
			break
		}
		q.fill(q.sq.slot(prod), &d[i], sges[s:s+n])
		prod = (prod + 1) & q.sq.mask
		atomic.StoreUint32(q.sq.producer(), prod) // publishes the slot written above
		s += n
		queued++
	}
	if queued > 0 || q.owed {
		// librxe rings after every post, even an empty or failed one;
		// with nothing queued there is nothing for the kernel to do,
		// unless an earlier doorbell failed and left requests waiting
		// (they may fill the queue, so that no post queues anything).
		e := q.doorbell()
		q.owed = e != 0
		if e != 0 && err == nil {
			err = e
		}
	}
	return bad, err
}

// check refuses what librxe's validate_send_wr refuses.
func (q *rxeQP) check(d *SendDesc, sges []SGE) syscall.Errno {
	if uint32(len(sges)) > q.sqMaxSGE {
		return syscall.EINVAL
	}
	length := sgeLength(sges)
	if d.Opcode == wrAtomicCmpSwap || d.Opcode == wrAtomicFetch {
		if length < 8 || d.RemoteAddr&7 != 0 {
			return syscall.EINVAL
		}
	}
	if d.Flags&sendInline != 0 && length > q.maxInl {
		return syscall.EINVAL
	}
	return 0
}

func sgeLength(sges []SGE) uint32 {
	var n uint32
	for _, g := range sges {
		n += g.Length
	}
	return n
}

// fill writes one send request into its slot, as librxe's init_send_wqe.
func (q *rxeQP) fill(w unsafe.Pointer, d *SendDesc, sges []SGE) {
	clear(unsafe.Slice((*byte)(w), rxeSendWRSize))
	*(*uint64)(w) = d.ID
	*(*uint32)(unsafe.Add(w, 12)) = d.Opcode
	*(*uint32)(unsafe.Add(w, 16)) = d.Flags
	*(*uint32)(unsafe.Add(w, 20)) = bits.ReverseBytes32(d.Imm) // big-endian, as htonl
	var iova uint64
	switch d.Opcode {
	case wrRDMAWrite, 1, wrRDMARead: // WRITE, WRITE_WITH_IMM, READ
		*(*uint64)(unsafe.Add(w, 24)) = d.RemoteAddr
		*(*uint32)(unsafe.Add(w, 32)) = d.RKey
		iova = d.RemoteAddr
	case wrAtomicCmpSwap, wrAtomicFetch:
		*(*uint64)(unsafe.Add(w, 24)) = d.RemoteAddr
		*(*uint64)(unsafe.Add(w, 32)) = d.CompareAdd
		*(*uint64)(unsafe.Add(w, 40)) = d.Swap
		*(*uint32)(unsafe.Add(w, 48)) = d.RKey
		iova = d.RemoteAddr
	}
	length := sgeLength(sges)
	if d.Flags&sendInline != 0 {
		dst := unsafe.Slice((*byte)(unsafe.Add(w, rxeSendSGE)), length)
		off := 0
		for _, g := range sges {
			off += copy(dst[off:], unsafe.Slice((*byte)(addrPointer(g.Addr)), g.Length))
		}
	} else {
		copy(unsafe.Slice((*SGE)(unsafe.Add(w, rxeSendSGE)), len(sges)), sges)
	}
	*(*uint64)(unsafe.Add(w, rxeSendIOVA)) = iova
	dma := (*[5]uint32)(unsafe.Add(w, rxeSendDMA)) // length, resid, cur_sge, num_sge, sge_offset
	*dma = [5]uint32{length, length, 0, uint32(len(sges)), 0}
	*(*uint32)(unsafe.Add(w, rxeSendState)) = 0
	*(*uint32)(unsafe.Add(w, rxeSendSSN)) = q.ssn
	q.ssn++
}

// postRecv queues receive requests; there is no doorbell. On failure bad
// is the index of the refused request.
func (q *rxeQP) postRecv(d []RecvDesc, sges []SGE) (bad int, err error) {
	if atomic.LoadUint32(q.state) == qpsReset {
		return -1, syscall.EINVAL // C10-97.2.1, as librxe (which names no request)
	}
	bad, s := -1, 0
	prod := atomic.LoadUint32(q.rq.producer())
	for i := range d {
		if atomic.LoadUint32(q.rq.consumer()) == (prod+1)&q.rq.mask {
			bad, err = i, syscall.ENOMEM
			break
		}
		n := int(d[i].NumSGE)
		if uint32(n) > q.rqMaxSGE || n > len(sges)-s {
			bad, err = i, syscall.EINVAL
			break
		}
		w := q.rq.slot(prod)
		*(*uint64)(w) = d[i].ID
		g := sges[s : s+n]
		copy(unsafe.Slice((*SGE)(unsafe.Add(w, rxeRecvSGE)), n), g)
		length := sgeLength(g)
		*(*[5]uint32)(unsafe.Add(w, rxeRecvDMA)) = [5]uint32{length, length, 0, uint32(n), 0}
		prod = (prod + 1) & q.rq.mask
		atomic.StoreUint32(q.rq.producer(), prod)
		s += n
	}
	return bad, err
}

// rxeCQ is an rxe CQ's queue; arming it is a system call.
type rxeCQ struct {
	q      rxeQueue
	notify func() syscall.Errno // REQ_NOTIFY_CQ for the next completion
}

// poll moves up to len(out) completions into out, as librxe's rxe_poll_cq
// (which copies the kernel's struct ib_uverbs_wc into struct ibv_wc).
func (c *rxeCQ) poll(out []WC) int {
	prod := atomic.LoadUint32(c.q.producer())
	cons := atomic.LoadUint32(c.q.consumer()) // ours
	n := 0
	for ; n < len(out) && cons != prod; n++ {
		e := c.q.slot(cons)
		wc := &out[n]
		// The layouts agree up to sl, but for the immediate data, which
		// arrives big-endian and counts only with IBV_WC_WITH_IMM.
		*wc = *(*WC)(e)
		if wc.Flags&rxeWCWithImm != 0 {
			wc.Imm = bits.ReverseBytes32(wc.Imm)
		} else {
			wc.Imm = 0
		}
		cons = (cons + 1) & c.q.mask
	}
	if n > 0 {
		atomic.StoreUint32(c.q.consumer(), cons) // the slots are the kernel's again
	}
	return n
}

func (c *rxeCQ) arm() error {
	if e := c.notify(); e != 0 {
		return &NotifyError{e}
	}
	return nil
}
