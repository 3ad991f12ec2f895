package rdmacm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmago/rdmago/internal/cma"
	"github.com/rdmago/rdmago/internal/ibv"
	"github.com/rdmago/rdmago/internal/vbridge"
	"github.com/rdmago/rdmago/verbs"
)

// ID is an rdma_cm_id: the thin layer, one method per librdmacm call, for
// programs that drive the CM step by step themselves (many connections set
// up in bulk, as rdma-core's cmtime does; a protocol of their own on top of
// the CM). [Dial], [Listen] and the connection types are built on it.
//
// The calls that ask the network (ResolveAddr, ResolveRoute, Connect,
// Accept, Disconnect, JoinMulticast) return once the request is out; the
// answer comes as an [Event]. Every ID of the process shares one event
// channel, as C programs do, but each has a queue of its own: Event waits
// for this ID's next event in Go's runtime poller, parking no OS thread,
// and a slow reader holds up no other ID. Events are acknowledged to
// librdmacm as they are read from the channel, so Close never waits on an
// unread event. (So there is nothing for rdma_migrate_id to do: an ID's
// events are already its own.)
//
// Private data passes through as it is: rdmago's private-data header is
// the convenient layer's. An ID is safe for use by several goroutines, but
// its events go to whichever calls Event first.
type ID struct {
	h     cmHandle
	raw   cma.ID // h's storage for an id of rdma_create_id (not a request's)
	ch    *channel
	token uint64 // the id's context: how the dispatcher finds it
	ps    PortSpace

	mu      sync.Mutex
	queue   []*Event
	handler func(*Event) // set by the convenient layer once it owns the id
	// wake is made by the first wait in next, not with the id (most ids of
	// a program that sets a handler never wait there): a token when queue
	// grows, and closed by destroy.
	wake chan struct{}
	// toldFailure: the handler has had eventChannelFailed (once each).
	toldFailure bool
	// backlog is Listen's (at most 65535, in what was padding): connect
	// requests beyond it, queued for no handler, are refused (deliver).
	backlog uint16
	// closed is set by destroy (under mu); enter reads it without.
	closed atomic.Bool

	// life is held for reading by every call into the C id and for
	// writing by destroy, so that Close never frees the id under a call
	// on another goroutine. A reader never waits for mu while holding it:
	// handlers run under mu and call methods.
	life sync.RWMutex
	qpMu sync.Mutex
	qp   *verbs.QP // made by CreateQP: destroyed with the id at the latest
	// joined are the groups JoinMulticast joined and LeaveMulticast has not
	// left (under qpMu): Close leaves them, as a QP still attached to one
	// cannot be destroyed.
	joined []netip.Addr
}

// Event is one CM event (struct rdma_cm_event), copied out of librdmacm.
type Event struct {
	Type EventType
	// Status is the event's status: a negative errno, or for REJECTED the
	// IB CM's reject reason (28: the peer's application rejected).
	Status int
	// PrivateData is what the peer sent with its connect request, accept or
	// reject. On InfiniBand and RoCE it is padded to the CM message's size.
	PrivateData []byte
	// Param is what the peer asked for or granted (a UD peer's QP number is
	// Param.QPNum).
	Param ConnParam
	// UD is set for events of PortSpaceUDP ids; QKey and AH are then the
	// peer's qkey and the address vector to reach it.
	UD   bool
	QKey uint32
	AH   verbs.AHAttr
	// ID is a CONNECT_REQUEST's new id, on which to Accept or Reject: its
	// events come to it, not to the listening id. The caller owns it.
	ID *ID

	id  *ID   // the id it was delivered to
	err error // eventChannelFailed: why
}

