package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rdmago/rdmago/examples/internal/profile"
	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

const (
	defaultPort = 18515 // perftest's
	maxMsg      = 64 * 1024
	inline      = 64 // bytes sent inline: no DMA read of the buffer, as perftest does for small messages
	// As perftest does: receives stay posted ahead (rxDepth of them),
	// inline sends are signaled only every signalEvery-th (a completion
	// retires every send before it), and bwDepth RDMA WRITEs are kept in
	// flight.
	rxDepth     = 16
	signalEvery = 16
	bwDepth     = 128
)

type config struct {
	listen, connect string
	addrs           []string
	iters, bwIters  int
	sizes           []int
	bwSize          int
	event           bool
	json            bool
	cpuprofile      *string
}

func parse(args []string, out io.Writer) (config, error) {
	c := config{sizes: []int{64, 4096}}
	fs := flag.NewFlagSet("pingpong", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.listen, "listen", "", "serve one client on ADDRESS:PORT")
	fs.StringVar(&c.connect, "connect", "", "connect to a server on ADDRESS:PORT")
	fs.IntVar(&c.iters, "n", 5000, "round trips per message size")
	fs.IntVar(&c.bwIters, "bw-n", 1000, "RDMA WRITEs for the bandwidth")
	fs.IntVar(&c.bwSize, "bw-size", maxMsg, "bytes per RDMA WRITE")
	fs.Func("sizes", "message sizes for the latency, comma-separated (default 64,4096)", func(s string) error {
		c.sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 || n > maxMsg {
				return fmt.Errorf("message size %q: want 1 to %d bytes", f, maxMsg)
			}
			c.sizes = append(c.sizes, n)
		}
		return nil
	})
	fs.BoolVar(&c.event, "event", false, "sleep on the completion channel (through Go's poller) instead of busy-polling, as perftest's -e")
	fs.BoolVar(&c.json, "json", false, "print the client's results as JSON")
	c.cpuprofile = profile.Flag(fs)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.addrs = fs.Args()
	modes := 0
	for _, set := range []bool{c.listen != "", c.connect != "", len(c.addrs) > 0} {
		if set {
			modes++
		}
	}
	switch {
	case modes != 1:
		return c, errors.New("give addresses to run both ends here, or one of -listen and -connect")
	case c.iters <= 0 || c.bwIters <= 0:
		return c, errors.New("iterations must be positive")
	case c.bwSize <= 0 || c.bwSize > maxMsg:
		return c, fmt.Errorf("-bw-size %d: want 1 to %d bytes", c.bwSize, maxMsg)
	}
	return c, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	c, err := parse(args, out)
	if err != nil {
		return err
	}
	return profile.Run(*c.cpuprofile, func() error { return measure(ctx, c, out) })
}

// measure runs what the flags ask: a server, a client, or both ends here.
func measure(ctx context.Context, c config, out io.Writer) error {
	switch {
	case c.listen != "":
		return serveOne(ctx, c.listen, c.event)
	case c.connect != "":
		r, err := dialAndMeasure(ctx, c, c.connect)
		if err != nil {
			return err
		}
		return report(out, c, r)
	}
	if !c.json {
		fmt.Fprintln(out, "rdmago pingpong: both ends in this process, talking through the RDMA device of each address.")
		fmt.Fprintln(out, "Latency is half a round trip (send, echo, receive); bandwidth is RDMA WRITE into the peer's memory.")
	}
	for _, a := range c.addrs {
		r, err := loopback(ctx, c, a)
		if err != nil {
			return err
		}
		if err := report(out, c, r); err != nil {
			return err
		}
	}
	return nil
}

