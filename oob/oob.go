// Package oob connects RC queue pairs without the RDMA CM: the two sides
// exchange their QP data over a TCP socket they already share (out of
// band), and each moves its own QP with package verbs. It is for
// applications that set up their connections on their own, and for
// networks where the CM's ports are closed. InfiniBand and RoCE only:
// iWARP QPs are connected by the iWARP CM alone (use package rdmacm).
package oob

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

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
	// TOS is the traffic class of the QP's GRH (zero: 0).
	TOS uint8
	// ACKTimeout is the QP's local ACK timeout code (zero: verbs' default).
	ACKTimeout verbs.ACKTimeout
	// BeforeModify sees each transition's attributes before the modify and
	// may change them; what it leaves is still validated. An error aborts
	// the connection.
	BeforeModify func(t verbs.Transition, attr *verbs.QPAttr, mask *verbs.AttrMask) error
}

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
// exchange QP number, PSN, GID, GID type, address family and MTU over the
// socket. GID types and address families must match (RoCE v1 against v2,
// or IPv4 against IPv6, connects and then never delivers a packet), and
// the path MTU is the smaller side's. Errors are *rdmacm.OpError; on
// failure the socket is left to the caller.
func Connect(ctx context.Context, tcp net.Conn, cfg *Config) (*Conn, error) {
	var o Config
	if cfg != nil {
		o = *cfg
	}
	local, remote := tcpAddr(tcp.LocalAddr()), tcpAddr(tcp.RemoteAddr())
	fail := func(step string, err error) *rdmacm.OpError {
		return &rdmacm.OpError{Op: "connect over TCP: " + step, Local: local, Remote: remote, Err: err}
	}
	retry, err := retries("RetryCount", o.RetryCount)
	if err != nil {
		return nil, fail("check config", err)
	}
	rnrRetry, err := retries("RNRRetryCount", o.RNRRetryCount)
	if err != nil {
		return nil, fail("check config", err)
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

	path, err := resolver.Resolve(ctx, remote.Addr(), resolver.Options{Source: local.Addr()})
	if err != nil {
		return nil, fail("resolve path", err)
	}
	if path.Kind == verbs.KindIWARP {
		oe := fail("resolve path", verbs.ErrIWARPManual)
		oe.Device, oe.Hint = path.Device, "iWARP QPs are connected by the iWARP CM only: use rdmacm's Dial and Listen"
		return nil, oe
	}
	var res cmbridge.RC
	x := exchange{o: &o, retry: retry, rnrRetry: rnrRetry, path: path, res: &res, local: local, remote: remote}
	if err := x.run(ctx, tcp); err != nil {
		release(&res)
		var oe *rdmacm.OpError
		if !errors.As(err, &oe) {
			oe = fail("exchange", err)
		}
		if ctx.Err() != nil {
			// The socket's deadline stopped the exchange: say why, and
			// match the context's error.
			oe.Err = fmt.Errorf("%w (%v)", ctx.Err(), oe.Err)
		}
		return nil, oe
	}
	if !halt() { // ctx ended just now: the exchange is not to be trusted
		release(&res)
		return nil, fail("exchange", ctx.Err())
	}
	res.TCP = tcp
	return &Conn{cmbridge.AdoptRC(res).(*rdmacm.Conn)}, nil
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

// tcpPeer is what each side tells the other, as one JSON line.
type tcpPeer struct {
	QPN       uint32        `json:"qpn"`
	PSN       uint32        `json:"psn"`
	GID       verbs.GID     `json:"gid"`
	GIDType   verbs.GIDType `json:"gid_type"`
	Family    string        `json:"family"`
	ActiveMTU verbs.MTU     `json:"mtu"`
	LID       uint16        `json:"lid"`
}

// exchange is one side's part of Connect, after the path is resolved.
type exchange struct {
	o               *Config
	retry, rnrRetry uint8
	path            *resolver.Path
	res             *cmbridge.RC
	local, remote   netip.AddrPort
}

func (x *exchange) where(step string, err error) *rdmacm.OpError {
	return &rdmacm.OpError{Op: "connect over TCP: " + step, Local: x.local, Remote: x.remote,
		Device: x.path.Device, Port: x.path.Port, Err: err}
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
// RTS and waits for the peer's.
func (x *exchange) run(ctx context.Context, tcp net.Conn) error {
	if err := x.checkShared(); err != nil {
		return err
	}
	port, err := x.makeQP()
	if err != nil {
		return err
	}
	o, res, path, where, local := x.o, x.res, x.path, x.where, x.local
	var psnBytes [4]byte
	rand.Read(psnBytes[:])
	me := tcpPeer{QPN: res.QP.QPN, PSN: binary.BigEndian.Uint32(psnBytes[:]) & 0xffffff, GID: path.GID,
		GIDType: path.GIDType, Family: family(local.Addr()), ActiveMTU: port.ActiveMTU, LID: port.LID}

	r := bufio.NewReader(tcp)
	var peer tcpPeer
	if err := sayHear(tcp, r, me, &peer); err != nil {
		return where("exchange QP data", err)
	}
	if peer.GIDType != me.GIDType {
		oe := where("check peer", fmt.Errorf("GID types differ: %v here, %v at the peer", me.GIDType, peer.GIDType))
		oe.Hint = "both ends must use the same RoCE version; set resolver's RoCE option or the ports' default_roce_mode"
		return oe
	}
	if peer.Family != me.Family {
		oe := where("check peer", fmt.Errorf("address families differ: %s here, %s at the peer", me.Family, peer.Family))
		oe.Hint = "connect the TCP socket over the same family on both sides (its addresses pick the GIDs)"
		return oe
	}
	cp := verbs.QPSetup{Type: verbs.QPTypeRC, Port: uint8(path.Port),
		Access: verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic,
		SQPSN:  me.PSN, Remote: verbs.Remote{QPN: peer.QPN, PSN: peer.PSN, GID: peer.GID, LID: peer.LID, ActiveMTU: peer.ActiveMTU},
		PathAttr: verbs.PathAttr{Global: path.Kind == verbs.KindRoCE || path.GIDIndex >= 0, SGIDIndex: uint8(max(path.GIDIndex, 0)),
			LocalActiveMTU: port.ActiveMTU, TrafficClass: o.TOS},
		Timeout: o.ACKTimeout, RetryCount: x.retry, RNRRetry: x.rnrRetry,
		MaxRdAtomic: 1, MaxDestRdAtomic: 1}
	// The path MTU: the smallest of this port's, this netdev's room and the peer's.
	mtu := port.ActiveMTU
	for _, m := range []verbs.MTU{path.PathMTU, peer.ActiveMTU} {
		if m.Valid() && m < mtu {
			mtu = m
		}
	}
	cp.PathAttr.MTU = mtu
	steps, err := cp.Steps()
	if err != nil {
		return where("QP attributes", err)
	}
	for _, s := range steps {
		if o.BeforeModify != nil {
			if err := o.BeforeModify(s.Transition, &s.Attr, &s.Mask); err != nil {
				return where("modify QP "+s.Transition.String(), fmt.Errorf("BeforeModify: %w", err))
			}
		}
		if err := res.QP.Modify(&s.Attr, s.Mask); err != nil {
			return where("modify QP "+s.Transition.String(), err)
		}
	}
	// Both QPs are at RTS before either side sends.
	var ready string
	if err := sayHear(tcp, r, "ready", &ready); err != nil {
		return where("wait for the peer's RTS", err)
	}
	if ready != "ready" {
		return where("wait for the peer's RTS", fmt.Errorf("the peer said %q, not \"ready\"", ready))
	}
	res.Reader = r
	res.Local, res.Remote, res.Port = local, x.remote, path.Port
	res.Kind, res.GIDIndex, res.GIDType = path.Kind, path.GIDIndex, path.GIDType
	return nil
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
	line, rerr := r.ReadSlice('\n')
	if werr := <-errc; werr != nil {
		return fmt.Errorf("writing to the peer: %w", werr)
	}
	if errors.Is(rerr, bufio.ErrBufferFull) {
		return fmt.Errorf("reading from the peer: a line longer than %d bytes, not QP data", r.Size())
	}
	if rerr != nil {
		return fmt.Errorf("reading from the peer: %w", rerr)
	}
	if err := json.Unmarshal(line, hear); err != nil {
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
