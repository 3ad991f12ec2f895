package ibv

import (
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rxe's queues in Go memory, laid out as struct rxe_queue_buf, and the
// kernel's side of them written here from rxe's code (Linux 6.1,
// sw/rxe/rxe_queue.h): it consumes a send or receive slot only when it
// completes it, and produces a CQE where the consumer has freed one.

func rxeTestQueue(slots, log2 uint32) rxeQueue {
	return rxeQueue{buf: ring(int(slots), 1<<log2+rxeData), log2: log2, mask: slots - 1}
}

type fakeRXE struct {
	qp    *rxeQP
	cq    *rxeCQ
	state uint32
	rings int
	arms  int
}

func newFakeRXE() *fakeRXE {
	f := &fakeRXE{state: 3} // RTR
	f.qp = &rxeQP{sq: rxeTestQueue(8, 9), rq: rxeTestQueue(4, 7), sqMaxSGE: 3, maxInl: 64, rqMaxSGE: 2,
		state: &f.state}
	f.qp.doorbell = func() syscall.Errno { f.rings++; return 0 }
	f.cq = &rxeCQ{q: rxeTestQueue(8, 6), notify: func() syscall.Errno { f.arms++; return 0 }}
	return f
}

// consume completes the oldest request of q, as the kernel does.
func consume(q rxeQueue) bool {
	cons := atomic.LoadUint32(q.consumer())
	if cons == atomic.LoadUint32(q.producer()) {
		return false
	}
	atomic.StoreUint32(q.consumer(), (cons+1)&q.mask)
	return true
}

// produce publishes a CQE as rxe_cq_post does; false when the CQ is full.
func produce(c *rxeCQ, wc WC, imm uint32) bool {
	prod := atomic.LoadUint32(c.q.producer())
	if (prod+1)&c.q.mask == atomic.LoadUint32(c.q.consumer()) {
		return false
	}
	e := c.q.slot(prod)
	*(*WC)(e) = wc
	*(*uint32)(unsafe.Add(e, 24)) = imm
	atomic.StoreUint32(c.q.producer(), (prod+1)&c.q.mask)
	return true
}

func TestRXEPostSendFillsTheSlots(t *testing.T) {
	f := newFakeRXE()
	sges := []SGE{{Addr: 0x10, Length: 100, LKey: 1}, {Addr: 0x20, Length: 28, LKey: 2}, {Addr: 0x30, Length: 8, LKey: 3}}
	w := f.qp.sq.slot(0)
	for i := range 1 << 9 {
		*(*byte)(unsafe.Add(w, i)) = 0xEE // what an earlier request left
	}
	bad, err := f.qp.post([]SendDesc{
		{ID: 1, Opcode: 3, Flags: sendSignaled, Imm: 0x01020304, NumSGE: 2, RemoteAddr: 5, RKey: 6}, // SEND_WITH_IMM
		{ID: 2, Opcode: wrAtomicFetch, NumSGE: 1, RemoteAddr: 0x1000, RKey: 7, CompareAdd: 8, Swap: 9},
		{ID: 3, Opcode: wrRDMAWrite, NumSGE: 0, RemoteAddr: 0x2000, RKey: 10},
	}, sges)
	require.NoError(t, err)
	assert.Equal(t, -1, bad)
	assert.Equal(t, 1, f.rings, "one doorbell for the batch")
	assert.Equal(t, uint32(3), atomic.LoadUint32(f.qp.sq.producer()))
	assert.Equal(t, uint32(3), f.qp.ssn, "the requests are numbered")

	u32 := func(w unsafe.Pointer, off uintptr) uint32 { return *(*uint32)(unsafe.Add(w, off)) }
	u64 := func(w unsafe.Pointer, off uintptr) uint64 { return *(*uint64)(unsafe.Add(w, off)) }
	assert.Equal(t, uint64(1), u64(w, 0))
	assert.Equal(t, uint32(0), u32(w, 8), "reserved, cleared")
	assert.Equal(t, uint32(3), u32(w, 12))
	assert.Equal(t, uint32(sendSignaled), u32(w, 16))
	assert.Equal(t, uint32(0x04030201), u32(w, 20), "imm_data big-endian")
	assert.Equal(t, uint64(0), u64(w, 24), "a send addresses no remote memory")
	assert.Equal(t, uint64(0), u64(w, 136), "the request's 144 bytes are cleared")
	assert.Equal(t, uint32(0), u32(w, rxeSendState))
	assert.Equal(t, uint64(0), u64(w, rxeSendIOVA))
	assert.Equal(t, uint32(0), u32(w, rxeSendSSN))
	assert.Equal(t, [5]uint32{128, 128, 0, 2, 0}, *(*[5]uint32)(unsafe.Add(w, rxeSendDMA)), "length, resid, cur_sge, num_sge, sge_offset")
	assert.Equal(t, sges[:2], unsafe.Slice((*SGE)(unsafe.Add(w, rxeSendSGE)), 2))
	assert.Equal(t, uint32(0xEEEEEEEE), u32(w, 160), "the kernel's mask is left to the kernel")

	w = f.qp.sq.slot(1)
	assert.Equal(t, uint64(0x1000), u64(w, 24))
	assert.Equal(t, uint64(8), u64(w, 32))
	assert.Equal(t, uint64(9), u64(w, 40))
	assert.Equal(t, uint32(7), u32(w, 48))
	assert.Equal(t, uint64(0x1000), u64(w, rxeSendIOVA))
	assert.Equal(t, uint32(1), u32(w, rxeSendSSN))

	w = f.qp.sq.slot(2)
	assert.Equal(t, uint64(0x2000), u64(w, 24))
	assert.Equal(t, uint32(10), u32(w, 32))
	assert.Equal(t, uint64(0x2000), u64(w, rxeSendIOVA))
	assert.Equal(t, [5]uint32{}, *(*[5]uint32)(unsafe.Add(w, rxeSendDMA)))

	// Inline: the bytes, not the SGEs, follow the header.
	data := []byte("inline bytes")
	_, err = f.qp.post([]SendDesc{{ID: 4, Opcode: wrSend, Flags: sendInline, NumSGE: 1}},
		[]SGE{{Addr: uint64(uintptr(unsafe.Pointer(&data[0]))), Length: uint32(len(data))}})
	runtime.KeepAlive(data)
	require.NoError(t, err)
	w = f.qp.sq.slot(3)
	assert.Equal(t, "inline bytes", string(unsafe.Slice((*byte)(unsafe.Add(w, rxeSendSGE)), len(data))))
	assert.Equal(t, [5]uint32{12, 12, 0, 1, 0}, *(*[5]uint32)(unsafe.Add(w, rxeSendDMA)))
}

func TestRXEPostSendRefusals(t *testing.T) {
	f := newFakeRXE()
	big := make([]SGE, 4)
	for _, tc := range []struct {
		name string
		d    SendDesc
		sges []SGE
	}{
		{"more SGEs than max_sge", SendDesc{Opcode: wrSend, NumSGE: 4}, big},
		{"more SGEs than the batch has", SendDesc{Opcode: wrSend, NumSGE: 2}, big[:1]},
		{"inline past max_inline", SendDesc{Opcode: wrSend, Flags: sendInline, NumSGE: 1}, []SGE{{Length: 65}}},
		{"an atomic on fewer than 8 bytes", SendDesc{Opcode: wrAtomicCmpSwap, NumSGE: 1}, []SGE{{Length: 4}}},
		{"an atomic at an unaligned address", SendDesc{Opcode: wrAtomicFetch, NumSGE: 1, RemoteAddr: 4}, []SGE{{Length: 8}}},
	} {
		bad, err := f.qp.post([]SendDesc{tc.d}, tc.sges)
		assert.ErrorIs(t, err, syscall.EINVAL, tc.name)
		assert.Equal(t, 0, bad, tc.name)
	}
	assert.Zero(t, f.rings, "nothing queued, nothing rung")

	// Eight slots hold seven requests: one stays empty to tell full from empty.
	d := make([]SendDesc, 9)
	for i := range d {
		d[i] = SendDesc{ID: uint64(i), Opcode: wrSend}
	}
	bad, err := f.qp.post(d, nil)
	assert.ErrorIs(t, err, syscall.ENOMEM)
	assert.Equal(t, 7, bad)
	assert.Equal(t, 1, f.rings, "the seven queued were rung for")
	require.True(t, consume(f.qp.sq))
	bad, err = f.qp.post(d[7:8], nil)
	assert.NoError(t, err, "a completion frees a slot")
	assert.Equal(t, -1, bad)

	ring := f.qp.doorbell
	f.qp.doorbell = func() syscall.Errno { return syscall.EINVAL } // rxe before RTS
	require.True(t, consume(f.qp.sq))
	bad, err = f.qp.post(d[8:9], nil)
	assert.ErrorIs(t, err, syscall.EINVAL)
	assert.Equal(t, -1, bad)

	// The failed doorbell left a full queue. In RTS the next post queues
	// nothing (ENOMEM) but rings for the requests left, as librxe's does.
	f.qp.doorbell = ring
	rings := f.rings
	bad, err = f.qp.post(d[:1], nil)
	assert.ErrorIs(t, err, syscall.ENOMEM)
	assert.Equal(t, 0, bad)
	assert.Equal(t, rings+1, f.rings, "the owed doorbell rings though nothing was queued")
	bad, err = f.qp.post(d[:1], nil)
	assert.ErrorIs(t, err, syscall.ENOMEM)
	assert.Equal(t, 0, bad)
	assert.Equal(t, rings+1, f.rings, "owed no more: nothing queued, nothing rung")
}

func TestRXEPostRecv(t *testing.T) {
	f := newFakeRXE()
	sges := []SGE{{Addr: 1, Length: 10, LKey: 3}, {Addr: 4, Length: 20, LKey: 6}, {Addr: 7, Length: 30, LKey: 9}}
	bad, err := f.qp.postRecv([]RecvDesc{{ID: 10, NumSGE: 2}, {ID: 11, NumSGE: 1}}, sges)
	require.NoError(t, err)
	assert.Equal(t, -1, bad)
	w := f.qp.rq.slot(0)
	assert.Equal(t, uint64(10), *(*uint64)(w))
	assert.Equal(t, [5]uint32{30, 30, 0, 2, 0}, *(*[5]uint32)(unsafe.Add(w, rxeRecvDMA)))
	assert.Equal(t, sges[:2], unsafe.Slice((*SGE)(unsafe.Add(w, rxeRecvSGE)), 2))
	assert.Equal(t, sges[2], *(*SGE)(unsafe.Add(f.qp.rq.slot(1), rxeRecvSGE)))

	bad, err = f.qp.postRecv([]RecvDesc{{ID: 12, NumSGE: 3}}, sges)
	assert.ErrorIs(t, err, syscall.EINVAL, "more SGEs than max_sge")
	assert.Equal(t, 0, bad)
	bad, err = f.qp.postRecv([]RecvDesc{{ID: 13, NumSGE: 1}, {ID: 14, NumSGE: 1}}, sges)
	assert.ErrorIs(t, err, syscall.ENOMEM, "the fourth receive in four slots")
	assert.Equal(t, 1, bad)

	f.state = qpsReset
	_, err = f.qp.postRecv([]RecvDesc{{ID: 15}}, nil)
	assert.ErrorIs(t, err, syscall.EINVAL, "no receives in RESET")
}

func TestRXEPoll(t *testing.T) {
	f := newFakeRXE()
	out := make([]WC, 4)
	assert.Zero(t, f.cq.poll(out))
	require.True(t, produce(f.cq, WC{ID: 1, Opcode: 128, ByteLen: 64, QPN: 17, SrcQP: 18, Flags: rxeWCWithImm, PKeyIndex: 1, SLID: 2, SL: 3}, 0x01020304))
	require.True(t, produce(f.cq, WC{ID: 2, Status: 5, QPN: 17}, 0x01020304))
	require.Equal(t, 2, f.cq.poll(out))
	assert.Equal(t, WC{ID: 1, Opcode: 128, ByteLen: 64, Imm: 0x04030201, QPN: 17, SrcQP: 18, Flags: rxeWCWithImm, PKeyIndex: 1, SLID: 2, SL: 3}, out[0])
	assert.Equal(t, WC{ID: 2, Status: 5, QPN: 17}, out[1], "without IBV_WC_WITH_IMM, no immediate data")
	assert.Equal(t, uint32(2), atomic.LoadUint32(f.cq.q.consumer()))
	for i := range 7 {
		require.True(t, produce(f.cq, WC{ID: uint64(10 + i)}, 0), "seven CQEs fit in eight slots")
	}
	assert.False(t, produce(f.cq, WC{}, 0))
	for want := uint64(10); want < 17; {
		n := f.cq.poll(out)
		require.NotZero(t, n)
		for _, wc := range out[:n] {
			require.Equal(t, want, wc.ID, "in order, around the ring")
			want++
		}
	}
	require.NoError(t, f.cq.arm())
	assert.Equal(t, 1, f.arms)
	f.cq.notify = func() syscall.Errno { return syscall.EBADF }
	var ne *NotifyError
	require.ErrorAs(t, f.cq.arm(), &ne)
	assert.Equal(t, syscall.EBADF, ne.Err)
}

// Completions produced on another goroutine arrive whole and in order:
// the CQE's fields are read only after the producer index that published
// them, under the race detector.
func TestRXEPollAgainstAProducer(t *testing.T) {
	const total = 20000
	f := newFakeRXE()
	go func() {
		for i := uint64(0); i < total; {
			if produce(f.cq, WC{ID: i, ByteLen: uint32(i), QPN: uint32(i * 3)}, 0) {
				i++
			} else {
				runtime.Gosched()
			}
		}
	}()
	out := make([]WC, 3)
	deadline := time.Now().Add(20 * time.Second)
	for next := uint64(0); next < total; {
		require.True(t, time.Now().Before(deadline))
		n := f.cq.poll(out)
		for _, wc := range out[:n] {
			require.Equal(t, WC{ID: next, ByteLen: uint32(next), QPN: uint32(next * 3)}, wc)
			next++
		}
		if n == 0 {
			runtime.Gosched()
		}
	}
}
