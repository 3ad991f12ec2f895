package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rdmago/rdmago/examples/internal/profile"
	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/resolver"
	"github.com/rdmago/rdmago/verbs"
)

type config struct {
	server, bind     string
	port, conns      int
	retries, timeout int
	manual           bool
	cpuprofile       *string
}

func parse(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("cmtime", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.server, "s", "", "server address to connect to (none: be the server)")
	fs.StringVar(&c.bind, "b", "", "address to bind to: the client's source, the server's listening address")
	fs.IntVar(&c.port, "p", 7471, "port")
	fs.IntVar(&c.conns, "c", 100, "client: number of connections")
	fs.IntVar(&c.retries, "r", 2, "client: retries of address and route resolution")
	fs.IntVar(&c.timeout, "t", 2000, "client: timeout of address and route resolution in milliseconds")
	fs.BoolVar(&c.manual, "q", false, "client: move the QPs with rdmago's manual mode (InfiniBand and RoCE only)")
	c.cpuprofile = profile.Flag(fs)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.conns <= 0:
		return c, fmt.Errorf("invalid number of connections %d", c.conns)
	case c.port <= 0 || c.port > 65535:
		return c, fmt.Errorf("invalid port %d", c.port)
	case c.timeout <= 0:
		return c, fmt.Errorf("invalid timeout %d ms", c.timeout)
	case c.retries < 0:
		return c, fmt.Errorf("invalid retries %d", c.retries)
	}
	return c, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	c, err := parse(args, out)
	if err != nil {
		return err
	}
	return profile.Run(*c.cpuprofile, func() error {
		if c.server == "" {
			return serve(ctx, c, out)
		}
		r, err := connectAll(ctx, c)
		if err != nil {
			return err
		}
		r.print(out)
		return errors.Join(r.err, r.pdErr)
	})
}

// listenConfig is the C tool's: one-entry queues, one read in flight, no
// private data.
var listenConfig = rdmacm.ListenConfig{
	ConnConfig: rdmacm.ConnConfig{
		Cap:                verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1},
		RawPrivateData:     true,
		ResponderResources: 1,
		InitiatorDepth:     1,
	},
	Backlog: 1024,
}

func serve(ctx context.Context, c config, out io.Writer) error {
	addr := c.bind
	if addr == "" {
		addr = "0.0.0.0"
	}
	l, err := listenConfig.Listen(ctx, net.JoinHostPort(addr, strconv.Itoa(c.port)))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "cmtime: listening on %v\n", l.Addr())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer l.Close()
	var mu sync.Mutex // out
	for {
		req, err := l.Request(ctx)
		if ctx.Err() != nil {
			return nil // interrupted: the normal end of a server
		}
		if err != nil {
			return err
		}
		// Accept waits for the dialer's RTU: one goroutine each, so that a
		// dialer that holds its RTU back (as a manual one may) does not
		// hold up the others.
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := req.Accept(ctx, nil)
			if err != nil {
				mu.Lock()
				fmt.Fprintf(out, "cmtime: %v\n", err) // a failed request does not end the server
				mu.Unlock()
				return
			}
			select {
			case <-conn.Done():
			case <-ctx.Done():
			}
			conn.Close()
		}()
	}
}

// node is one connection: its id and QP, and its times per step (from its
// request to the moment its answer is taken; the manual QP moves are each
// timed on their own).
type node struct {
	id     *rdmacm.ID
	qp     *verbs.QP
	d      [len(steps)]time.Duration
	timed  uint32        // bit i: step i was timed
	start  time.Duration // on now's clock
	tries  int           // resolution retries left
	failed bool
}

// add counts d to step i's time.
func (n *node) add(i int, d time.Duration) {
	n.d[i] += d
	n.timed |= 1 << i
}

// took is the node's time in step s, and whether it ran it.
func (n *node) took(s string) (time.Duration, bool) {
	i := stepIndex(s)
	return n.d[i], n.timed&(1<<i) != 0
}

// phase is one step for all connections, timed as a whole.
type phase struct {
	step string
	wall time.Duration
}

type result struct {
	conns   int
	nodes   []*node
	phases  []phase
	within  []string // steps that run inside another's phase
	err     error    // the first failure, if any
	pdErr   error    // closing the shared CQs and PD
	failed  int
	threads int
	// Counted from before the first step to after the last.
	counted profile.Counters
	perConn profile.PerOp
	peakRSS string
}

