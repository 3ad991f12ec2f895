// Package oob connects RC queue pairs without the RDMA CM: the two sides
// exchange their QP data over a TCP socket they already share (out of
// band), and each moves its own QP with package verbs. It is for
// applications that set up their connections on their own, and for
// networks where the CM's ports are closed. InfiniBand and RoCE only:
// iWARP QPs are connected by the iWARP CM alone (use package rdmacm).
package oob

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/rdmago/rdmago/internal/cmbridge"
	"github.com/rdmago/rdmago/internal/vbridge"
	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/resolver"
	"github.com/rdmago/rdmago/verbs"
)

// Config configures Connect. Its zero value is ready to use: an RC QP
// with small queues and the usual retry counts. As in package rdmacm,
// zero means the default, and counts whose zero is a real setting take a
// negative value for "none".
type Config struct {
	// Cap sizes the QP; zero fields take defaults (16 WRs, 1 SGE each way).
	Cap verbs.QPCap
	// CQEntries sizes each of the connection's own CQs; default MaxSendWR
	// and MaxRecvWR.
	CQEntries int
	// PD, if set, is the protection domain for the QP and for the memory
	// RegisterMemory registers, instead of one of its own; the caller owns
	// it. SendCQ and RecvCQ, if set, are completion queues for the QP
	// instead of two of its own; they need PD, made on the same device
	// context (the QP, its PD and its CQs share one), and the connection's
	// Send, Recv, RDMAWrite and RDMARead refuse to wait on them.
	PD     *verbs.PD
	SendCQ *verbs.CQ
	RecvCQ *verbs.CQ

	// RetryCount and RNRRetryCount (3 bits; an RNR count of 7 retries
	// forever) default to 7; negative means none.
	RetryCount    int
	RNRRetryCount int
	// ResponderResources and InitiatorDepth bound the RDMA reads and
	// atomics in flight that the QP answers and issues: 1 to 255, default 1
	// each (unlike rdmacm's, negative is refused). The drivers hold
	// InitiatorDepth to the device's MaxQPRdAtom and ResponderResources to
	// its MaxQPInitRdAtom. As the CM pairs them, each side tells the other
	// both, and lowers its InitiatorDepth to the peer's ResponderResources
	// (a read beyond what the responder answers would fail the QP) and its
	// ResponderResources to the peer's InitiatorDepth.
	ResponderResources int
	InitiatorDepth     int
	// TOS is the traffic class of the QP's GRH (zero: 0).
	TOS uint8
	// ACKTimeout is the QP's local ACK timeout code (zero: verbs' default).
	ACKTimeout verbs.ACKTimeout
	// BeforeModify sees each transition's attributes before the modify and
	// may change them; what it leaves is still validated. An error aborts
	// the connection.
	BeforeModify func(t verbs.Transition, attr *verbs.QPAttr, mask *verbs.AttrMask) error
	// BeforeConnect, if set, runs once the QP is at RTS and before this
	// side tells the peer it is ready. Register memory and post receives
	// there: the peer may send as soon as it hears that, and a SEND that
	// finds no receive waits out RNR retries (or, with RNRRetryCount
	// negative, fails the connection). An error aborts the connection and
	// is told to the peer; memory registered here is released on every
	// path.
	BeforeConnect func(s rdmacm.Setup) error

	// Timeout bounds Connect, the wait for the peer included, unless ctx
	// ends sooner: 10 s by default, negative for none (ctx alone). A peer
	// that accepted the TCP connection but never runs its side would
	// otherwise hold the QP until ctx ends.
	Timeout time.Duration
}

// ErrPeerFailed is matched by the error of a Connect whose peer failed
// its side of the exchange and said why; the error carries that reason.
var ErrPeerFailed = errors.New("the peer failed its side")

const (
	// version is the exchange's; a peer speaking another is refused.
	version        = 1
	defaultTimeout = 10 * time.Second
	// maxLine is the longest line the reader takes (bufio's default
	// size, newline included), and maxReason the longest failure told
	// to the peer before its encoding, which may make it longer.
	maxLine   = 4096
	maxReason = 1024
)

