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

// options are the C tool's: one-entry queues, one read in flight, no
// private data.
func options(c config) *rdmacm.Options {
	return &rdmacm.Options{
		Cap:                verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1},
		RawPrivateData:     true,
		ResponderResources: 1,
		InitiatorDepth:     1,
		Backlog:            1024,
	}
}

func serve(ctx context.Context, c config, out io.Writer) error {
	addr := c.bind
	if addr == "" {
		addr = "0.0.0.0"
	}
	l, err := rdmacm.Listen(net.JoinHostPort(addr, strconv.Itoa(c.port)), options(c))
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

// node is one connection: its Connector, then its Conn, and its times per
// step (a step may occur twice: the manual dialer takes its QP to INIT
// again after the reply).
type node struct {
	o      *rdmacm.Options
	c      *rdmacm.Connector
	conn   *rdmacm.Conn
	d      map[rdmacm.Step]time.Duration
	failed bool
}

// phase is one step for all connections, timed as a whole.
type phase struct {
	step rdmacm.Step
	wall time.Duration
}

type result struct {
	conns   int
	nodes   []*node
	phases  []phase
	within  []rdmacm.Step // steps that run inside another's phase
	err     error         // the first failure, if any
	pdErr   error         // closing the shared CQs and PD
	failed  int
	threads int
	peakRSS string
}

// connectAll runs the C client's schedule: each step for every connection
// before the next step, from one goroutine. The local calls (create id,
// create qp, destroy) run one connection after another in a loop; the
// steps that wait for the network send every connection's request in a
// loop, then wait for each answer in another.
func connectAll(ctx context.Context, c config) (*result, error) {
	dst := net.JoinHostPort(c.server, strconv.Itoa(c.port))
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
	pd, err := devicePD(ctx, c.server, src)
	if err != nil {
		return nil, err
	}
	cqs, err := newSharedCQs(pd, options(c).Cap)
	if err != nil {
		pd.Close()
		return nil, err
	}
	r := &result{conns: c.conns, nodes: make([]*node, c.conns)}
	if c.manual {
		// The modifies and the RTU follow each reply, inside Connect.
		r.within = []rdmacm.Step{rdmacm.StepInitQP, rdmacm.StepRTRQP, rdmacm.StepRTSQP, rdmacm.StepEstablish}
	}
	for i := range r.nodes {
		n := &node{d: map[rdmacm.Step]time.Duration{}, o: options(c)}
		r.nodes[i] = n
		o := n.o
		o.Source = src
		o.PD = pd
		o.SendCQ, o.RecvCQ = cqs.send, cqs.recv
		// As in C cmtime, -t bounds address and route resolution; the
		// connect waits as long as the CM itself keeps trying, which a
		// server working through a thousand requests needs.
		step := time.Duration(c.timeout) * time.Millisecond
		o.ResolveAddrTimeout, o.ResolveRouteTimeout = step, step
		o.ConnectTimeout, o.CloseTimeout = time.Minute, time.Minute
		o.ResolveRetries = c.retries
		if c.retries == 0 {
			o.ResolveRetries = -1
		}
		if c.manual {
			o.Mode = rdmacm.ModeManual
		}
		// Each node's steps run on one goroutine at a time, the phases
		// one after another: its map needs no lock.
		o.Trace = func(s rdmacm.Step, _ time.Time, d time.Duration) { n.d[s] += d }
	}
	r.run(rdmacm.StepCreateID, func(n *node) (err error) {
		n.c, err = rdmacm.NewConnector(dst, n.o)
		return err
	})
	r.startWait(rdmacm.StepResolveAddr, startStep(rdmacm.StepResolveAddr), func(n *node) error { return n.c.ResolveAddr(ctx) })
	r.startWait(rdmacm.StepResolveRoute, startStep(rdmacm.StepResolveRoute), func(n *node) error { return n.c.ResolveRoute(ctx) })
	r.run(rdmacm.StepCreateQP, func(n *node) error { return n.c.CreateQP() })
	cqs.charge(r)
	r.startWait(rdmacm.StepConnect, startStep(rdmacm.StepConnect), func(n *node) (err error) {
		n.conn, err = n.c.Connect(ctx)
		return err
	})
	r.startWait(rdmacm.StepDisconnect, func(n *node) error { return n.conn.StartDisconnect() },
		func(n *node) error { return n.conn.Disconnect(ctx) })
	// Close releases the QP, then the id: two rows, each the sum of the
	// connections' times, as the loop takes them one after another.
	r.run(-1, func(n *node) error { return n.conn.Close() })
	r.within = append(r.within, rdmacm.StepDestroyQP, rdmacm.StepDestroyID)
	// Every connection is closed by now, unless an interrupted iWARP dial
	// still releases its QP in the background: then the CQs and the PD are
	// busy, and that is reported rather than left behind unsaid.
	if err := errors.Join(cqs.close(), pd.Close()); err != nil {
		r.pdErr = fmt.Errorf("closing the shared CQs and PD: %w", err)
	}
	r.threads = pprof.Lookup("threadcreate").Count()
	r.peakRSS = procStatus("VmHWM")
	return r, nil
}

// startWait runs network step s as C does: a loop that sends every
// connection's request, then one that waits for each answer.
func (r *result) startWait(s rdmacm.Step, send, wait func(*node) error) {
	begin := time.Now()
	r.run(-1, send)
	r.run(-1, wait)
	r.phases = append(r.phases, phase{s, time.Since(begin)})
}

// startStep sends a connection's request for step s (Connector.Start).
func startStep(s rdmacm.Step) func(*node) error {
	return func(n *node) error { return n.c.Start(s) }
}

// run takes every connection still going through step s in a loop, and
// records the step's wall time (unless s is negative). A connection that
// fails is released and drops out.
func (r *result) run(s rdmacm.Step, f func(*node) error) {
	start := time.Now()
	for _, n := range r.nodes {
		if n.failed {
			continue
		}
		if err := f(n); err != nil {
			n.failed = true
			if n.c != nil {
				n.c.Close()
			}
			if n.conn != nil {
				n.conn.Close()
			}
			r.failed++
			if r.err == nil {
				r.err = err
			}
		}
	}
	if s >= 0 {
		r.phases = append(r.phases, phase{s, time.Since(start)})
	}
}

// sharedCQs are the send and receive CQ that all connections share, as
// the C tool's do: its first rdma_create_qp makes a pair of CQs and, as
// librdmacm does, writes them back into the attributes the tool passes
// again for every other connection, which then reuses them. Ours are made
// before the clock starts (Options are fixed when a Connector is made), and
// the time that took is charged to the create qp step, where C pays it.
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
		if r.phases[i].step == rdmacm.StepCreateQP {
			r.phases[i].wall += q.took
		}
	}
	for _, n := range r.nodes {
		if _, ok := n.d[rdmacm.StepCreateQP]; ok {
			n.d[rdmacm.StepCreateQP] += q.took
			return
		}
	}
}

