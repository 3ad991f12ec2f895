package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

type config struct {
	server, bind string
	port, conns  int
	count, size  int
}

func parse(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("udaddy", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.server, "s", "", "server address to connect to (none: be the server)")
	fs.StringVar(&c.bind, "b", "", "address to bind to: the client's source, the server's listening address")
	fs.IntVar(&c.port, "port", 7174, "port (C udaddy always uses 7174)")
	fs.Func("p", "port space, as C udaddy takes it: 0x111 (UDP) only", func(v string) error {
		if ps, err := strconv.ParseInt(v, 0, 32); err != nil || ps != int64(rdmacm.PortSpaceUDP) {
			return fmt.Errorf("port space %s: only UDP (%#x) is supported", v, int(rdmacm.PortSpaceUDP))
		}
		return nil
	})
	fs.Func("P", "port space by name: udp only", func(v string) error {
		if v != "udp" {
			return fmt.Errorf("port space %q: only udp is supported", v)
		}
		return nil
	})
	fs.IntVar(&c.conns, "c", 1, "number of connections")
	fs.IntVar(&c.count, "C", 10, "datagrams each way per connection")
	fs.IntVar(&c.size, "S", 100, "datagram size in bytes (at most the path MTU)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.conns <= 0:
		return c, fmt.Errorf("invalid number of connections %d", c.conns)
	case c.count <= 0:
		return c, fmt.Errorf("invalid message count %d", c.count)
	case c.size <= 0:
		return c, fmt.Errorf("invalid message size %d", c.size)
	case c.port <= 0 || c.port > 65535:
		return c, fmt.Errorf("invalid port %d", c.port)
	}
	return c, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	c, err := parse(args, out)
	if err != nil {
		return err
	}
	if c.server == "" {
		fmt.Fprintln(out, "udaddy: starting server")
		err = serve(ctx, c, out)
	} else {
		fmt.Fprintln(out, "udaddy: starting client")
		err = connectAll(ctx, c, out)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "test complete")
	return nil
}

// endpoint is one connection's QP and datagram buffers: count receive
// slots of GRH plus size bytes, and one send buffer.
type endpoint struct {
	c    config
	conn *rdmacm.UDConn
	mr   *verbs.MR
}

func (e *endpoint) slot(i int) int { return i * (verbs.GRHSize + e.c.size) }

func (e *endpoint) sendOff() int { return e.slot(e.c.count) }

// config posts every receive before the connection exists, as udaddy
// does: datagrams that find no receive are dropped.
func (e *endpoint) config() rdmacm.ConnConfig {
	n := uint32(e.c.count)
	return rdmacm.ConnConfig{
		Cap:            verbs.QPCap{MaxSendWR: n, MaxRecvWR: n, MaxSendSGE: 1, MaxRecvSGE: 1},
		RawPrivateData: true,
		BeforeConnect:  e.prepost,
	}
}

func (e *endpoint) prepost(s rdmacm.Setup) error {
	if err := checkPortMTU(s.Route(), e.c.size); err != nil {
		return err // the request is rejected, before its dialer sends what the device would drop
	}
	var err error
	if e.mr, err = s.RegisterMemory(e.slot(e.c.count)+e.c.size, verbs.AccessLocalWrite); err != nil {
		return err
	}
	for i := 0; i < e.c.count; i++ {
		if err := s.PostRecv(e.mr, e.slot(i), verbs.GRHSize+e.c.size); err != nil {
			return err
		}
	}
	return nil
}

// checkPortMTU refuses a message size above the port's active MTU, as C
// udaddy's server does before it accepts (ibv_query_port).
func checkPortMTU(r rdmacm.Route, size int) error {
	if r.Device == "" {
		return nil
	}
	dev, err := verbs.Open(r.Device)
	if err != nil {
		return err
	}
	defer dev.Close()
	port, err := dev.QueryPort(r.Port)
	if err != nil {
		return err
	}
	if size > port.ActiveMTU.Bytes() {
		return fmt.Errorf("message size %d is larger than the active MTU %d of %s port %d", size, port.ActiveMTU.Bytes(), r.Device, r.Port)
	}
	return nil
}

// checkSize refuses datagrams larger than the path MTU, which the device
// would drop.
func (e *endpoint) checkSize() error {
	if mtu := e.conn.Route().MTU; mtu.Valid() && e.c.size > mtu.Bytes() {
		return fmt.Errorf("message size %d is larger than the path MTU %d of %s", e.c.size, mtu.Bytes(), e.conn.Route().Device)
	}
	return nil
}