// The C tool's rows, and the manual mode's.
const (
	stepCreateID     = "create id"
	stepResolveAddr  = "resolve addr"
	stepResolveRoute = "resolve route"
	stepCreateQP     = "create qp"
	stepConnect      = "connect"
	stepDisconnect   = "disconnect"
	stepDestroy      = "destroy"
	stepInitQP       = "init qp"
	stepRTRQP        = "rtr qp"
	stepRTSQP        = "rts qp"
	stepEstablish    = "establish"
)

// steps numbers the steps: a connection's times live in an array indexed
// by them, as C's do, so that timing a connection inside a step costs what
// C's timing costs (no map update with a string key).
var steps = [...]string{stepCreateID, stepResolveAddr, stepResolveRoute, stepCreateQP, stepConnect,
	stepDisconnect, stepDestroy, stepInitQP, stepRTRQP, stepRTSQP, stepEstablish}

// A node's timed steps are bits of a uint32.
var _ [32 - len(steps)]struct{}

// stepIndex is the step's number in steps.
func stepIndex(s string) int {
	for i, name := range steps {
		if name == s {
			return i
		}
	}
	panic("cmtime: unknown step " + s)
}

// epoch is the origin of now.
var epoch = time.Now()

// now reads the monotonic clock alone (one vDSO call, as C's gettimeofday
// is one), where time.Now reads the wall clock as well.
func now() time.Duration { return time.Since(epoch) }

// connectAll runs the C client's schedule on rdmacm's thin layer, from one
// goroutine: each step for every connection before the next. The local
// calls (create id, create qp, destroy) run one connection after another
// in a loop; the steps that wait for the network send every connection's
// request in a loop, then take each answer in another, while the CM works
// on all of them. As in C, each QP is destroyed right after its
// rdma_disconnect, inside the disconnect step.
func connectAll(ctx context.Context, c config) (*result, error) {
	var src netip.Addr
	if c.bind != "" {
		var err error
		if src, err = netip.ParseAddr(c.bind); err != nil {
			return nil, fmt.Errorf("bind address: %w", err)
		}
	}
	// The C tool opens its event channel, and with it librdmacm, before its
	// clock starts; so do we.
	if err := rdmacm.Init(); err != nil {
		return nil, err
	}
	pd, dst, err := devicePD(ctx, c.server, src)
	if err != nil {
		return nil, err
	}
	cqs, err := newSharedCQs(pd, qpCap)
	if err != nil {
		pd.Close()
		return nil, err
	}
	r := &result{conns: c.conns, nodes: make([]*node, c.conns), counted: profile.Count()}
	if c.manual {
		// The modifies and the RTU follow each reply, inside connect.
		r.within = []string{stepInitQP, stepRTRQP, stepRTSQP, stepEstablish}
	}
	for i := range r.nodes {
		r.nodes[i] = &node{}
	}
	to := netip.AddrPortFrom(dst, uint16(c.port))
	timeout := time.Duration(c.timeout) * time.Millisecond
	param := rdmacm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}

	r.local(stepCreateID, func(n *node) (err error) {
		n.id, err = rdmacm.NewID(rdmacm.PortSpaceTCP)
		n.tries = c.retries
		return err
	})
	resolveAddr := func(n *node) error { return n.id.ResolveAddr(src, to, timeout) }
	r.network(ctx, stepResolveAddr, resolveAddr, retrying(rdmacm.EventAddrResolved, rdmacm.EventAddrError, resolveAddr))
	resolveRoute := func(n *node) error { return n.id.ResolveRoute(timeout) }
	r.network(ctx, stepResolveRoute, resolveRoute, retrying(rdmacm.EventRouteResolved, rdmacm.EventRouteError, resolveRoute))
	init := verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cqs.send, RecvCQ: cqs.recv, Cap: qpCap}
	r.local(stepCreateQP, func(n *node) (err error) {
		if !c.manual {
			n.qp, err = n.id.CreateQP(pd, init)
			return err
		}
		if n.qp, err = pd.CreateQP(init); err != nil {
			return err
		}
		return n.move(verbs.QPStateInit, "")
	})
	cqs.charge(r)
	r.network(ctx, stepConnect, func(n *node) error {
		p := param
		if c.manual {
			p.QPNum = n.qp.QPN
		}
		return n.id.Connect(p, nil)
	}, func(n *node, ev *rdmacm.Event) (bool, error) {
		switch {
		case ev.Type == rdmacm.EventEstablished && !c.manual:
			return true, nil
		case ev.Type == rdmacm.EventConnectResponse && c.manual:
			// The QP is ours to move, then the RTU tells the peer. INIT
			// again first, as librdmacm does: only now does the CM grant
			// remote read access.
			for _, s := range []verbs.QPState{verbs.QPStateInit, verbs.QPStateRTR, verbs.QPStateRTS} {
				if err := n.move(s, map[verbs.QPState]string{verbs.QPStateInit: stepInitQP, verbs.QPStateRTR: stepRTRQP,
					verbs.QPStateRTS: stepRTSQP}[s]); err != nil {
					return true, err
				}
			}
			i := stepIndex(stepEstablish)
			start := now()
			err := n.id.Establish()
			n.add(i, now()-start)
			return true, err
		}
		return true, unexpected(ev)
	})
	r.network(ctx, stepDisconnect, func(n *node) error {
		err := n.id.Disconnect()
		if cerr := n.qp.Close(); err == nil {
			err = cerr
		}
		n.qp = nil
		return err
	}, func(n *node, ev *rdmacm.Event) (bool, error) {
		if ev.Type == rdmacm.EventDisconnected {
			return true, nil
		}
		return true, unexpected(ev)
	})
	r.local(stepDestroy, func(n *node) error {
		err := n.id.Close()
		n.id = nil
		return err
	})
	// Every connection is released by now: the CQs and the PD must be free.
	if err := errors.Join(cqs.close(), pd.Close()); err != nil {
		r.pdErr = fmt.Errorf("closing the shared CQs and PD: %w", err)
	}
	r.perConn = r.counted.Since(c.conns)
	r.threads = pprof.Lookup("threadcreate").Count()
	r.peakRSS = procStatus("VmHWM")
	return r, nil
}