func (q *sharedCQs) close() error { return errors.Join(q.send.Close(), q.recv.Close()) }

// devicePD allocates the PD that all connections share. The C tool's QPs
// share librdmacm's PD of the device, allocated once, with the first id
// that resolves to it; ours is allocated once as well, on the device the
// route to the server leaves by, before the clock starts.
func devicePD(ctx context.Context, server string, src netip.Addr) (*verbs.PD, error) {
	path, err := resolver.ResolveHost(ctx, server, resolver.Options{Source: src})
	if err != nil {
		return nil, fmt.Errorf("the RDMA device towards %s: %w", server, err)
	}
	dev, err := rdmacm.OpenDevice(path.Device)
	if err != nil {
		return nil, err
	}
	return dev.AllocPD()
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
	add := func(s rdmacm.Step, total time.Duration, sum bool) {
		w := row{step: s.String(), min: -1}
		seen := false
		for _, n := range r.nodes {
			if d, ok := n.d[s]; ok {
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
	fmt.Fprintf(out, "go process: %d OS threads created, peak RSS %s\n", r.threads, r.peakRSS)
	if r.err != nil {
		fmt.Fprintf(out, "%d of %d connections failed; the first: %v\n", r.failed, r.conns, r.err)
	}
	if r.pdErr != nil {
		fmt.Fprintf(out, "%v\n", r.pdErr)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
