package rdmacm

import (
	"fmt"
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
	// verbs.Validate, after Options.BeforeModify has seen them; the path MTU
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

// Options configure Dial, Listen and the connections they make. The zero
// value (or nil) is a reliable connected (RC) QP with small queues,
// librdmacm moving it, and 2 s per step.
type Options struct {
	// Source is the local address to connect from; zero lets the kernel
	// pick by route (as connect(2) does).
	Source netip.Addr

	// QPType is RC (default) or UD. UD uses the UDP port space.
	QPType verbs.QPType
	// Cap sizes the QP; zero fields take defaults (16 WRs, 1 SGE each way).
	Cap verbs.QPCap
	// CQEntries sizes each of the connection's own CQs; default MaxSendWR
	// and MaxRecvWR.
	CQEntries int
	// PD, if set, is the protection domain for the connection's QP and for
	// the memory Conn.RegisterMemory registers, instead of one of its own:
	// memory registered once in it serves every connection made with it.
	// Its keys are then valid on all of them, so a peer of one connection
	// can reach memory registered for another. It must be allocated on
	// librdmacm's context for the device the connection goes through (see
	// OpenDevice); a connection on another device fails with a hint. The
	// caller owns it: closing a connection leaves it, and the caller closes
	// it after the last connection and MR using it.
	PD *verbs.PD
	// SendCQ and RecvCQ, if set, are completion queues for the
	// connection's QP instead of two of its own: one CQ can serve many
	// connections, each completion naming its QP (WorkCompletion.QPN), and
	// the same CQ may be both. Size them for every work request that can
	// be outstanding on all the QPs together: an overrun CQ ends them all
	// (an async CQ error). Like PD they must be created on librdmacm's
	// context for the device (see OpenDevice), the caller owns them, and
	// closes them after the last connection using them. Conn's Send,
	// Write, Read, SendTo and Recv wait on the connection's own CQs and
	// refuse to run on a shared one, whose completions may be another
	// connection's: poll it yourself.
	SendCQ *verbs.CQ
	RecvCQ *verbs.CQ

	Mode Mode
	// BeforeModify (ModeManual) sees each transition's attributes before the
	// modify and may change them (timeout, retry counts, path MTU, minimum
	// RNR timer); what it leaves is still validated. An error aborts the
	// connection.
	BeforeModify func(t verbs.Transition, attr *verbs.QPAttr, mask *verbs.AttrMask) error

	// RetryCount and RNRRetryCount (3 bits; 7 means retry RNR forever)
	// default to 7, as most tools use.
	RetryCount    *uint8
	RNRRetryCount *uint8
	// ResponderResources and InitiatorDepth bound RDMA reads and atomics in
	// flight; 0 means the device's maximum (the passive side also caps them
	// at what the peer offered).
	ResponderResources uint8
	InitiatorDepth     uint8

	// TOS sets RDMA_OPTION_ID_TOS (0 leaves the default).
	TOS uint8
	// ACKTimeout sets RDMA_OPTION_ID_ACK_TIMEOUT, the QP's local ACK
	// timeout code (0 leaves the CM's choice).
	ACKTimeout verbs.ACKTimeout
	// ReuseAddr sets RDMA_OPTION_ID_REUSEADDR; AFOnly RDMA_OPTION_ID_AFONLY
	// (an IPv6 listener then takes no IPv4 connections).
	ReuseAddr bool
	AFOnly    bool

	// Per-step timeouts, 2 s each by default.
	ResolveAddrTimeout  time.Duration
	ResolveRouteTimeout time.Duration
	ConnectTimeout      time.Duration // waiting for the peer's reply (active) or its RTU (passive)
	CloseTimeout        time.Duration // waiting for DISCONNECTED after our disconnect
	// ResolveRetries is how many times an ADDR_ERROR or ROUTE_ERROR other
	// than "no device" or "no route" is retried (default 2; -1 for none).
	ResolveRetries int

	// PrivateData is sent with the connect request (Dial) or the accept
	// (Listener.Accept). How much fits depends on the message and the
	// transport (see the package documentation): rdmago frames it with a
	// 4-byte header, which leaves 52 bytes in a connect request on
	// InfiniBand and RoCE (56 on the wire), 192 in an accept, and 247 in
	// either on iWARP.
	PrivateData []byte
	// RawPrivateData sends and receives private data without that header,
	// for peers that read private data in a format of their own. A
	// receiver then gets the field as it arrives: on InfiniBand and RoCE
	// padded with zeros to the message's size.
	RawPrivateData bool

	// Backlog bounds connect requests waiting for Request or Accept
	// (default 128). A listener refuses the requests past it at once, and
	// the dialer's error matches ErrBacklogFull.
	Backlog int

	// BeforeConnect, if set, runs once the QP exists and before the
	// connect request (Dial) or the accept (Accept) goes out, with the Conn
	// that Dial or Accept will return. Register memory and post receives
	// there, so that the peer's first SEND finds one: on iWARP a SEND that
	// arrives before its receive ends the connection (there is no RNR
	// retry), and on RoCE it costs an RNR delay. Only RegisterMemory and
	// PostRecv are meaningful before the connection is up; an error aborts
	// it. Memory registered here is released on every path.
	BeforeConnect func(c *Conn) error

	// Trace, if set, is called after each step of Dial, Accept and Close
	// completes, with when it started and how long it took: the per-step
	// view of rdma-core's cmtime. It runs on the caller's goroutine.
	Trace func(s Step, start time.Time, d time.Duration)
}

const (
	defaultStepTimeout = 2 * time.Second
	defaultRetries     = 2
	defaultWR          = 16
	defaultBacklog     = 128
	// udpQKey is the qkey the kernel CM gives every PS_UDP QP (RDMA_UDP_QKEY).
	udpQKey = 0x01234567
)

// withDefaults returns a copy with every zero field filled in.
func (o *Options) withDefaults() Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.QPType == 0 {
		c.QPType = verbs.QPTypeRC
	}
	if c.Cap.MaxSendWR == 0 {
		c.Cap.MaxSendWR = defaultWR
	}
	if c.Cap.MaxRecvWR == 0 {
		c.Cap.MaxRecvWR = defaultWR
	}
	if c.Cap.MaxSendSGE == 0 {
		c.Cap.MaxSendSGE = 1
	}
	if c.Cap.MaxRecvSGE == 0 {
		c.Cap.MaxRecvSGE = 1
	}
	for _, d := range []*time.Duration{&c.ResolveAddrTimeout, &c.ResolveRouteTimeout, &c.ConnectTimeout, &c.CloseTimeout} {
		if *d <= 0 {
			*d = defaultStepTimeout
		}
	}
	switch {
	case c.ResolveRetries == 0:
		c.ResolveRetries = defaultRetries
	case c.ResolveRetries < 0:
		c.ResolveRetries = 0
	}
	if c.Backlog <= 0 {
		c.Backlog = defaultBacklog
	}
	return c
}