// Err is nil for an event that is not a failure, and otherwise an
// *OpError that says where, with the event, its status and their usual
// meaning, matching the failure's kind: [ErrAddrResolution] (ADDR_ERROR),
// [ErrRouteResolution] (ROUTE_ERROR), [ErrUnreachable], [ErrRejected] (with a
// [*RejectedError] carrying the status and the private data as received),
// [ErrConnect] (CONNECT_ERROR, MULTICAST_ERROR), [ErrDeviceRemoved] or
// [ErrEventChannel].
func (e *Event) Err() error {
	var kind error
	switch e.Type {
	case EventAddrError:
		kind = ErrAddrResolution
	case EventRouteError:
		kind = ErrRouteResolution
	case EventUnreachable:
		kind = ErrUnreachable
		if e.UD && e.Status > 0 {
			kind = ErrRejected // a SIDR REP without a QP comes as UNREACHABLE
		}
	case EventRejected:
		kind = ErrRejected
	case EventConnectError, EventMulticastError:
		kind = ErrConnect
	case EventDeviceRemoval:
		kind = ErrDeviceRemoved
	case eventChannelFailed:
		return &OpError{Op: "get event", Err: e.err, thin: true} // e.err matches ErrEventChannel
	default:
		return nil
	}
	oe := &OpError{Op: "event", Kind: kind, Event: e.Type.String(), Status: e.Status, thin: true}
	iwarp := false
	if e.id != nil && e.id.enter("") == nil {
		defer e.id.leave()
		oe = e.id.fail("event", nil)
		oe.Kind, oe.Event, oe.Status = kind, e.Type.String(), e.Status
		t, bound := e.id.h.Transport()
		iwarp = bound && verbs.Transport(t) == verbs.TransportIWARP
	}
	oe.Hint = hintFor(e.Type, e.Status, iwarp)
	switch {
	case kind == ErrRejected:
		oe.Err = &RejectedError{Status: e.Status, PrivateData: e.PrivateData, ud: e.UD}
	case (e.Type == EventConnectError && !iwarp || e.Type == EventMulticastError) && e.Status == -1:
		// librdmacm makes these events itself with status -1, "see
		// errno", which an event cannot carry: not EPERM.
		if e.Type == EventConnectError {
			oe.Hint = connectErrorHint
		}
	case e.Status < 0:
		oe.Err = syscall.Errno(-e.Status)
	}
	return oe
}

// NewID creates an id in port space ps (rdma_create_id) on the process's
// event channel, which the first call opens (see Init).
func NewID(ps PortSpace) (*ID, error) {
	if ps != PortSpaceTCP && ps != PortSpaceUDP {
		// The private data limits, the QP types and the events this
		// package knows are those of these two.
		return nil, &OpError{Op: "new id", Err: fmt.Errorf("%w: port space %v: rdmacm takes RDMA_PS_TCP (connections) "+
			"and RDMA_PS_UDP (datagrams)", syscall.EINVAL, ps), thin: true}
	}
	id, err := newID(ps)
	if err != nil {
		return nil, &OpError{Op: "new id", Err: err, thin: true}
	}
	return id, nil
}

// fail describes a failed call on the id; the caller has entered.
func (c *ID) fail(op string, err error) *OpError {
	oe := &OpError{Op: op, Local: addrPortOf(c.h.LocalAddr()), Remote: addrPortOf(c.h.PeerAddr()), Device: c.h.DeviceName(),
		Port: c.h.PortNum(), Err: err, thin: true}
	if oe.Device == "" {
		oe.Port = 0
	}
	return oe
}

// enter admits a call into the C id, unless the id is closed: the caller
// then defers leave. Calls do not nest: those that need another's result
// use the unexported accessors.
func (c *ID) enter(op string) error {
	c.life.RLock()
	if c.closed.Load() {
		c.life.RUnlock()
		return &OpError{Op: op, Err: ErrClosed, thin: true}
	}
	return nil
}

func (c *ID) leave() { c.life.RUnlock() }