// qpCap is the C tool's: one-entry queues.
var qpCap = verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}

// move takes the node's own QP to state with the CM's attributes, timing
// it as step (unless "").
func (n *node) move(state verbs.QPState, step string) error {
	i := -1
	if step != "" {
		i = stepIndex(step)
	}
	start := now()
	a, mask, err := n.id.InitQPAttr(state)
	if err != nil {
		return err
	}
	if err := n.qp.Modify(&a, mask); err != nil {
		return err
	}
	if i >= 0 {
		n.add(i, now()-start)
	}
	return nil
}

// unexpected is the error of an event the step did not wait for: the
// event's own error if it reports a failure.
func unexpected(ev *rdmacm.Event) error {
	if err := ev.Err(); err != nil {
		return err
	}
	return fmt.Errorf("%w: %v, status %d", errUnexpected, ev.Type, ev.Status)
}

var errUnexpected = errors.New("unexpected CM event")

// retrying answers a resolution step: done on ok; on fail, the request
// again while the node has retries left, as the C tool does.
func retrying(ok, fail rdmacm.EventType, again func(*node) error) func(*node, *rdmacm.Event) (bool, error) {
	return func(n *node, ev *rdmacm.Event) (bool, error) {
		switch {
		case ev.Type == ok:
			return true, nil
		case ev.Type == fail && n.tries > 0:
			n.tries--
			return false, again(n)
		}
		return true, unexpected(ev)
	}
}

// local runs a step that waits for nothing, for every connection in a
// loop, timing the phase and each connection.
func (r *result) local(s string, f func(*node) error) {
	i := stepIndex(s)
	begin := time.Now()
	for _, n := range r.live() {
		start := now()
		err := f(n)
		n.add(i, now()-start)
		r.check(n, err)
	}
	r.phases = append(r.phases, phase{s, time.Since(begin)})
}

// network runs a step as C does: a loop that sends every connection's
// request, then one that takes each connection's answer (answer reports
// whether the step is done, or sent its request again).
func (r *result) network(ctx context.Context, s string, send func(*node) error, answer func(*node, *rdmacm.Event) (bool, error)) {
	i := stepIndex(s)
	begin := time.Now()
	for _, n := range r.live() {
		n.start = now()
		r.check(n, send(n))
	}
	for _, n := range r.live() {
		for {
			ev, err := n.id.Event(ctx)
			if err != nil {
				r.check(n, err)
				break
			}
			done, err := answer(n, ev)
			if done || err != nil {
				n.add(i, now()-n.start)
				r.check(n, err)
				break
			}
		}
	}
	r.phases = append(r.phases, phase{s, time.Since(begin)})
}

func (r *result) live() []*node {
	var out []*node
	for _, n := range r.nodes {
		if !n.failed {
			out = append(out, n)
		}
	}
	return out
}

// check drops a connection that failed, releasing its QP and id.
func (r *result) check(n *node, err error) {
	if err == nil {
		return
	}
	n.failed = true
	if n.qp != nil {
		n.qp.Close()
	}
	if n.id != nil {
		n.id.Close()
	}
	r.failed++
	if r.err == nil {
		r.err = err
	}
}