// Conn is an RC connection whose QP data crossed a TCP socket. It has the
// methods of rdmacm.Conn; the socket stays open as its liveness signal:
// when the peer closes it, Done fires with rdmacm.ErrDisconnected, and
// Disconnect and Close close it.
type Conn struct {
	*rdmacm.Conn
}

// Connect connects an RC QP over tcp, an established TCP connection whose
// other end calls Connect too. Each side resolves its path to the other's
// IP address with package resolver (device, port, the GID index the kernel
// CM would pick, GID type, active MTU), creates its QP, and the two
// exchange QP number, PSN, GID, GID type, address family, MTU and read
// depths over the socket, one JSON line each way, then one more once each
// QP is at RTS.
// GID types and address families must match (RoCE v1 against v2, or IPv4
// against IPv6, connects and then never delivers a packet), and the path
// MTU is the smaller side's. A side that fails tells the other why, in
// one line on the socket, and the other's error then matches
// [ErrPeerFailed]; only a refusal of iWARP, which the peer makes too, is
// not told. Errors are *rdmacm.OpError; on failure the socket is left to
// the caller.
func Connect(ctx context.Context, tcp net.Conn, cfg *Config) (*Conn, error) {
	var o Config
	if cfg != nil {
		o = *cfg
	}
	local, remote := tcpAddr(tcp.LocalAddr()), tcpAddr(tcp.RemoteAddr())
	fail := func(step string, err error) *rdmacm.OpError {
		return &rdmacm.OpError{Op: "connect over TCP: " + step, Local: local, Remote: remote, Err: err}
	}
	if o.Timeout == 0 {
		o.Timeout = defaultTimeout
	}
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, o.Timeout,
			fmt.Errorf("%w: Connect took longer than Config.Timeout (%v)", context.DeadlineExceeded, o.Timeout))
		defer cancel()
	}
	if dl, ok := ctx.Deadline(); ok {
		tcp.SetDeadline(dl)
	}
	// The context's end puts a past deadline on the socket, which stops
	// the exchange's I/O. halt keeps that from happening later, or waits
	// until it has happened, and reports whether it was kept from it.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { tcp.SetDeadline(time.Unix(1, 0)); close(fired) })
	var haltOnce sync.Once
	var prevented bool
	halt := func() bool {
		haltOnce.Do(func() {
			if prevented = stop(); !prevented {
				<-fired
			}
		})
		return prevented
	}
	defer func() {
		// The socket goes back to the caller (on failure) or stays the
		// liveness signal without the deadlines set for the exchange.
		halt()
		tcp.SetDeadline(time.Time{})
	}()

	// ended says why a step failed when ctx had ended by then (the
	// socket's deadline, or the resolver's check, stopped it), so that the
	// error matches the context's and, for a deadline, ErrTimeout.
	ended := func(oe *rdmacm.OpError) {
		if ctx.Err() == nil {
			return
		}
		oe.Err = fmt.Errorf("%w (%w)", context.Cause(ctx), oe.Err)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			oe.Kind = rdmacm.ErrTimeout
		}
	}
	// A side that fails before the exchange tells the peer too, which
	// would otherwise wait for its timeout to learn nothing.
	refuse := func(oe *rdmacm.OpError) (*Conn, error) {
		ended(oe)
		halt() // no past deadline may land on the socket after tell's
		tell(tcp, oe)
		return nil, oe
	}
	retry, err := retries("RetryCount", o.RetryCount)
	if err != nil {
		return refuse(fail("check config", err))
	}
	rnrRetry, err := retries("RNRRetryCount", o.RNRRetryCount)
	if err != nil {
		return refuse(fail("check config", err))
	}
	path, err := resolver.Resolve(ctx, remote.Addr(), resolver.Options{Source: local.Addr()})
	if err != nil {
		return refuse(fail("resolve path", err))
	}
	if path.Kind == verbs.KindIWARP {
		// Not told: the peer on the same link refuses by itself, and a
		// caller that falls back to rdmacm over this socket finds it clean.
		oe := fail("resolve path", verbs.ErrIWARPManual)
		oe.Device, oe.Hint = path.Device, "iWARP QPs are connected by the iWARP CM only: use rdmacm's Dial and Listen"
		return nil, oe
	}
	var res cmbridge.RC
	x := exchange{o: &o, retry: retry, rnrRetry: rnrRetry, path: path, res: &res, local: local, remote: remote}
	conn, err := x.run(ctx, tcp)
	if err != nil {
		if conn != nil {
			cmbridge.AbortRC(conn)
		} else {
			release(&res)
		}
		var oe *rdmacm.OpError
		if !errors.As(err, &oe) {
			oe = fail("exchange", err)
		}
		if dl, ok := ctx.Deadline(); ok && ctx.Err() == nil && errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(dl) {
			<-ctx.Done() // the socket's deadline was ctx's, whose timer is due
		}
		ended(oe)
		if !x.told {
			// Why, as this side reports it: the context's end, not the
			// deadline that it put on the socket.
			halt() // no past deadline may land on the socket after tell's
			tell(tcp, oe)
		}
		return nil, oe
	}
	// Every line has crossed: a ctx that ends now does not undo that, as
	// the peer has its connection too. The socket stays the liveness
	// signal, without the exchange's deadline.
	halt()
	tcp.SetDeadline(time.Time{})
	cmbridge.StartRC(conn, x.reader)
	return &Conn{conn.(*rdmacm.Conn)}, nil
}