// needDevice is enter for the calls that need the id bound to a device:
// librdmacm would dereference the missing device (and crash the process)
// in rdma_resolve_route, rdma_connect and rdma_accept. On success the
// caller defers leave.
func (c *ID) needDevice(op, first string) error {
	if err := c.enter(op); err != nil {
		return err
	}
	if _, bound := c.h.Transport(); !bound {
		oe := c.fail(op, fmt.Errorf("%w: the id is bound to no RDMA device", syscall.EINVAL))
		oe.Hint = first
		c.leave()
		return oe
	}
	return nil
}

// Event waits for the id's next event until ctx ends. After the process's
// event channel failed it returns an error matching ErrEventChannel.
func (c *ID) Event(ctx context.Context) (*Event, error) {
	ev, err := c.next(ctx)
	if err == nil {
		return ev, nil
	}
	if c.enter("get event") != nil {
		return nil, &OpError{Op: "get event", Err: err, thin: true}
	}
	defer c.leave()
	return nil, c.fail("get event", err)
}

// Close destroys the id (rdma_destroy_id), and first the QP CreateQP made
// if it is still open: librdmacm destroys that QP through its id, so the
// QP's Close does nothing afterwards. Connect requests still queued for a
// listening id are rejected and their ids destroyed. Closing twice does
// nothing.
func (c *ID) Close() error {
	err := c.destroy()
	var oe *OpError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &oe):
		return oe // described before the id went
	}
	return c.fail("rdma_destroy_id", err)
}

// PortSpace is the id's port space.
func (c *ID) PortSpace() PortSpace { return c.ps }

func sockaddrOf(ap netip.AddrPort) (cma.SockAddr, error) {
	a := ap.Addr()
	if !a.IsValid() {
		return cma.SockAddr{}, fmt.Errorf("%w: no address", syscall.EINVAL)
	}
	var scope uint32
	if z := a.Zone(); z != "" {
		idx, err := zoneIndex(z)
		if err != nil {
			return cma.SockAddr{}, err
		}
		scope = idx
	}
	return cma.SockAddr{AP: netip.AddrPortFrom(a.WithZone(""), ap.Port()), Scope: scope}, nil
}

func addrPortOf(sa cma.SockAddr) netip.AddrPort {
	if sa.Scope != 0 && sa.AP.Addr().Is6() {
		return netip.AddrPortFrom(sa.AP.Addr().WithZone(zoneName(sa.Scope)), sa.AP.Port())
	}
	return sa.AP
}

// LocalAddr is the id's source address and port (rdma_get_local_addr),
// once bound or resolved.
func (c *ID) LocalAddr() netip.AddrPort {
	if c.enter("") != nil {
		return netip.AddrPort{}
	}
	defer c.leave()
	return addrPortOf(c.h.LocalAddr())
}

// RemoteAddr is the peer's address and port (rdma_get_peer_addr), once
// resolved or connected.
func (c *ID) RemoteAddr() netip.AddrPort {
	if c.enter("") != nil {
		return netip.AddrPort{}
	}
	defer c.leave()
	return addrPortOf(c.h.PeerAddr())
}

// DeviceName is the RDMA device the id is bound to, "" until it is.
func (c *ID) DeviceName() string {
	if c.enter("") != nil {
		return ""
	}
	defer c.leave()
	return c.h.DeviceName()
}

// Port is the device port the id is bound to, 0 until it is.
func (c *ID) Port() int {
	if c.enter("") != nil {
		return 0
	}
	defer c.leave()
	return c.h.PortNum()
}

// Device is librdmacm's context of the id's device, on which CreateQP
// makes QPs: allocate the PD and CQs for them on it. librdmacm owns the
// context: Close only retires this Device value (a new call gives another).
func (c *ID) Device() (*verbs.Device, error) {
	if err := c.enter("device"); err != nil {
		return nil, err
	}
	defer c.leave()
	ctx := c.h.Context()
	if ctx == nil {
		return nil, c.fail("device", errors.New("the id is bound to no RDMA device yet: resolve an address or bind one first"))
	}
	return vbridge.Device(ctx).(*verbs.Device), nil
}

