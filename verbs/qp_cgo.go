//go:build linux && cgo

package verbs

/*
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

// A send request as Go describes it; C links a batch into ibv_send_wr in one crossing.
struct rdmago_swr {
	uint64_t wr_id, remote_addr, compare_add, swap;
	struct ibv_ah *ah;
	uint32_t opcode, flags, imm, num_sge, rkey, remote_qpn, remote_qkey;
};

static int rdmago_post_send(struct ibv_qp *qp, struct rdmago_swr *d, int n, struct ibv_sge *sges,
		struct ibv_send_wr *wrs, int *bad_index) {
	int s = 0;
	memset(wrs, 0, sizeof(*wrs) * n);
	for (int i = 0; i < n; i++) {
		struct ibv_send_wr *w = &wrs[i];
		w->wr_id = d[i].wr_id;
		w->opcode = d[i].opcode;
		w->send_flags = d[i].flags;
		w->num_sge = d[i].num_sge;
		w->sg_list = d[i].num_sge ? &sges[s] : NULL;
		s += d[i].num_sge;
		w->imm_data = htonl(d[i].imm);
		switch (d[i].opcode) {
		case IBV_WR_RDMA_WRITE: case IBV_WR_RDMA_WRITE_WITH_IMM: case IBV_WR_RDMA_READ:
			w->wr.rdma.remote_addr = d[i].remote_addr;
			w->wr.rdma.rkey = d[i].rkey;
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP: case IBV_WR_ATOMIC_FETCH_AND_ADD:
			w->wr.atomic.remote_addr = d[i].remote_addr;
			w->wr.atomic.rkey = d[i].rkey;
			w->wr.atomic.compare_add = d[i].compare_add;
			w->wr.atomic.swap = d[i].swap;
			break;
		}
		if (d[i].ah) {
			w->wr.ud.ah = d[i].ah;
			w->wr.ud.remote_qpn = d[i].remote_qpn;
			w->wr.ud.remote_qkey = d[i].remote_qkey;
		}
		w->next = i + 1 < n ? &wrs[i + 1] : NULL;
	}
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(qp, wrs, &bad);
	*bad_index = bad ? (int)(bad - wrs) : -1;
	return rc;
}

struct rdmago_rwr {
	uint64_t wr_id;
	uint32_t num_sge;
};

static int rdmago_post_recv(struct ibv_qp *qp, struct rdmago_rwr *d, int n, struct ibv_sge *sges,
		struct ibv_recv_wr *wrs, int *bad_index) {
	int s = 0;
	for (int i = 0; i < n; i++) {
		wrs[i].wr_id = d[i].wr_id;
		wrs[i].num_sge = d[i].num_sge;
		wrs[i].sg_list = d[i].num_sge ? &sges[s] : NULL;
		s += d[i].num_sge;
		wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
	}
	struct ibv_recv_wr *bad = NULL;
	int rc = ibv_post_recv(qp, wrs, &bad);
	*bad_index = bad ? (int)(bad - wrs) : -1;
	return rc;
}

// Pointers as integers: both are C memory, and a pointer argument would
// cost a cgocheck scan on every poll of a busy-polling loop.
static int rdmago_poll_cq(uintptr_t cq, int n, uintptr_t wc) {
	return ibv_poll_cq((struct ibv_cq *)cq, n, (struct ibv_wc *)wc);
}

static int rdmago_req_notify(struct ibv_cq *cq) {
	return ibv_req_notify_cq(cq, 0);
}

static uint32_t rdmago_ntohl(uint32_t v) { return ntohl(v); }

// The fields of a received UD completion that ibv_init_ah_from_wc reads.
static int rdmago_ah_from_wc(struct ibv_context *ctx, uint8_t port, uint32_t flags, uint32_t src_qp,
		uint16_t slid, uint8_t sl, uint16_t pkey_index, struct ibv_grh *grh, struct ibv_ah_attr *out) {
	struct ibv_wc wc;
	memset(&wc, 0, sizeof(wc));
	wc.wc_flags = flags;
	wc.src_qp = src_qp;
	wc.slid = slid;
	wc.sl = sl;
	wc.pkey_index = pkey_index;
	return ibv_init_ah_from_wc(ctx, port, &wc, grh, out);
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmago/rdmago/internal/fdwait"
)

// PD is a protection domain (struct ibv_pd).
type PD struct {
	dev *Device
	pd  *C.struct_ibv_pd
}

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (*PD, error) {
	ctx, err := d.context()
	if err != nil {
		return nil, err
	}
	pd, err := C.ibv_alloc_pd(ctx)
	if pd == nil {
		return nil, &OpError{Op: "ibv_alloc_pd", Device: d.Info.Name, Err: errnoOf(err)}
	}
	return &PD{dev: d, pd: pd}, nil
}

// Device is the device the PD was allocated on.
func (p *PD) Device() *Device { return p.dev }

// Close deallocates the PD; its MRs, QPs and AHs must be closed first.
func (p *PD) Close() error {
	if p.pd == nil {
		return nil
	}
	if rc := C.ibv_dealloc_pd(p.pd); rc != 0 {
		return &OpError{Op: "ibv_dealloc_pd", Device: p.dev.Info.Name, Err: syscall.Errno(rc),
			Hint: "close its QPs, MRs and AHs first"}
	}
	p.pd = nil
	return nil
}

// MR is a registered memory region over memory the Go heap does not own
// (an anonymous mapping), so the NIC may touch it while Go runs.
type MR struct {
	pd  *PD
	mr  *C.struct_ibv_mr
	buf []byte
	// LKey and RKey name the region in local SGEs and in a peer's RDMA requests.
	LKey, RKey uint32
}

// RegisterMemory maps size bytes of fresh zeroed memory and registers them
// with the given access rights (LOCAL_WRITE is needed for any region a
// receive or an RDMA read writes into).
func (p *PD) RegisterMemory(size int, access AccessFlags) (*MR, error) {
	if size <= 0 {
		return nil, &OpError{Op: "register memory", Device: p.dev.Info.Name, Err: syscall.EINVAL, Hint: "size must be positive"}
	}
	buf, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, &OpError{Op: "mmap", Device: p.dev.Info.Name, Err: err}
	}
	mr, err := C.ibv_reg_mr(p.pd, unsafe.Pointer(&buf[0]), C.size_t(size), C.int(access))
	if mr == nil {
		unix.Munmap(buf)
		e := &OpError{Op: "ibv_reg_mr", Device: p.dev.Info.Name, Detail: fmt.Sprintf("%d bytes, %v", size, access), Err: errnoOf(err)}
		if errors.Is(e.Err, syscall.ENOMEM) || errors.Is(e.Err, syscall.EPERM) {
			e.Hint = "registered memory is pinned: raise the memlock limit (ulimit -l)"
		}
		return nil, e
	}
	return &MR{pd: p, mr: mr, buf: buf, LKey: uint32(mr.lkey), RKey: uint32(mr.rkey)}, nil
}

// Bytes is the region's memory.
func (m *MR) Bytes() []byte { return m.buf }

// Addr is the region's start address, as a peer uses it in RDMA requests.
func (m *MR) Addr() uint64 { return uint64(uintptr(unsafe.Pointer(&m.buf[0]))) }

// SGE returns the scatter/gather element for buf[off:off+n].
func (m *MR) SGE(off, n int) SGE {
	return SGE{Addr: m.Addr() + uint64(off), Length: uint32(n), LKey: m.LKey}
}

// Close deregisters and unmaps the region.
func (m *MR) Close() error {
	if m.mr == nil {
		return nil
	}
	if rc := C.ibv_dereg_mr(m.mr); rc != 0 {
		return &OpError{Op: "ibv_dereg_mr", Device: m.pd.dev.Info.Name, Err: syscall.Errno(rc)}
	}
	m.mr = nil
	return unix.Munmap(m.buf)
}

// CQ is a completion queue, with a completion channel whose fd waits in Go's
// runtime poller: a goroutine waiting for completions parks no OS thread.
type CQ struct {
	dev *Device
	cq  *C.struct_ibv_cq
	ch  *C.struct_ibv_comp_channel

	mu   sync.Mutex
	wait *fdwait.Waiter // the channel fd in Go's poller, from the first wait on

	wc      *C.struct_ibv_wc // poll scratch, C memory
	wcCap   int
	unacked C.uint

	yield yielder // Poll yields through it
}

// Device is the device the CQ was created on.
func (c *CQ) Device() *Device { return c.dev }

// CreateCQ creates a completion queue of at least entries entries.
func (d *Device) CreateCQ(entries int) (*CQ, error) {
	ctx, err := d.context()
	if err != nil {
		return nil, err
	}
	ch, err := C.ibv_create_comp_channel(ctx)
	if ch == nil {
		return nil, &OpError{Op: "ibv_create_comp_channel", Device: d.Info.Name, Err: errnoOf(err)}
	}
	cq, err := C.ibv_create_cq(ctx, C.int(entries), nil, ch, 0)
	if cq == nil {
		C.ibv_destroy_comp_channel(ch)
		return nil, &OpError{Op: "ibv_create_cq", Device: d.Info.Name, Detail: fmt.Sprintf("%d entries", entries), Err: errnoOf(err)}
	}
	return &CQ{dev: d, cq: cq, ch: ch}, nil
}

// Poll moves up to len(wcs) completions into wcs, crossing into C once, and
// returns how many there were (0 when the queue is empty).
//
// A goroutine that busy-polls passes through the Go scheduler every few
// milliseconds from inside Poll (see yieldEvery), so that it never needs
// the runtime's forced preemption.
func (c *CQ) Poll(wcs []WorkCompletion) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	c.yield.maybeYield()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cq == nil {
		return 0, &OpError{Op: "ibv_poll_cq", Device: c.dev.Info.Name, Err: syscall.EBADF, Hint: "the CQ is closed"}
	}
	if len(wcs) > c.wcCap {
		C.free(unsafe.Pointer(c.wc))
		c.wc = (*C.struct_ibv_wc)(C.calloc(C.size_t(len(wcs)), C.sizeof_struct_ibv_wc))
		c.wcCap = len(wcs)
	}
	n := int(C.rdmago_poll_cq(C.uintptr_t(uintptr(unsafe.Pointer(c.cq))), C.int(len(wcs)), C.uintptr_t(uintptr(unsafe.Pointer(c.wc)))))
	if n < 0 {
		return 0, &OpError{Op: "ibv_poll_cq", Device: c.dev.Info.Name, Err: syscall.EIO}
	}
	for i, w := range unsafe.Slice(c.wc, n) {
		wc := &wcs[i]
		*wc = WorkCompletion{ID: uint64(w.wr_id), Status: WCStatus(w.status), Opcode: WCOpcode(w.opcode),
			VendorErr: uint32(w.vendor_err), ByteLen: uint32(w.byte_len), QPN: uint32(w.qp_num),
			SrcQP: uint32(w.src_qp), Flags: WCFlags(w.wc_flags), PKeyIndex: uint16(w.pkey_index),
			SLID: uint16(w.slid), SL: uint8(w.sl)}
		if wc.Flags&WCWithImm != 0 {
			wc.Imm = uint32(C.rdmago_ntohl(*(*C.uint32_t)(unsafe.Pointer(&w.anon0[0]))))
		}
	}
	return n, nil
}

// Wait arms the CQ's notification and blocks until a completion arrives
// after that, or ctx ends. A completion that landed between the caller's
// last empty poll and the arming wakes nobody: to wait for completions,
// use PollWait, which polls again after arming. One goroutine at a time
// may wait on a CQ.
func (c *CQ) Wait(ctx context.Context) error {
	if err := c.arm(); err != nil {
		return err
	}
	return c.waitEvent(ctx)
}

// PollWait polls into wcs, and if the CQ is empty waits for completions
// until at least one arrives or ctx ends. It arms the notification between
// two polls, so a completion that lands just before arming is not missed.
func (c *CQ) PollWait(ctx context.Context, wcs []WorkCompletion) (int, error) {
	for {
		if n, err := c.Poll(wcs); n > 0 || err != nil {
			return n, err
		}
		if err := c.arm(); err != nil {
			return 0, err
		}
		if n, err := c.Poll(wcs); n > 0 || err != nil {
			return n, err // the armed event fires later and costs one spurious wake
		}
		if err := c.waitEvent(ctx); err != nil {
			return 0, err
		}
	}
}

func (c *CQ) arm() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cq == nil {
		return &OpError{Op: "ibv_req_notify_cq", Device: c.dev.Info.Name, Err: syscall.EBADF, Hint: "the CQ is closed"}
	}
	if rc := C.rdmago_req_notify(c.cq); rc != 0 {
		return &OpError{Op: "ibv_req_notify_cq", Device: c.dev.Info.Name, Err: syscall.Errno(rc)}
	}
	return nil
}

// waiter registers the channel with the poller on the first wait: a CQ
// that is only ever busy-polled costs no duplicate descriptor.
func (c *CQ) waiter() (*fdwait.Waiter, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cq == nil {
		return nil, &OpError{Op: "wait for completions", Device: c.dev.Info.Name, Err: syscall.EBADF, Hint: "the CQ is closed"}
	}
	if c.wait == nil {
		w, err := fdwait.New(int(c.ch.fd), "completion channel")
		if err != nil {
			return nil, &OpError{Op: "wait for completions", Device: c.dev.Info.Name, Err: err}
		}
		c.wait = w
	}
	return c.wait, nil
}

func (c *CQ) waitEvent(ctx context.Context) error {
	w, err := c.waiter()
	if err != nil {
		return err
	}
	var got bool
	err = w.Wait(ctx, func() bool {
		var cq *C.struct_ibv_cq
		var cqctx unsafe.Pointer
		if C.ibv_get_cq_event(c.ch, &cq, &cqctx) == 0 {
			got = true
			c.unacked++
			return true
		}
		return false // EAGAIN: wait in the poller
	})
	if got {
		if c.unacked >= 64 {
			C.ibv_ack_cq_events(c.cq, c.unacked)
			c.unacked = 0
		}
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return &OpError{Op: "wait for completion event", Device: c.dev.Info.Name, Err: err}
}

// Close destroys the CQ and its channel; QPs using it must be closed first.
func (c *CQ) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cq == nil {
		return nil
	}
	if c.unacked > 0 {
		C.ibv_ack_cq_events(c.cq, c.unacked)
		c.unacked = 0
	}
	if rc := C.ibv_destroy_cq(c.cq); rc != 0 {
		return &OpError{Op: "ibv_destroy_cq", Device: c.dev.Info.Name, Err: syscall.Errno(rc), Hint: "close the QPs that use it first"}
	}
	c.cq = nil
	if c.wait != nil {
		c.wait.Close()
	}
	C.ibv_destroy_comp_channel(c.ch)
	C.free(unsafe.Pointer(c.wc))
	c.wc = nil
	return nil
}

// AH is an address handle for UD sends (struct ibv_ah).
type AH struct {
	pd *PD
	ah *C.struct_ibv_ah
}

// CreateAH creates an address handle. On RoCE the kernel resolves the
// destination MAC here (by route and neighbour lookup from the source GID's
// netdev).
func (p *PD) CreateAH(attr AHAttr) (*AH, error) {
	if err := checkAHForPort(p.dev, &attr); err != nil {
		return nil, err
	}
	ca := ahToC(&attr)
	ah, err := C.ibv_create_ah(p.pd, &ca)
	if ah == nil {
		e := &OpError{Op: "ibv_create_ah", Device: p.dev.Info.Name, Port: int(attr.PortNum), Err: errnoOf(err)}
		e.Hint = driverHint(e.Err)
		return nil, e
	}
	return &AH{pd: p, ah: ah}, nil
}

// GRHSize is the room a UD receive buffer keeps for the GRH before the data.
const GRHSize = 40

// AHAttrFromWC is the address vector back to the sender of a UD receive
// (ibv_init_ah_from_wc): wc is its completion and grh the first GRHSize
// bytes of its buffer. On RoCE the GRH is always there; the source GID
// index is the local entry that matches the packet's destination GID.
func (p *PD) AHAttrFromWC(port int, wc WorkCompletion, grh []byte) (AHAttr, error) {
	if len(grh) < GRHSize {
		return AHAttr{}, &OpError{Op: "ibv_init_ah_from_wc", Device: p.dev.Info.Name, Port: port, Err: syscall.EINVAL,
			Hint: fmt.Sprintf("pass the first %d bytes of the receive buffer (the GRH)", GRHSize)}
	}
	g := (*C.struct_ibv_grh)(C.malloc(GRHSize))
	defer C.free(unsafe.Pointer(g))
	copy(unsafe.Slice((*byte)(unsafe.Pointer(g)), GRHSize), grh)
	var out C.struct_ibv_ah_attr
	ctx, err := p.dev.context()
	if err != nil {
		return AHAttr{}, err
	}
	if rc, err := C.rdmago_ah_from_wc(ctx, C.uint8_t(port), C.uint32_t(wc.Flags), C.uint32_t(wc.SrcQP),
		C.uint16_t(wc.SLID), C.uint8_t(wc.SL), C.uint16_t(wc.PKeyIndex), g, &out); rc != 0 {
		return AHAttr{}, &OpError{Op: "ibv_init_ah_from_wc", Device: p.dev.Info.Name, Port: port, Err: errnoOf(err),
			Hint: "no local GID matches the packet's destination, or the completion has no GRH"}
	}
	return ahFromC(&out), nil
}

// Close destroys the address handle.
func (a *AH) Close() error {
	if a.ah == nil {
		return nil
	}
	if rc := C.ibv_destroy_ah(a.ah); rc != 0 {
		return &OpError{Op: "ibv_destroy_ah", Device: a.pd.dev.Info.Name, Err: syscall.Errno(rc)}
	}
	a.ah = nil
	return nil
}

func checkAHForPort(d *Device, ah *AHAttr) error {
	if ah.PortNum == 0 {
		return &OpError{Op: "create AH", Device: d.Info.Name, Err: syscall.EINVAL, Hint: "AHAttr.PortNum is required (from 1)"}
	}
	port, err := d.QueryPort(int(ah.PortNum))
	if err != nil {
		return err
	}
	if KindOf(d.Info.Transport, port.LinkLayer) == KindRoCE && !ah.IsGlobal {
		return &OpError{Op: "create AH", Device: d.Info.Name, Port: int(ah.PortNum), Err: syscall.EINVAL,
			Hint: "RoCE needs a GRH: set IsGlobal with GRH.DGID and GRH.SGIDIndex"}
	}
	return nil
}

func ahToC(a *AHAttr) C.struct_ibv_ah_attr {
	var c C.struct_ibv_ah_attr
	c.dlid = C.uint16_t(a.DLID)
	c.sl = C.uint8_t(a.SL)
	c.src_path_bits = C.uint8_t(a.SrcPathBits)
	c.static_rate = C.uint8_t(a.StaticRate)
	if a.IsGlobal {
		c.is_global = 1
	}
	c.port_num = C.uint8_t(a.PortNum)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&c.grh.dgid)), 16), a.GRH.DGID[:])
	c.grh.flow_label = C.uint32_t(a.GRH.FlowLabel)
	c.grh.sgid_index = C.uint8_t(a.GRH.SGIDIndex)
	c.grh.hop_limit = C.uint8_t(a.GRH.HopLimit)
	c.grh.traffic_class = C.uint8_t(a.GRH.TrafficClass)
	return c
}

func ahFromC(c *C.struct_ibv_ah_attr) AHAttr {
	a := AHAttr{DLID: uint16(c.dlid), SL: uint8(c.sl), SrcPathBits: uint8(c.src_path_bits),
		StaticRate: uint8(c.static_rate), IsGlobal: c.is_global != 0, PortNum: uint8(c.port_num)}
	copy(a.GRH.DGID[:], unsafe.Slice((*byte)(unsafe.Pointer(&c.grh.dgid)), 16))
	a.GRH.FlowLabel = uint32(c.grh.flow_label)
	a.GRH.SGIDIndex = uint8(c.grh.sgid_index)
	a.GRH.HopLimit = uint8(c.grh.hop_limit)
	a.GRH.TrafficClass = uint8(c.grh.traffic_class)
	return a
}

// driverHint is the usual meaning of an errno from modify QP or create AH.
func driverHint(err error) string {
	switch {
	case errors.Is(err, syscall.ENETUNREACH):
		return "no route from the source GID's netdev to the destination: usually the wrong GID index " +
			"(use the entry of the source address on the egress netdev; the resolver picks it)"
	case errors.Is(err, syscall.ETIMEDOUT):
		return "neighbour (ARP/ND) resolution of the destination did not finish within 1 s: is the peer up and on-link?"
	case errors.Is(err, syscall.EINVAL):
		return "a value the device refuses: GID index of an empty slot, MTU above the device's maximum, " +
			"or an attribute this device does not support"
	}
	return ""
}

// QP is a queue pair (struct ibv_qp). Modify checks every transition in Go
// before the driver sees it; the QP remembers its state and port for that.
type QP struct {
	Type QPType
	QPN  uint32

	pd *PD
	qp *C.struct_ibv_qp

	mu    sync.Mutex // state, port, and the post scratch below
	state QPState
	port  int
	// adopted QPs were created by another library (librdmacm), which moves
	// and destroys them: state is queried, Close calls destroy.
	adopted bool
	destroy func()

	sdesc *C.struct_rdmago_swr
	swrs  *C.struct_ibv_send_wr
	rdesc *C.struct_rdmago_rwr
	rwrs  *C.struct_ibv_recv_wr
	sges  *C.struct_ibv_sge
	bad   *C.int // the index of the request a post refused: in C memory, so that posting allocates nothing
	nWR   int    // capacity of sdesc/swrs/rdesc/rwrs
	nSGE  int    // capacity of sges
}

// CreateQP creates a queue pair in RESET.
func (p *PD) CreateQP(init QPInit) (*QP, error) {
	if init.SendCQ == nil || init.RecvCQ == nil {
		return nil, &OpError{Op: "ibv_create_qp", Device: p.dev.Info.Name, Err: syscall.EINVAL, Hint: "SendCQ and RecvCQ are required"}
	}
	var a C.struct_ibv_qp_init_attr
	a.send_cq = init.SendCQ.cq
	a.recv_cq = init.RecvCQ.cq
	a.qp_type = C.enum_ibv_qp_type(init.Type)
	a.cap.max_send_wr = C.uint32_t(init.Cap.MaxSendWR)
	a.cap.max_recv_wr = C.uint32_t(init.Cap.MaxRecvWR)
	a.cap.max_send_sge = C.uint32_t(init.Cap.MaxSendSGE)
	a.cap.max_recv_sge = C.uint32_t(init.Cap.MaxRecvSGE)
	a.cap.max_inline_data = C.uint32_t(init.Cap.MaxInlineData)
	if init.SignalAll {
		a.sq_sig_all = 1
	}
	qp, err := C.ibv_create_qp(p.pd, &a)
	if qp == nil {
		e := &OpError{Op: "ibv_create_qp", Device: p.dev.Info.Name, Detail: fmt.Sprintf("%v %+v", init.Type, init.Cap), Err: errnoOf(err)}
		if p.dev.Info.Transport == TransportIWARP && init.Type != QPTypeRC {
			e.Hint = "iWARP supports RC QPs only"
		}
		return nil, e
	}
	return &QP{Type: init.Type, QPN: uint32(qp.qp_num), pd: p, qp: qp, state: QPStateReset}, nil
}

// State is the state the last successful Modify left the QP in. The device
// may since have moved it to SQE or ERR; Query tells.
func (q *QP) State() QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.adopted && q.qp != nil {
		var qa C.struct_ibv_qp_attr
		var qi C.struct_ibv_qp_init_attr
		if C.ibv_query_qp(q.qp, &qa, C.IBV_QP_STATE, &qi) == 0 {
			q.state = QPState(qa.qp_state)
		}
	}
	return q.state
}

// Modify runs one ibv_modify_qp. The transition (from the QP's state to
// attr.State, or a modify in place without AttrState) is checked first with
// ValidateForPort: a missing or unaccepted attribute, an unencodable value,
// RoCE without GRH, a GID index of an empty slot, a path MTU above the
// port's active MTU and manual transitions on iWARP never reach the driver.
func (q *QP) Modify(attr *QPAttr, mask AttrMask) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.closedError("modify QP"); err != nil {
		return err
	}
	from, to := q.state, q.state
	if mask&AttrState != 0 {
		to = attr.State
	}
	port := q.port
	if mask&AttrPort != 0 {
		port = int(attr.PortNum)
	}
	dev := q.pd.dev
	var err error
	if port > 0 {
		info := PortInfo{Device: dev.Info.Name, Port: port, Transport: dev.Info.Transport}
		if info.Attr, err = dev.QueryPort(port); err != nil {
			return err
		}
		err = ValidateForPort(q.Type, from, to, attr, mask, info)
		if err == nil && mask&AttrAV != 0 && attr.AH.IsGlobal {
			if _, gerr := dev.QueryGID(port, int(attr.AH.GRH.SGIDIndex)); gerr != nil {
				err = &AttrError{QPType: q.Type, Transition: Transition{from, to}, Problems: []AttrProblem{{Attr: AttrAV,
					Reason: fmt.Sprintf("source GID index %d of %s port %d is an empty slot (%v): pick the entry of the local source address",
						attr.AH.GRH.SGIDIndex, dev.Info.Name, port, gerr)}}}
			}
		}
	} else {
		err = ValidateAttr(q.Type, from, to, attr, mask)
	}
	if err != nil {
		e := &OpError{Op: "modify QP", Device: dev.Info.Name, Port: port, QPN: q.QPN,
			Detail: Transition{from, to}.String(), Err: err}
		var ae *AttrError
		if errors.As(err, &ae) && mask&AttrAV != 0 && port > 0 {
			e.Hint = gidSuggestions(dev, port)
		}
		return e
	}
	ca := attrToC(attr)
	if rc := C.ibv_modify_qp(q.qp, &ca, C.int(mask)); rc != 0 {
		e := &OpError{Op: "ibv_modify_qp", Device: dev.Info.Name, Port: port, QPN: q.QPN,
			Detail: fmt.Sprintf("%v %v mask %v", q.Type, Transition{from, to}, mask), Err: syscall.Errno(rc)}
		e.Hint = driverHint(e.Err)
		// A failed modify leaves the QP as it was, unless the device moved it.
		var qa C.struct_ibv_qp_attr
		var qi C.struct_ibv_qp_init_attr
		if C.ibv_query_qp(q.qp, &qa, C.IBV_QP_STATE, &qi) == 0 {
			q.state = QPState(qa.qp_state)
		}
		return e
	}
	q.state, q.port = to, port
	return nil
}

// Query reads the QP's attributes (ibv_query_qp). In ERR only the state can
// be trusted.
func (q *QP) Query(mask AttrMask) (QPAttr, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.closedError("ibv_query_qp"); err != nil {
		return QPAttr{}, err
	}
	var qa C.struct_ibv_qp_attr
	var qi C.struct_ibv_qp_init_attr
	if rc := C.ibv_query_qp(q.qp, &qa, C.int(mask|AttrState), &qi); rc != 0 {
		return QPAttr{}, &OpError{Op: "ibv_query_qp", Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: syscall.Errno(rc)}
	}
	a := attrFromC(&qa)
	q.state = a.State
	return a, nil
}

// closedError refuses op on a closed QP (whose handle C would dereference).
func (q *QP) closedError(op string) error {
	if q.qp == nil {
		return &OpError{Op: op, Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: syscall.EBADF, Hint: "the QP is closed"}
	}
	return nil
}

// growScratch makes room for n work requests with s SGEs in C memory.
func (q *QP) growScratch(n, s int) {
	if q.bad == nil {
		q.bad = (*C.int)(C.malloc(C.sizeof_int))
	}
	if n > q.nWR {
		q.sdesc = (*C.struct_rdmago_swr)(C.realloc(unsafe.Pointer(q.sdesc), C.size_t(n)*C.sizeof_struct_rdmago_swr))
		q.swrs = (*C.struct_ibv_send_wr)(C.realloc(unsafe.Pointer(q.swrs), C.size_t(n)*C.sizeof_struct_ibv_send_wr))
		q.rdesc = (*C.struct_rdmago_rwr)(C.realloc(unsafe.Pointer(q.rdesc), C.size_t(n)*C.sizeof_struct_rdmago_rwr))
		q.rwrs = (*C.struct_ibv_recv_wr)(C.realloc(unsafe.Pointer(q.rwrs), C.size_t(n)*C.sizeof_struct_ibv_recv_wr))
		q.nWR = n
	}
	if s > q.nSGE {
		q.sges = (*C.struct_ibv_sge)(C.realloc(unsafe.Pointer(q.sges), C.size_t(s)*C.sizeof_struct_ibv_sge))
		q.nSGE = s
	}
}

func fillSGEs(dst []C.struct_ibv_sge, src []SGE) {
	for i, s := range src {
		dst[i] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)}
	}
}

// PostSend posts send work requests as one linked list, in one crossing into C.
// SGE addresses must be registered memory (MR.SGE), never the Go heap.
func (q *QP) PostSend(wrs ...SendWR) error {
	if len(wrs) == 0 {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.closedError("ibv_post_send"); err != nil {
		return err
	}
	total := 0
	for _, w := range wrs {
		total += len(w.SGEs)
	}
	q.growScratch(len(wrs), max(total, 1))
	desc := unsafe.Slice(q.sdesc, len(wrs))
	sges := unsafe.Slice(q.sges, max(total, 1))
	s := 0
	for i, w := range wrs {
		d := C.struct_rdmago_swr{wr_id: C.uint64_t(w.ID), opcode: C.uint32_t(w.Opcode), flags: C.uint32_t(w.Flags),
			imm: C.uint32_t(w.Imm), num_sge: C.uint32_t(len(w.SGEs)), remote_addr: C.uint64_t(w.RemoteAddr),
			rkey: C.uint32_t(w.RKey), compare_add: C.uint64_t(w.CompareAdd), swap: C.uint64_t(w.Swap),
			remote_qpn: C.uint32_t(w.RemoteQPN), remote_qkey: C.uint32_t(w.RemoteQKey)}
		if w.AH != nil {
			d.ah = w.AH.ah
		}
		desc[i] = d
		fillSGEs(sges[s:], w.SGEs)
		s += len(w.SGEs)
	}
	if rc := C.rdmago_post_send(q.qp, q.sdesc, C.int(len(wrs)), q.sges, q.swrs, q.bad); rc != 0 {
		bad := *q.bad
		e := &OpError{Op: "ibv_post_send", Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: syscall.Errno(rc)}
		if bad >= 0 {
			e.Detail = fmt.Sprintf("work request %d (%v) of %d", bad, wrs[bad].Opcode, len(wrs))
		}
		if q.state != QPStateRTS {
			e.Hint = fmt.Sprintf("the QP is in %v: sends need RTS", q.state)
		} else if errors.Is(e.Err, syscall.ENOMEM) {
			e.Hint = "the send queue is full: poll completions first or raise Cap.MaxSendWR"
		}
		return e
	}
	return nil
}

// PostRecv posts receive work requests as one linked list, in one crossing.
func (q *QP) PostRecv(wrs ...RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.closedError("ibv_post_recv"); err != nil {
		return err
	}
	total := 0
	for _, w := range wrs {
		total += len(w.SGEs)
	}
	q.growScratch(len(wrs), max(total, 1))
	desc := unsafe.Slice(q.rdesc, len(wrs))
	sges := unsafe.Slice(q.sges, max(total, 1))
	s := 0
	for i, w := range wrs {
		desc[i] = C.struct_rdmago_rwr{wr_id: C.uint64_t(w.ID), num_sge: C.uint32_t(len(w.SGEs))}
		fillSGEs(sges[s:], w.SGEs)
		s += len(w.SGEs)
	}
	if rc := C.rdmago_post_recv(q.qp, q.rdesc, C.int(len(wrs)), q.sges, q.rwrs, q.bad); rc != 0 {
		e := &OpError{Op: "ibv_post_recv", Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: syscall.Errno(rc)}
		if errors.Is(e.Err, syscall.ENOMEM) {
			e.Hint = "the receive queue is full: raise Cap.MaxRecvWR"
		}
		return e
	}
	return nil
}

// Close destroys the QP and frees its scratch memory.
func (q *QP) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.qp == nil {
		return nil
	}
	if q.adopted {
		q.destroy()
	} else if rc := C.ibv_destroy_qp(q.qp); rc != 0 {
		return &OpError{Op: "ibv_destroy_qp", Device: q.pd.dev.Info.Name, QPN: q.QPN, Err: syscall.Errno(rc)}
	}
	q.qp = nil
	for _, p := range []unsafe.Pointer{unsafe.Pointer(q.sdesc), unsafe.Pointer(q.swrs), unsafe.Pointer(q.rdesc),
		unsafe.Pointer(q.rwrs), unsafe.Pointer(q.sges), unsafe.Pointer(q.bad)} {
		C.free(p)
	}
	q.sdesc, q.swrs, q.rdesc, q.rwrs, q.sges, q.bad, q.nWR, q.nSGE = nil, nil, nil, nil, nil, nil, 0, 0
	return nil
}

func attrToC(a *QPAttr) C.struct_ibv_qp_attr {
	var c C.struct_ibv_qp_attr
	c.qp_state = C.enum_ibv_qp_state(a.State)
	c.cur_qp_state = C.enum_ibv_qp_state(a.CurState)
	c.path_mtu = C.enum_ibv_mtu(a.PathMTU)
	c.path_mig_state = C.enum_ibv_mig_state(a.PathMigState)
	c.qkey = C.uint32_t(a.QKey)
	c.rq_psn = C.uint32_t(a.RQPSN)
	c.sq_psn = C.uint32_t(a.SQPSN)
	c.dest_qp_num = C.uint32_t(a.DestQPN)
	c.qp_access_flags = C.uint(a.AccessFlags)
	c.cap = C.struct_ibv_qp_cap{max_send_wr: C.uint32_t(a.Cap.MaxSendWR), max_recv_wr: C.uint32_t(a.Cap.MaxRecvWR),
		max_send_sge: C.uint32_t(a.Cap.MaxSendSGE), max_recv_sge: C.uint32_t(a.Cap.MaxRecvSGE),
		max_inline_data: C.uint32_t(a.Cap.MaxInlineData)}
	c.ah_attr = ahToC(&a.AH)
	c.alt_ah_attr = ahToC(&a.AltAH)
	c.pkey_index = C.uint16_t(a.PKeyIndex)
	c.alt_pkey_index = C.uint16_t(a.AltPKeyIndex)
	if a.EnSQDAsyncNotify {
		c.en_sqd_async_notify = 1
	}
	c.max_rd_atomic = C.uint8_t(a.MaxRdAtomic)
	c.max_dest_rd_atomic = C.uint8_t(a.MaxDestRdAtomic)
	c.min_rnr_timer = C.uint8_t(a.MinRNRTimer)
	c.port_num = C.uint8_t(a.PortNum)
	c.timeout = C.uint8_t(a.Timeout)
	c.retry_cnt = C.uint8_t(a.RetryCount)
	c.rnr_retry = C.uint8_t(a.RNRRetry)
	c.alt_port_num = C.uint8_t(a.AltPortNum)
	c.alt_timeout = C.uint8_t(a.AltTimeout)
	c.rate_limit = C.uint32_t(a.RateLimit)
	return c
}

func attrFromC(c *C.struct_ibv_qp_attr) QPAttr {
	return QPAttr{
		State: QPState(c.qp_state), CurState: QPState(c.cur_qp_state), PathMTU: MTU(c.path_mtu),
		PathMigState: MigState(c.path_mig_state), QKey: uint32(c.qkey), RQPSN: uint32(c.rq_psn),
		SQPSN: uint32(c.sq_psn), DestQPN: uint32(c.dest_qp_num), AccessFlags: AccessFlags(c.qp_access_flags),
		Cap: QPCap{MaxSendWR: uint32(c.cap.max_send_wr), MaxRecvWR: uint32(c.cap.max_recv_wr),
			MaxSendSGE: uint32(c.cap.max_send_sge), MaxRecvSGE: uint32(c.cap.max_recv_sge),
			MaxInlineData: uint32(c.cap.max_inline_data)},
		AH: ahFromC(&c.ah_attr), AltAH: ahFromC(&c.alt_ah_attr), PKeyIndex: uint16(c.pkey_index),
		AltPKeyIndex: uint16(c.alt_pkey_index), EnSQDAsyncNotify: c.en_sqd_async_notify != 0,
		SQDraining: c.sq_draining != 0, MaxRdAtomic: uint8(c.max_rd_atomic),
		MaxDestRdAtomic: uint8(c.max_dest_rd_atomic), MinRNRTimer: RNRTimer(c.min_rnr_timer),
		PortNum: uint8(c.port_num), Timeout: ACKTimeout(c.timeout), RetryCount: uint8(c.retry_cnt),
		RNRRetry: uint8(c.rnr_retry), AltPortNum: uint8(c.alt_port_num), AltTimeout: ACKTimeout(c.alt_timeout),
		RateLimit: uint32(c.rate_limit),
	}
}

// gidSuggestions lists a port's routable RoCE GID entries, for errors about
// the address vector. The right one is the entry of the source address on
// the egress netdev (what the kernel CM and our resolver choose).
func gidSuggestions(dev *Device, port int) string {
	table, err := dev.GIDTable()
	if err != nil {
		return ""
	}
	var cands []string
	for _, e := range table {
		ip := e.GID.IP()
		if e.Port != port || ip.IsLinkLocalUnicast() || (e.Type != GIDTypeRoCEv2 && e.Type != GIDTypeRoCEv1) {
			continue
		}
		netdev := "?"
		if ifc, err := net.InterfaceByIndex(e.NetdevIndex); err == nil {
			netdev = ifc.Name
		}
		cands = append(cands, fmt.Sprintf("%d (%v, %v, %s)", e.Index, ip, e.Type, netdev))
	}
	if len(cands) == 0 {
		return "the port's GID table has no routable RoCE entry: does its netdev have an IP address?"
	}
	if len(cands) > 6 {
		cands = append(cands[:6], "…")
	}
	return "GID indexes of this port by source address: " + strings.Join(cands, ", ")
}
