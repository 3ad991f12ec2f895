//go:build linux && cgo

package cma

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include <errno.h>
#include <string.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>

_Static_assert(RDMA_OPTION_ID_TOS == 0 && RDMA_OPTION_ID_REUSEADDR == 1 && RDMA_OPTION_ID_AFONLY == 2 &&
	RDMA_OPTION_ID_ACK_TIMEOUT == 3, "rdma_set_option names");

// One event, copied out of librdmacm so that it can be acked at once: an
// event left unacked makes rdma_destroy_id wait forever.
struct rdmago_event {
	struct rdma_cm_id *id;
	uint64_t token; // the id's context; for a connect request, the listener's
	int type, status, ud;
	uint8_t pdata[256];
	int pdata_len;
	uint8_t responder_resources, initiator_depth, flow_control, retry_count, rnr_retry_count, srq;
	uint32_t qp_num, qkey;
	struct ibv_ah_attr ah_attr;
};

// rdmago_get_event fetches, copies and acks one event. The channel fd is
// non-blocking: -1 with errno EAGAIN means none is queued.
static int rdmago_get_event(struct rdma_event_channel *ch, struct rdmago_event *out) {
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		return -1;
	memset(out, 0, sizeof(*out));
	out->id = ev->id;
	struct rdma_cm_id *owner = ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && ev->listen_id ? ev->listen_id : ev->id;
	out->token = (uint64_t)(uintptr_t)owner->context;
	out->type = ev->event;
	out->status = ev->status;
	out->ud = ev->id->ps == RDMA_PS_UDP || ev->id->ps == RDMA_PS_IPOIB;
	const void *pd;
	int n;
	if (out->ud) {
		pd = ev->param.ud.private_data;
		n = ev->param.ud.private_data_len;
		out->ah_attr = ev->param.ud.ah_attr;
		out->qp_num = ev->param.ud.qp_num;
		out->qkey = ev->param.ud.qkey;
	} else {
		struct rdma_conn_param *c = &ev->param.conn;
		pd = c->private_data;
		n = c->private_data_len;
		out->responder_resources = c->responder_resources;
		out->initiator_depth = c->initiator_depth;
		out->flow_control = c->flow_control;
		out->retry_count = c->retry_count;
		out->rnr_retry_count = c->rnr_retry_count;
		out->srq = c->srq;
		out->qp_num = c->qp_num;
	}
	if (pd && n > 0) {
		if (n > (int)sizeof(out->pdata))
			n = sizeof(out->pdata);
		out->pdata_len = n;
		memcpy(out->pdata, pd, n);
	}
	rdma_ack_cm_event(ev);
	return 0;
}

// rdmago_get_events fetches, copies and acks up to max events in one
// crossing. It returns how many it got in the low 16 bits; bit 16 is set
// when it stopped because none was queued (errno EAGAIN) rather than at
// max, and bits 17 and up hold the errno of a failed read other than
// EAGAIN. (One return value: out parameters in Go memory would each be
// allocated on the Go heap per call.)
static int rdmago_get_events(uintptr_t chp, uintptr_t outp, int max) {
	struct rdma_event_channel *ch = (struct rdma_event_channel *)chp;
	struct rdmago_event *out = (struct rdmago_event *)outp;
	int n = 0;
	while (n < max) {
		if (rdmago_get_event(ch, &out[n])) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return n | 1 << 16;
			return n | errno << 17;
		}
		n++;
	}
	return n;
}

// An id's context is the token that routes its events; librdmacm never
// dereferences it.
// It returns the id, or on failure -errno cast to a pointer, as the
// kernel's ERR_PTR does: the caller reads no errno, so the call is made
// without cgo's errno form (which clears and saves errno around it). (The
// channel and the id travel as integers: a C pointer argument costs cgo's
// check of whether it points into Go memory on every call, and an out
// parameter in Go memory a heap allocation.)
static struct rdma_cm_id *rdmago_create_id(uintptr_t ch, uint64_t token, int ps) {
	struct rdma_cm_id *id;
	if (rdma_create_id((struct rdma_event_channel *)ch, &id, (void *)(uintptr_t)token, ps))
		return (struct rdma_cm_id *)(intptr_t)-(errno ? errno : EIO);
	return id;
}

