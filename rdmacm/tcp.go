package rdmacm

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
	"time"

	"github.com/rdmago/rdmago/resolver"
	"github.com/rdmago/rdmago/verbs"
)

// ConnectOverTCP connects an RC QP without the RDMA CM, for applications
// that set up their connections on their own (and for networks where the
// CM's ports are closed): both sides call it on the two ends of an
// established TCP connection. Each side resolves its path to the other's
// IP address with package resolver (device, port, the GID index the kernel
// CM would pick, GID type, active MTU), creates its QP, and the two
// exchange QP number, PSN, GID, GID type, address family and MTU over the
// socket. GID types and address families must match (RoCE v1 against v2,
// or IPv4 against IPv6, connects and then never delivers a packet), and
// the path MTU is the smaller side's. The socket stays open as the
// connection's liveness signal: when the peer closes it, Done fires with
// ErrDisconnected. Close closes the socket too. Not for iWARP, whose QPs
// only the iWARP CM can connect.
func ConnectOverTCP(ctx context.Context, tcp net.Conn, opts *Options) (*Conn, error) {
	o := opts.withDefaults()
	if o.QPType != verbs.QPTypeRC {
		return nil, errors.New("rdmacm: ConnectOverTCP makes RC connections only")
	}
	local, remote := tcpAddr(tcp.LocalAddr()), tcpAddr(tcp.RemoteAddr())
	fail := func(step string, err error) *OpError {
		return &OpError{Op: "connect over TCP: " + step, Local: local, Remote: remote, Err: err}
	}
	if dl, ok := ctx.Deadline(); ok {
		tcp.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { tcp.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	wrap := func(step string, err error) error {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fail(step, err)
	}

	path, err := resolver.Resolve(ctx, remote.Addr(), resolver.Options{Source: local.Addr()})
	if err != nil {
		return nil, fail("resolve path", err)
	}
	if path.Kind == verbs.KindIWARP {
		oe := fail("resolve path", ErrManualOnIWARP)
		oe.Device, oe.Hint = path.Device, "iWARP QPs are connected by the iWARP CM only: use Dial and Listen"
		return nil, oe
	}
	var res resources
	c, r, err := connectOverTCP(ctx, tcp, &o, path, &res, local, remote)
	if err != nil {
		res.close()
		var oe *OpError
		if !errors.As(err, &oe) {
			err = wrap("exchange", err)
		}
		return nil, err
	}
	if !stop() { // ctx ended just now: its past deadline may be on the socket
		c.tcpDone = nil
		c.Close()
		return nil, fail("exchange", ctx.Err())
	}
	tcp.SetDeadline(time.Time{})
	go c.watchTCP(r)
	return c, nil
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

func connectOverTCP(ctx context.Context, tcp net.Conn, o *Options, path *resolver.Path, res *resources,
	local, remote netip.AddrPort) (*Conn, *bufio.Reader, error) {
	where := func(step string, err error) *OpError {
		return &OpError{Op: "connect over TCP: " + step, Local: local, Remote: remote, Device: path.Device, Port: path.Port, Err: err}
	}
	var err error
	// Our own QP: any context of the device will do, as long as the PD and
	// the CQs share it. The PD comes first in o.shared(): once it passed,
	// its device is there to compare the CQs' with.
	for _, s := range o.shared() {
		if why, hint := s.mismatch(path.Device, 0); why != "" {
			oe := where("use Options."+s.field, errors.New(why))
			oe.Hint = hint
			return nil, nil, oe
		}
		if o.PD != nil && contextKey(s.owner) != contextKey(o.PD.Device()) {
			oe := where("use Options."+s.field, fmt.Errorf("the CQ in Options.%s and the PD in Options.PD were made on different contexts of %s", s.field, path.Device))
			oe.Hint = "create the CQs on the PD's device (PD.Device)"
			return nil, nil, oe
		}
	}
	if (o.SendCQ != nil || o.RecvCQ != nil) && o.PD == nil {
		oe := where("use Options.SendCQ and RecvCQ", errors.New("shared CQs need Options.PD: the QP, its PD and its CQs must share one device context"))
		oe.Hint = "allocate the PD on the CQs' device (their Device method) and set Options.PD"
		return nil, nil, oe
	}
	if o.PD != nil {
		res.dev, res.pd, res.sharedPD = o.PD.Device(), o.PD, true
	} else if res.dev, err = verbs.Open(path.Device); err != nil {
		return nil, nil, where("open device", err)
	}
	port, err := res.dev.QueryPort(path.Port)
	if err != nil {
		return nil, nil, where("query port", err)
	}
	if res.pd == nil {
		if res.pd, err = res.dev.AllocPD(); err != nil {
			return nil, nil, where("allocate PD", err)
		}
	}
	if err := res.makeCQs(o, res.dev); err != nil {
		return nil, nil, where("create CQ", err)
	}
	if res.qp, err = res.pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: res.scq, RecvCQ: res.rcq, Cap: o.Cap}); err != nil {
		return nil, nil, where("create QP", err)
	}
	var psnBytes [4]byte
	rand.Read(psnBytes[:])
	me := tcpPeer{QPN: res.qp.QPN, PSN: binary.BigEndian.Uint32(psnBytes[:]) & 0xffffff, GID: path.GID,
		GIDType: path.GIDType, Family: family(local.Addr()), ActiveMTU: port.ActiveMTU, LID: port.LID}

	r := bufio.NewReader(tcp)
	var peer tcpPeer
	if err := sayHear(tcp, r, me, &peer); err != nil {
		return nil, nil, where("exchange QP data", err)
	}
	if peer.GIDType != me.GIDType {
		oe := where("check peer", fmt.Errorf("GID types differ: %v here, %v at the peer", me.GIDType, peer.GIDType))
		oe.Hint = "both ends must use the same RoCE version; set resolver's RoCE option or the ports' default_roce_mode"
		return nil, nil, oe
	}
	if peer.Family != me.Family {
		oe := where("check peer", fmt.Errorf("address families differ: %s here, %s at the peer", me.Family, peer.Family))
		oe.Hint = "connect the TCP socket over the same family on both sides (its addresses pick the GIDs)"
		return nil, nil, oe
	}
	cp := verbs.QPSetup{Type: verbs.QPTypeRC, Port: uint8(path.Port),
		Access: verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic,
		SQPSN:  me.PSN, Remote: verbs.Remote{QPN: peer.QPN, PSN: peer.PSN, GID: peer.GID, LID: peer.LID, ActiveMTU: peer.ActiveMTU},
		PathAttr: verbs.PathAttr{Global: path.Kind == verbs.KindRoCE || path.GIDIndex >= 0, SGIDIndex: uint8(max(path.GIDIndex, 0)),
			LocalActiveMTU: port.ActiveMTU, TrafficClass: o.TOS},
		Timeout: o.ACKTimeout, RetryCount: orSeven(o.RetryCount), RNRRetry: orSeven(o.RNRRetryCount),
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
		return nil, nil, where("QP attributes", err)
	}
	for _, s := range steps {
		if o.BeforeModify != nil {
			if err := o.BeforeModify(s.Transition, &s.Attr, &s.Mask); err != nil {
				return nil, nil, where("modify QP "+s.Transition.String(), fmt.Errorf("BeforeModify: %w", err))
			}
		}
		if err := res.qp.Modify(&s.Attr, s.Mask); err != nil {
			return nil, nil, where("modify QP "+s.Transition.String(), err)
		}
	}
	// Both QPs are at RTS before either side sends.
	var ready string
	if err := sayHear(tcp, r, "ready", &ready); err != nil || ready != "ready" {
		return nil, nil, where("wait for the peer's RTS", fmt.Errorf("%v (got %q)", err, ready))
	}
	c := &Conn{QP: res.qp, SendCQ: res.scq, RecvCQ: res.rcq, PD: res.pd, Device: res.dev, opts: *o,
		done: make(chan struct{}), tcp: tcp, tcpDone: make(chan struct{})}
	rc := *res
	c.res = &rc
	*res = resources{}
	c.path = Path{Local: local, Remote: remote, Device: path.Device, Port: path.Port, Transport: c.Device.Info.Transport,
		Kind: path.Kind, GIDIndex: path.GIDIndex, GIDType: path.GIDType, Mode: ModeManual}
	c.pathKnown = true // the resolver's path has it all
	if a, err := c.QP.Query(verbs.AttrPathMTU); err == nil {
		c.path.MTU = a.PathMTU
	}
	return c, r, nil
}

// watchTCP ends the connection when the peer closes the socket.
func (c *Conn) watchTCP(r *bufio.Reader) {
	defer close(c.tcpDone)
	var b [1]byte
	for {
		if _, err := r.Read(b[:]); err != nil {
			c.end(ErrDisconnected, nil)
			return
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
	line, rerr := r.ReadBytes('\n')
	if werr := <-errc; werr != nil {
		return fmt.Errorf("writing to the peer: %w", werr)
	}
	if rerr != nil {
		return fmt.Errorf("reading from the peer: %w", rerr)
	}
	return json.Unmarshal(line, hear)
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