// release closes what a failed Connect made.
func release(r *cmbridge.RC) {
	if r.QP != nil {
		r.QP.Close()
	}
	if r.SendCQ != nil && !r.SharedSendCQ {
		r.SendCQ.Close()
	}
	if r.RecvCQ != nil && !r.SharedRecvCQ {
		r.RecvCQ.Close()
	}
	if !r.SharedPD {
		if r.PD != nil {
			r.PD.Close()
		}
		if r.Dev != nil {
			r.Dev.Close()
		}
	}
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

// line is what each side tells the other, as one JSON line: first its QP
// data, then, once its QP is at RTS, that it is ready. Either may instead
// say why this side failed (Error), which ends the exchange.
type line struct {
	Version int    `json:"v"`
	Error   string `json:"error,omitempty"`

	QPN     uint32        `json:"qpn,omitempty"`
	PSN     uint32        `json:"psn,omitempty"`
	GID     netip.Addr    `json:"gid,omitzero"`
	GIDType verbs.GIDType `json:"gid_type,omitempty"`
	Family  string        `json:"family,omitempty"`
	// MTU is the largest this side can use on the path: its port's active
	// MTU, or less where its netdev has less room.
	MTU verbs.MTU `json:"mtu,omitempty"`
	LID uint16    `json:"lid,omitempty"`
	// ResponderResources and InitiatorDepth are this side's reads in
	// flight as responder and initiator, as configured: each side lowers
	// its initiator depth to the peer's responder resources and its
	// responder resources to the peer's initiator depth. Peers older than
	// the fields send neither, and are taken as configured.
	ResponderResources uint8 `json:"rr,omitempty"`
	InitiatorDepth     uint8 `json:"id,omitempty"`

	Ready bool `json:"ready,omitempty"`
}

// exchange is one side's part of Connect, after the path is resolved.
type exchange struct {
	o               *Config
	retry, rnrRetry uint8
	path            *resolver.Path
	res             *cmbridge.RC
	local, remote   netip.AddrPort
	reader          *bufio.Reader // the socket, past the exchange's lines
	// told is set when the peer needs no word of this side's failure.
	told bool
}

func (x *exchange) where(step string, err error) *rdmacm.OpError {
	oe := &rdmacm.OpError{Op: "connect over TCP: " + step, Local: x.local, Remote: x.remote,
		Device: x.path.Device, Port: x.path.Port, Err: err}
	if x.res.QP != nil {
		oe.QPN = x.res.QP.QPN
	}
	return oe
}

// checkShared refuses a PD or CQ of the config that cannot serve a QP on
// the path's device: closed, another device's, or (the CQs) another
// context's than the PD's. The QP is ours, so any context of the device
// will do, as long as the PD and the CQs share it.
func (x *exchange) checkShared() error {
	o, dev := x.o, x.path.Device
	if o.PD != nil {
		switch d := o.PD.Device(); {
		case vbridge.PD(o.PD) == nil || d == nil:
			oe := x.where("use Config.PD", errors.New("the PD in Config.PD is closed"))
			oe.Hint = "close the PD only after the last connection and MR using it"
			return oe
		case d.Info.Name != dev:
			oe := x.where("use Config.PD", fmt.Errorf("Config.PD belongs to %s, but the path goes through %s", d.Info.Name, dev))
			oe.Hint = fmt.Sprintf("use a PD per device, this one allocated on %s", dev)
			return oe
		}
	}
	for _, cq := range []struct {
		field string
		cq    *verbs.CQ
	}{{"SendCQ", o.SendCQ}, {"RecvCQ", o.RecvCQ}} {
		if cq.cq == nil {
			continue
		}
		if o.PD == nil {
			oe := x.where("use Config."+cq.field, errors.New("shared CQs need Config.PD: the QP, its PD and its CQs must share one device context"))
			oe.Hint = "allocate the PD on the CQs' device (their Device method) and set Config.PD"
			return oe
		}
		switch d := cq.cq.Device(); {
		case vbridge.CQ(cq.cq) == nil || d == nil:
			oe := x.where("use Config."+cq.field, fmt.Errorf("the CQ in Config.%s is closed", cq.field))
			oe.Hint = "close the CQ only after the last connection using it"
			return oe
		case contextKey(d) != contextKey(o.PD.Device()):
			oe := x.where("use Config."+cq.field, fmt.Errorf("the CQ in Config.%s and the PD in Config.PD were made on different contexts of %s", cq.field, dev))
			oe.Hint = "create the CQs on the PD's device (PD.Device)"
			return oe
		}
	}
	return nil
}

// contextKey identifies a device's context (0 if closed).
func contextKey(d *verbs.Device) uintptr {
	if c := vbridge.Context(d); c != nil {
		return c.Key()
	}
	return 0
}

// makeQP opens the device (unless Config.PD) and makes the PD, CQs and QP.
func (x *exchange) makeQP() (verbs.PortAttr, error) {
	o, res := x.o, x.res
	var err error
	if o.PD != nil {
		res.Dev, res.PD, res.SharedPD = o.PD.Device(), o.PD, true
	} else if res.Dev, err = verbs.Open(x.path.Device); err != nil {
		return verbs.PortAttr{}, x.where("open device", err)
	}
	port, err := res.Dev.QueryPort(x.path.Port)
	if err != nil {
		return port, x.where("query port", err)
	}
	if res.PD == nil {
		if res.PD, err = res.Dev.AllocPD(); err != nil {
			return port, x.where("allocate PD", err)
		}
	}
	res.Cap = o.Cap
	if res.Cap.MaxSendWR == 0 {
		res.Cap.MaxSendWR = 16
	}
	if res.Cap.MaxRecvWR == 0 {
		res.Cap.MaxRecvWR = 16
	}
	if res.Cap.MaxSendSGE == 0 {
		res.Cap.MaxSendSGE = 1
	}
	if res.Cap.MaxRecvSGE == 0 {
		res.Cap.MaxRecvSGE = 1
	}
	sn, rn := int(res.Cap.MaxSendWR), int(res.Cap.MaxRecvWR)
	if o.CQEntries > 0 {
		sn, rn = o.CQEntries, o.CQEntries
	}
	if o.SendCQ != nil {
		res.SendCQ, res.SharedSendCQ = o.SendCQ, true
	} else if res.SendCQ, err = res.Dev.CreateCQ(sn); err != nil {
		return port, x.where("create CQ", err)
	}
	if o.RecvCQ != nil {
		res.RecvCQ, res.SharedRecvCQ = o.RecvCQ, true
	} else if res.RecvCQ, err = res.Dev.CreateCQ(rn); err != nil {
		return port, x.where("create CQ", err)
	}
	if res.QP, err = res.PD.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: res.SendCQ, RecvCQ: res.RecvCQ, Cap: res.Cap}); err != nil {
		return port, x.where("create QP", err)
	}
	return port, nil
}