// Option is an id option of rdma_set_option (level RDMA_OPTION_ID).
type Option int

// The id options of SetOption.
const (
	// OptionTOS is the IP type of service (a byte).
	OptionTOS Option = cma.OptTOS
	// OptionReuseAddr (0 or 1) lets ids bind to a port in use by ids that
	// also set it.
	OptionReuseAddr Option = cma.OptReuseAddr
	// OptionAFOnly (0 or 1) keeps an IPv6 listener from taking IPv4.
	OptionAFOnly Option = cma.OptAFOnly
	// OptionACKTimeout is the QP's ACK timeout code (verbs.ACKTimeout).
	OptionACKTimeout Option = cma.OptACKTimeout
)

func (o Option) String() string {
	switch o {
	case OptionTOS:
		return "RDMA_OPTION_ID_TOS"
	case OptionReuseAddr:
		return "RDMA_OPTION_ID_REUSEADDR"
	case OptionAFOnly:
		return "RDMA_OPTION_ID_AFONLY"
	case OptionACKTimeout:
		return "RDMA_OPTION_ID_ACK_TIMEOUT"
	}
	return fmt.Sprintf("Option(%d)", int(o))
}

// SetOption sets an id option (rdma_set_option); address options must be
// set before the id binds or resolves.
func (c *ID) SetOption(opt Option, value int) error {
	op := "set " + opt.String()
	if err := c.enter(op); err != nil {
		return err
	}
	defer c.leave()
	var v []byte
	switch opt {
	case OptionTOS, OptionACKTimeout:
		if value < 0 || value > 255 || (opt == OptionACKTimeout && value > 31) {
			return c.fail(op, fmt.Errorf("%w: value %d out of range", syscall.EINVAL, value))
		}
		v = []byte{byte(value)}
	case OptionReuseAddr, OptionAFOnly:
		if value != 0 && value != 1 {
			return c.fail(op, fmt.Errorf("%w: value %d, want 0 or 1", syscall.EINVAL, value))
		}
		v = binary.NativeEndian.AppendUint32(nil, uint32(value))
	default:
		return c.fail(op, fmt.Errorf("%w: unknown option", syscall.EINVAL))
	}
	if err := c.h.SetOption(int(opt), v); err != nil {
		return c.fail(op, err)
	}
	return nil
}

// Bind binds the id to a local address and port (rdma_bind_addr); port 0
// picks one. An unspecified address binds to no device until a request
// arrives or an address resolves.
func (c *ID) Bind(addr netip.AddrPort) error {
	if err := c.enter("rdma_bind_addr"); err != nil {
		return err
	}
	defer c.leave()
	sa, err := sockaddrOf(addr)
	if err == nil {
		err = c.h.Bind(sa)
	}
	if err != nil {
		oe := c.fail("rdma_bind_addr", err)
		oe.Local = addr
		return oe
	}
	return nil
}

// ResolveAddr asks for the route to dst and the device and port it leaves
// by (rdma_resolve_addr), from src unless it is the zero Addr. An
// ADDR_RESOLVED or ADDR_ERROR event answers within timeout.
func (c *ID) ResolveAddr(src netip.Addr, dst netip.AddrPort, timeout time.Duration) error {
	if err := c.enter("rdma_resolve_addr"); err != nil {
		return err
	}
	defer c.leave()
	ms, err := timeoutMS(timeout)
	if err != nil {
		oe := c.fail("rdma_resolve_addr", err)
		oe.Remote = dst
		return oe
	}
	var s cma.SockAddr
	if src.IsValid() {
		s, err = sockaddrOf(netip.AddrPortFrom(src, 0))
	}
	var d cma.SockAddr
	if err == nil {
		d, err = sockaddrOf(dst)
	}
	if err == nil {
		err = c.h.ResolveAddr(s, d, ms)
	}
	if err != nil {
		oe := c.fail("rdma_resolve_addr", err)
		oe.Remote = dst
		return oe
	}
	return nil
}

