package ibv

import (
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests run the Go side of siw's rings against a kernel written
// here from siw's code (drivers/infiniband/sw/siw, Linux 6.1): it takes a
// send request at activation, clearing its flags, and publishes a CQE
// where the flags are 0, then reads the CQ's notify word. The rings live
// in Go memory, not in pages the kernel mapped; the layouts are the uapi's.

// ring is page-aligned memory for n slots of size bytes (and, for a CQ,
// the notify word after them).
func ring(n, size int) unsafe.Pointer {
	b := make([]uint64, (n*size+8+4096)/8)
	p := unsafe.Pointer(&b[0])
	return unsafe.Add(p, (4096-uintptr(p)%4096)%4096)
}

type fakeSIW struct {
	qp      *siwQP
	cq      *siwCQ
	sqGet   uint32 // the kernel's own counters
	cqPut   uint32
	rings   int    // doorbells rung
	sqPut   uint32 // libsiw's counters, which the Go side keeps
	rqPut   uint32
	cqGet   uint32
	events  atomic.Int32
	ringErr syscall.Errno
}

func newFakeSIW(sq, rq, cq uint32) *fakeSIW {
	f := &fakeSIW{}
	f.qp = &siwQP{sq: ring(int(sq), siwSQESize), rq: ring(int(rq), siwRQESize), sqSize: sq, rqSize: rq,
		sqPut: &f.sqPut, rqPut: &f.rqPut}
	f.qp.doorbell = func() syscall.Errno { f.rings++; return f.ringErr }
	r := ring(int(cq), siwCQESize)
	f.cq = &siwCQ{ring: r, size: cq, get: &f.cqGet, ctrl: (*uint32)(unsafe.Add(r, uintptr(cq)*siwCQESize))}
	return f
}

func (f *fakeSIW) sqe(i uint32) unsafe.Pointer {
	return unsafe.Add(f.qp.sq, uintptr(i&(f.qp.sqSize-1))*siwSQESize)
}

// activate takes the next send request off the ring, if one is valid, as
// siw_activate_tx does: it copies it and frees the slot.
func (f *fakeSIW) activate() (id uint64, word uint32, ok bool) {
	s := f.sqe(f.sqGet)
	w := atomic.LoadUint32((*uint32)(unsafe.Add(s, 8)))
	if w&siwValid == 0 {
		return 0, 0, false
	}
	id = *(*uint64)(s)
	atomic.StoreUint32((*uint32)(unsafe.Add(s, 8)), 0)
	f.sqGet++
	return id, w, true
}

// complete publishes a CQE as siw_sqe_complete/siw_rqe_complete do, and
// reports whether it fired an event.
func (f *fakeSIW) complete(id uint64, opcode, status uint8, bytes uint32, qpn uint64) bool {
	c := unsafe.Add(f.cq.ring, uintptr(f.cqPut&(f.cq.size-1))*siwCQESize)
	word := (*uint32)(unsafe.Add(c, 8))
	if atomic.LoadUint32(word)&0xff != 0 {
		panic("CQ overflow in the test")
	}
	*(*uint64)(c) = id
	*(*uint32)(unsafe.Add(c, 12)) = bytes
	*(*uint64)(unsafe.Add(c, 24)) = qpn
	atomic.StoreUint32(word, siwValid|uint32(opcode)<<8|uint32(status)<<16)
	f.cqPut++
	// smp_store_mb, then siw_cq_notify_now: fire on NEXT_COMPLETION and
	// clear the word.
	if atomic.LoadUint32(f.cq.ctrl)&2 != 0 && atomic.CompareAndSwapUint32(f.cq.ctrl, siwNotifyAll, 0) {
		f.events.Add(1)
		return true
	}
	return false
}

func TestSIWPostSendFillsTheSlots(t *testing.T) {
	f := newFakeSIW(8, 8, 16)
	d := []SendDesc{
		{ID: 1, Opcode: wrSend, Flags: sendSignaled | sendSolicited, NumSGE: 2, RKey: 9, RemoteAddr: 99},
		{ID: 2, Opcode: wrRDMAWrite, Flags: sendFence, NumSGE: 1, RKey: 7, RemoteAddr: 0x1000},
		{ID: 3, Opcode: wrRDMARead, NumSGE: 0, RKey: 8, RemoteAddr: 0x2000},
	}
	sges := []SGE{{Addr: 0x10, Length: 16, LKey: 1}, {Addr: 0x20, Length: 32, LKey: 2}, {Addr: 0x30, Length: 48, LKey: 3}}
	bad, err := f.qp.post(d, sges)
	require.NoError(t, err)
	assert.Equal(t, -1, bad)
	assert.Equal(t, uint32(3), f.sqPut)
	assert.Equal(t, 1, f.rings, "an idle queue (the slot before the batch is free) rings once")

	s := f.sqe(0)
	assert.Equal(t, uint64(1), *(*uint64)(s))
	assert.Equal(t, uint32(siwValid|siwSignalled|siwSolicited|2<<16|3<<24), *(*uint32)(unsafe.Add(s, 8)), "flags, num_sge, SIW_OP_SEND")
	assert.Equal(t, uint32(0), *(*uint32)(unsafe.Add(s, 12)), "a send carries no rkey")
	assert.Equal(t, uint64(0), *(*uint64)(unsafe.Add(s, 16)), "nor a remote address")
	assert.Equal(t, sges[:2], unsafe.Slice((*SGE)(unsafe.Add(s, 24)), 2))

	s = f.sqe(1)
	assert.Equal(t, uint32(siwValid|siwReadFence|1<<16|0<<24), *(*uint32)(unsafe.Add(s, 8)), "unsignalled, SIW_OP_WRITE")
	assert.Equal(t, uint32(7), *(*uint32)(unsafe.Add(s, 12)))
	assert.Equal(t, uint64(0x1000), *(*uint64)(unsafe.Add(s, 16)))
	assert.Equal(t, sges[2], *(*SGE)(unsafe.Add(s, 24)))

	s = f.sqe(2)
	assert.Equal(t, uint32(siwValid|1<<24), *(*uint32)(unsafe.Add(s, 8)), "no SGEs, SIW_OP_READ")
	assert.Equal(t, uint64(0x2000), *(*uint64)(unsafe.Add(s, 16)))

	f.qp.sigAll = true
	_, err = f.qp.post([]SendDesc{{ID: 4, Opcode: wrSend}}, sges)
	require.NoError(t, err)
	assert.Equal(t, uint32(siwValid|siwSignalled|3<<24), *(*uint32)(unsafe.Add(f.sqe(3), 8)), "sq_sig_all signals every send")
}

func TestSIWDoorbellOnlyWhenTheKernelMayBeIdle(t *testing.T) {
	f := newFakeSIW(4, 4, 16)
	one := []SendDesc{{ID: 1, Opcode: wrSend}}
	_, err := f.qp.post(one, nil)
	require.NoError(t, err)
	assert.Equal(t, 1, f.rings)
	// The kernel has not taken the first one: it is busy on this queue
	// and reaches the second by itself.
	_, err = f.qp.post(one, nil)
	require.NoError(t, err)
	assert.Equal(t, 1, f.rings, "no doorbell while the slot before is still valid")
	for range 2 {
		_, _, ok := f.activate()
		require.True(t, ok)
	}
	_, err = f.qp.post(one, nil)
	require.NoError(t, err)
	assert.Equal(t, 2, f.rings, "the kernel took everything: ring")

	// A batch that fills the whole queue rings whatever the slot before
	// says (it is the batch's own last slot).
	_, _, ok := f.activate()
	require.True(t, ok)
	_, err = f.qp.post([]SendDesc{{ID: 1, Opcode: wrSend}, {ID: 2, Opcode: wrSend}, {ID: 3, Opcode: wrSend}, {ID: 4, Opcode: wrSend}}, nil)
	require.NoError(t, err)
	assert.Equal(t, 3, f.rings)

	// A failed doorbell is the post's error; the requests stay queued, as
	// with libsiw.
	for range 4 {
		f.activate()
	}
	f.ringErr = syscall.ENOTCONN
	bad, err := f.qp.post(one, nil)
	assert.ErrorIs(t, err, syscall.ENOTCONN)
	assert.Equal(t, -1, bad, "every request was queued")
	assert.Equal(t, uint32(8), f.sqPut)
}

// A doorbell that failed (siw refuses it before RTS) leaves its requests
// valid on the ring, where libsiw's rule takes them for work under way:
// the next post rings for them, even one that finds the queue full of
// them, and a doorbell that fails again stays owed.
func TestSIWFailedDoorbellIsRungByTheNextPost(t *testing.T) {
	f := newFakeSIW(4, 4, 16)
	one := []SendDesc{{ID: 1, Opcode: wrSend}}
	f.ringErr = syscall.ENOTCONN
	bad, err := f.qp.post(one, nil)
	assert.ErrorIs(t, err, syscall.ENOTCONN)
	assert.Equal(t, -1, bad, "queued, then the doorbell failed")
	assert.Equal(t, 1, f.rings)

	// Still not in RTS: the next post rings, fails again, and the
	// doorbell stays owed.
	_, err = f.qp.post(one, nil)
	assert.ErrorIs(t, err, syscall.ENOTCONN)
	assert.Equal(t, 2, f.rings, "rung though the slot before is valid")

	// A full queue of requests nobody rang for: the post that finds no
	// slot rings, and the kernel takes them.
	_, err = f.qp.post([]SendDesc{{ID: 3, Opcode: wrSend}, {ID: 4, Opcode: wrSend}}, nil)
	assert.ErrorIs(t, err, syscall.ENOTCONN)
	assert.Equal(t, 3, f.rings)
	f.ringErr = 0
	bad, err = f.qp.post(one, nil)
	assert.ErrorIs(t, err, syscall.ENOMEM, "the queue is full")
	assert.Equal(t, 0, bad)
	assert.Equal(t, 4, f.rings, "the owed doorbell rings though nothing was queued")
	for range 4 {
		_, _, ok := f.activate()
		require.True(t, ok)
	}

	// Paid: the rule is libsiw's again.
	_, err = f.qp.post(one, nil)
	require.NoError(t, err)
	assert.Equal(t, 5, f.rings, "the kernel took everything: ring")
	_, err = f.qp.post(one, nil)
	require.NoError(t, err)
	assert.Equal(t, 5, f.rings, "no doorbell while the slot before is still valid")
}

func TestSIWPostSendRefusals(t *testing.T) {
	f := newFakeSIW(4, 4, 16)
	sges := make([]SGE, 8)
	for _, tc := range []struct {
		name string
		d    SendDesc
	}{
		{"WRITE_WITH_IMM (siw has no immediate data)", SendDesc{Opcode: 1}},
		{"SEND_WITH_IMM", SendDesc{Opcode: 3}},
		{"an atomic", SendDesc{Opcode: 5}},
		{"an opcode past the table", SendDesc{Opcode: 200}},
		{"seven SGEs", SendDesc{Opcode: wrSend, NumSGE: 7}},
		{"more SGEs than the batch has", SendDesc{Opcode: wrSend, NumSGE: 9}},
	} {
		bad, err := f.qp.post([]SendDesc{{ID: 1, Opcode: wrSend}, tc.d}, sges)
		assert.ErrorIs(t, err, syscall.EINVAL, tc.name)
		assert.Equal(t, 1, bad, tc.name)
		_, _, ok := f.activate()
		require.True(t, ok)
	}
	assert.Equal(t, uint32(6), f.sqPut, "the request before each refused one was queued")

	// A full queue: the slot the next request needs is still valid.
	f = newFakeSIW(4, 4, 16)
	d := make([]SendDesc, 6)
	for i := range d {
		d[i] = SendDesc{ID: uint64(i), Opcode: wrSend}
	}
	bad, err := f.qp.post(d, nil)
	assert.ErrorIs(t, err, syscall.ENOMEM)
	assert.Equal(t, 4, bad)
	assert.Equal(t, uint32(4), f.sqPut)
	assert.Equal(t, 1, f.rings, "the four that fit were rung for")
}

func TestSIWInlineSend(t *testing.T) {
	f := newFakeSIW(4, 4, 16)
	a, b := []byte("inline data, "), []byte("in two pieces")
	sges := []SGE{{Addr: uint64(uintptr(unsafe.Pointer(&a[0]))), Length: uint32(len(a))},
		{Addr: uint64(uintptr(unsafe.Pointer(&b[0]))), Length: uint32(len(b))}}
	_, err := f.qp.post([]SendDesc{{ID: 1, Opcode: wrSend, Flags: sendInline, NumSGE: 2}}, sges)
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	require.NoError(t, err)
	s := f.sqe(0)
	assert.Equal(t, uint32(siwValid|siwInline|2<<16|3<<24), *(*uint32)(unsafe.Add(s, 8)))
	assert.Equal(t, uint32(len(a)+len(b)), *(*uint32)(unsafe.Add(s, 32)), "the length in sge[0]")
	assert.Equal(t, "inline data, in two pieces", string(unsafe.Slice((*byte)(unsafe.Add(s, 40)), len(a)+len(b))))

	big := make([]byte, 81)
	bad, err := f.qp.post([]SendDesc{{ID: 2, Opcode: wrSend, Flags: sendInline, NumSGE: 1}},
		[]SGE{{Addr: uint64(uintptr(unsafe.Pointer(&big[0]))), Length: 81}})
	runtime.KeepAlive(big)
	assert.ErrorIs(t, err, syscall.EINVAL, "81 bytes do not fit inline")
	assert.Equal(t, 0, bad)
}

func TestSIWPostRecv(t *testing.T) {
	f := newFakeSIW(4, 4, 16)
	sges := []SGE{{Addr: 1, Length: 2, LKey: 3}, {Addr: 4, Length: 5, LKey: 6}, {Addr: 7, Length: 8, LKey: 9}}
	bad, err := f.qp.postRecv([]RecvDesc{{ID: 10, NumSGE: 1}, {ID: 11, NumSGE: 2}}, sges)
	require.NoError(t, err)
	assert.Equal(t, -1, bad)
	r := f.qp.rq
	assert.Equal(t, uint64(10), *(*uint64)(r))
	assert.Equal(t, uint32(siwValid|1<<16), *(*uint32)(unsafe.Add(r, 8)), "flags exactly VALID, as siw requires")
	assert.Equal(t, sges[0], *(*SGE)(unsafe.Add(r, 16)))
	r = unsafe.Add(r, siwRQESize)
	assert.Equal(t, uint32(siwValid|2<<16), *(*uint32)(unsafe.Add(r, 8)))
	assert.Equal(t, sges[1:], unsafe.Slice((*SGE)(unsafe.Add(r, 16)), 2))

	bad, err = f.qp.postRecv([]RecvDesc{{ID: 12, NumSGE: 1}, {ID: 13, NumSGE: 0}}, sges)
	assert.ErrorIs(t, err, syscall.EINVAL, "a receive needs an SGE")
	assert.Equal(t, 1, bad)
	bad, err = f.qp.postRecv([]RecvDesc{{ID: 14, NumSGE: 7}}, make([]SGE, 7))
	assert.ErrorIs(t, err, syscall.EINVAL, "seven SGEs")
	assert.Equal(t, 0, bad)
	bad, err = f.qp.postRecv([]RecvDesc{{ID: 15, NumSGE: 1}, {ID: 16, NumSGE: 1}}, sges)
	assert.ErrorIs(t, err, syscall.ENOMEM, "the fifth receive on a queue of four")
	assert.Equal(t, 1, bad)
	assert.Equal(t, uint32(4), f.rqPut)
}

func TestSIWPollMapsAndFreesCQEs(t *testing.T) {
	f := newFakeSIW(4, 4, 4)
	out := make([]WC, 3)
	assert.Equal(t, 0, f.cq.poll(out))
	f.complete(1, 3, 0, 64, 17)   // SIW_OP_SEND, success
	f.complete(2, 8, 0, 4096, 17) // SIW_OP_RECEIVE
	f.complete(3, 1, 4, 0, 17)    // SIW_OP_READ, SIW_WC_WR_FLUSH_ERR
	f.complete(4, 0, 7, 0, 17)    // SIW_OP_WRITE, SIW_WC_REM_ACCESS_ERR
	out[0].SrcQP, out[0].Flags = 5, 6
	require.Equal(t, 3, f.cq.poll(out))
	assert.Equal(t, WC{ID: 1, Opcode: 0, ByteLen: 64, QPN: 17}, out[0], "the fields siw does not report are zero")
	assert.Equal(t, WC{ID: 2, Opcode: 128, ByteLen: 4096, QPN: 17}, out[1])
	assert.Equal(t, WC{ID: 3, Opcode: 2, Status: 5, QPN: 17}, out[2])
	require.Equal(t, 1, f.cq.poll(out))
	assert.Equal(t, WC{ID: 4, Opcode: 1, Status: 10, QPN: 17}, out[0])
	assert.Equal(t, uint32(4), f.cqGet)
	for i := range uintptr(4) {
		assert.Zero(t, *(*uint32)(unsafe.Add(f.cq.ring, i*siwCQESize+8)), "slot %d freed", i)
	}
	// Around the ring, and a CQE outside siw's tables.
	f.complete(5, 42, 0, 0, 17)
	f.complete(6, 3, 99, 0, 17)
	require.Equal(t, 2, f.cq.poll(out))
	assert.Equal(t, WC{ID: 5, Status: wcGeneralErr, VendorErr: 42, QPN: 17}, out[0])
	assert.Equal(t, WC{ID: 6, Status: wcGeneralErr, VendorErr: 3 | 99<<8, QPN: 17}, out[1])
}

// A poller that arms the CQ when it finds it empty and then polls once
// more never sleeps through a completion, against a kernel publishing on
// another goroutine: the protocol's stores and loads, under the race
// detector.
func TestSIWArmNeverLosesAWakeUp(t *testing.T) {
	const total = 20000
	f := newFakeSIW(4, 4, 64)
	wake := make(chan struct{}, 1)
	free := make(chan struct{}, 64) // the CQ's free slots, so it never overflows
	for range 64 {
		free <- struct{}{}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range total {
			<-free
			if f.complete(uint64(i), 3, 0, 0, 1) {
				wake <- struct{}{}
			}
		}
	}()
	out := make([]WC, 16)
	next := uint64(0)
	for next < total {
		n := f.cq.poll(out)
		if n == 0 {
			f.cq.arm()
			if n = f.cq.poll(out); n == 0 {
				select {
				case <-wake:
				case <-time.After(10 * time.Second):
					t.Fatalf("asleep with completion %d due: a wake-up was lost", next)
				}
				continue
			}
		}
		for _, wc := range out[:n] {
			require.Equal(t, next, wc.ID)
			next++
			free <- struct{}{}
		}
	}
	wg.Wait()
	t.Logf("%d completions, %d events", total, f.events.Load())
}

// libsiw's doorbell rule never leaves a request on the ring unsent,
// against a kernel that processes the queue on another goroutine after a
// doorbell until it finds the next slot empty, as siw_qp_sq_process does.
func TestSIWDoorbellRuleNeverStrandsARequest(t *testing.T) {
	const total = 20000
	f := newFakeSIW(8, 4, 16)
	kick := make(chan struct{}, 1)
	f.qp.doorbell = func() syscall.Errno {
		select {
		case kick <- struct{}{}:
		default:
		}
		return 0
	}
	var sent atomic.Uint64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-kick:
			case <-time.After(5 * time.Second):
				return
			}
			for {
				id, _, ok := f.activate()
				if !ok {
					break
				}
				if id != sent.Load() {
					panic("out of order")
				}
				sent.Add(1)
				if id == total-1 {
					return
				}
			}
		}
	}()
	d := make([]SendDesc, 3)
	deadline := time.Now().Add(20 * time.Second)
	for id := uint64(0); id < total; {
		require.True(t, time.Now().Before(deadline), "stuck at %d with %d sent: the queue stays full", id, sent.Load())
		n := min(1+int(id%3), total-int(id))
		for i := range n {
			d[i] = SendDesc{ID: id + uint64(i), Opcode: wrSend}
		}
		bad, err := f.qp.post(d[:n], nil)
		if err != nil {
			require.ErrorIs(t, err, syscall.ENOMEM)
			n = bad
			runtime.Gosched()
		}
		id += uint64(n)
	}
	<-done
	assert.Equal(t, uint64(total), sent.Load(), "every request reached the kernel")
}
