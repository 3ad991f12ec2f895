package rdmacm_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// A server accepts one connection and receives a message; the client dials
// it with private data and sends. Run both halves in separate processes (or
// goroutines) on hosts with RDMA devices.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Server.
	l, err := rdmacm.Listen("10.10.0.1:7471")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	go func() {
		req, err := l.Request(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("request from %v: %q\n", req.Remote, req.PrivateData)
		// The receive is posted before the accept goes out: the client
		// may send as soon as it is connected.
		var mr *verbs.MR
		conn, err := req.AcceptWith(ctx, []byte("welcome"), func(s rdmacm.Setup) (err error) {
			if mr, err = s.RegisterMemory(4096, verbs.AccessLocalWrite); err != nil {
				return err
			}
			return s.PostRecv(mr, 0, 4096)
		})
		if err != nil {
			log.Fatal(err)
		}
		defer conn.Close()
		wc, err := conn.Recv(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("received %q\n", mr.Bytes()[:wc.ByteLen])
		// The client closes first: a disconnect from here could flush its
		// send before the ACK reaches it, and its Send would fail.
		<-conn.Done()
	}()

	// Client.
	d := rdmacm.Dialer{PrivateData: []byte("hello")}
	conn, err := d.Dial(ctx, "10.10.0.1:7471")
	var rejected *rdmacm.RejectedError
	switch {
	case errors.As(err, &rejected):
		log.Fatalf("refused (status %d): %s", rejected.Status, rejected.PrivateData)
	case err != nil:
		log.Fatal(err) // says which step failed, between which addresses, on which device
	}
	defer conn.Close()
	fmt.Println("connected:", conn.Route(), "server said", string(conn.PeerPrivateData()))
	mr, err := conn.RegisterMemory(4096, verbs.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	n := copy(mr.Bytes(), "ping")
	if err := conn.Send(ctx, mr, 0, n); err != nil {
		log.Fatal(err)
	}
}

// ModeManual moves the QP in rdmago, showing each transition's attributes
// first; here it lowers the ACK timeout.
func ExampleDialer_manual() {
	var d rdmacm.Dialer
	d.Mode = rdmacm.ModeManual
	d.BeforeModify = func(t verbs.Transition, attr *verbs.QPAttr, mask *verbs.AttrMask) error {
		if t.To == verbs.QPStateRTS {
			attr.Timeout = 12 // about 17 ms
		}
		return nil
	}
	conn, err := d.Dial(context.Background(), "10.10.0.1:7471")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
}

// A server registers one buffer pool for all its connections: every
// connection it accepts uses the PD allocated on librdmacm's context for
// the device it listens on.
func ExampleOpenDevice() {
	dev, err := rdmacm.OpenDevice("rxe0")
	if err != nil {
		log.Fatal(err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	defer pd.Close() // after the connections and the pool
	pool, err := pd.RegisterMemory(1<<20, verbs.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// Each connection receives into a slot of the pool, posted before the
	// peer may send. Accept runs BeforeConnect, one connection at a time here.
	slot := 0
	var lc rdmacm.ListenConfig
	lc.PD = pd
	lc.BeforeConnect = func(s rdmacm.Setup) error {
		slot++
		return s.PostRecv(pool, (slot-1)*4096, 4096)
	}
	l, err := lc.Listen(context.Background(), "10.10.0.1:7471")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	for i := 0; i < 4; i++ {
		conn, err := l.Accept(context.Background())
		if err != nil {
			log.Fatal(err)
		}
		defer conn.Close()
	}
}

// A server takes every connection's receives on one CQ and serves them
// from one goroutine, telling the connections apart by QP number.
func ExampleListenConfig_sharedCQ() {
	dev, err := rdmacm.OpenDevice("rxe0")
	if err != nil {
		log.Fatal(err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	defer pd.Close() // after everything made on it
	const conns, slots = 4, 16
	recvCQ, err := dev.CreateCQ(conns * slots) // room for every receive posted
	if err != nil {
		log.Fatal(err)
	}
	defer recvCQ.Close() // after the connections
	pool, err := pd.RegisterMemory(conns*slots*4096, verbs.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// Receives are posted with the QP itself: the Conn's Recv would refuse
	// (ErrSharedCQ), as it waits on a CQ of its own. A receive's ID is
	// its slot in the pool.
	next := 0
	lc := rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{PD: pd, RecvCQ: recvCQ}}
	lc.BeforeConnect = func(s rdmacm.Setup) error {
		for i := 0; i < slots; i++ {
			id := uint64(next)
			next++
			if err := s.QP().PostRecv(verbs.RecvWR{ID: id, SGEs: []verbs.SGE{pool.SGE(int(id)*4096, 4096)}}); err != nil {
				return err
			}
		}
		return nil
	}
	l, err := lc.Listen(context.Background(), "10.10.0.1:7471")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	byQPN := map[uint32]*rdmacm.Conn{}
	for i := 0; i < conns; i++ {
		conn, err := l.Accept(context.Background())
		if err != nil {
			log.Fatal(err)
		}
		defer conn.Close()
		byQPN[conn.QP().QPN] = conn
	}
	wcs := make([]verbs.WorkCompletion, 16)
	for got := 0; got < conns*slots; { // until every slot is used
		n, err := recvCQ.PollWait(context.Background(), wcs)
		if err != nil {
			log.Fatal(err)
		}
		got += n
		for _, wc := range wcs[:n] {
			if wc.Status != verbs.WCSuccess {
				log.Fatalf("QP %#x: receive %d: %v", wc.QPN, wc.ID, wc.Status)
			}
			fmt.Printf("%v sent %d bytes into slot %d\n", byQPN[wc.QPN].RemoteAddr(), wc.ByteLen, wc.ID)
		}
	}
}

// A UD client reaches a UD listener through the CM, then sends it a
// datagram; the listener answers the sender of each datagram it receives.
func ExampleDialer_DialUD() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A datagram that finds no posted receive is dropped without a trace:
	// each side posts its receive before the other can send.
	post := func(s rdmacm.Setup) (*verbs.MR, error) {
		mr, err := s.RegisterMemory(4096, verbs.AccessLocalWrite)
		if err != nil {
			return nil, err
		}
		return mr, s.PostRecv(mr, 0, verbs.GRHSize+1024) // a datagram lands after the GRH
	}
	l, err := rdmacm.ListenUD("10.10.0.1:7471")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	go func() {
		req, err := l.Request(ctx)
		if err != nil {
			log.Fatal(err)
		}
		var mr *verbs.MR
		ep, err := req.AcceptWith(ctx, nil, func(s rdmacm.Setup) (err error) {
			mr, err = post(s)
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
		defer ep.Close()
		wc, err := ep.Recv(ctx)
		if err != nil {
			log.Fatal(err)
		}
		from, err := ep.ReplyTo(wc, mr, 0)
		if err != nil {
			log.Fatal(err)
		}
		if err := ep.SendTo(ctx, mr, verbs.GRHSize, int(wc.ByteLen)-verbs.GRHSize, from); err != nil { // echo
			log.Fatal(err)
		}
	}()

	var mr *verbs.MR
	d := rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{BeforeConnect: func(s rdmacm.Setup) (err error) {
		mr, err = post(s) // for the echo
		return err
	}}}
	ep, err := d.DialUD(ctx, "10.10.0.1:7471")
	if err != nil {
		log.Fatal(err)
	}
	defer ep.Close()
	n := copy(mr.Bytes()[2048:], "ping")
	if err := ep.SendTo(ctx, mr, 2048, n, ep.Peer()); err != nil {
		log.Fatal(err)
	}
	wc, err := ep.Recv(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("echoed %q\n", mr.Bytes()[verbs.GRHSize:wc.ByteLen])
}

// Many connections set up from one goroutine on the thin layer, one step
// for all of them before the next, as rdma-core's cmtime does: each
// network step's requests go out in one loop, and the answers are awaited
// in the next while the CM works on all of them.
func ExampleID() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dst := netip.MustParseAddrPort("10.10.0.1:7471")
	ids := make([]*rdmacm.ID, 64)
	for i := range ids {
		id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
		if err != nil {
			log.Fatal(err)
		}
		defer id.Close()
		ids[i] = id
	}
	// await waits for every id's next event, which must be want.
	await := func(want rdmacm.EventType) {
		for _, id := range ids {
			ev, err := id.Event(ctx)
			if err != nil {
				log.Fatal(err)
			}
			if ev.Type != want {
				log.Fatalf("%v: %v (status %d), want %v", id.RemoteAddr(), ev.Type, ev.Status, want)
			}
		}
	}
	for _, id := range ids {
		if err := id.ResolveAddr(netip.Addr{}, dst, 2*time.Second); err != nil {
			log.Fatal(err)
		}
	}
	await(rdmacm.EventAddrResolved)
	for _, id := range ids {
		if err := id.ResolveRoute(2 * time.Second); err != nil {
			log.Fatal(err)
		}
	}
	await(rdmacm.EventRouteResolved)
	// The QPs are librdmacm's to move; their PD and CQs live on its
	// context of the device, shared by all connections.
	dev, err := ids[0].Device()
	if err != nil {
		log.Fatal(err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	defer pd.Close()
	cq, err := dev.CreateCQ(len(ids) * 2)
	if err != nil {
		log.Fatal(err)
	}
	defer cq.Close()
	for _, id := range ids {
		qp, err := id.CreateQP(pd, verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			log.Fatal(err)
		}
		defer qp.Close() // before its id (defers run last in, first out)
		if err := id.Connect(rdmacm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}, nil); err != nil {
			log.Fatal(err)
		}
	}
	await(rdmacm.EventEstablished)
	fmt.Println(len(ids), "connections up")
	for _, id := range ids {
		id.Disconnect()
	}
	await(rdmacm.EventDisconnected)
}