// sendAll sends count datagrams to peer, each carrying our QP number as
// immediate data (the C server answers to it), and waits for them.
func (e *endpoint) sendAll(ctx context.Context, peer rdmacm.UDPeer) error {
	buf := e.mr.Bytes()[e.sendOff():]
	for i := range buf[:e.c.size] {
		buf[i] = byte(i)
	}
	wr := verbs.SendWR{Opcode: verbs.OpSendWithImm, Flags: verbs.SendSignaled, Imm: e.conn.QP().QPN,
		SGEs: []verbs.SGE{e.mr.SGE(e.sendOff(), e.c.size)}, AH: peer.AH, RemoteQPN: peer.QPN, RemoteQKey: peer.QKey}
	for i := 0; i < e.c.count; i++ {
		wr.ID = uint64(i)
		if err := e.conn.QP().PostSend(wr); err != nil {
			return fmt.Errorf("posting datagram %d: %w", i, err)
		}
	}
	wcs := make([]verbs.WorkCompletion, e.c.count)
	for done := 0; done < e.c.count; {
		n, err := e.conn.SendCQ().PollWait(ctx, wcs)
		if err != nil {
			return fmt.Errorf("waiting for sends: %w", err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != verbs.WCSuccess {
				return fmt.Errorf("datagram %d: %w", wc.ID, &verbs.CompletionError{WC: wc})
			}
		}
		done += n
	}
	return nil
}

// receiveAll waits for count datagrams and returns the first one's sender.
func (e *endpoint) receiveAll(ctx context.Context) (rdmacm.UDPeer, error) {
	var from rdmacm.UDPeer
	for i := 0; i < e.c.count; i++ {
		wc, err := e.conn.Recv(ctx)
		if err != nil {
			return from, fmt.Errorf("datagram %d: %w", i, err)
		}
		// C udaddy takes datagrams of any size that fits; so does this.
		if wc.ByteLen < verbs.GRHSize || wc.ByteLen > uint32(verbs.GRHSize+e.c.size) {
			return from, fmt.Errorf("datagram %d is %d bytes with its GRH, want %d to %d", i, wc.ByteLen, verbs.GRHSize, verbs.GRHSize+e.c.size)
		}
		if i == 0 {
			if from, err = e.conn.ReplyTo(wc, e.mr, e.slot(0)); err != nil {
				return from, err
			}
		}
	}
	return from, nil
}

func connectAll(ctx context.Context, c config, out io.Writer) error {
	dst := net.JoinHostPort(c.server, strconv.Itoa(c.port))
	var src netip.Addr
	if c.bind != "" {
		var err error
		if src, err = netip.ParseAddr(c.bind); err != nil {
			return fmt.Errorf("bind address: %w", err)
		}
	}
	fmt.Fprintln(out, "udaddy: connecting")
	eps := make([]*endpoint, c.conns)
	errs := make([]error, c.conns)
	var wg sync.WaitGroup
	for i := range eps {
		eps[i] = &endpoint{c: c}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := rdmacm.Dialer{ConnConfig: eps[i].config(), Source: src}
			eps[i].conn, errs[i] = d.DialUD(ctx, dst)
		}()
	}
	wg.Wait()
	defer func() {
		for _, e := range eps {
			if e.conn != nil {
				e.conn.Close()
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Fprintln(out, "initiating data transfers")
	for _, e := range eps {
		if err := e.checkSize(); err != nil {
			return err
		}
		if err := e.sendAll(ctx, e.conn.Peer()); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "receiving data transfers")
	for _, e := range eps {
		if _, err := e.receiveAll(ctx); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "data transfers complete")
	return nil
}

func serve(ctx context.Context, c config, out io.Writer) error {
	addr := c.bind
	if addr == "" {
		addr = "0.0.0.0"
	}
	// One endpoint per expected request: BeforeConnect fills in the next.
	eps := make([]*endpoint, c.conns)
	for i := range eps {
		eps[i] = &endpoint{c: c}
	}
	next := 0
	lc := rdmacm.ListenConfig{ConnConfig: eps[0].config(), Backlog: c.conns}
	lc.BeforeConnect = func(s rdmacm.Setup) error { return eps[next].prepost(s) }
	l, err := lc.ListenUD(ctx, net.JoinHostPort(addr, strconv.Itoa(c.port)))
	if err != nil {
		return err
	}
	defer l.Close()
	defer func() {
		for _, e := range eps {
			if e.conn != nil {
				e.conn.Close()
			}
		}
	}()
	for ; next < c.conns; next++ {
		if eps[next].conn, err = l.Accept(ctx); err != nil {
			return err
		}
		if err := eps[next].checkSize(); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "receiving data transfers")
	peers := make([]rdmacm.UDPeer, c.conns)
	for i, e := range eps {
		if peers[i], err = e.receiveAll(ctx); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "sending replies")
	for i, e := range eps {
		if err := e.sendAll(ctx, peers[i]); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "data transfers complete")
	return nil
}