// run makes the QP, swaps QP data with the peer over tcp, moves the QP to
// RTS, runs BeforeConnect and waits for the peer's readiness. It returns
// the connection, not yet watching the socket, once it exists: a failure
// after that must abort it, before that release x.res.
func (x *exchange) run(ctx context.Context, tcp net.Conn) (conn any, err error) {
	x.reader = bufio.NewReaderSize(tcp, maxLine)
	if err := x.checkShared(); err != nil {
		return nil, err
	}
	port, err := x.makeQP()
	if err != nil {
		return nil, err
	}
	me, err := x.announce(port)
	if err != nil {
		return nil, err
	}
	var peer line
	if err := sayHear(tcp, x.reader, me, &peer); err != nil {
		return nil, x.where("exchange QP data", err)
	}
	if err := x.checkPeer(me, &peer); err != nil {
		x.told = peer.Error != "" // the peer has failed: nothing to tell it
		return nil, err
	}
	steps, err := x.steps(port, me, &peer)
	if err != nil {
		return nil, err
	}
	o, res := x.o, x.res
	for _, s := range steps {
		if o.BeforeModify != nil {
			if err := o.BeforeModify(s.Transition, &s.Attr, &s.Mask); err != nil {
				return nil, x.where("modify QP "+s.Transition.String(), fmt.Errorf("BeforeModify: %w", err))
			}
		}
		if err := res.QP.Modify(&s.Attr, s.Mask); err != nil {
			return nil, x.where("modify QP "+s.Transition.String(), err)
		}
	}
	res.Local, res.Remote, res.Port = x.local, x.remote, x.path.Port
	res.Kind, res.GIDIndex, res.GIDType = x.path.Kind, x.path.GIDIndex, x.path.GIDType
	res.TCP = tcp
	conn = cmbridge.AdoptRC(*res)
	if o.BeforeConnect != nil {
		if err := o.BeforeConnect(cmbridge.SetupOf(conn).(rdmacm.Setup)); err != nil {
			return conn, x.where("BeforeConnect", err)
		}
	}
	// Both QPs are at RTS, and this side's receives posted, before either
	// side sends.
	var ready line
	if err := sayHear(tcp, x.reader, line{Version: version, Ready: true}, &ready); err != nil {
		return conn, x.where("wait for the peer's RTS", err)
	}
	if err := x.peerSaid("wait for the peer's RTS", &ready); err != nil {
		x.told = ready.Error != "" // a peer that failed needs no word; one of another version does
		return conn, err
	}
	if !ready.Ready {
		return conn, x.where("wait for the peer's RTS", errors.New("the peer said neither that it is ready nor why not"))
	}
	return conn, nil
}