// ResolveRoute resolves the path to the resolved address
// (rdma_resolve_route); ROUTE_RESOLVED or ROUTE_ERROR answers within
// timeout.
func (c *ID) ResolveRoute(timeout time.Duration) error {
	if err := c.needDevice("rdma_resolve_route", "resolve the address first (ResolveAddr, then its ADDR_RESOLVED)"); err != nil {
		return err
	}
	defer c.leave()
	ms, err := timeoutMS(timeout)
	if err == nil {
		err = c.h.ResolveRoute(ms)
	}
	if err != nil {
		return c.fail("rdma_resolve_route", err)
	}
	return nil
}

// timeoutMS is a resolve call's timeout as librdmacm takes it:
// milliseconds in a C int, rounded up: a timeout under a millisecond is
// not zero, which the kernel takes as no time to wait at all.
func timeoutMS(timeout time.Duration) (int, error) {
	if timeout < 0 || timeout > maxCMTimeout {
		return 0, fmt.Errorf("%w: timeout %v outside 0..%v (milliseconds in a C int)", syscall.EINVAL, timeout, maxCMTimeout)
	}
	return int((timeout + time.Millisecond - 1) / time.Millisecond), nil
}

// Listen listens for connect requests on the bound address (rdma_listen);
// each comes as a CONNECT_REQUEST event whose ID is the request's own id.
// The kernel caps backlog at rdma_ucm's max_backlog, and takes zero for
// that maximum. As in C, backlog bounds the requests not yet taken: one
// that arrives while backlog of them wait for Event is rejected at once.
func (c *ID) Listen(backlog int) error {
	if err := c.enter("rdma_listen"); err != nil {
		return err
	}
	defer c.leave()
	if backlog < 0 || backlog > math.MaxInt32 {
		return c.fail("rdma_listen", fmt.Errorf("%w: backlog %d outside 0..%d", syscall.EINVAL, backlog, math.MaxInt32))
	}
	if err := c.h.Listen(backlog); err != nil {
		return c.fail("rdma_listen", err)
	}
	// The kernel's backlog counts the requests not yet read from the
	// event channel, and the dispatcher reads every event at once: the
	// same bound is kept here on the requests not yet taken with Event.
	n := kernelMaxBacklog()
	if backlog > 0 && backlog < n {
		n = backlog
	}
	c.mu.Lock()
	c.backlog = uint16(min(n, math.MaxUint16))
	c.mu.Unlock()
	return nil
}

// kernelMaxBacklog is rdma_ucm's max_backlog (the kernel's default if it cannot
// be read): the largest backlog the kernel keeps, and what it takes zero for.
func kernelMaxBacklog() int {
	b, err := os.ReadFile("/proc/sys/net/rdma_ucm/max_backlog")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			return n
		}
	}
	return 1024
}

// Connect sends a connect request (rdma_connect) with p and privateData;
// CONNECT_RESPONSE (a QP of the caller's own, which it must then move to
// RTS and Establish), ESTABLISHED, REJECTED, UNREACHABLE or CONNECT_ERROR
// answers. On a UD id this is a SIDR request, answered by ESTABLISHED with
// the peer's QP number, qkey and address vector.
func (c *ID) Connect(p ConnParam, privateData []byte) error {
	if err := c.checkData("rdma_connect", msgConnect, privateData); err != nil {
		return err
	}
	return c.connectOrAccept(false, p, privateData)
}

// checkData refuses private data the message cannot carry on the id's
// transport (see MaxConnectDataTCP and the others) with a
// *PrivateDataError: more is refused by the kernel with a bare EINVAL on
// InfiniBand and RoCE, and on iWARP lost at the peer.
func (c *ID) checkData(op string, k messageKind, data []byte) error {
	if err := c.enter(op); err != nil {
		return err
	}
	defer c.leave()
	cm := cmUnknown
	if t, bound := c.h.Transport(); bound {
		cm = cmKindOf(verbs.Transport(t))
	}
	if pe := checkPrivateData(cm, c.ps, k, true, data); pe != nil {
		return c.fail(op, pe)
	}
	return nil
}

