//go:build linux && cgo

package rdmacm

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include <errno.h>
#include <string.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>

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
		out->pdata_len = n;
		memcpy(out->pdata, pd, n);
	}
	rdma_ack_cm_event(ev);
	return 0;
}

// An id's context is the token that routes its events; librdmacm never
// dereferences it.
static int rdmago_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id, uint64_t token,
		enum rdma_port_space ps) {
	return rdma_create_id(ch, id, (void *)(uintptr_t)token, ps);
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

static int rdmago_connect(struct rdma_cm_id *id, int accept, const void *pd, int pdlen, uint8_t rr, uint8_t depth,
		uint8_t retry, uint8_t rnr, uint32_t qpn) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof(p));
	p.private_data = pdlen ? pd : NULL;
	p.private_data_len = pdlen;
	p.responder_resources = rr;
	p.initiator_depth = depth;
	p.retry_count = retry;
	p.rnr_retry_count = rnr;
	p.qp_num = qpn;
	return accept ? rdma_accept(id, &p) : rdma_connect(id, &p);
}

static int rdmago_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
		int type, uint32_t swr, uint32_t rwr, uint32_t ssge, uint32_t rsge, uint32_t inl) {
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
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/rdmago/rdmago/internal/fdwait"
	"github.com/rdmago/rdmago/verbs"
)

// event is one CM event as the library delivers it.
type event struct {
	Type        EventType
	Status      int
	PrivateData []byte
	Param       ConnParam
	// UD (PS_UDP) events: the peer's QP number and qkey, and the address
	// vector to reach it.
	UD    bool
	QKey  uint32
	AH    verbs.AHAttr
	child *cmID // CONNECT_REQUEST: the new id
}

// cmID is an rdma_cm_id. Every id of the process shares one event channel,
// as C programs do (see channel); the channel's dispatcher queues each
// event on its id, or hands it to the id's handler once the connection is
// up. Queues are per id, so a slow consumer holds up no other connection.
type cmID struct {
	id    *C.struct_rdma_cm_id
	token uint64 // the id's context: how the dispatcher finds it
	ps    PortSpace

	mu      sync.Mutex
	queue   []*event
	handler func(*event)
	notify  chan struct{} // one token when queue grows
	closed  chan struct{} // closed by close
}

func errnoOf(err error) error {
	var en syscall.Errno
	if errors.As(err, &en) && en != 0 {
		return en
	}
	return syscall.EIO
}

// channel is the process's rdma_cm event channel and its dispatcher: one
// goroutine, waiting in Go's runtime poller, that copies and acks each
// event and routes it by the id's context token. Creating an id is then
// one rdma_create_id, as in C, not a channel, a descriptor, a poller
// registration and a goroutine of its own.
type channel struct {
	ch *C.struct_rdma_event_channel
	w  *fdwait.Waiter

	mu   sync.Mutex
	ids  map[uint64]*cmID
	next uint64
}

var shared struct {
	mu sync.Mutex
	c  *channel
}

// Init opens librdmacm and the process's CM event channel, which Dial,
// Listen and JoinMulticast otherwise do on first use. On the first call
// librdmacm opens every RDMA device and reads its attributes, which takes
// milliseconds (more on a slow or emulated CPU): a program that times its
// first connection, or wants to learn at start-up that rdma_cm is missing,
// calls Init first. Calling it again does nothing; after a failure it
// tries again.
func Init() error {
	_, err := sharedChannel()
	return err
}

// OpenDevice returns librdmacm's context for the named RDMA device: the one
// the QPs of its connections are created on, so that a PD allocated on it
// can be Options.PD. The first call has librdmacm open every device on the
// host (a descriptor or two each), which it keeps for the life of the
// process; Close on the Device does nothing.
func OpenDevice(name string) (*verbs.Device, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	var n C.int
	list, err := C.rdma_get_devices(&n)
	if list == nil {
		return nil, &OpError{Op: "rdma_get_devices", Device: name, Err: errnoOf(err)}
	}
	defer C.rdma_free_devices(list)
	var names []string
	for _, ctx := range unsafe.Slice(list, int(n)) {
		got := C.GoString(C.ibv_get_device_name(ctx.device))
		if got == name {
			return verbs.BorrowContext(unsafe.Pointer(ctx))
		}
		names = append(names, got)
	}
	return nil, &OpError{Op: "open device", Device: name, Err: syscall.ENODEV,
		Hint: fmt.Sprintf("librdmacm has %d device(s): %s", len(names), strings.Join(names, ", "))}
}