// announce is this side's QP data: the MTU it can use on the path, a
// random first PSN.
func (x *exchange) announce(port verbs.PortAttr) (line, error) {
	if x.path.GIDIndex > math.MaxUint8 {
		// ibv_global_route's sgid_index is 8 bits: a larger index would
		// name another entry.
		oe := x.where("check path", fmt.Errorf("GID index %d does not fit the 8 bits a QP's address vector holds", x.path.GIDIndex))
		oe.Hint = "use rdmacm's Dial and Listen, whose CM addresses the GID itself"
		return line{}, oe
	}
	rr, err := rdAtomic("ResponderResources", x.o.ResponderResources)
	if err != nil {
		return line{}, x.where("check config", err)
	}
	id, err := rdAtomic("InitiatorDepth", x.o.InitiatorDepth)
	if err != nil {
		return line{}, x.where("check config", err)
	}
	var psn [4]byte
	rand.Read(psn[:])
	mtu := port.ActiveMTU
	if m := x.path.PathMTU; m.Valid() && m < mtu {
		mtu = m
	}
	return line{Version: version, QPN: x.res.QP.QPN, PSN: binary.BigEndian.Uint32(psn[:]) & 0xffffff,
		GID: netip.AddrFrom16(x.path.GID), GIDType: x.path.GIDType, Family: family(x.local.Addr()), MTU: mtu, LID: port.LID,
		ResponderResources: rr, InitiatorDepth: id}, nil
}