// sharedCQs are the send and receive CQ that all connections share, as
// the C tool's do: its first rdma_create_qp makes a pair of CQs and, as
// librdmacm does, writes them back into the attributes the tool passes
// again for every other connection, which then reuses them. Ours are made
// before the clock starts, and the time that took is charged to the create
// qp step, where C pays it.
type sharedCQs struct {
	send, recv *verbs.CQ
	took       time.Duration
}

func newSharedCQs(pd *verbs.PD, cp verbs.QPCap) (*sharedCQs, error) {
	dev := pd.Device()
	start := time.Now()
	send, err := dev.CreateCQ(int(cp.MaxSendWR))
	if err != nil {
		return nil, err
	}
	recv, err := dev.CreateCQ(int(cp.MaxRecvWR))
	if err != nil {
		send.Close()
		return nil, err
	}
	return &sharedCQs{send: send, recv: recv, took: time.Since(start)}, nil
}

// charge adds the CQs' creation to the create qp step: to its wall time
// and to the first connection's own time, as in C.
func (q *sharedCQs) charge(r *result) {
	for i := range r.phases {
		if r.phases[i].step == stepCreateQP {
			r.phases[i].wall += q.took
		}
	}
	for _, n := range r.nodes {
		if _, ok := n.took(stepCreateQP); ok {
			n.add(stepIndex(stepCreateQP), q.took)
			return
		}
	}
}

func (q *sharedCQs) close() error { return errors.Join(q.send.Close(), q.recv.Close()) }

// devicePD allocates the PD that all connections share, on librdmacm's
// context of the device the route to the server leaves by, before the
// clock starts (the C tool's QPs share librdmacm's PD of the device,
// allocated once, with the first id that resolves to it). It also looks
// the server's name up, as the C tool does before its clock starts.
func devicePD(ctx context.Context, server string, src netip.Addr) (*verbs.PD, netip.Addr, error) {
	path, err := resolver.ResolveHost(ctx, server, resolver.Options{Source: src})
	if err != nil {
		return nil, netip.Addr{}, fmt.Errorf("the RDMA device towards %s: %w", server, err)
	}
	dev, err := rdmacm.OpenDevice(path.Device)
	if err != nil {
		return nil, netip.Addr{}, err
	}
	pd, err := dev.AllocPD()
	return pd, path.Destination, err
}

// procStatus is one field of /proc/self/status.
func procStatus(field string) string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "?"
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return "?"
}

// row is one step of the table.
type row struct {
	step     string
	total    time.Duration // wall time of the step for all connections
	max, min time.Duration // of one connection
	perConn  time.Duration // total / connections
}

// rows makes the table: a row per phase, its total the phase's wall time,
// then a row per step that ran inside another phase, its total the sum of
// the connections' times. Max and min are one connection's.
func (r *result) rows() []row {
	var rows []row
	add := func(s string, total time.Duration, sum bool) {
		w := row{step: s, min: -1}
		seen := false
		for _, n := range r.nodes {
			if d, ok := n.took(s); ok {
				seen = true
				w.max = max(w.max, d)
				if w.min < 0 || d < w.min {
					w.min = d
				}
				if sum {
					w.total += d
				}
			}
		}
		if sum && !seen {
			return // no connection got that far
		}
		if !sum {
			w.total = total
		}
		w.min = max(w.min, 0)
		w.perConn = w.total / time.Duration(r.conns)
		rows = append(rows, w)
	}
	for _, p := range r.phases {
		add(p.step, p.wall, false)
	}
	for _, s := range r.within {
		add(s, 0, true)
	}
	return rows
}

func (r *result) print(out io.Writer) {
	fmt.Fprintf(out, "step              total ms     max ms     min us  us / conn\n")
	for _, w := range r.rows() {
		fmt.Fprintf(out, "%-13s: %11.2f%11.2f%11.2f%11.2f\n", w.step, ms(w.total), ms(w.max), us(w.min), us(w.perConn))
	}
	fmt.Fprintf(out, "go process: %d OS threads created, peak RSS %s, per connection %.1f cgo calls and %.1f allocations\n",
		r.threads, r.peakRSS, r.perConn.CgoCalls, r.perConn.Allocs)
	if r.err != nil {
		fmt.Fprintf(out, "%d of %d connections failed; the first: %v\n", r.failed, r.conns, r.err)
	}
	if r.pdErr != nil {
		fmt.Fprintf(out, "%v\n", r.pdErr)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