func sharedChannel() (*channel, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		return shared.c, nil
	}
	ch, err := C.rdma_create_event_channel()
	if ch == nil {
		return nil, fmt.Errorf("rdma_create_event_channel: %w (is /dev/infiniband/rdma_cm there, and is rdma_ucm loaded?)", errnoOf(err))
	}
	w, err := fdwait.New(int(ch.fd), "rdma_cm event channel")
	if err != nil {
		C.rdma_destroy_event_channel(ch)
		return nil, err
	}
	shared.c = &channel{ch: ch, w: w, ids: map[uint64]*cmID{}}
	go shared.c.dispatch()
	return shared.c, nil
}

// add registers a new id under a fresh token.
func (ch *channel) add(ps PortSpace) *cmID {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.next++
	c := &cmID{token: ch.next, ps: ps, notify: make(chan struct{}, 1), closed: make(chan struct{})}
	ch.ids[c.token] = c
	return c
}

func (ch *channel) remove(c *cmID) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	delete(ch.ids, c.token)
}

func (ch *channel) lookup(token uint64) *cmID {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.ids[token]
}

// newID creates an id on the shared channel.
func newID(ps PortSpace) (*cmID, error) {
	ch, err := sharedChannel()
	if err != nil {
		return nil, err
	}
	c := ch.add(ps)
	var id *C.struct_rdma_cm_id
	if rc, err := C.rdmago_create_id(ch.ch, &id, C.uint64_t(c.token), C.enum_rdma_port_space(ps)); rc != 0 {
		ch.remove(c)
		return nil, fmt.Errorf("rdma_create_id %v: %w", ps, errnoOf(err))
	}
	c.id = id
	return c, nil
}

// dispatch runs for the life of the process: the channel is never closed,
// like librdmacm's own per-process state.
func (ch *channel) dispatch() {
	ce := (*C.struct_rdmago_event)(C.calloc(1, C.sizeof_struct_rdmago_event))
	defer C.free(unsafe.Pointer(ce))
	for {
		if err := ch.w.Wait(context.Background(), func() bool { return C.rdmago_get_event(ch.ch, ce) == 0 }); err != nil {
			return // only if the poller fails
		}
		ev := &event{Type: EventType(ce._type), Status: int(ce.status), UD: ce.ud != 0}
		if n := int(ce.pdata_len); n > 0 {
			ev.PrivateData = C.GoBytes(unsafe.Pointer(&ce.pdata[0]), C.int(n))
		}
		ev.Param = ConnParam{ResponderResources: uint8(ce.responder_resources), InitiatorDepth: uint8(ce.initiator_depth),
			FlowControl: ce.flow_control != 0, RetryCount: uint8(ce.retry_count), RNRRetryCount: uint8(ce.rnr_retry_count),
			SRQ: ce.srq != 0, QPNum: uint32(ce.qp_num)}
		if ev.UD {
			ev.QKey = uint32(ce.qkey)
			ev.AH = verbs.AHAttrFromC(unsafe.Pointer(&ce.ah_attr))
		}
		c := ch.lookup(uint64(ce.token))
		if ev.Type == EventConnectRequest {
			// The request's id is new: it inherited the listener's token
			// and port space (a request whose listener is gone is refused).
			ps := PortSpaceTCP
			if c != nil {
				ps = c.ps
			}
			child := ch.add(ps)
			child.id = ce.id
			C.rdmago_set_token(ce.id, C.uint64_t(child.token))
			ev.child = child
		}
		if c == nil {
			// The id was closed after the event was read.
			ev.dropLater()
			continue
		}
		c.deliver(ev)
	}
}

// dropped releases what an event that no one will see holds: a connect
// request's new id is refused and destroyed.
func (ev *event) dropped() {
	if ev.child != nil {
		ev.child.reject(nil)
		ev.child.close()
	}
}

// dropLater is dropped for the dispatcher, which must never wait:
// destroying an iWARP id can wait on the peer, so a refusal runs on a
// goroutine of its own.
func (ev *event) dropLater() {
	if ev.child != nil {
		go ev.dropped()
	}
}

// deliver hands ev to the handler, or queues it. The handler runs under
// c.mu, which keeps events in order; it must not block.
func (c *cmID) deliver(ev *event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.closed:
		ev.dropLater()
		return
	default:
	}
	if c.handler != nil {
		c.handler(ev)
		return
	}
	c.queue = append(c.queue, ev)
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// setHandler routes this id's events to h from now on, queued ones first.
func (c *cmID) setHandler(h func(*event)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handler = h
	for _, ev := range c.queue {
		h(ev)
	}
	c.queue = nil
}

