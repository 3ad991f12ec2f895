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

// barrier holds each connection's k-th step until every connection still
// running has done its k-th step, as the C tool runs one step at a time.
// Within a step it schedules the connections as C's loops do: the steps
// that are local calls (create id, create qp, the modifies, destroy) are
// taken in turns, one connection after another, and those that wait for
// the network start together, their answers arriving in any order.
type barrier struct {
	mu      sync.Mutex
	parties int
	seq     []rdmacm.Step   // the steps expected, in order
	done    int             // parties through the running step
	queue   []chan struct{} // parties waiting for their turn at the running step
	next    []chan struct{} // parties through it, waiting for the next
	release time.Time       // when the running step began
	walls   []time.Duration // per step that ended
	steps   []rdmacm.Step   // per step that ended, as reported
}

// inTurns lists the steps that C cmtime runs in a loop of local calls.
var inTurns = map[rdmacm.Step]bool{
	rdmacm.StepCreateID: true, rdmacm.StepCreateQP: true, rdmacm.StepInitQP: true, rdmacm.StepRTRQP: true,
	rdmacm.StepRTSQP: true, rdmacm.StepEstablish: true, rdmacm.StepDestroyQP: true, rdmacm.StepDestroyID: true,
}

// stepsOf is the order in which a dial and close report their steps.
func stepsOf(manual bool) []rdmacm.Step {
	if manual {
		return []rdmacm.Step{rdmacm.StepCreateID, rdmacm.StepResolveAddr, rdmacm.StepResolveRoute, rdmacm.StepCreateQP,
			rdmacm.StepInitQP, rdmacm.StepConnect, rdmacm.StepInitQP, rdmacm.StepRTRQP, rdmacm.StepRTSQP,
			rdmacm.StepEstablish, rdmacm.StepDisconnect, rdmacm.StepDestroyQP, rdmacm.StepDestroyID}
	}
	return []rdmacm.Step{rdmacm.StepCreateID, rdmacm.StepResolveAddr, rdmacm.StepResolveRoute, rdmacm.StepCreateQP,
		rdmacm.StepConnect, rdmacm.StepDisconnect, rdmacm.StepDestroyQP, rdmacm.StepDestroyID}
}

func newBarrier(seq []rdmacm.Step) *barrier {
	return &barrier{seq: seq}
}

// join adds a party, which waits on turn for each step to begin.
func (b *barrier) join(turn chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.parties++
	b.queue = append(b.queue, turn)
}

// start begins the first step.
func (b *barrier) start() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.release = time.Now()
	b.letGo()
}

// running is the step under way, as expected.
func (b *barrier) running() (rdmacm.Step, bool) {
	if k := len(b.walls); k < len(b.seq) {
		return b.seq[k], true
	}
	return 0, false
}

// letGo starts the next party waiting at the running step, or all of them.
func (b *barrier) letGo() {
	if s, ok := b.running(); ok && inTurns[s] {
		if len(b.queue) > 0 {
			b.queue[0] <- struct{}{}
			b.queue = b.queue[1:]
		}
		return
	}
	for _, t := range b.queue {
		t <- struct{}{}
	}
	b.queue = nil
}

// arrive records that a party did step s, and waits on turn until the next
// step lets it go.
func (b *barrier) arrive(s rdmacm.Step, turn chan struct{}) {
	b.mu.Lock()
	b.done++
	b.next = append(b.next, turn)
	if len(b.steps) == len(b.walls) {
		b.steps = append(b.steps, s)
	}
	b.advance()
	b.mu.Unlock()
	<-turn
}

// leave drops a party that failed or finished. A failure in a step taken in
// turns passes the turn on.
func (b *barrier) leave() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.parties--
	b.advance()
}

// advance ends the running step once every party is through it, else lets
// the next party in turn go.
func (b *barrier) advance() {
	if b.done < b.parties || b.parties == 0 {
		if len(b.queue) > 0 {
			if s, ok := b.running(); ok && inTurns[s] {
				b.letGo()
			}
		}
		return
	}
	now := time.Now()
	b.walls = append(b.walls, now.Sub(b.release))
	b.release = now
	b.done, b.queue, b.next = 0, b.next, nil
	b.letGo()
}

// node is one connection's times, per step (a step may occur twice: the
// manual dialer takes its QP to INIT again after the reply).
type node struct {
	d  map[rdmacm.Step]time.Duration
	ok bool
}

type result struct {
	conns   int
	nodes   []*node
	b       *barrier
	err     error // the first failure, if any
	pdErr   error // closing the shared PD
	failed  int
	threads int
	peakRSS string
}

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
	r := &result{conns: c.conns, nodes: make([]*node, c.conns), b: newBarrier(stepsOf(c.manual))}
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		r.failed++
		if r.err == nil {
			r.err = err
		}
	}
	// The goroutines are up before the clock starts, as C starts its
	// threads before its first step.
	var ready sync.WaitGroup
	var wg sync.WaitGroup
	for i := range r.nodes {
		n := &node{d: map[rdmacm.Step]time.Duration{}}
		r.nodes[i] = n
		o := options(c)
		o.Source = src
		o.PD = pd
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
		turn := make(chan struct{}, 1)
		o.Trace = func(s rdmacm.Step, _ time.Time, d time.Duration) {
			n.d[s] += d
			r.b.arrive(s, turn)
		}
		r.b.join(turn)
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			defer r.b.leave()
			ready.Done()
			<-turn
			conn, err := rdmacm.Dial(ctx, dst, o)
			if err != nil {
				fail(err)
				return
			}
			n.ok = true
			if err := conn.Close(); err != nil {
				fail(err)
			}
		}()
	}
	ready.Wait()
	r.b.start()
	wg.Wait()
	// Every connection is closed by now, unless an interrupted iWARP dial
	// still releases its QP in the background: then the PD is busy, and
	// that is reported rather than left behind unsaid.
	if err := pd.Close(); err != nil {
		r.pdErr = fmt.Errorf("closing the shared PD: %w", err)
	}
	r.threads = pprof.Lookup("threadcreate").Count()
	r.peakRSS = procStatus("VmHWM")
	return r, nil
}

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

// rows aggregates the barrier's walls and the nodes' times by step, in the
// order the steps ran.
func (r *result) rows() []row {
	var rows []row
	index := map[rdmacm.Step]int{}
	for k, s := range r.b.steps {
		if k >= len(r.b.walls) {
			break
		}
		i, ok := index[s]
		if !ok {
			i = len(rows)
			index[s] = i
			rows = append(rows, row{step: s.String(), min: -1})
		}
		rows[i].total += r.b.walls[k]
	}
	for s, i := range index {
		w := &rows[i]
		for _, n := range r.nodes {
			if d, ok := n.d[s]; ok {
				w.max = max(w.max, d)
				if w.min < 0 || d < w.min {
					w.min = d
				}
			}
		}
		w.min = max(w.min, 0)
		w.perConn = w.total / time.Duration(r.conns)
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