func (o *Options) portSpace() PortSpace {
	if o.QPType == verbs.QPTypeUD {
		return PortSpaceUDP
	}
	return PortSpaceTCP
}

func (o *Options) check() error {
	switch o.QPType {
	case verbs.QPTypeRC, verbs.QPTypeUD:
	default:
		return fmt.Errorf("rdmacm: QP type %v is not supported over the CM (RC or UD)", o.QPType)
	}
	if o.Mode != ModeCM && o.Mode != ModeManual {
		return fmt.Errorf("rdmacm: unknown mode %v", o.Mode)
	}
	for _, v := range []*uint8{o.RetryCount, o.RNRRetryCount} {
		if v != nil && *v > 7 {
			return fmt.Errorf("rdmacm: retry counts are 3-bit values (0..7), got %d", *v)
		}
	}
	if o.ACKTimeout > 31 {
		return fmt.Errorf("rdmacm: ACK timeout is a 5-bit code (0..31), got %d", o.ACKTimeout)
	}
	return nil
}

func orSeven(v *uint8) uint8 {
	if v == nil {
		return 7
	}
	return *v
}

// parseAddr accepts "host:port" with a numeric host (IPv6 in brackets,
// with a zone for link-local addresses).
func parseAddr(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("rdmacm: address %q: want a numeric host:port such as 10.0.0.1:7471 or [fe80::1%%eth0]:7471: %w", s, err)
	}
	return ap, nil
}

func addrPort(a netip.Addr) netip.AddrPort {
	if !a.IsValid() {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(a, 0)
}