// loopback runs a server and a client over address's device.
func loopback(ctx context.Context, c config, address string) (*results, error) {
	addr := net.JoinHostPort(address, strconv.Itoa(defaultPort))
	lc, mem := serverConfig()
	l, err := lc.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	served := make(chan error, 1)
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		defer l.Close()
		conn, err := l.Accept(sctx)
		if err != nil {
			served <- err
			return
		}
		served <- echo(sctx, conn, mem, c.event)
	}()
	r, err := dialAndMeasure(ctx, c, addr)
	if err != nil {
		// The dial may have failed before its request reached the
		// listener: the server would wait for it forever.
		stop()
		<-served
		return nil, err
	}
	if serr := <-served; serr != nil {
		err = fmt.Errorf("server: %w", serr)
	}
	return r, err
}

func serveOne(ctx context.Context, addr string, event bool) error {
	lc, mem := serverConfig()
	l, err := lc.Listen(ctx, addr)
	if err != nil {
		return err
	}
	conn, err := l.Accept(ctx)
	l.Close()
	if err != nil {
		return err
	}
	return echo(ctx, conn, mem, event)
}

// capacity leaves room for the unsignaled sends of the latency test that
// no completion has retired yet when the bandwidth test starts.
func capacity() verbs.QPCap {
	return verbs.QPCap{MaxSendWR: bwDepth + signalEvery, MaxRecvWR: rxDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: inline}
}

// receives is a registered buffer of rxDepth slots, each with a receive
// posted; a completion's ID is its slot.
type receives struct{ mr *verbs.MR }