// rdmago_destroy_id returns 0 or -errno.
static int rdmago_destroy_id(uintptr_t id) {
	if (rdma_destroy_id((struct rdma_cm_id *)id))
		return -(errno ? errno : EIO);
	return 0;
}
static int rdmago_resolve_route(uintptr_t id, int ms) { return rdma_resolve_route((struct rdma_cm_id *)id, ms); }
static int rdmago_disconnect(uintptr_t id) { return rdma_disconnect((struct rdma_cm_id *)id); }

// rdmago_shutdown_qp moves the id's QP as rdma_disconnect does before the
// CM's disconnect (to ERR on InfiniBand and RoCE, SQD on iWARP); 0 or
// -errno.
static int rdmago_shutdown_qp(uintptr_t p) {
	struct rdma_cm_id *id = (struct rdma_cm_id *)p;
	struct ibv_qp_attr attr;
	if (!id->qp || !id->verbs || !id->verbs->device)
		return 0;
	memset(&attr, 0, sizeof(attr));
	switch (id->verbs->device->transport_type) {
	case IBV_TRANSPORT_IB:
		attr.qp_state = IBV_QPS_ERR;
		break;
	case IBV_TRANSPORT_IWARP:
		attr.qp_state = IBV_QPS_SQD;
		break;
	default:
		return 0;
	}
	int rc = ibv_modify_qp(id->qp, &attr, IBV_QP_STATE);
	return rc > 0 ? -rc : rc < 0 ? -(errno ? errno : EIO) : 0;
}

// rdmago_swap_qp sets the id's QP and returns the one it had.
static uintptr_t rdmago_swap_qp(uintptr_t p, uintptr_t qp) {
	struct rdma_cm_id *id = (struct rdma_cm_id *)p;
	uintptr_t had = (uintptr_t)id->qp;
	id->qp = (struct ibv_qp *)qp;
	return had;
}

static void rdmago_set_token(struct rdma_cm_id *id, uint64_t token) { id->context = (void *)(uintptr_t)token; }

static void rdmago_sockaddr(struct sockaddr_storage *ss, int v6, const uint8_t *ip, uint16_t port, uint32_t scope) {
	memset(ss, 0, sizeof(*ss));
	if (v6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons(port);
		s->sin6_scope_id = scope;
		memcpy(&s->sin6_addr, ip, 16);
	} else {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(port);
		memcpy(&s->sin_addr, ip, 4);
	}
}

// rdmago_addr reads a sockaddr: 4 or 16 address bytes, or 0 if unset.
static int rdmago_addr(const struct sockaddr *sa, uint8_t *ip, uint16_t *port, uint32_t *scope) {
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
		memcpy(ip, &s->sin_addr, 4);
		*port = ntohs(s->sin_port);
		return 4;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
		memcpy(ip, &s->sin6_addr, 16);
		*port = ntohs(s->sin6_port);
		*scope = s->sin6_scope_id;
		return 16;
	}
	return 0;
}

static const struct sockaddr *rdmago_local(struct rdma_cm_id *id) { return rdma_get_local_addr(id); }
static const struct sockaddr *rdmago_peer(struct rdma_cm_id *id) { return rdma_get_peer_addr(id); }

static int rdmago_connect(struct rdma_cm_id *id, int accept, const void *pd, uint8_t pdlen, uint8_t rr, uint8_t depth,
		uint8_t fc, uint8_t retry, uint8_t rnr, uint8_t srq, uint32_t qpn) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof(p));
	p.private_data = pdlen ? pd : NULL;
	p.private_data_len = pdlen;
	p.responder_resources = rr;
	p.initiator_depth = depth;
	p.flow_control = fc;
	p.srq = srq;
	p.retry_count = retry;
	p.rnr_retry_count = rnr;
	p.qp_num = qpn;
	return accept ? rdma_accept(id, &p) : rdma_connect(id, &p);
}