// Accept accepts the connect request this id was made for (rdma_accept);
// ESTABLISHED follows on PortSpaceTCP (on PortSpaceUDP nothing does).
func (c *ID) Accept(p ConnParam, privateData []byte) error {
	if err := c.checkData("rdma_accept", msgAccept, privateData); err != nil {
		return err
	}
	return c.connectOrAccept(true, p, privateData)
}

func (c *ID) connectOrAccept(accept bool, p ConnParam, data []byte) error {
	op, first := "rdma_connect", "resolve the address and the route first"
	if accept {
		op, first = "rdma_accept", "accept on the id of a CONNECT_REQUEST event (Event.ID)"
	}
	if err := c.needDevice(op, first); err != nil {
		return err
	}
	defer c.leave()
	if err := c.h.Connect(accept, cma.ConnParam(p), data); err != nil {
		return c.fail(op, err)
	}
	return nil
}

// Reject refuses the connect request this id was made for (rdma_reject),
// sending privateData.
func (c *ID) Reject(privateData []byte) error {
	if err := c.checkData("rdma_reject", msgReject, privateData); err != nil {
		return err
	}
	return c.reject(privateData)
}

// reject is Reject for the convenient layer, which checked the data itself.
func (c *ID) reject(privateData []byte) error {
	if err := c.enter("rdma_reject"); err != nil {
		return err
	}
	defer c.leave()
	if err := c.h.Reject(privateData); err != nil {
		return c.fail("rdma_reject", err)
	}
	return nil
}

// Disconnect ends the connection (rdma_disconnect), which moves the QP that
// CreateQP made to ERR (SQD on iWARP); DISCONNECTED follows. Call it too when the peer's DISCONNECTED
// arrives: on InfiniBand and RoCE the peer waits for that answer (the
// DREP) and otherwise gets its DISCONNECTED only after a CM timeout.
func (c *ID) Disconnect() error {
	if err := c.enter("rdma_disconnect"); err != nil {
		return err
	}
	defer c.leave()
	if err := c.h.Disconnect(); err != nil {
		return c.fail("rdma_disconnect", err)
	}
	return nil
}

// Establish tells the CM that the dialer moved its own QP to RTS after
// CONNECT_RESPONSE (rdma_establish). InfiniBand and RoCE only.
func (c *ID) Establish() error {
	if err := c.enter("rdma_establish"); err != nil {
		return err
	}
	defer c.leave()
	if err := c.h.Establish(); err != nil {
		return c.fail("rdma_establish", err)
	}
	return nil
}

// InitQPAttr is what the CM would set to move a QP of this connection to
// state (rdma_init_qp_attr), for a QP the caller moves itself: pass both
// to verbs.QP.Modify, which checks them before the driver sees them.
func (c *ID) InitQPAttr(state verbs.QPState) (verbs.QPAttr, verbs.AttrMask, error) {
	if err := c.enter("rdma_init_qp_attr"); err != nil {
		return verbs.QPAttr{}, 0, err
	}
	defer c.leave()
	a, mask, err := c.h.InitQPAttr(int(state))
	if err != nil {
		oe := c.fail("rdma_init_qp_attr", err)
		oe.Hint = fmt.Sprintf("for %v the id must have its route (dialer) or be a request's id (listener)", state)
		return verbs.QPAttr{}, 0, oe
	}
	return vbridge.QPAttr(&a).(verbs.QPAttr), verbs.AttrMask(mask), nil
}