// peerSaid checks a line's version and whether it reports the peer's
// failure.
func (x *exchange) peerSaid(step string, l *line) error {
	if l.Version != version {
		oe := x.where(step, fmt.Errorf("the peer speaks version %d of the exchange, this side %d", l.Version, version))
		oe.Hint = "run rdmago's oob of the same exchange version at both ends"
		return oe
	}
	if l.Error != "" {
		oe := x.where(step, fmt.Errorf("%w: %s", ErrPeerFailed, printable(l.Error)))
		oe.Hint = "this side released its QP; the peer's own error says more"
		return oe
	}
	return nil
}

// checkPeer refuses QP data that cannot name a peer QP on this path, or
// that does not match this side's.
func (x *exchange) checkPeer(me line, peer *line) error {
	if err := x.peerSaid("exchange QP data", peer); err != nil {
		return err
	}
	bad := func(err error) error {
		oe := x.where("check peer", err)
		oe.Hint = "the peer is not a working rdmago oob.Connect"
		return oe
	}
	g := peer.GID
	switch {
	case peer.QPN < 2 || peer.QPN > 0xffffff:
		return bad(fmt.Errorf("the peer sent QP number %#x: QP numbers are 24 bits, and 0 and 1 are special QPs", peer.QPN))
	case peer.PSN > 0xffffff:
		return bad(fmt.Errorf("the peer sent PSN %#x, more than 24 bits", peer.PSN))
	case !peer.MTU.Valid():
		return bad(fmt.Errorf("the peer sent no MTU (%d)", int(peer.MTU)))
	case !g.IsValid() || g.Unmap().IsUnspecified() || g.Unmap().IsMulticast() || g.Unmap().IsLoopback() ||
		g.Unmap() == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return bad(fmt.Errorf("the peer sent GID %q, not the GID of a unicast address another host can reach", g))
	}
	if peer.GIDType != me.GIDType {
		oe := x.where("check peer", fmt.Errorf("GID types differ: %v here, %v at the peer", me.GIDType, peer.GIDType))
		oe.Hint = "both ends must use the same RoCE version; set resolver's RoCE option or the ports' default_roce_mode"
		return oe
	}
	if peer.Family != me.Family {
		oe := x.where("check peer", fmt.Errorf("address families differ: %s here, %s at the peer", me.Family, peer.Family))
		oe.Hint = "connect the TCP socket over the same family on both sides (its addresses pick the GIDs)"
		return oe
	}
	return nil
}

// steps are the QP's modifies to RTS for this side and its checked peer:
// the path MTU the smaller side's, the retry counts as configured (zero
// included).
func (x *exchange) steps(port verbs.PortAttr, me line, peer *line) ([]verbs.Step, error) {
	o, path := x.o, x.path
	rr, err := rdAtomic("ResponderResources", o.ResponderResources)
	if err != nil {
		return nil, x.where("check config", err)
	}
	id, err := rdAtomic("InitiatorDepth", o.InitiatorDepth)
	if err != nil {
		return nil, x.where("check config", err)
	}
	if peer.ResponderResources > 0 {
		// No more reads out than the peer answers at once.
		id = min(id, peer.ResponderResources)
	}
	if peer.InitiatorDepth > 0 {
		// No more answered at once than the peer sends, as the CM's
		// accepting side caps its responder resources.
		rr = min(rr, peer.InitiatorDepth)
	}
	cp := verbs.QPSetup{Type: verbs.QPTypeRC, Port: uint8(path.Port),
		Access: verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic,
		SQPSN:  me.PSN, Remote: verbs.Remote{QPN: peer.QPN, PSN: peer.PSN, GID: peer.GID.As16(), LID: peer.LID},
		PathAttr: verbs.PathAttr{Global: path.Kind == verbs.KindRoCE || path.GIDIndex >= 0, SGIDIndex: uint8(max(path.GIDIndex, 0)),
			MTU: min(me.MTU, peer.MTU), LocalActiveMTU: port.ActiveMTU, TrafficClass: o.TOS},
		Timeout: o.ACKTimeout, MaxRdAtomic: id, MaxDestRdAtomic: rr}
	steps, err := cp.Steps()
	if err != nil {
		return nil, x.where("QP attributes", err)
	}
	// Steps reads a zero count as its default; here zero is asked for.
	rts := &steps[len(steps)-1]
	rts.Attr.RetryCount, rts.Attr.RNRRetry = x.retry, x.rnrRetry
	return steps, nil
}

