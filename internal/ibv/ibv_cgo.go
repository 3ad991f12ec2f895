//go:build linux && cgo

package ibv

/*
#cgo LDFLAGS: -libverbs
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

// ibv_query_port is a macro; cgo needs a function.
static int rdmago_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
	return ibv_query_port(ctx, port, attr);
}

// The event's element is a union; cgo sees bytes.
static uint32_t rdmago_event_qpn(struct ibv_async_event *ev) {
	return ev->element.qp ? ev->element.qp->qp_num : 0;
}
static int rdmago_event_port(struct ibv_async_event *ev) { return ev->element.port_num; }

// post_result makes a post's result an errno, or RDMAGO_REASON_LOST. The
// man page promises an errno, but libsiw 44 returns it negated, and -1
// (with errno set) when its doorbell's write failed; and when the
// doorbell rang for the requests before a refused one, it returns the
// doorbell's 0 while naming the refused request.
#define RDMAGO_REASON_LOST 0x10000
static int post_result(int rc, int refused) {
	if (rc == -1 && errno > 0) {
		return errno;
	}
	if (rc < 0) {
		return -rc;
	}
	if (rc == 0 && refused) {
		return RDMAGO_REASON_LOST;
	}
	return rc;
}

// A send request as Go describes it (SendDesc); C links a batch into
// ibv_send_wr in one crossing.
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
	errno = 0;
	int rc = ibv_post_send(qp, wrs, &bad);
	*bad_index = bad ? (int)(bad - wrs) : -1;
	return post_result(rc, bad != NULL);
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
	errno = 0;
	int rc = ibv_post_recv(qp, wrs, &bad);
	*bad_index = bad ? (int)(bad - wrs) : -1;
	return post_result(rc, bad != NULL);
}

// The completions as Go lays them out (WC), converted in C so that a poll
// is one crossing and writes nothing Go must convert again.
struct rdmago_wc {
	uint64_t wr_id;
	uint32_t status, opcode, vendor_err, byte_len, imm, qp_num, src_qp, wc_flags;
	uint16_t pkey_index, slid;
	uint8_t sl;
};

// Pointers as integers: both the provider's scratch and out (the converted
// completions, which Go copies into the caller's slice) are C memory, and
// a pointer argument costs a cgocheck on every poll of a busy loop.
static int rdmago_poll_cq(uintptr_t cq, int n, uintptr_t scratch, uintptr_t out) {
	struct ibv_wc *wc = (struct ibv_wc *)scratch;
	struct rdmago_wc *o = (struct rdmago_wc *)out;
	int got = ibv_poll_cq((struct ibv_cq *)cq, n, wc);
	if (got < 0) {
		return -1; // providers fail with codes of their own (mlx5: -2)
	}
	for (int i = 0; i < got; i++) {
		o[i].wr_id = wc[i].wr_id;
		o[i].status = wc[i].status;
		o[i].opcode = wc[i].opcode;
		o[i].vendor_err = wc[i].vendor_err;
		o[i].byte_len = wc[i].byte_len;
		o[i].imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc[i].imm_data) : 0;
		o[i].qp_num = wc[i].qp_num;
		o[i].src_qp = wc[i].src_qp;
		o[i].wc_flags = wc[i].wc_flags;
		o[i].pkey_index = wc[i].pkey_index;
		o[i].slid = wc[i].slid;
		o[i].sl = wc[i].sl;
	}
	return got;
}

static int rdmago_req_notify(struct ibv_cq *cq) {
	return ibv_req_notify_cq(cq, 0);
}

// ibv_req_notify_cq's failure as a result below -2 (see polled).
static int rdmago_notify_failed(int rc) {
	return -2 - (rc > 0 ? rc : -rc);
}

// What a wait for completions does before it sleeps, in one crossing:
// poll; when the CQ is empty and arm is set, arm it and poll again (a
// completion may have landed before the arming). Returns the completions
// taken, -1 when a poll failed, or rdmago_notify_failed.
static int rdmago_poll_arm(uintptr_t cq, int n, uintptr_t scratch, uintptr_t out, int arm) {
	int got = rdmago_poll_cq(cq, n, scratch, out);
	if (got != 0 || !arm) {
		return got;
	}
	int rc = ibv_req_notify_cq((struct ibv_cq *)cq, 0);
	if (rc != 0) {
		return rdmago_notify_failed(rc);
	}
	return rdmago_poll_cq(cq, n, scratch, out);
}

// ibv_get_cq_event with its results kept on the C side: Go pointers to
// them would put two variables on the Go heap per event.
static int rdmago_get_cq_event(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq;
	void *ctx;
	return ibv_get_cq_event(ch, &cq, &ctx);
}

// The data path's calls with their pointers passed as integers: every one
// points into C memory, and a pointer argument costs a cgocheck of each on
// every call (cgoCheckPointer, cgoIsGoPointer), which in the cost model was
// about a microsecond per round trip of the pingpong, both ends together.
static int rdmago_post_send_u(uintptr_t qp, uintptr_t d, int n, uintptr_t sges, uintptr_t wrs, uintptr_t bad) {
	return rdmago_post_send((struct ibv_qp *)qp, (struct rdmago_swr *)d, n, (struct ibv_sge *)sges,
		(struct ibv_send_wr *)wrs, (int *)bad);
}
static int rdmago_post_recv_u(uintptr_t qp, uintptr_t d, int n, uintptr_t sges, uintptr_t wrs, uintptr_t bad) {
	return rdmago_post_recv((struct ibv_qp *)qp, (struct rdmago_rwr *)d, n, (struct ibv_sge *)sges,
		(struct ibv_recv_wr *)wrs, (int *)bad);
}
static int rdmago_get_cq_event_u(uintptr_t ch) {
	return rdmago_get_cq_event((struct ibv_comp_channel *)ch);
}

// One wait's step in one crossing, as CQ.EventPollArm: poll; when empty
// and armed (flags bit 0; the channel is non-blocking), read the pending
// event; when not armed (any more), arm and poll again. The count of
// completions comes back with bit 24 set when an event was read and bit
// 25 when the CQ is left armed; errors as rdmago_poll_arm's, and -2 when
// the poll after a successful arming failed, after acking an event read
// (a lost ack would hang ibv_destroy_cq).
static int rdmago_event_poll_arm(uintptr_t ch, uintptr_t cq, int n, uintptr_t scratch, uintptr_t out, int flags) {
	int armed = flags & 1, ev = 0;
	int got = rdmago_poll_cq(cq, n, scratch, out);
	if (got != 0) {
		return got < 0 ? got : got | armed << 25;
	}
	if (armed && rdmago_get_cq_event((struct ibv_comp_channel *)ch) == 0) {
		ev = 1;
		armed = 0;
	}
	if (armed) {
		return 1 << 25;
	}
	int rc = ibv_req_notify_cq((struct ibv_cq *)cq, 0);
	if (rc == 0) {
		got = rdmago_poll_cq(cq, n, scratch, out);
	}
	if (rc != 0 || got < 0) {
		if (ev) {
			ibv_ack_cq_events((struct ibv_cq *)cq, 1);
		}
		return rc != 0 ? rdmago_notify_failed(rc) : -2;
	}
	return got | ev << 24 | 1 << 25;
}

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
	"fmt"
	"syscall"
	"unsafe"
)

func init() {
	if bad := layoutMismatch(); bad != "" {
		panic("ibv: Go and C layouts differ: " + bad)
	}
}

// layoutMismatch names the first field of SendDesc, RecvDesc, WC or SGE
// that does not sit where its C struct has it, or "".
func layoutMismatch() string {
	var (
		swr C.struct_rdmago_swr
		rwr C.struct_rdmago_rwr
		wc  C.struct_rdmago_wc
		sge C.struct_ibv_sge
		sd  SendDesc
		rd  RecvDesc
		w   WC
		g   SGE
	)
	type pair struct {
		name         string
		goOff, cOff  uintptr
		goSize, cSiz uintptr
	}
	for _, p := range []pair{
		{"SendDesc", 0, 0, unsafe.Sizeof(sd), unsafe.Sizeof(swr)},
		{"SendDesc.ID", unsafe.Offsetof(sd.ID), unsafe.Offsetof(swr.wr_id), 8, 8},
		{"SendDesc.RemoteAddr", unsafe.Offsetof(sd.RemoteAddr), unsafe.Offsetof(swr.remote_addr), 8, 8},
		{"SendDesc.CompareAdd", unsafe.Offsetof(sd.CompareAdd), unsafe.Offsetof(swr.compare_add), 8, 8},
		{"SendDesc.Swap", unsafe.Offsetof(sd.Swap), unsafe.Offsetof(swr.swap), 8, 8},
		{"SendDesc.AH", unsafe.Offsetof(sd.AH), unsafe.Offsetof(swr.ah), unsafe.Sizeof(sd.AH), unsafe.Sizeof(swr.ah)},
		{"SendDesc.Opcode", unsafe.Offsetof(sd.Opcode), unsafe.Offsetof(swr.opcode), 4, 4},
		{"SendDesc.Flags", unsafe.Offsetof(sd.Flags), unsafe.Offsetof(swr.flags), 4, 4},
		{"SendDesc.Imm", unsafe.Offsetof(sd.Imm), unsafe.Offsetof(swr.imm), 4, 4},
		{"SendDesc.NumSGE", unsafe.Offsetof(sd.NumSGE), unsafe.Offsetof(swr.num_sge), 4, 4},
		{"SendDesc.RKey", unsafe.Offsetof(sd.RKey), unsafe.Offsetof(swr.rkey), 4, 4},
		{"SendDesc.RemoteQPN", unsafe.Offsetof(sd.RemoteQPN), unsafe.Offsetof(swr.remote_qpn), 4, 4},
		{"SendDesc.RemoteQKey", unsafe.Offsetof(sd.RemoteQKey), unsafe.Offsetof(swr.remote_qkey), 4, 4},
		{"RecvDesc", 0, 0, unsafe.Sizeof(rd), unsafe.Sizeof(rwr)},
		{"RecvDesc.ID", unsafe.Offsetof(rd.ID), unsafe.Offsetof(rwr.wr_id), 8, 8},
		{"RecvDesc.NumSGE", unsafe.Offsetof(rd.NumSGE), unsafe.Offsetof(rwr.num_sge), 4, 4},
		{"WC", 0, 0, unsafe.Sizeof(w), unsafe.Sizeof(wc)},
		{"WC.ID", unsafe.Offsetof(w.ID), unsafe.Offsetof(wc.wr_id), 8, 8},
		{"WC.Status", unsafe.Offsetof(w.Status), unsafe.Offsetof(wc.status), 4, 4},
		{"WC.Opcode", unsafe.Offsetof(w.Opcode), unsafe.Offsetof(wc.opcode), 4, 4},
		{"WC.VendorErr", unsafe.Offsetof(w.VendorErr), unsafe.Offsetof(wc.vendor_err), 4, 4},
		{"WC.ByteLen", unsafe.Offsetof(w.ByteLen), unsafe.Offsetof(wc.byte_len), 4, 4},
		{"WC.Imm", unsafe.Offsetof(w.Imm), unsafe.Offsetof(wc.imm), 4, 4},
		{"WC.QPN", unsafe.Offsetof(w.QPN), unsafe.Offsetof(wc.qp_num), 4, 4},
		{"WC.SrcQP", unsafe.Offsetof(w.SrcQP), unsafe.Offsetof(wc.src_qp), 4, 4},
		{"WC.Flags", unsafe.Offsetof(w.Flags), unsafe.Offsetof(wc.wc_flags), 4, 4},
		{"WC.PKeyIndex", unsafe.Offsetof(w.PKeyIndex), unsafe.Offsetof(wc.pkey_index), 2, 2},
		{"WC.SLID", unsafe.Offsetof(w.SLID), unsafe.Offsetof(wc.slid), 2, 2},
		{"WC.SL", unsafe.Offsetof(w.SL), unsafe.Offsetof(wc.sl), 1, 1},
		{"SGE", 0, 0, unsafe.Sizeof(g), unsafe.Sizeof(sge)},
		{"SGE.Addr", unsafe.Offsetof(g.Addr), unsafe.Offsetof(sge.addr), 8, 8},
		{"SGE.Length", unsafe.Offsetof(g.Length), unsafe.Offsetof(sge.length), 4, 4},
		{"SGE.LKey", unsafe.Offsetof(g.LKey), unsafe.Offsetof(sge.lkey), 4, 4},
	} {
		if p.goOff != p.cOff || p.goSize != p.cSiz {
			return fmt.Sprintf("%s at %d (%d bytes) in Go, at %d (%d bytes) in C", p.name, p.goOff, p.goSize, p.cOff, p.cSiz)
		}
	}
	return ""
}

// Available reports whether this build can call libibverbs.
const Available = true

// errnoOf turns the error cgo returns alongside a NULL result into an
// errno, EIO when libibverbs left errno unset.
func errnoOf(err error) error {
	if err == nil {
		return syscall.EIO
	}
	return err
}

func deviceInfo(d *C.struct_ibv_device) DeviceInfo {
	return DeviceInfo{
		Name:      C.GoString(C.ibv_get_device_name(d)),
		Transport: int(d.transport_type),
		NodeType:  int(d.node_type),
		GUID:      be64(uint64(C.ibv_get_device_guid(d))),
	}
}

// be64 converts a big-endian 64-bit value, as libibverbs returns GUIDs, to
// host order.
func be64(v uint64) uint64 {
	var b [8]byte
	*(*uint64)(unsafe.Pointer(&b[0])) = v
	var r uint64
	for _, x := range b {
		r = r<<8 | uint64(x)
	}
	return r
}

// Devices lists the host's devices (ibv_get_device_list).
func Devices() ([]DeviceInfo, error) {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		return nil, errnoOf(err)
	}
	defer C.ibv_free_device_list(list)
	out := make([]DeviceInfo, 0, int(n))
	for _, d := range unsafe.Slice(list, int(n)) {
		out = append(out, deviceInfo(d))
	}
	return out, nil
}

// Context is an open device (struct ibv_context).
type Context struct {
	Info     DeviceInfo
	c        *C.struct_ibv_context
	borrowed bool
}

// Open opens the named device. A name not in the list fails with ENODEV;
// the op says which step failed.
func Open(name string) (c *Context, op string, err error) {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		return nil, "ibv_get_device_list", errnoOf(err)
	}
	defer C.ibv_free_device_list(list)
	for _, d := range unsafe.Slice(list, int(n)) {
		info := deviceInfo(d)
		if info.Name != name {
			continue
		}
		ctx, err := C.ibv_open_device(d)
		if ctx == nil {
			return nil, "ibv_open_device", errnoOf(err)
		}
		return &Context{Info: info, c: ctx}, "", nil
	}
	return nil, "open device", syscall.ENODEV
}

// BorrowContext wraps a struct ibv_context another library (librdmacm)
// owns: Close leaves it open.
func BorrowContext(p unsafe.Pointer) *Context {
	c := (*C.struct_ibv_context)(p)
	return &Context{Info: deviceInfo(c.device), c: c, borrowed: true}
}

// Pointer is the struct ibv_context, for librdmacm's wrapper.
func (c *Context) Pointer() unsafe.Pointer { return unsafe.Pointer(c.c) }

// Close closes the context, unless it is borrowed.
func (c *Context) Close() error {
	if c.borrowed {
		return nil
	}
	if rc := C.ibv_close_device(c.c); rc != 0 {
		return syscall.Errno(-rc)
	}
	return nil
}

// QueryDevice is ibv_query_device.
func (c *Context) QueryDevice() (DeviceAttr, error) {
	var a C.struct_ibv_device_attr
	if rc := C.ibv_query_device(c.c, &a); rc != 0 {
		return DeviceAttr{}, syscall.Errno(rc)
	}
	return DeviceAttr{
		FirmwareVersion:    C.GoString(&a.fw_ver[0]),
		NodeGUID:           be64(uint64(a.node_guid)),
		SysImageGUID:       be64(uint64(a.sys_image_guid)),
		MaxMRSize:          uint64(a.max_mr_size),
		PageSizeCap:        uint64(a.page_size_cap),
		VendorID:           uint32(a.vendor_id),
		VendorPartID:       uint32(a.vendor_part_id),
		HardwareVersion:    uint32(a.hw_ver),
		MaxQP:              int(a.max_qp),
		MaxQPWR:            int(a.max_qp_wr),
		MaxSGE:             int(a.max_sge),
		MaxCQ:              int(a.max_cq),
		MaxCQE:             int(a.max_cqe),
		MaxMR:              int(a.max_mr),
		MaxPD:              int(a.max_pd),
		MaxQPRdAtom:        int(a.max_qp_rd_atom),
		MaxQPInitRdAtom:    int(a.max_qp_init_rd_atom),
		MaxSRQ:             int(a.max_srq),
		MaxSRQWR:           int(a.max_srq_wr),
		MaxAH:              int(a.max_ah),
		AtomicCapable:      a.atomic_cap != C.IBV_ATOMIC_NONE,
		PhysicalPortCount:  int(a.phys_port_cnt),
		MaxMulticastGroups: int(a.max_mcast_grp),
		MaxQPPerMulticast:  int(a.max_mcast_qp_attach),
		LocalCACKDelay:     uint8(a.local_ca_ack_delay),
		MaxPKeys:           int(a.max_pkeys),
		DeviceCapFlags:     uint32(a.device_cap_flags),
	}, nil
}

// QueryPort is ibv_query_port; port is from 1 to 255.
func (c *Context) QueryPort(port int) (PortAttr, error) {
	var a C.struct_ibv_port_attr
	if rc := C.rdmago_query_port(c.c, C.uint8_t(port), &a); rc != 0 {
		return PortAttr{}, syscall.Errno(rc)
	}
	return PortAttr{
		State:        int(a.state),
		MaxMTU:       int(a.max_mtu),
		ActiveMTU:    int(a.active_mtu),
		GIDTableLen:  int(a.gid_tbl_len),
		PKeyTableLen: int(a.pkey_tbl_len),
		PortCapFlags: uint32(a.port_cap_flags),
		LID:          uint16(a.lid),
		SMLID:        uint16(a.sm_lid),
		LMC:          uint8(a.lmc),
		ActiveWidth:  uint8(a.active_width),
		ActiveSpeed:  uint8(a.active_speed),
		PhysState:    uint8(a.phys_state),
		LinkLayer:    uint8(a.link_layer),
		Flags:        uint8(a.flags),
	}, nil
}

func gidEntry(e *C.struct_ibv_gid_entry) GIDEntry {
	g := GIDEntry{Index: int(e.gid_index), Port: int(e.port_num), Type: int(e.gid_type), NetdevIndex: int(e.ndev_ifindex)}
	copy(g.GID[:], unsafe.Slice((*byte)(unsafe.Pointer(&e.gid)), 16))
	return g
}

// QueryGIDTable is ibv_query_gid_table with room for max entries.
func (c *Context) QueryGIDTable(max int) ([]GIDEntry, error) {
	entries := (*C.struct_ibv_gid_entry)(C.calloc(C.size_t(max), C.sizeof_struct_ibv_gid_entry))
	if entries == nil {
		return nil, syscall.ENOMEM
	}
	defer C.free(unsafe.Pointer(entries))
	n := C.ibv_query_gid_table(c.c, entries, C.size_t(max), 0)
	if n < 0 {
		return nil, syscall.Errno(-n)
	}
	es := unsafe.Slice(entries, int(n))
	out := make([]GIDEntry, 0, len(es))
	for i := range es {
		out = append(out, gidEntry(&es[i]))
	}
	return out, nil
}

// QueryGID is ibv_query_gid_ex: an empty slot fails with ENODATA.
func (c *Context) QueryGID(port, index int) (GIDEntry, error) {
	var e C.struct_ibv_gid_entry
	if rc := C.ibv_query_gid_ex(c.c, C.uint32_t(port), C.uint32_t(index), &e, 0); rc != 0 {
		return GIDEntry{}, syscall.Errno(rc)
	}
	return gidEntry(&e), nil
}

// AsyncFD is the context's non-blocking async event descriptor.
func (c *Context) AsyncFD() int { return int(c.c.async_fd) }

// GetAsyncEvent reads and acks one async event; false when none is queued.
func (c *Context) GetAsyncEvent(isPort, isQP func(int) bool) (AsyncEvent, bool) {
	var e C.struct_ibv_async_event
	if C.ibv_get_async_event(c.c, &e) != 0 {
		return AsyncEvent{}, false
	}
	ev := AsyncEvent{Type: int(e.event_type)}
	if isPort(ev.Type) {
		ev.Port = int(C.rdmago_event_port(&e))
	} else if isQP(ev.Type) {
		ev.QPN = uint32(C.rdmago_event_qpn(&e))
	}
	C.ibv_ack_async_event(&e)
	return ev, true
}

// InitAHFromWC is ibv_init_ah_from_wc for a UD receive: grh is the first
// 40 bytes of its buffer.
func (c *Context) InitAHFromWC(port int, wc *WC, grh []byte) (AHAttr, error) {
	g := (*C.struct_ibv_grh)(C.malloc(C.sizeof_struct_ibv_grh))
	defer C.free(unsafe.Pointer(g))
	copy(unsafe.Slice((*byte)(unsafe.Pointer(g)), C.sizeof_struct_ibv_grh), grh)
	var out C.struct_ibv_ah_attr
	if rc, err := C.rdmago_ah_from_wc(c.c, C.uint8_t(port), C.uint32_t(wc.Flags), C.uint32_t(wc.SrcQP),
		C.uint16_t(wc.SLID), C.uint8_t(wc.SL), C.uint16_t(wc.PKeyIndex), g, &out); rc != 0 {
		return AHAttr{}, errnoOf(err)
	}
	return ahFromC(&out), nil
}

// PD is a protection domain (struct ibv_pd).
type PD struct{ p *C.struct_ibv_pd }

// AllocPD is ibv_alloc_pd.
func (c *Context) AllocPD() (*PD, error) {
	pd, err := C.ibv_alloc_pd(c.c)
	if pd == nil {
		return nil, errnoOf(err)
	}
	return &PD{pd}, nil
}

// Pointer is the struct ibv_pd, for librdmacm's wrapper.
func (p *PD) Pointer() unsafe.Pointer { return unsafe.Pointer(p.p) }

// Dealloc is ibv_dealloc_pd.
func (p *PD) Dealloc() error {
	if rc := C.ibv_dealloc_pd(p.p); rc != 0 {
		return syscall.Errno(rc)
	}
	return nil
}

// MR is a memory region (struct ibv_mr).
type MR struct {
	p          *C.struct_ibv_mr
	LKey, RKey uint32
}

// RegMR is ibv_reg_mr over buf, which must not be Go heap memory.
func (p *PD) RegMR(buf []byte, access uint32) (*MR, error) {
	mr, err := C.ibv_reg_mr(p.p, unsafe.Pointer(&buf[0]), C.size_t(len(buf)), C.int(access))
	if mr == nil {
		return nil, errnoOf(err)
	}
	return &MR{p: mr, LKey: uint32(mr.lkey), RKey: uint32(mr.rkey)}, nil
}

// Dereg is ibv_dereg_mr.
func (m *MR) Dereg() error {
	if rc := C.ibv_dereg_mr(m.p); rc != 0 {
		return syscall.Errno(rc)
	}
	return nil
}

// CQ is a completion queue with a completion channel of its own.
type CQ struct {
	cq      *C.struct_ibv_cq
	ch      *C.struct_ibv_comp_channel
	wc      *C.struct_ibv_wc // poll scratch, C memory
	owc     *C.struct_rdmago_wc
	wcCap   int
	unacked C.uint
	fast    goCQ           // the Go data path, if chosen when created
	cmem    unsafe.Pointer // C memory it holds
}

// CreateCQ creates a completion channel and a CQ of at least entries
// entries on it; op names the step that failed.
func (c *Context) CreateCQ(entries int) (cq *CQ, op string, err error) {
	ch, err := C.ibv_create_comp_channel(c.c)
	if ch == nil {
		return nil, "ibv_create_comp_channel", errnoOf(err)
	}
	q, err := C.ibv_create_cq(c.c, C.int(entries), nil, ch, 0)
	if q == nil {
		C.ibv_destroy_comp_channel(ch)
		return nil, "ibv_create_cq", errnoOf(err)
	}
	// Events are only ever taken without waiting (waits are the poller's):
	// a read of an empty channel must return, on every path.
	if err := syscall.SetNonblock(int(ch.fd), true); err != nil {
		C.ibv_destroy_cq(q)
		C.ibv_destroy_comp_channel(ch)
		return nil, "making the completion channel non-blocking", err
	}
	cq = &CQ{cq: q, ch: ch}
	// The data path is chosen now, not at the first use: a wait reads
	// events without the CQ's lock.
	cq.choose()
	return cq, "", nil
}

// Pointer is the struct ibv_cq, for librdmacm's wrapper.
func (c *CQ) Pointer() unsafe.Pointer { return unsafe.Pointer(c.cq) }

// Poll moves up to len(out) completions into out in one crossing.
func (c *CQ) Poll(out []WC) (int, error) {
	return c.PollArm(out, false)
}

// PollArm polls into out and, when the CQ is empty and arm is set, arms it
// (ibv_req_notify_cq) and polls again, all in one crossing. A failed
// arming is a *NotifyError.
func (c *CQ) PollArm(out []WC, arm bool) (n int, err error) {
	if c.goPath() {
		n = c.fast.poll(out)
		if n == 0 && arm {
			if err := c.fast.arm(); err != nil {
				return 0, err
			}
			n = c.fast.poll(out)
		}
		return n, nil
	}
	if !c.scratchFor(len(out)) {
		return 0, syscall.ENOMEM
	}
	a := C.int(0)
	if arm {
		a = 1
	}
	n, err = polled(int(C.rdmago_poll_arm(C.uintptr_t(uintptr(unsafe.Pointer(c.cq))), C.int(len(out)),
		C.uintptr_t(uintptr(unsafe.Pointer(c.wc))), C.uintptr_t(uintptr(unsafe.Pointer(c.owc))), a)))
	c.converted(out, n)
	return n, err
}

// scratchFor makes the poll scratch (C memory) hold n completions; false
// when it cannot be allocated.
//
// C converts the completions into owc, also C memory, and Go copies them
// into the caller's slice: C never writes Go memory, whose address it
// would get as an integer, unpinned.
func (c *CQ) scratchFor(n int) bool {
	if n > c.wcCap {
		wc := (*C.struct_ibv_wc)(C.calloc(C.size_t(n), C.sizeof_struct_ibv_wc))
		owc := (*C.struct_rdmago_wc)(C.calloc(C.size_t(n), C.sizeof_struct_rdmago_wc))
		if wc == nil || owc == nil {
			C.free(unsafe.Pointer(wc))
			C.free(unsafe.Pointer(owc))
			return false
		}
		C.free(unsafe.Pointer(c.wc))
		C.free(unsafe.Pointer(c.owc))
		c.wc, c.owc, c.wcCap = wc, owc, n
	}
	return true
}

// converted copies the first n completions C converted into out.
func (c *CQ) converted(out []WC, n int) {
	if n > 0 {
		copy(out, unsafe.Slice((*WC)(unsafe.Pointer(c.owc)), n))
	}
}

// polled turns rdmago_poll_arm's result (a count, -1 or -2 for a failed
// poll, -2-errno for a failed arming) into a count or an error.
func polled(n int) (int, error) {
	switch {
	case n == -1, n == -2:
		return 0, syscall.EIO
	case n < -2:
		return 0, &NotifyError{syscall.Errno(-2 - n)}
	}
	return n, nil
}

// eventRead counts an event read off the channel. An ack only tells
// ibv_destroy_cq how many events were read (the kernel counts them too,
// and destroy waits until the two agree), so they are acked when the CQ
// is destroyed, not as they come: each ack is a crossing into C and a
// lock in libibverbs.
func (c *CQ) eventRead() {
	c.unacked++
	if c.unacked >= 1<<30 {
		C.ibv_ack_cq_events(c.cq, c.unacked)
		c.unacked = 0
	}
}

// EventPollArm is one step of a wait on a CQ, in one crossing. It polls
// into out first, so that after a wake-up the completions come before the
// event's read. When the CQ is empty and armed, it reads the event off the
// (non-blocking) channel, if one is there; when that leaves it unarmed, it
// arms it and polls again. It returns what it polled and whether the CQ is
// armed with its event unread, which the next step takes as armed, also
// with an error (PollArm's): unarmed after a failed arming, armed when the
// poll after it failed, as it was when the first poll failed.
//
// Reading the event only before the next sleep takes that read off a round
// trip's path: the caller answers first. At most one event is queued, as a
// CQ is never armed again before its event was read.
func (c *CQ) EventPollArm(out []WC, armed bool) (n int, armedAfter bool, err error) {
	if c.goPath() {
		if n = c.fast.poll(out); n > 0 {
			return n, armed, nil
		}
		if armed && readCompEvent(int(c.ch.fd)) {
			armed = false
			c.eventRead()
		}
		if armed {
			return 0, true, nil // the next completion brings the event and wakes the poller
		}
		if err := c.fast.arm(); err != nil {
			return 0, false, err
		}
		return c.fast.poll(out), true, nil
	}
	if !c.scratchFor(len(out)) {
		return 0, armed, syscall.ENOMEM
	}
	f := C.int(0)
	if armed {
		f = 1
	}
	r := int(C.rdmago_event_poll_arm(C.uintptr_t(uintptr(unsafe.Pointer(c.ch))), C.uintptr_t(uintptr(unsafe.Pointer(c.cq))),
		C.int(len(out)), C.uintptr_t(uintptr(unsafe.Pointer(c.wc))), C.uintptr_t(uintptr(unsafe.Pointer(c.owc))), f))
	if r < 0 {
		n, err = polled(r)
		switch {
		case r == -2:
			armed = true // the poll after the arming failed
		case r < -2:
			armed = false // the arming failed, after its event (if any) was read
		}
		return n, armed, err
	}
	if r&(1<<24) != 0 {
		c.eventRead()
	}
	n = r & (1<<24 - 1)
	c.converted(out, n)
	return n, r&(1<<25) != 0, nil
}

// ReqNotify arms the CQ for the next completion.
func (c *CQ) ReqNotify() error {
	if c.goPath() {
		if err := c.fast.arm(); err != nil {
			return err.(*NotifyError).Err
		}
		return nil
	}
	if rc := C.rdmago_req_notify(c.cq); rc != 0 {
		return syscall.Errno(rc)
	}
	return nil
}

// ChannelFD is the completion channel's descriptor.
func (c *CQ) ChannelFD() int { return int(c.ch.fd) }

// GetEvent takes one event off the completion channel (false when none is
// queued); events are acked when the CQ is destroyed.
func (c *CQ) GetEvent() bool {
	if c.goPath() {
		if !readCompEvent(int(c.ch.fd)) {
			return false
		}
		c.eventRead()
		return true
	}
	if C.rdmago_get_cq_event_u(C.uintptr_t(uintptr(unsafe.Pointer(c.ch)))) != 0 {
		return false
	}
	c.eventRead()
	return true
}

// Destroy acks what is unacked and destroys the CQ, then its channel. A
// CQ that QPs still use is refused, and left whole unless
// KeptOnFailedDestroy says otherwise.
func (c *CQ) Destroy() error {
	if c.unacked > 0 {
		C.ibv_ack_cq_events(c.cq, c.unacked)
		c.unacked = 0
	}
	if rc := C.ibv_destroy_cq(c.cq); rc != 0 {
		return syscall.Errno(rc)
	}
	C.ibv_destroy_comp_channel(c.ch)
	C.free(unsafe.Pointer(c.wc))
	C.free(unsafe.Pointer(c.owc))
	C.free(c.cmem)
	c.wc, c.owc, c.wcCap, c.fast, c.cmem = nil, nil, 0, nil, nil
	return nil
}

// goPath reports whether the CQ is polled and armed from Go.
func (c *CQ) goPath() bool { return c.fast != nil }

// AH is an address handle (struct ibv_ah).
type AH struct{ p *C.struct_ibv_ah }

func (a *AH) handle() uintptr { return uintptr(unsafe.Pointer(a.p)) }

// CreateAH is ibv_create_ah.
func (p *PD) CreateAH(a *AHAttr) (*AH, error) {
	ca := ahToC(a)
	ah, err := C.ibv_create_ah(p.p, &ca)
	if ah == nil {
		return nil, errnoOf(err)
	}
	return &AH{ah}, nil
}

// Destroy is ibv_destroy_ah.
func (a *AH) Destroy() error {
	if rc := C.ibv_destroy_ah(a.p); rc != 0 {
		return syscall.Errno(rc)
	}
	return nil
}

// QP is a queue pair, with C scratch memory for posting in one crossing.
type QP struct {
	p       *C.struct_ibv_qp
	destroy func() error // adopted QPs: the owner's destroy

	sdesc *C.struct_rdmago_swr
	swrs  *C.struct_ibv_send_wr
	rdesc *C.struct_rdmago_rwr
	rwrs  *C.struct_ibv_recv_wr
	sges  *C.struct_ibv_sge
	bad   *C.int // the index of a refused request: C memory, so that a post allocates nothing
	nWR   int
	nSGE  int

	chosen bool           // the data path, at the first post
	fast   goQP           // the Go data path, if chosen
	cmem   unsafe.Pointer // C memory it holds
}

// CreateQP is ibv_create_qp.
func (p *PD) CreateQP(init *QPInit) (*QP, error) {
	var a C.struct_ibv_qp_init_attr
	a.send_cq = init.SendCQ.cq
	a.recv_cq = init.RecvCQ.cq
	a.qp_type = C.enum_ibv_qp_type(init.Type)
	a.cap = capToC(init.Cap)
	if init.SignalAll {
		a.sq_sig_all = 1
	}
	qp, err := C.ibv_create_qp(p.p, &a)
	if qp == nil {
		return nil, errnoOf(err)
	}
	return &QP{p: qp}, nil
}

// AdoptQP wraps a struct ibv_qp another library created; Destroy calls
// destroy instead of ibv_destroy_qp.
func AdoptQP(p unsafe.Pointer, destroy func() error) *QP {
	return &QP{p: (*C.struct_ibv_qp)(p), destroy: destroy}
}

// Num is the QP number.
func (q *QP) Num() uint32 { return uint32(q.p.qp_num) }

// State is the state libibverbs has cached for the QP.
func (q *QP) State() int { return int(q.p.state) }

// QueryState asks the device for the QP's state.
func (q *QP) QueryState() (int, error) {
	var qa C.struct_ibv_qp_attr
	var qi C.struct_ibv_qp_init_attr
	if rc := C.ibv_query_qp(q.p, &qa, C.IBV_QP_STATE, &qi); rc != 0 {
		return 0, syscall.Errno(rc)
	}
	return int(qa.qp_state), nil
}

// Query is ibv_query_qp.
func (q *QP) Query(mask uint32) (QPAttr, error) {
	var qa C.struct_ibv_qp_attr
	var qi C.struct_ibv_qp_init_attr
	if rc := C.ibv_query_qp(q.p, &qa, C.int(mask), &qi); rc != 0 {
		return QPAttr{}, syscall.Errno(rc)
	}
	return attrFromC(&qa), nil
}

// Modify is ibv_modify_qp.
func (q *QP) Modify(a *QPAttr, mask uint32) error {
	ca := attrToC(a)
	if rc := C.ibv_modify_qp(q.p, &ca, C.int(mask)); rc != 0 {
		return syscall.Errno(rc)
	}
	return nil
}

// grow makes room for n work requests with s SGEs in C memory; it fails
// only when memory runs out, leaving what was there.
func (q *QP) grow(n, s int) error {
	if q.bad == nil {
		if q.bad = (*C.int)(C.malloc(C.sizeof_int)); q.bad == nil {
			return syscall.ENOMEM
		}
	}
	if n > q.nWR {
		for _, b := range []struct {
			p    *unsafe.Pointer
			size C.size_t
		}{{(*unsafe.Pointer)(unsafe.Pointer(&q.sdesc)), C.sizeof_struct_rdmago_swr},
			{(*unsafe.Pointer)(unsafe.Pointer(&q.swrs)), C.sizeof_struct_ibv_send_wr},
			{(*unsafe.Pointer)(unsafe.Pointer(&q.rdesc)), C.sizeof_struct_rdmago_rwr},
			{(*unsafe.Pointer)(unsafe.Pointer(&q.rwrs)), C.sizeof_struct_ibv_recv_wr}} {
			p := C.realloc(*b.p, C.size_t(n)*b.size)
			if p == nil {
				return syscall.ENOMEM // the ones grown so far are only larger than needed
			}
			*b.p = p
		}
		q.nWR = n
	}
	if s > q.nSGE {
		p := C.realloc(unsafe.Pointer(q.sges), C.size_t(s)*C.sizeof_struct_ibv_sge)
		if p == nil {
			return syscall.ENOMEM
		}
		q.sges, q.nSGE = (*C.struct_ibv_sge)(p), s
	}
	return nil
}

// SendScratch returns room for n send requests and s SGEs, in C memory,
// for the caller to fill before PostSend.
func (q *QP) SendScratch(n, s int) ([]SendDesc, []SGE, error) {
	if err := q.grow(n, max(s, 1)); err != nil {
		return nil, nil, err
	}
	return unsafe.Slice((*SendDesc)(unsafe.Pointer(q.sdesc)), n), unsafe.Slice((*SGE)(unsafe.Pointer(q.sges)), max(s, 1)), nil
}

// RecvScratch is SendScratch for receives.
func (q *QP) RecvScratch(n, s int) ([]RecvDesc, []SGE, error) {
	if err := q.grow(n, max(s, 1)); err != nil {
		return nil, nil, err
	}
	return unsafe.Slice((*RecvDesc)(unsafe.Pointer(q.rdesc)), n), unsafe.Slice((*SGE)(unsafe.Pointer(q.sges)), max(s, 1)), nil
}

// PostSend posts the first n requests of the send scratch as one list. On
// failure bad is the index of the refused request, or -1.
func (q *QP) PostSend(n int) (bad int, err error) {
	if q.goPath() {
		return q.fast.post(unsafe.Slice((*SendDesc)(unsafe.Pointer(q.sdesc)), n), unsafe.Slice((*SGE)(unsafe.Pointer(q.sges)), q.nSGE))
	}
	if rc := C.rdmago_post_send_u(cptr(unsafe.Pointer(q.p)), cptr(unsafe.Pointer(q.sdesc)), C.int(n), cptr(unsafe.Pointer(q.sges)),
		cptr(unsafe.Pointer(q.swrs)), cptr(unsafe.Pointer(q.bad))); rc != 0 {
		return int(*q.bad), postError(rc)
	}
	return -1, nil
}

// PostRecv posts the first n requests of the receive scratch.
func (q *QP) PostRecv(n int) (bad int, err error) {
	if q.goPath() {
		return q.fast.postRecv(unsafe.Slice((*RecvDesc)(unsafe.Pointer(q.rdesc)), n), unsafe.Slice((*SGE)(unsafe.Pointer(q.sges)), q.nSGE))
	}
	if rc := C.rdmago_post_recv_u(cptr(unsafe.Pointer(q.p)), cptr(unsafe.Pointer(q.rdesc)), C.int(n), cptr(unsafe.Pointer(q.sges)),
		cptr(unsafe.Pointer(q.rwrs)), cptr(unsafe.Pointer(q.bad))); rc != 0 {
		return int(*q.bad), postError(rc)
	}
	return -1, nil
}

func postError(rc C.int) error {
	if rc == C.RDMAGO_REASON_LOST {
		return ErrReasonLost
	}
	return syscall.Errno(rc)
}

// Destroy destroys the QP (through its owner if adopted) and frees the
// scratch.
func (q *QP) Destroy() error {
	if q.destroy != nil {
		if err := q.destroy(); err != nil {
			return err
		}
	} else if rc := C.ibv_destroy_qp(q.p); rc != 0 {
		return syscall.Errno(rc)
	}
	for _, p := range []unsafe.Pointer{unsafe.Pointer(q.sdesc), unsafe.Pointer(q.swrs), unsafe.Pointer(q.rdesc),
		unsafe.Pointer(q.rwrs), unsafe.Pointer(q.sges), unsafe.Pointer(q.bad)} {
		C.free(p)
	}
	q.sdesc, q.swrs, q.rdesc, q.rwrs, q.sges, q.bad, q.nWR, q.nSGE = nil, nil, nil, nil, nil, nil, 0, 0
	C.free(q.cmem)
	q.fast, q.cmem = nil, nil
	return nil
}

// goPath reports whether the QP's work requests are posted from Go,
// choosing at the first post (posts are serialised by the caller, and
// the provider's structures are complete by then, for adopted QPs too).
func (q *QP) goPath() bool {
	if !q.chosen {
		q.choose()
	}
	return q.fast != nil
}

func capToC(c QPCap) C.struct_ibv_qp_cap {
	return C.struct_ibv_qp_cap{max_send_wr: C.uint32_t(c.MaxSendWR), max_recv_wr: C.uint32_t(c.MaxRecvWR),
		max_send_sge: C.uint32_t(c.MaxSendSGE), max_recv_sge: C.uint32_t(c.MaxRecvSGE),
		max_inline_data: C.uint32_t(c.MaxInlineData)}
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
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&c.grh.dgid)), 16), a.DGID[:])
	c.grh.flow_label = C.uint32_t(a.FlowLabel)
	c.grh.sgid_index = C.uint8_t(a.SGIDIndex)
	c.grh.hop_limit = C.uint8_t(a.HopLimit)
	c.grh.traffic_class = C.uint8_t(a.TrafficClass)
	return c
}

func ahFromC(c *C.struct_ibv_ah_attr) AHAttr {
	a := AHAttr{DLID: uint16(c.dlid), SL: uint8(c.sl), SrcPathBits: uint8(c.src_path_bits),
		StaticRate: uint8(c.static_rate), IsGlobal: c.is_global != 0, PortNum: uint8(c.port_num),
		FlowLabel: uint32(c.grh.flow_label), SGIDIndex: uint8(c.grh.sgid_index), HopLimit: uint8(c.grh.hop_limit),
		TrafficClass: uint8(c.grh.traffic_class)}
	copy(a.DGID[:], unsafe.Slice((*byte)(unsafe.Pointer(&c.grh.dgid)), 16))
	return a
}

// AHAttrAt reads a struct ibv_ah_attr (from a librdmacm UD event).
func AHAttrAt(p unsafe.Pointer) AHAttr { return ahFromC((*C.struct_ibv_ah_attr)(p)) }

// QPAttrAt reads a struct ibv_qp_attr (from rdma_init_qp_attr).
func QPAttrAt(p unsafe.Pointer) QPAttr { return attrFromC((*C.struct_ibv_qp_attr)(p)) }

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
	c.cap = capToC(a.Cap)
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
		State: int(c.qp_state), CurState: int(c.cur_qp_state), PathMTU: int(c.path_mtu),
		PathMigState: int(c.path_mig_state), QKey: uint32(c.qkey), RQPSN: uint32(c.rq_psn),
		SQPSN: uint32(c.sq_psn), DestQPN: uint32(c.dest_qp_num), AccessFlags: uint32(c.qp_access_flags),
		Cap: QPCap{MaxSendWR: uint32(c.cap.max_send_wr), MaxRecvWR: uint32(c.cap.max_recv_wr),
			MaxSendSGE: uint32(c.cap.max_send_sge), MaxRecvSGE: uint32(c.cap.max_recv_sge),
			MaxInlineData: uint32(c.cap.max_inline_data)},
		AH: ahFromC(&c.ah_attr), AltAH: ahFromC(&c.alt_ah_attr), PKeyIndex: uint16(c.pkey_index),
		AltPKeyIndex: uint16(c.alt_pkey_index), EnSQDAsyncNotify: c.en_sqd_async_notify != 0,
		SQDraining: c.sq_draining != 0, MaxRdAtomic: uint8(c.max_rd_atomic),
		MaxDestRdAtomic: uint8(c.max_dest_rd_atomic), MinRNRTimer: uint8(c.min_rnr_timer),
		PortNum: uint8(c.port_num), Timeout: uint8(c.timeout), RetryCount: uint8(c.retry_cnt),
		RNRRetry: uint8(c.rnr_retry), AltPortNum: uint8(c.alt_port_num), AltTimeout: uint8(c.alt_timeout),
		RateLimit: uint32(c.rate_limit),
	}
}

// Key identifies the context's C object, for telling whether two Contexts
// wrap the same one.
func (c *Context) Key() uintptr { return uintptr(unsafe.Pointer(c.c)) }

// cptr passes a pointer to C memory as an integer, which cgo does not check
// (see rdmago_post_send_u).
func cptr(p unsafe.Pointer) C.uintptr_t { return C.uintptr_t(uintptr(p)) }