// poll returns a queued event, or nil.
func (c *cmID) poll() *event {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		return nil
	}
	ev := c.queue[0]
	c.queue = c.queue[1:]
	return ev
}

// next waits for the next queued event.
func (c *cmID) next(ctx context.Context) (*event, error) {
	for {
		if ev := c.poll(); ev != nil {
			return ev, nil
		}
		select {
		case <-c.notify:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.closed:
			return nil, ErrClosed
		}
	}
}

// close destroys the id. Every event read was acked at once, so
// rdma_destroy_id cannot wait on us; events still queued in the kernel are
// dropped with the id, and queued connect requests' ids are refused and
// destroyed. The QP, if the CM made one, must be gone.
func (c *cmID) close() {
	c.mu.Lock()
	select {
	case <-c.closed:
		c.mu.Unlock()
		return
	default:
	}
	close(c.closed)
	queued := c.queue
	c.queue = nil
	c.mu.Unlock()
	shared.c.remove(c)
	C.rdma_destroy_id(c.id)
	for _, ev := range queued {
		ev.dropped()
	}
}

func toSockaddr(ap netip.AddrPort, ss *C.struct_sockaddr_storage) error {
	a := ap.Addr()
	if !a.IsValid() {
		return errors.New("no address")
	}
	var scope uint32
	if z := a.Zone(); z != "" {
		idx, err := zoneIndex(z)
		if err != nil {
			return err
		}
		scope = idx
	}
	if a.Is4() || a.Is4In6() {
		b := a.Unmap().As4()
		C.rdmago_sockaddr(ss, 0, (*C.uint8_t)(&b[0]), C.uint16_t(ap.Port()), 0)
		return nil
	}
	b := a.As16()
	C.rdmago_sockaddr(ss, 1, (*C.uint8_t)(&b[0]), C.uint16_t(ap.Port()), C.uint32_t(scope))
	return nil
}

func fromSockaddr(sa *C.struct_sockaddr) netip.AddrPort {
	if sa == nil {
		return netip.AddrPort{}
	}
	var ip [16]byte
	var port C.uint16_t
	var scope C.uint32_t
	switch C.rdmago_addr(sa, (*C.uint8_t)(&ip[0]), &port, &scope) {
	case 4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[:4])), uint16(port))
	case 16:
		a := netip.AddrFrom16(ip)
		if scope != 0 {
			a = a.WithZone(zoneName(uint32(scope)))
		}
		return netip.AddrPortFrom(a, uint16(port))
	}
	return netip.AddrPort{}
}

func (c *cmID) localAddr() netip.AddrPort { return fromSockaddr(C.rdmago_local(c.id)) }
func (c *cmID) peerAddr() netip.AddrPort  { return fromSockaddr(C.rdmago_peer(c.id)) }

// deviceName is the RDMA device the id is bound to, once it is.
func (c *cmID) deviceName() string {
	if c.id.verbs == nil {
		return ""
	}
	return C.GoString(C.ibv_get_device_name(c.id.verbs.device))
}

func (c *cmID) portNum() int { return int(c.id.port_num) }

// device wraps the id's verbs context, which librdmacm owns.
func (c *cmID) device() (*verbs.Device, error) {
	if c.id.verbs == nil {
		return nil, errors.New("the id is bound to no RDMA device yet")
	}
	return verbs.BorrowContext(unsafe.Pointer(c.id.verbs))
}