static int rdmago_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
		int type, uint32_t swr, uint32_t rwr, uint32_t ssge, uint32_t rsge, uint32_t inl, int sig_all) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = type;
	a.cap.max_send_wr = swr;
	a.cap.max_recv_wr = rwr;
	a.cap.max_send_sge = ssge;
	a.cap.max_recv_sge = rsge;
	a.cap.max_inline_data = inl;
	a.sq_sig_all = sig_all;
	return rdma_create_qp(id, pd, &a);
}

static int rdmago_init_qp_attr(struct rdma_cm_id *id, int state, struct ibv_qp_attr *attr, int *mask) {
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = state;
	return rdma_init_qp_attr(id, attr, mask);
}
*/
import "C"

import (
	"errors"
	"net/netip"
	"sync"
	"syscall"
	"unsafe"

	"github.com/rdmago/rdmago/internal/ibv"
)

func cbool(b bool) C.uint8_t {
	if b {
		return 1
	}
	return 0
}

func errnoOf(err error) error {
	var en syscall.Errno
	if errors.As(err, &en) && en != 0 {
		return en
	}
	return syscall.EIO
}

// Channel is an rdma_event_channel.
type Channel struct {
	ch *C.struct_rdma_event_channel
	ev *C.struct_rdmago_event // the copy-out buffer, C memory: EventBatch entries

	// qps is held while an event is read, while a QP librdmacm made is
	// created and while one leaves its id to be destroyed:
	// rdma_get_cm_event moves an id's QP itself (CONNECT_RESPONSE,
	// REJECTED, MULTICAST_JOIN), which must not meet the QP's destroy on
	// another thread. Reading an event never blocks; a QP's destroy can,
	// and happens outside. (The calls on one id that use its QP take the
	// id's qpMu instead.)
	qps sync.Mutex
}

// NewChannel is rdma_create_event_channel.
func NewChannel() (*Channel, error) {
	ch, err := C.rdma_create_event_channel()
	if ch == nil {
		return nil, errnoOf(err)
	}
	ev := (*C.struct_rdmago_event)(C.calloc(EventBatch, C.sizeof_struct_rdmago_event))
	if ev == nil {
		C.rdma_destroy_event_channel(ch)
		return nil, syscall.ENOMEM
	}
	return &Channel{ch: ch, ev: ev}, nil
}

// FD is the channel's descriptor, for the poller.
func (c *Channel) FD() int { return int(c.ch.fd) }

// Destroy is rdma_destroy_event_channel; every id on it must be gone.
func (c *Channel) Destroy() {
	C.rdma_destroy_event_channel(c.ch)
	C.free(unsafe.Pointer(c.ev))
}

// EventBatch is the most events GetEvents reads in one crossing.
const EventBatch = 16

// GetEvents reads, copies and acks up to len(dst) (at most EventBatch)
// queued events in one crossing into C, and returns how many. drained is
// set when it stopped because none was left queued (the descriptor is
// non-blocking once in the poller), so that a waiter can go straight to
// the poller; err is a failed read's error other than "none queued".
func (c *Channel) GetEvents(dst []Event) (n int, drained bool, err error) {
	max := min(len(dst), EventBatch)
	if max == 0 {
		return 0, false, nil
	}
	c.qps.Lock()
	rc := int(C.rdmago_get_events(C.uintptr_t(uintptr(unsafe.Pointer(c.ch))), C.uintptr_t(uintptr(unsafe.Pointer(c.ev))), C.int(max)))
	c.qps.Unlock()
	got := rc & 0xffff
	evs := unsafe.Slice(c.ev, got)
	for i := range evs {
		dst[i] = c.copyEvent(&evs[i])
	}
	if en := rc >> 17; en != 0 {
		err = syscall.Errno(en)
	}
	return got, rc&(1<<16) != 0, err
}

// GetEvent reads, copies and acks one event; false when none is queued
// (the descriptor is non-blocking once in the poller).
func (c *Channel) GetEvent() (Event, bool) {
	var ev [1]Event
	n, _, _ := c.GetEvents(ev[:])
	return ev[0], n == 1
}