// postReceives registers the slots and posts a receive on each. It runs in
// BeforeConnect, so that the peer may send the moment it is connected.
func postReceives(conn rdmacm.Setup) (*receives, error) {
	mr, err := conn.RegisterMemory(rxDepth*maxMsg, verbs.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	r := &receives{mr: mr}
	wrs := make([]verbs.RecvWR, rxDepth)
	for i := range wrs {
		wrs[i] = r.wr(i)
	}
	return r, conn.QP().PostRecv(wrs...)
}

func (r *receives) wr(slot int) verbs.RecvWR {
	return verbs.RecvWR{ID: uint64(slot), SGEs: []verbs.SGE{r.mr.SGE(slot*maxMsg, maxMsg)}}
}

// slot is the buffer of a receive completion.
func (r *receives) slot(wc verbs.WorkCompletion) []byte {
	off := int(wc.ID) * maxMsg
	return r.mr.Bytes()[off : off+int(wc.ByteLen)]
}

// repost gives the slot of a completed receive back to the QP.
func (r *receives) repost(qp *verbs.QP, wc verbs.WorkCompletion) error {
	return qp.PostRecv(r.wr(int(wc.ID)))
}

// serverMemory is the receive slots, and the window the client WRITEs into.
type serverMemory struct {
	recv   *receives
	window *verbs.MR
}

// serverConfig registers the server's memory and posts its receives
// before the accept, so that the client may send at once.
func serverConfig() (*rdmacm.ListenConfig, *serverMemory) {
	mem := &serverMemory{}
	lc := &rdmacm.ListenConfig{}
	lc.Cap = capacity()
	lc.BeforeConnect = func(conn rdmacm.Setup) error {
		var err error
		if mem.window, err = conn.RegisterMemory(maxMsg, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
			return err
		}
		mem.recv, err = postReceives(conn)
		return err
	}
	return lc, mem
}

// echo answers the client's hello with the window, then returns each
// message it receives from the slot it landed in, busy-polling as perftest
// does, until an empty message says goodbye.
//
// The client speaks first because iWARP requires it (MPA): a message the
// server sent first can reach the client together with the MPA reply, and
// siw then fails the client's connect (CONNECT_ERROR, status -22).
func echo(ctx context.Context, conn *rdmacm.Conn, mem *serverMemory, event bool) error {
	defer conn.Close()
	idle, cancel := untilEnded(ctx, conn)
	defer cancel()
	p := poller{conn: conn, idle: idle, event: event}
	hello, err := p.next(ctx, conn.RecvCQ())
	if err != nil {
		return fmt.Errorf("waiting for the client's hello: %w", err)
	}
	if err := mem.recv.repost(conn.QP(), hello); err != nil {
		return err
	}
	window := mem.window
	copy(window.Bytes(), rdmacm.RemoteBufferOf(window, 0, maxMsg).Marshal())
	if err := conn.Send(ctx, window, 0, rdmacm.RemoteBufferSize); err != nil {
		return err
	}
	for {
		wc, err := p.next(ctx, conn.RecvCQ())
		if err != nil {
			return err
		}
		n := int(wc.ByteLen)
		if err := p.send(ctx, mem.recv.mr, int(wc.ID)*maxMsg, n); err != nil {
			return err
		}
		if err := mem.recv.repost(conn.QP(), wc); err != nil {
			return err
		}
		if n == 0 {
			select { // the client closes
			case <-conn.Done():
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// untilEnded returns a context that ends with ctx or with the connection,
// for waits on its completion channel.
func untilEnded(ctx context.Context, conn *rdmacm.Conn) (context.Context, context.CancelFunc) {
	wait, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-conn.Done():
			cancel()
		case <-wait.Done():
		}
	}()
	return wait, cancel
}

// poller busy-polls a connection's CQs, or sleeps on their completion
// channels in event mode.
type poller struct {
	conn  *rdmacm.Conn
	wc    [signalEvery]verbs.WorkCompletion
	sends int // posted, to signal every signalEvery-th
	// idle, when set, makes next sleep on the CQ's completion channel
	// (until a completion, or the context ends) after idleSpins empty
	// polls: the server idles through the client's bandwidth run, where
	// spinning would take a CPU from the writes, as perftest's server
	// does not poll then either.
	idle context.Context
	// event makes every wait sleep on the completion channel at once, as
	// perftest's -e: both ends then wait through Go's runtime poller.
	event bool
}

const idleSpins = 2 * 4096

// next busy-polls cq for one completion. Every 4096 empty polls it checks
// whether the connection or ctx ended, so that it cannot spin forever.
func (p *poller) next(ctx context.Context, cq *verbs.CQ) (verbs.WorkCompletion, error) {
	for spins := 0; ; spins++ {
		var n int
		var err error
		if p.idle != nil && (p.event || spins >= idleSpins) {
			n, err = cq.PollWait(p.idle, p.wc[:1])
			if err != nil && p.idle.Err() != nil && ctx.Err() == nil {
				return verbs.WorkCompletion{}, p.conn.Err() // the connection ended
			}
		} else {
			n, err = cq.Poll(p.wc[:1])
		}
		if err != nil {
			return verbs.WorkCompletion{}, err
		}
		if n == 1 {
			if p.wc[0].Status != verbs.WCSuccess {
				return p.wc[0], &verbs.CompletionError{WC: p.wc[0]}
			}
			return p.wc[0], nil
		}
		if spins%4096 == 4095 {
			select {
			case <-ctx.Done():
				return verbs.WorkCompletion{}, ctx.Err()
			case <-p.conn.Done():
				return verbs.WorkCompletion{}, p.conn.Err()
			default:
			}
		}
	}
}

// send posts n bytes of mr from off (inline when small). A send that is
// not inline is signaled and waited for: the device reads its buffer until
// it completes, and the server gives the slot it echoes from back to the
// QP straight after. Of the inline sends, copied when posted, every
// signalEvery-th is signaled and waited for, and the empty goodbye; a
// completion frees the send queue of the unsignaled sends before it. (On
// siw, waiting for each 4 KiB send also made the round trip about 30 %
// shorter; see the README.)
func (p *poller) send(ctx context.Context, mr *verbs.MR, off, n int) error {
	wr := verbs.SendWR{Opcode: verbs.OpSend, SGEs: []verbs.SGE{mr.SGE(off, n)}}
	if n <= inline {
		wr.Flags |= verbs.SendInline
	}
	if n == 0 {
		wr.SGEs = nil
	}
	p.sends++
	signaled := signaledSend(n, p.sends)
	if signaled {
		wr.Flags |= verbs.SendSignaled
	}
	if err := p.conn.QP().PostSend(wr); err != nil {
		return err
	}
	if !signaled {
		return nil
	}
	_, err := p.next(ctx, p.conn.SendCQ())
	return err
}

// signaledSend says whether the k-th send, of n bytes, is signaled (see
// send).
func signaledSend(n, k int) bool {
	return n > inline || n == 0 || k%signalEvery == 0
}

type results struct {
	Route     rdmacm.Route  `json:"-"`
	Device    string        `json:"device"`
	Transport string        `json:"transport"`
	GIDIndex  int           `json:"gid_index"` // -1 on iWARP
	Setup     time.Duration `json:"setup_ns"`
	Latency   []latencyRow  `json:"latency"`
	BWSize    int           `json:"bw_size"`
	BWIters   int           `json:"bw_iters"`
	MBps      float64       `json:"bw_MBps"`
}

type latencyRow struct {
	Size  int     `json:"size"`
	P50us float64 `json:"p50_us"`
	P90us float64 `json:"p90_us"`
	P99us float64 `json:"p99_us"`
	MaxUs float64 `json:"max_us"`
	// The client's cgo crossings, allocations and CPU time, and the
	// machine's idle time, per round trip.
	profile.PerOp
}

func dialAndMeasure(ctx context.Context, c config, addr string) (*results, error) {
	var recv *receives
	var d rdmacm.Dialer
	d.Cap = capacity()
	d.BeforeConnect = func(conn rdmacm.Setup) error {
		var err error
		recv, err = postReceives(conn) // the first takes the server's window, the answer to our hello
		return err
	}
	start := time.Now()
	conn, err := d.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	route := conn.Route()
	r := &results{Route: route, Device: route.Device, Transport: route.Transport.String(), GIDIndex: route.GIDIndex,
		Setup: time.Since(start), BWSize: c.bwSize, BWIters: c.bwIters}
	send, err := conn.RegisterMemory(maxMsg, verbs.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	p := poller{conn: conn, event: c.event}
	if c.event {
		// Only in event mode: busy-polling, the client never sleeps, as
		// perftest's does not.
		idle, cancel := untilEnded(ctx, conn)
		defer cancel()
		p.idle = idle
	}
	// The hello: on iWARP the dialing side must send first (see echo).
	if err := p.send(ctx, send, 0, 1); err != nil {
		return nil, fmt.Errorf("saying hello: %w", err)
	}
	wc, err := p.next(ctx, conn.RecvCQ())
	if err != nil {
		return nil, fmt.Errorf("waiting for the server's window: %w", err)
	}
	window, err := rdmacm.ParseRemoteBuffer(recv.slot(wc))
	if err != nil {
		return nil, err
	}
	if err := recv.repost(conn.QP(), wc); err != nil {
		return nil, err
	}
	for _, size := range c.sizes {
		row, err := measureLatency(ctx, &p, send, recv, size, c.iters)
		if err != nil {
			return nil, fmt.Errorf("latency of %d bytes: %w", size, err)
		}
		r.Latency = append(r.Latency, row)
	}
	if r.MBps, err = measureBandwidth(ctx, &p, send, window, c.bwSize, c.bwIters); err != nil {
		return nil, fmt.Errorf("bandwidth: %w", err)
	}
	// Goodbye: an empty message, echoed.
	if err := p.send(ctx, send, 0, 0); err != nil {
		return nil, err
	}
	if _, err := p.next(ctx, conn.RecvCQ()); err != nil {
		return nil, err
	}
	return r, conn.Close()
}

// measureLatency times iters round trips of size bytes, after a warm-up.
// A round trip is the send, the echo's arrival and its slot's repost, as
// perftest times it.
func measureLatency(ctx context.Context, p *poller, send *verbs.MR, recv *receives, size, iters int) (latencyRow, error) {
	const warmUp = 100
	rtts := make([]time.Duration, 0, iters)
	var counted profile.Counters
	for i := 0; i < warmUp+iters; i++ {
		if i == warmUp {
			counted = profile.Count()
		}
		start := time.Now()
		if err := p.send(ctx, send, 0, size); err != nil {
			return latencyRow{}, err
		}
		wc, err := p.next(ctx, p.conn.RecvCQ())
		if err != nil {
			return latencyRow{}, err
		}
		if err := recv.repost(p.conn.QP(), wc); err != nil {
			return latencyRow{}, err
		}
		if i >= warmUp {
			rtts = append(rtts, time.Since(start))
		}
		if int(wc.ByteLen) != size {
			return latencyRow{}, fmt.Errorf("the echo is %d bytes, want %d", wc.ByteLen, size)
		}
	}
	perOp := counted.Since(iters)
	slices.Sort(rtts)
	half := func(q float64) float64 {
		return float64(rtts[min(len(rtts)-1, int(q*float64(len(rtts))))]) / 2 / float64(time.Microsecond)
	}
	return latencyRow{Size: size, P50us: half(0.5), P90us: half(0.9), P99us: half(0.99), MaxUs: half(1), PerOp: perOp}, nil
}

// measureBandwidth keeps up to bwDepth RDMA WRITEs of size bytes in flight
// until iters completed, and returns MB/s (10^6 bytes). WRITEs go out in
// batches of signalEvery, one crossing into C each; only a batch's last is
// signaled, and its ID counts the WRITEs posted up to it.
func measureBandwidth(ctx context.Context, p *poller, src *verbs.MR, window rdmacm.RemoteBuffer, size, iters int) (float64, error) {
	wr := verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGEs: []verbs.SGE{src.SGE(0, size)}, RemoteAddr: window.Addr, RKey: window.RKey}
	batch := make([]verbs.SendWR, signalEvery)
	posted, done := 0, 0
	start := time.Now()
	for done < iters {
		for posted < iters && posted-done+signalEvery <= bwDepth {
			k := min(signalEvery, iters-posted)
			for j := range k {
				batch[j] = wr
			}
			posted += k
			batch[k-1].Flags, batch[k-1].ID = verbs.SendSignaled, uint64(posted)
			if err := p.conn.QP().PostSend(batch[:k]...); err != nil {
				return 0, err
			}
		}
		var n int
		var err error
		if p.event {
			n, err = p.conn.SendCQ().PollWait(p.idle, p.wc[:])
		} else {
			n, err = p.conn.SendCQ().Poll(p.wc[:])
		}
		if err != nil {
			return 0, err
		}
		for _, wc := range p.wc[:n] {
			if wc.Status != verbs.WCSuccess {
				return 0, &verbs.CompletionError{WC: wc}
			}
			done = max(done, int(wc.ID))
		}
		if n == 0 && ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
	return float64(size*iters) / time.Since(start).Seconds() / 1e6, nil
}

func report(out io.Writer, c config, r *results) error {
	if c.json {
		return json.NewEncoder(out).Encode(r)
	}
	fmt.Fprintf(out, "\n%s\n", r.Route)
	fmt.Fprintf(out, "  connected in %.1f ms (resolve address and route, create the QP, connect)\n", float64(r.Setup)/1e6)
	fmt.Fprintf(out, "  latency, %d round trips each:   p50       p90       p99       max\n", c.iters)
	for _, l := range r.Latency {
		fmt.Fprintf(out, "    %-8s %21.1f µs %6.1f µs %6.1f µs %6.1f µs\n", sizeName(l.Size), l.P50us, l.P90us, l.P99us, l.MaxUs)
	}
	fmt.Fprintf(out, "  bandwidth, %d RDMA WRITEs of %s, %d in flight: %.1f MB/s\n", r.BWIters, sizeName(r.BWSize), bwDepth, r.MBps)
	return nil
}

func sizeName(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}
