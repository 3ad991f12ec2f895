package rdmacm

import (
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/rdmago/rdmago/verbs"
)

// Mode says who moves the QP through INIT, RTR and RTS.
type Mode int

const (
	// ModeCM (the default): librdmacm creates the QP and moves it, on the
	// peer's reply (active side) and in accept (passive side). Use it unless
	// you need to see or change the attributes.
	ModeCM Mode = iota
	// ModeManual: rdmago creates the QP with package verbs and moves it
	// itself with the attributes rdma_init_qp_attr gives, checked by
	// verbs.Validate, after ConnConfig.BeforeModify has seen them; the path MTU
	// is the smaller of both sides' active MTUs. InfiniBand and RoCE only:
	// on iWARP the CM and the provider must move the QP.
	ModeManual
)

func (m Mode) String() string {
	switch m {
	case ModeCM:
		return "CM-managed"
	case ModeManual:
		return "manual"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ConnConfig is what a Dialer and a ListenConfig share: how the QP is made
// and moved, and how long each step may take. Its zero value is ready to
// use: a QP with small queues, librdmacm moving it, 2 s per step.
//
// Zero means the default throughout. Counts whose zero is a real setting
// (retries, RDMA reads in flight) take a negative value for "none".
type ConnConfig struct {
	// Cap sizes the QP; zero fields take defaults (16 WRs, 1 SGE each way).
	Cap verbs.QPCap
	// CQEntries sizes each of the connection's own CQs; default MaxSendWR
	// and MaxRecvWR.
	CQEntries int
	// PD, if set, is the protection domain for the connection's QP and for
	// the memory RegisterMemory registers, instead of one of its own:
	// memory registered once in it serves every connection made with it.
	// Its keys are then valid on all of them, so a peer of one connection
	// can reach memory registered for another. It must be allocated on
	// librdmacm's context for the device the connection goes through (see
	// [OpenDevice]); a connection on another device fails with a hint. The
	// caller owns it: closing a connection leaves it, and the caller closes
	// it after the last connection and MR using it.
	PD *verbs.PD
	// SendCQ and RecvCQ, if set, are completion queues for the
	// connection's QP instead of two of its own: one CQ can serve many
	// connections, each completion naming its QP (WorkCompletion.QPN), and
	// the same CQ may be both. Size them for every work request that can
	// be outstanding on all the QPs together: an overrun CQ ends them all
	// (an async CQ error). Like PD they must be created on librdmacm's
	// context for the device (see [OpenDevice]), the caller owns them, and
	// closes them after the last connection using them. The connection's
	// Send, RDMAWrite, RDMARead, SendTo and Recv wait on its own CQs and
	// refuse to run on a shared one, whose completions may be another
	// connection's: poll it yourself.
	SendCQ *verbs.CQ
	RecvCQ *verbs.CQ

	// Mode says who moves the QP (default [ModeCM]).
	Mode Mode
	// BeforeModify ([ModeManual]) sees each transition's attributes before
	// the modify and may change them (timeout, retry counts, path MTU,
	// minimum RNR timer); what it leaves is still validated. An error
	// aborts the connection.
	BeforeModify func(t verbs.Transition, attr *verbs.QPAttr, mask *verbs.AttrMask) error

	// RetryCount and RNRRetryCount (3 bits; an RNR count of 7 retries
	// forever) default to 7, as most tools use; negative means none. The
	// CM applies them as the InfiniBand CM defines: both QPs take the
	// dialer's RetryCount, and each side's QP retries RNR as often as its
	// peer's RNRRetryCount says (the peer is the one that may be not
	// ready).
	RetryCount    int
	RNRRetryCount int
	// ResponderResources and InitiatorDepth bound RDMA reads and atomics in
	// flight; zero means the device's maximum, negative none (the passive
	// side also caps them at what the peer offered). A side whose QP
	// reports an initiator depth of 0 (rxe's and siw's, when this side's
	// InitiatorDepth is negative; rxe's also when the peer's
	// ResponderResources is) has its reads refused at the post
	// ([verbs.ErrNoInitiatorDepth]): the device would not send them.
	ResponderResources int
	InitiatorDepth     int

	// TOS sets RDMA_OPTION_ID_TOS (zero leaves the kernel's default).
	TOS uint8
	// ACKTimeout sets RDMA_OPTION_ID_ACK_TIMEOUT, the QP's local ACK
	// timeout code (zero leaves the CM's choice).
	ACKTimeout verbs.ACKTimeout

	// ConnectTimeout bounds the wait for the peer's reply (dialing) or its
	// RTU (accepting), and for a multicast join; CloseTimeout the wait for
	// DISCONNECTED after this side's disconnect. 2 s each by default. On
	// iWARP, where the connect call itself connects the TCP stream, a dial
	// gives ConnectTimeout to that call and again to the reply: up to
	// twice it in all.
	ConnectTimeout time.Duration
	CloseTimeout   time.Duration

	// RawPrivateData sends and receives private data without rdmago's
	// 4-byte header (see the package documentation), for peers that read
	// private data in a format of their own, such as rdma-core's tools. A
	// receiver then gets the field as it arrives: on InfiniBand and RoCE
	// padded with zeros to the message's size.
	RawPrivateData bool

	// BeforeConnect, if set, runs once the QP exists and before the
	// connect request (dialing) or the accept goes out. Register memory
	// and post receives there, so that the peer's first SEND finds one: on
	// iWARP a SEND that arrives before its receive ends the connection
	// (there is no RNR retry), and on RoCE it costs an RNR delay. An error
	// aborts the connection; memory registered here is released on every
	// path. The private data (Dialer.PrivateData, or what Accept was
	// given) is read after it returns, so it may write into that slice's
	// bytes, e.g. the key and address of memory it registered for the
	// peer. To keep what it makes for one accepted connection, see
	// [ConnRequest.AcceptWith]. A multicast join has no connect request
	// and does not run it: post its receives once JoinMulticast returns.
	BeforeConnect func(s Setup) error

	// Trace, if set, is called after each step of a dial, an accept and a
	// close completes, with when it started and how long it took: the
	// per-step view of rdma-core's cmtime. It runs on the caller's
	// goroutine.
	Trace func(s Step, start time.Time, d time.Duration)
}

// Setup is a connection before its connect request or accept goes out, as
// [ConnConfig.BeforeConnect] sees it: its QP exists, its memory can be
// registered and its receives posted.
type Setup interface {
	// QP is the connection's queue pair, for receives of your own.
	QP() *verbs.QP
	// RegisterMemory and PostRecv are those of the connection.
	RegisterMemory(size int, access verbs.AccessFlags) (*verbs.MR, error)
	PostRecv(mr *verbs.MR, off, n int) error
	// Route is the connection's route as far as it is known before the
	// connection is up: addresses, device and port, but no GID index or
	// MTU yet.
	Route() Route
}

// setup is what BeforeConnect gets: the connection being made, with only
// Setup's methods (not Close, which would free what the setup goes on
// to use).
type setup struct{ c *conn }

func (s setup) QP() *verbs.QP { return s.c.QP() }
func (s setup) RegisterMemory(size int, access verbs.AccessFlags) (*verbs.MR, error) {
	return s.c.RegisterMemory(size, access)
}
func (s setup) PostRecv(mr *verbs.MR, off, n int) error { return s.c.PostRecv(mr, off, n) }
func (s setup) Route() Route                            { return s.c.Route() }

// A Dialer connects to listeners (reliable connections with Dial, UD
// endpoints with DialUD) and joins multicast groups. Its zero value is
// ready to use.
type Dialer struct {
	ConnConfig

	// Source is the local address to connect from; zero lets the kernel
	// pick by route (as connect(2) does).
	Source netip.Addr
	// PrivateData is sent with the connect request. How much fits depends
	// on the transport (see the package documentation): with rdmago's
	// header, 52 bytes on InfiniBand and RoCE (56 on the wire) and 247 on
	// iWARP.
	PrivateData []byte

	// ResolveAddrTimeout and ResolveRouteTimeout bound address and route
	// resolution, 2 s each by default (at most about 24 days: librdmacm
	// takes milliseconds in a C int).
	ResolveAddrTimeout  time.Duration
	ResolveRouteTimeout time.Duration
	// ResolveRetries is how many times an ADDR_ERROR or ROUTE_ERROR other
	// than "no device" or "no route" is retried (default 2, negative none).
	ResolveRetries int
}

// A ListenConfig makes listeners. Its zero value is ready to use.
type ListenConfig struct {
	ConnConfig

	// PrivateData is sent with every accept that Listener.Accept makes
	// (ConnRequest.Accept takes its own). With rdmago's header, 192 bytes
	// fit on InfiniBand and RoCE and 247 on iWARP; 132 in a UD listener's
	// answer.
	PrivateData []byte
	// Backlog bounds connect requests waiting for Request or Accept
	// (default 128, at most 65536). A listener refuses the requests past it at once, and
	// the dialer's error matches [ErrBacklogFull].
	Backlog int
	// ReuseAddr sets RDMA_OPTION_ID_REUSEADDR; AFOnly RDMA_OPTION_ID_AFONLY
	// (an IPv6 listener then takes no IPv4 connections).
	ReuseAddr bool
	AFOnly    bool
}

// settings are a dial's, listen's or accept's configuration with every
// default filled in: what the steps read.
type settings struct {
	QPType             verbs.QPType
	Source             netip.Addr
	Cap                verbs.QPCap
	CQEntries          int
	PD                 *verbs.PD
	SendCQ, RecvCQ     *verbs.CQ
	Mode               Mode
	BeforeModify       func(t verbs.Transition, attr *verbs.QPAttr, mask *verbs.AttrMask) error
	RetryCount         uint8
	RNRRetryCount      uint8
	ResponderResources int // a cap on the device's maximum; -1: none
	InitiatorDepth     int
	TOS                uint8
	ACKTimeout         verbs.ACKTimeout
	ReuseAddr, AFOnly  bool

	ResolveAddrTimeout  time.Duration
	ResolveRouteTimeout time.Duration
	ConnectTimeout      time.Duration
	CloseTimeout        time.Duration
	ResolveRetries      int

	PrivateData    []byte
	RawPrivateData bool
	Backlog        int
	BeforeConnect  func(s Setup) error
	Trace          func(s Step, start time.Time, d time.Duration)
}

const (
	defaultStepTimeout = 2 * time.Second
	defaultRetries     = 2
	defaultWR          = 16
	defaultBacklog     = 128
	// maxBacklog bounds ListenConfig.Backlog: the listener's queue is
	// allocated whole, and the kernel caps its own at rdma_ucm's
	// max_backlog (1024 by default) anyway.
	maxBacklog = 1 << 16
	// maxCMTimeout is the longest timeout librdmacm's resolve calls take:
	// milliseconds in a C int.
	maxCMTimeout = math.MaxInt32 * time.Millisecond
	// udpQKey is the qkey the kernel CM gives every PS_UDP QP (RDMA_UDP_QKEY).
	udpQKey = 0x01234567
)

// settings fills in c's defaults for a QP of type t, and checks it.
func (c *ConnConfig) settings(t verbs.QPType) (settings, error) {
	s := settings{QPType: t, Cap: c.Cap, CQEntries: c.CQEntries, PD: c.PD, SendCQ: c.SendCQ, RecvCQ: c.RecvCQ,
		Mode: c.Mode, BeforeModify: c.BeforeModify, TOS: c.TOS, ACKTimeout: c.ACKTimeout,
		ConnectTimeout: c.ConnectTimeout, CloseTimeout: c.CloseTimeout, RawPrivateData: c.RawPrivateData,
		BeforeConnect: c.BeforeConnect, Trace: c.Trace, ResolveRetries: defaultRetries, Backlog: defaultBacklog}
	if s.Cap.MaxSendWR == 0 {
		s.Cap.MaxSendWR = defaultWR
	}
	if s.Cap.MaxRecvWR == 0 {
		s.Cap.MaxRecvWR = defaultWR
	}
	if s.Cap.MaxSendSGE == 0 {
		s.Cap.MaxSendSGE = 1
	}
	if s.Cap.MaxRecvSGE == 0 {
		s.Cap.MaxRecvSGE = 1
	}
	if s.Mode != ModeCM && s.Mode != ModeManual {
		return s, fmt.Errorf("unknown mode %v", s.Mode)
	}
	if c.CQEntries < 0 || c.CQEntries > math.MaxInt32 {
		return s, fmt.Errorf("CQEntries is %d, outside 1..%d; zero means the QP's capacity", c.CQEntries, math.MaxInt32)
	}
	var err error
	if s.RetryCount, err = retries("RetryCount", c.RetryCount); err != nil {
		return s, err
	}
	if s.RNRRetryCount, err = retries("RNRRetryCount", c.RNRRetryCount); err != nil {
		return s, err
	}
	if s.ResponderResources, err = rdAtomicCap("ResponderResources", c.ResponderResources); err != nil {
		return s, err
	}
	if s.InitiatorDepth, err = rdAtomicCap("InitiatorDepth", c.InitiatorDepth); err != nil {
		return s, err
	}
	if s.ACKTimeout > 31 {
		return s, fmt.Errorf("ACKTimeout is a 5-bit code (0..31), got %d", s.ACKTimeout)
	}
	for _, d := range []struct {
		name string
		d    *time.Duration
	}{{"ConnectTimeout", &s.ConnectTimeout}, {"CloseTimeout", &s.CloseTimeout}} {
		if err := stepTimeout(d.name, d.d); err != nil {
			return s, err
		}
	}
	return s, nil
}

// settings are the dialer's for a QP of type t.
func (d *Dialer) settings(t verbs.QPType) (settings, error) {
	if d == nil {
		d = &Dialer{}
	}
	s, err := d.ConnConfig.settings(t)
	if err != nil {
		return s, err
	}
	s.Source, s.PrivateData = d.Source, d.PrivateData
	s.ResolveAddrTimeout, s.ResolveRouteTimeout = d.ResolveAddrTimeout, d.ResolveRouteTimeout
	for _, d := range []struct {
		name string
		d    *time.Duration
	}{{"ResolveAddrTimeout", &s.ResolveAddrTimeout}, {"ResolveRouteTimeout", &s.ResolveRouteTimeout}} {
		if err := stepTimeout(d.name, d.d); err != nil {
			return s, err
		}
		// librdmacm takes these in milliseconds, in a C int.
		if *d.d > maxCMTimeout {
			return s, fmt.Errorf("%s is %v, more than the %v the CM takes", d.name, *d.d, maxCMTimeout)
		}
	}
	switch {
	case d.ResolveRetries > 0:
		s.ResolveRetries = d.ResolveRetries
	case d.ResolveRetries < 0:
		s.ResolveRetries = 0
	}
	return s, nil
}

// settings are the listen config's for a QP of type t.
func (lc *ListenConfig) settings(t verbs.QPType) (settings, error) {
	if lc == nil {
		lc = &ListenConfig{}
	}
	s, err := lc.ConnConfig.settings(t)
	if err != nil {
		return s, err
	}
	s.PrivateData, s.ReuseAddr, s.AFOnly = lc.PrivateData, lc.ReuseAddr, lc.AFOnly
	switch {
	case lc.Backlog > maxBacklog:
		// The queue behind the kernel's is allocated whole.
		return s, fmt.Errorf("ListenConfig.Backlog is %d, more than %d", lc.Backlog, maxBacklog)
	case lc.Backlog > 0:
		s.Backlog = lc.Backlog
	case lc.Backlog < 0:
		return s, fmt.Errorf("ListenConfig.Backlog is %d; zero means the default (%d)", lc.Backlog, defaultBacklog)
	}
	return s, nil
}

// retries is a 3-bit retry count: zero is 7, negative none.
func retries(name string, v int) (uint8, error) {
	switch {
	case v == 0:
		return 7, nil
	case v < 0:
		return 0, nil
	case v > 7:
		return 0, fmt.Errorf("%s is a 3-bit count (1..7; zero for the default 7, negative for none), got %d", name, v)
	}
	return uint8(v), nil
}

// rdAtomicCap is a cap on RDMA reads and atomics in flight: zero (-1 here)
// leaves the device's maximum, negative allows none.
func rdAtomicCap(name string, v int) (int, error) {
	switch {
	case v == 0:
		return -1, nil
	case v < 0:
		return 0, nil
	case v > 255:
		return 0, fmt.Errorf("%s is at most 255 (zero for the device's maximum, negative for none), got %d", name, v)
	}
	return v, nil
}

// stepTimeout fills in the default of a step's timeout.
func stepTimeout(name string, d *time.Duration) error {
	switch {
	case *d == 0:
		*d = defaultStepTimeout
	case *d < 0:
		return fmt.Errorf("%s is %v; zero means the default (%v)", name, *d, defaultStepTimeout)
	}
	return nil
}

func (s *settings) portSpace() PortSpace {
	if s.QPType == verbs.QPTypeUD {
		return PortSpaceUDP
	}
	return PortSpaceTCP
}

// parseAddr accepts "host:port" with a numeric host (IPv6 in brackets,
// with a zone for link-local addresses).
func parseAddr(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q: want a numeric host:port such as 10.0.0.1:7471 or [fe80::1%%eth0]:7471: %w", s, err)
	}
	return ap, nil
}

func addrPort(a netip.Addr) netip.AddrPort {
	if !a.IsValid() {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(a, 0)
}