func (c *Channel) copyEvent(ce *C.struct_rdmago_event) Event {
	ev := Event{Type: int(ce._type), Status: int(ce.status), UD: ce.ud != 0, Token: uint64(ce.token)}
	if ce._type == C.RDMA_CM_EVENT_CONNECT_REQUEST {
		ev.ID = &ID{id: ce.id, ch: c}
	}
	if n := int(ce.pdata_len); n > 0 {
		ev.PrivateData = C.GoBytes(unsafe.Pointer(&ce.pdata[0]), C.int(n))
	}
	ev.Param = ConnParam{ResponderResources: uint8(ce.responder_resources), InitiatorDepth: uint8(ce.initiator_depth),
		FlowControl: ce.flow_control != 0, RetryCount: uint8(ce.retry_count), RNRRetryCount: uint8(ce.rnr_retry_count),
		SRQ: ce.srq != 0, QPNum: uint32(ce.qp_num)}
	if ev.UD {
		ev.QKey = uint32(ce.qkey)
		ev.AH = ibv.AHAttrAt(unsafe.Pointer(&ce.ah_attr))
	}
	return ev
}

// Devices is rdma_get_devices: librdmacm's own contexts, which it keeps
// open for the life of the process.
func Devices() ([]*ibv.Context, error) {
	var n C.int
	list, err := C.rdma_get_devices(&n)
	if list == nil {
		return nil, errnoOf(err)
	}
	defer C.rdma_free_devices(list)
	var out []*ibv.Context
	for _, ctx := range unsafe.Slice(list, int(n)) {
		out = append(out, ibv.BorrowContext(unsafe.Pointer(ctx)))
	}
	return out, nil
}

// ReleaseDeadDevices has librdmacm look at the kernel's device list again
// (rdma_get_devices does), which closes its context of every device that
// has gone away and that no id uses any more. Until then librdmacm keeps
// the context, and the kernel cannot finish deleting the device: it waits
// for every open context, and a device of the same kind cannot be added on
// that netdev meanwhile ("File exists").
func ReleaseDeadDevices() {
	var n C.int
	if list := C.rdma_get_devices(&n); list != nil {
		C.rdma_free_devices(list)
	}
}

// ID is an rdma_cm_id.
type ID struct {
	id *C.struct_rdma_cm_id
	ch *Channel

	// qpMu is held by the calls that use the QP librdmacm made for the
	// id (rdma_connect and rdma_accept read it and move it,
	// rdma_disconnect moves it, rdma_leave_multicast detaches it) and by
	// that QP's destroy: a QP closed on one goroutine while another
	// disconnects (a connection's Close, while the dispatcher answers the
	// peer's disconnect) is either still whole or already gone from the
	// id, never freed under the call. Per id, not the channel's qps: on
	// iWARP rdma_connect (siw's TCP connect) and rdma_disconnect (while a
	// connect is pending) can block, and must not stop every id's events.
	qpMu sync.Mutex
	gone bool // rdma_destroy_id freed the id: its QP's destroy must not read it
}

// NewID is rdma_create_id, with token as the id's context: it fills in
// into, which the caller allocates with its own state (one allocation per
// id, not two).
func (c *Channel) NewID(into *ID, token uint64, ps int) error {
	id := C.rdmago_create_id(C.uintptr_t(uintptr(unsafe.Pointer(c.ch))), C.uint64_t(token), C.int(ps))
	if v := uintptr(unsafe.Pointer(id)); v > ^uintptr(4095) { // -4095..-1: -errno
		return syscall.Errno(-v)
	}
	*into = ID{id: id, ch: c}
	return nil
}

// addr is the id's address as an integer, for the calls made often: see
// rdmago_create_id.
func (i *ID) addr() C.uintptr_t { return C.uintptr_t(uintptr(unsafe.Pointer(i.id))) }

// SetToken sets the id's context.
func (i *ID) SetToken(token uint64) { C.rdmago_set_token(i.id, C.uint64_t(token)) }