// rdAtomic is a count of reads and atomics in flight: zero is 1.
func rdAtomic(name string, v int) (uint8, error) {
	switch {
	case v == 0:
		return 1, nil
	case v < 0 || v > math.MaxUint8:
		return 0, fmt.Errorf("%s is a count of 1 to 255 (zero for the default 1), got %d", name, v)
	}
	return uint8(v), nil
}

// tell says to the peer why this side failed, so that it need not wait
// for the socket to close; what comes of the write does not matter. The
// write has a deadline of its own: the one a cancelled or timed-out
// Connect put on the socket has passed.
func tell(tcp net.Conn, err error) {
	tcp.SetWriteDeadline(time.Now().Add(tellTimeout))
	tcp.Write(errorLine(err.Error()))
}

// tellTimeout bounds the write that tells the peer of a failure.
const tellTimeout = time.Second

// printable is a peer's text with its control and format characters (a
// newline, a terminal's escape, a bidi override, a line separator) made
// spaces, for an error that may reach a log.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) {
			return ' '
		}
		return r
	}, s)
}

// errorLine is the line that tells the peer reason, cut to fit the line
// the peer reads: first to maxReason bytes, then shorter while its JSON,
// whose escapes can take six bytes for one, is too long.
func errorLine(reason string) []byte {
	cut := reason
	for n := maxReason; ; n /= 2 {
		if len(reason) > n {
			for n > 0 && !utf8.RuneStart(reason[n]) {
				n--
			}
			cut = reason[:n] + "…"
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		enc.Encode(line{Version: version, Error: cut}) // a string always encodes; Encode ends the line
		if b.Len() <= maxLine || n == 0 {
			return b.Bytes()
		}
	}
}

func sayHear(tcp net.Conn, r *bufio.Reader, say, hear any) error {
	b, err := json.Marshal(say)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { _, err := tcp.Write(append(b, '\n')); errc <- err }()
	// A line longer than the reader's buffer is not a peer of ours: read
	// no more of it (ReadBytes would take a line without end whole).
	l, rerr := r.ReadSlice('\n')
	if werr := <-errc; werr != nil {
		return fmt.Errorf("writing to the peer: %w", werr)
	}
	if errors.Is(rerr, bufio.ErrBufferFull) {
		return fmt.Errorf("reading from the peer: a line longer than %d bytes, not QP data", r.Size())
	}
	if errors.Is(rerr, io.EOF) {
		if len(l) > 0 {
			return fmt.Errorf("reading from the peer: it closed the connection in the middle of a line: %w", rerr)
		}
		return fmt.Errorf("reading from the peer: it closed the connection without a word (is it running oob.Connect?): %w", rerr)
	}
	if rerr != nil {
		return fmt.Errorf("reading from the peer: %w", rerr)
	}
	if err := json.Unmarshal(l, hear); err != nil {
		return fmt.Errorf("the peer's QP data: %w", err)
	}
	return nil
}

func tcpAddr(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

func family(a netip.Addr) string {
	if a.Unmap().Is4() {
		return "IPv4"
	}
	return "IPv6"
}