// CreateQP has librdmacm create the connection's QP on pd with init's CQs
// and capacities (rdma_create_qp); the CM then moves it through its states
// itself. pd and the CQs must be made on the id's Device. The QP is closed
// with the id at the latest.
func (c *ID) CreateQP(pd *verbs.PD, init verbs.QPInit) (*verbs.QP, error) {
	if err := c.needDevice("rdma_create_qp", "resolve the address first, or take a CONNECT_REQUEST's id"); err != nil {
		return nil, err
	}
	defer c.leave()
	if pd == nil || init.SendCQ == nil || init.RecvCQ == nil {
		return nil, c.fail("rdma_create_qp", fmt.Errorf("%w: a PD, a SendCQ and a RecvCQ are required", syscall.EINVAL))
	}
	if want := c.h.ContextKey(); contextKey(pd.Device()) != want || contextKey(init.SendCQ.Device()) != want ||
		contextKey(init.RecvCQ.Device()) != want {
		oe := c.fail("rdma_create_qp", fmt.Errorf("%w: the PD and the CQs must be made on the id's device context", syscall.EINVAL))
		oe.Hint = "allocate them on ID.Device(), librdmacm's context (a context from verbs.Open is another one)"
		return nil, oe
	}
	// The CQs count the QP among their users from here, so that neither
	// closes under it.
	cqs, s, r := vbridge.UseCQs(init.SendCQ, init.RecvCQ)
	var qp *ibv.QP
	// The PD's Close waits while the QP is made on it: a PD freed under
	// rdma_create_qp would be used after its free.
	err := vbridge.InPD(pd, func(p *ibv.PD) error {
		if p == nil || s == nil || r == nil {
			return fmt.Errorf("%w: the PD or a CQ is closed", syscall.EBADF)
		}
		var err error
		qp, err = c.h.CreateQP(p, s, r, int(init.Type), vbridge.QPCap(init.Cap), init.SignalAll)
		return err
	})
	if err != nil {
		vbridge.UnuseCQs(cqs)
		return nil, c.fail("rdma_create_qp", err)
	}
	q := vbridge.AdoptQP(pd, qp, int(init.Type), cqs).(*verbs.QP)
	c.qpMu.Lock()
	c.qp = q
	c.qpMu.Unlock()
	return q, nil
}

// JoinMulticast joins the id (PortSpaceUDP) to a multicast group
// (rdma_join_multicast); MULTICAST_JOIN or MULTICAST_ERROR answers. Close
// leaves the groups still joined.
func (c *ID) JoinMulticast(group netip.Addr) error {
	return c.multicast("rdma_join_multicast", group, c.h.JoinMulticast, func() {
		c.joined = append(c.joined, group)
	})
}

// LeaveMulticast leaves a group the id joined (rdma_leave_multicast).
func (c *ID) LeaveMulticast(group netip.Addr) error {
	return c.multicast("rdma_leave_multicast", group, c.h.LeaveMulticast, func() {
		if i := slices.Index(c.joined, group); i >= 0 {
			c.joined = slices.Delete(c.joined, i, i+1)
		}
	})
}

// multicast makes the call and, once it succeeded, track (under qpMu)
// while the id is still entered: a Close waits for both.
func (c *ID) multicast(op string, group netip.Addr, call func(netip.Addr, uint32) error, track func()) error {
	if err := c.enter(op); err != nil {
		return err
	}
	defer c.leave()
	sa, err := sockaddrOf(netip.AddrPortFrom(group, 0))
	if err == nil {
		err = call(sa.AP.Addr(), sa.Scope)
	}
	if err != nil {
		oe := c.fail(op, err)
		oe.Remote = netip.AddrPortFrom(group, 0)
		if _, bound := c.h.Transport(); !bound && errors.Is(err, syscall.EINVAL) {
			oe.Hint = "the id is bound to no RDMA device: resolve the group's address first (ResolveAddr), as the kernel CM needs the device"
		}
		return oe
	}
	c.qpMu.Lock()
	track()
	c.qpMu.Unlock()
	return nil
}