// Destroy is rdma_destroy_id.
func (i *ID) Destroy() error {
	i.qpMu.Lock()
	defer i.qpMu.Unlock()
	if rc := C.rdmago_destroy_id(i.addr()); rc != 0 {
		return syscall.Errno(-rc)
	}
	i.gone = true
	return nil
}

func toSockaddr(sa SockAddr, ss *C.struct_sockaddr_storage) {
	a := sa.AP.Addr()
	if a.Is4() || a.Is4In6() {
		b := a.Unmap().As4()
		C.rdmago_sockaddr(ss, 0, (*C.uint8_t)(&b[0]), C.uint16_t(sa.AP.Port()), 0)
		return
	}
	b := a.As16()
	C.rdmago_sockaddr(ss, 1, (*C.uint8_t)(&b[0]), C.uint16_t(sa.AP.Port()), C.uint32_t(sa.Scope))
}

func fromSockaddr(sa *C.struct_sockaddr) SockAddr {
	if sa == nil {
		return SockAddr{}
	}
	var ip [16]byte
	var port C.uint16_t
	var sc C.uint32_t
	switch C.rdmago_addr(sa, (*C.uint8_t)(&ip[0]), &port, &sc) {
	case 4:
		return SockAddr{AP: netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[:4])), uint16(port))}
	case 16:
		return SockAddr{AP: netip.AddrPortFrom(netip.AddrFrom16(ip), uint16(port)), Scope: uint32(sc)}
	}
	return SockAddr{}
}

// LocalAddr is rdma_get_local_addr.
func (i *ID) LocalAddr() SockAddr { return fromSockaddr(C.rdmago_local(i.id)) }

// PeerAddr is rdma_get_peer_addr.
func (i *ID) PeerAddr() SockAddr { return fromSockaddr(C.rdmago_peer(i.id)) }

// DeviceName is the device the id is bound to, "" before it is.
func (i *ID) DeviceName() string {
	if i.id.verbs == nil {
		return ""
	}
	return C.GoString(C.ibv_get_device_name(i.id.verbs.device))
}

// PortNum is the id's port, 0 before it is bound.
func (i *ID) PortNum() int { return int(i.id.port_num) }

// Transport is the transport of the id's device (enum ibv_transport_type),
// and false before the id is bound to one: read from the id's memory,
// without a call into C.
func (i *ID) Transport() (int, bool) {
	if i.id.verbs == nil || i.id.verbs.device == nil {
		return 0, false
	}
	return int(i.id.verbs.device.transport_type), true
}

// ContextKey identifies the id's device context (0 before it is bound),
// to compare with ibv.Context.Key without a call into C.
func (i *ID) ContextKey() uintptr { return uintptr(unsafe.Pointer(i.id.verbs)) }

// Context is the id's device context (librdmacm's), nil before it is bound.
func (i *ID) Context() *ibv.Context {
	if i.id.verbs == nil {
		return nil
	}
	return ibv.BorrowContext(unsafe.Pointer(i.id.verbs))
}