func (c *cmID) setOption(name int, v []byte) error {
	if rc, err := C.rdma_set_option(c.id, C.RDMA_OPTION_ID, C.int(name), unsafe.Pointer(&v[0]), C.size_t(len(v))); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

const (
	optTOS        = C.RDMA_OPTION_ID_TOS
	optReuseAddr  = C.RDMA_OPTION_ID_REUSEADDR
	optAFOnly     = C.RDMA_OPTION_ID_AFONLY
	optACKTimeout = C.RDMA_OPTION_ID_ACK_TIMEOUT
)

func (c *cmID) bind(ap netip.AddrPort) error {
	var ss C.struct_sockaddr_storage
	if err := toSockaddr(ap, &ss); err != nil {
		return err
	}
	if rc, err := C.rdma_bind_addr(c.id, (*C.struct_sockaddr)(unsafe.Pointer(&ss))); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

func (c *cmID) resolveAddr(src netip.Addr, dst netip.AddrPort, timeout time.Duration) error {
	var s, d C.struct_sockaddr_storage
	var sp *C.struct_sockaddr
	if src.IsValid() {
		if err := toSockaddr(netip.AddrPortFrom(src, 0), &s); err != nil {
			return err
		}
		sp = (*C.struct_sockaddr)(unsafe.Pointer(&s))
	}
	if err := toSockaddr(dst, &d); err != nil {
		return err
	}
	if rc, err := C.rdma_resolve_addr(c.id, sp, (*C.struct_sockaddr)(unsafe.Pointer(&d)), C.int(timeout.Milliseconds())); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

func (c *cmID) resolveRoute(timeout time.Duration) error {
	if rc, err := C.rdma_resolve_route(c.id, C.int(timeout.Milliseconds())); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

func (c *cmID) listen(backlog int) error {
	if rc, err := C.rdma_listen(c.id, C.int(backlog)); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

func (c *cmID) connectOrAccept(accept bool, p ConnParam, data []byte) error {
	var dp unsafe.Pointer
	if len(data) > 0 {
		dp = unsafe.Pointer(&data[0])
	}
	a := C.int(0)
	if accept {
		a = 1
	}
	if rc, err := C.rdmago_connect(c.id, a, dp, C.int(len(data)), C.uint8_t(p.ResponderResources),
		C.uint8_t(p.InitiatorDepth), C.uint8_t(p.RetryCount), C.uint8_t(p.RNRRetryCount), C.uint32_t(p.QPNum)); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

func (c *cmID) reject(data []byte) error {
	var dp unsafe.Pointer
	if len(data) > 0 {
		dp = unsafe.Pointer(&data[0])
	}
	if rc, err := C.rdma_reject(c.id, dp, C.uint8_t(len(data))); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

func (c *cmID) disconnect() error {
	if rc, err := C.rdma_disconnect(c.id); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

func (c *cmID) establish() error {
	if rc, err := C.rdma_establish(c.id); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

// initQPAttr asks the CM for the attributes of the transition to state.
func (c *cmID) initQPAttr(state verbs.QPState) (verbs.QPAttr, verbs.AttrMask, error) {
	var a C.struct_ibv_qp_attr
	var mask C.int
	if rc, err := C.rdmago_init_qp_attr(c.id, C.int(state), &a, &mask); rc != 0 {
		return verbs.QPAttr{}, 0, errnoOf(err)
	}
	return verbs.QPAttrFromC(unsafe.Pointer(&a)), verbs.AttrMask(mask), nil
}

// createQP has librdmacm create the QP (rdma_create_qp), which it then
// moves itself; it is destroyed with rdma_destroy_qp.
func (c *cmID) createQP(pd *verbs.PD, scq, rcq *verbs.CQ, t verbs.QPType, cp verbs.QPCap) (*verbs.QP, error) {
	rc, err := C.rdmago_create_qp(c.id, (*C.struct_ibv_pd)(pd.CPointer()), (*C.struct_ibv_cq)(scq.CPointer()),
		(*C.struct_ibv_cq)(rcq.CPointer()), C.int(t), C.uint32_t(cp.MaxSendWR), C.uint32_t(cp.MaxRecvWR),
		C.uint32_t(cp.MaxSendSGE), C.uint32_t(cp.MaxRecvSGE), C.uint32_t(cp.MaxInlineData))
	if rc != 0 {
		return nil, errnoOf(err)
	}
	id := c.id
	return verbs.AdoptQP(pd, unsafe.Pointer(id.qp), t, func() { C.rdma_destroy_qp(id) }), nil
}

func (c *cmID) joinMulticast(group netip.Addr) error {
	var ss C.struct_sockaddr_storage
	if err := toSockaddr(netip.AddrPortFrom(group, 0), &ss); err != nil {
		return err
	}
	if rc, err := C.rdma_join_multicast(c.id, (*C.struct_sockaddr)(unsafe.Pointer(&ss)), nil); rc != 0 {
		return errnoOf(err)
	}
	return nil
}

func (c *cmID) leaveMulticast(group netip.Addr) error {
	var ss C.struct_sockaddr_storage
	if err := toSockaddr(netip.AddrPortFrom(group, 0), &ss); err != nil {
		return err
	}
	if rc, err := C.rdma_leave_multicast(c.id, (*C.struct_sockaddr)(unsafe.Pointer(&ss))); rc != 0 {
		return errnoOf(err)
	}
	return nil
}