// SetOption is rdma_set_option at level RDMA_OPTION_ID.
func (i *ID) SetOption(name int, v []byte) error {
	if rc, err := C.rdma_set_option(i.id, C.RDMA_OPTION_ID, C.int(name), unsafe.Pointer(&v[0]), C.size_t(len(v))); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

// Bind is rdma_bind_addr.
func (i *ID) Bind(sa SockAddr) error {
	var ss C.struct_sockaddr_storage
	toSockaddr(sa, &ss)
	if rc, err := C.rdma_bind_addr(i.id, (*C.struct_sockaddr)(unsafe.Pointer(&ss))); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

// ResolveAddr is rdma_resolve_addr; src may be the zero SockAddr.
func (i *ID) ResolveAddr(src, dst SockAddr, timeoutMS int) error {
	var s, d C.struct_sockaddr_storage
	var sp *C.struct_sockaddr
	if src.AP.Addr().IsValid() {
		toSockaddr(src, &s)
		sp = (*C.struct_sockaddr)(unsafe.Pointer(&s))
	}
	toSockaddr(dst, &d)
	if rc, err := C.rdma_resolve_addr(i.id, sp, (*C.struct_sockaddr)(unsafe.Pointer(&d)), C.int(timeoutMS)); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

// ResolveRoute is rdma_resolve_route.
func (i *ID) ResolveRoute(timeoutMS int) error {
	if rc, err := C.rdmago_resolve_route(i.addr(), C.int(timeoutMS)); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

// Listen is rdma_listen.
func (i *ID) Listen(backlog int) error {
	if rc, err := C.rdma_listen(i.id, C.int(backlog)); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

// Connect is rdma_connect, or rdma_accept when accept is set.
func (i *ID) Connect(accept bool, p ConnParam, data []byte) error {
	var dp unsafe.Pointer
	if len(data) > 0 {
		dp = unsafe.Pointer(&data[0])
	}
	a := C.int(0)
	if accept {
		a = 1
	}
	if len(data) > 255 {
		return syscall.EINVAL // the length is 8 bits: more would be cut short
	}
	i.qpMu.Lock()
	defer i.qpMu.Unlock()
	if rc, err := C.rdmago_connect(i.id, a, dp, C.uint8_t(len(data)), C.uint8_t(p.ResponderResources),
		C.uint8_t(p.InitiatorDepth), cbool(p.FlowControl), C.uint8_t(p.RetryCount), C.uint8_t(p.RNRRetryCount),
		cbool(p.SRQ), C.uint32_t(p.QPNum)); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

// Reject is rdma_reject.
func (i *ID) Reject(data []byte) error {
	var dp unsafe.Pointer
	if len(data) > 0 {
		dp = unsafe.Pointer(&data[0])
	}
	if len(data) > 255 {
		return syscall.EINVAL // the length is 8 bits: more would be cut short
	}
	if rc, err := C.rdma_reject(i.id, dp, C.uint8_t(len(data))); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

// Disconnect is rdma_disconnect; it moves the id's QP to the error state
// (InfiniBand, RoCE) or SQD (iWARP), under qpMu.
//
// rdma_disconnect moves the QP first and gives up, the CM's disconnect
// unsent, when the move is refused (a QP in RESET cannot go to ERR). The
// peer must learn of the end whatever state the QP is in: when the same
// move fails again here, the disconnect is sent with the QP detached from
// the id for the call (librdmacm then moves none; the QP stays as it is on
// InfiniBand and RoCE, and the kernel's iWARP CM moves it itself). When
// the move works, the failure was the disconnect's own, and is returned.
func (i *ID) Disconnect() error {
	i.qpMu.Lock()
	defer i.qpMu.Unlock()
	rc, err := C.rdmago_disconnect(i.addr())
	if rc == 0 {
		return nil
	}
	if C.rdmago_shutdown_qp(i.addr()) == 0 {
		return errnoOf(err)
	}
	// The event reader reads an id's QP under qps (CONNECT_RESPONSE,
	// REJECTED, MULTICAST_JOIN); the disconnect itself goes outside, as it
	// may block on iWARP. An event of this id read meanwhile finds no QP to
	// move, which the failed move makes moot.
	i.ch.qps.Lock()
	qp := C.rdmago_swap_qp(i.addr(), 0)
	i.ch.qps.Unlock()
	rc2, _ := C.rdmago_disconnect(i.addr())
	i.ch.qps.Lock()
	C.rdmago_swap_qp(i.addr(), qp)
	i.ch.qps.Unlock()
	if rc2 == 0 {
		return nil
	}
	return errnoOf(err)
}

// Establish is rdma_establish (for an id without a QP of librdmacm's: it
// moves no QP).
func (i *ID) Establish() error {
	if rc, err := C.rdma_establish(i.id); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

// InitQPAttr is rdma_init_qp_attr for the transition to state.
func (i *ID) InitQPAttr(state int) (ibv.QPAttr, uint32, error) {
	var a C.struct_ibv_qp_attr
	var mask C.int
	if rc, err := C.rdmago_init_qp_attr(i.id, C.int(state), &a, &mask); rc != 0 {
		return ibv.QPAttr{}, 0, errnoOf(err)
	}
	return ibv.QPAttrAt(unsafe.Pointer(&a)), uint32(mask), nil
}

// CreateQP is rdma_create_qp: librdmacm creates the QP and moves it; the
// returned QP's Destroy is rdma_destroy_qp's.
func (i *ID) CreateQP(pd *ibv.PD, scq, rcq *ibv.CQ, qpType int, cp ibv.QPCap, signalAll bool) (*ibv.QP, error) {
	sig := C.int(0)
	if signalAll {
		sig = 1
	}
	i.ch.qps.Lock()
	defer i.ch.qps.Unlock()
	rc, err := C.rdmago_create_qp(i.id, (*C.struct_ibv_pd)(pd.Pointer()), (*C.struct_ibv_cq)(scq.Pointer()),
		(*C.struct_ibv_cq)(rcq.Pointer()), C.int(qpType), C.uint32_t(cp.MaxSendWR), C.uint32_t(cp.MaxRecvWR),
		C.uint32_t(cp.MaxSendSGE), C.uint32_t(cp.MaxRecvSGE), C.uint32_t(cp.MaxInlineData), sig)
	if rc != 0 {
		return nil, errnoOf(err)
	}
	id, ch, qp := i.id, i.ch, i.id.qp
	return ibv.AdoptQP(unsafe.Pointer(qp), func() error {
		// rdma_destroy_qp in two steps (the CQs are the caller's, so it
		// has none of its own to destroy): the QP leaves its id under the
		// channel's lock, as an event being read may move it, and is
		// destroyed outside it. On iWARP the destroy of a QP whose
		// connect is still pending waits for the MPA exchange to end
		// (about 10 s on siw): under the channel's lock, every id's events
		// waited with it. The id's own qpMu is held throughout.
		i.qpMu.Lock()
		defer i.qpMu.Unlock()
		left := false
		if !i.gone {
			ch.qps.Lock()
			if left = id.qp == qp; left {
				id.qp = nil
			}
			ch.qps.Unlock()
		}
		if rc := C.ibv_destroy_qp(qp); rc != 0 {
			// Still there (EBUSY: attached to a multicast group, or
			// another command on it): back into its id, which a leave or
			// the id's end needs, for a later try.
			if left {
				ch.qps.Lock()
				if id.qp == nil {
					id.qp = qp
				}
				ch.qps.Unlock()
			}
			return syscall.Errno(rc)
		}
		return nil
	}), nil
}

// JoinMulticast is rdma_join_multicast.
func (i *ID) JoinMulticast(group netip.Addr, scope uint32) error {
	var ss C.struct_sockaddr_storage
	toSockaddr(SockAddr{AP: netip.AddrPortFrom(group, 0), Scope: scope}, &ss)
	if rc, err := C.rdma_join_multicast(i.id, (*C.struct_sockaddr)(unsafe.Pointer(&ss)), nil); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

// LeaveMulticast is rdma_leave_multicast, under the channel's qps too:
// librdmacm attaches the QP to a group while the JOIN event is read
// (ucma_process_join), so a leave between the kernel's event and that
// read would detach nothing (the group's GID is not known yet) and the
// attach would follow it, leaving a QP that cannot be destroyed. Holding
// qps, the leave comes before the event is read (the kernel then drops
// it) or after it was processed. librdmacm's wait for the group's events
// to be acked cannot block on it: GetEvents acks under the same lock.
func (i *ID) LeaveMulticast(group netip.Addr, scope uint32) error {
	var ss C.struct_sockaddr_storage
	toSockaddr(SockAddr{AP: netip.AddrPortFrom(group, 0), Scope: scope}, &ss)
	i.qpMu.Lock()
	defer i.qpMu.Unlock()
	i.ch.qps.Lock()
	defer i.ch.qps.Unlock()
	if rc, err := C.rdma_leave_multicast(i.id, (*C.struct_sockaddr)(unsafe.Pointer(&ss))); rc != 0 {
		return errnoOf(err)
	}
	return nil
}
