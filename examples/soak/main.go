// Command soak runs mixed traffic over rdmacm/msg and rdmacm/stream on
// each RDMA device of a test bed guest for a few minutes, with connections
// opened and closed continually and server processes killed at random, and
// reports the operations, the errors by kind and the leaks at the end. It
// fails (exit 1) on data corruption, on an operation that outlives its
// timeout (a hang), on a protocol error, or on a leak.
//
//	soak -duration 3m -out bench/soak.md     # in a guest: bin/rdmavm exec $PWD/bin/soak ...
//
// The coordinator (this process) starts -servers server processes per
// device (this program again, with -serve-msg and -serve-stream), whose
// listeners have keepalive probes on; its workers dial a random one,
// exchange messages or stream bytes and check every byte, and close after a
// random short lifetime; a killer per device SIGKILLs a random server at
// random intervals and starts a new one on other ports. At the end everything is closed, the last servers are
// stopped (they check their own leaks), and the coordinator compares its
// RDMA objects, file descriptors and goroutines with a snapshot taken at
// the start.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/rdmago/examples/internal/command"
	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/rdmacm/msg"
	"github.com/rdmago/rdmago/test/testbed"
)

func main() { command.Main("soak", run) }

type config struct {
	duration, killEvery, opTimeout time.Duration
	lifetime                       time.Duration
	keepAlive, keepAliveTimeout    time.Duration
	devices                        string
	msgWorkers, streamWorkers      int
	siwMsgWorkers, siwStreamWorker int
	servers                        int
	out                            string
	seed                           uint64

	// The server role.
	serveMsg, serveStream, device string
}

func parse(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.DurationVar(&c.duration, "duration", 3*time.Minute, "how long traffic runs")
	fs.DurationVar(&c.killEvery, "kill-every", 8*time.Second, "mean interval between server kills, per device (0: none)")
	fs.DurationVar(&c.opTimeout, "op-timeout", 15*time.Second, "an operation still waiting after this long is a hang")
	fs.DurationVar(&c.lifetime, "lifetime", 2*time.Second, "longest life of a connection (each gets a random one up to this)")
	fs.DurationVar(&c.keepAlive, "keepalive", 300*time.Millisecond, "msg Config.KeepAlive, both sides")
	fs.DurationVar(&c.keepAliveTimeout, "keepalive-timeout", time.Second, "msg Config.KeepAliveTimeout, both sides")
	fs.StringVar(&c.devices, "devices", "rxe0,siw0", "RDMA devices of the test bed to soak, comma-separated")
	fs.IntVar(&c.msgWorkers, "msg-workers", 4, "msg workers per rxe device")
	fs.IntVar(&c.streamWorkers, "stream-workers", 3, "stream workers per rxe device")
	fs.IntVar(&c.siwMsgWorkers, "siw-msg-workers", 2, "msg workers per siw device (siw holds few connections a process)")
	fs.IntVar(&c.siwStreamWorker, "siw-stream-workers", 2, "stream workers per siw device")
	fs.IntVar(&c.servers, "servers", 2, "server processes per device (the workers pick one at random)")
	fs.StringVar(&c.out, "out", "", "write the Markdown report to `file`")
	fs.Uint64Var(&c.seed, "seed", 0, "random seed (0: from the clock)")
	fs.StringVar(&c.serveMsg, "serve-msg", "", "server role: msg listener `address`")
	fs.StringVar(&c.serveStream, "serve-stream", "", "server role: stream listener `address`")
	fs.StringVar(&c.device, "device", "rxe0", "server role: the listeners' device")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case (c.serveMsg == "") != (c.serveStream == ""):
		return c, errors.New("the server role needs -serve-msg and -serve-stream")
	case c.duration <= 0 || c.opTimeout <= 0 || c.lifetime <= 0 || c.killEvery < 0:
		return c, errors.New("-duration, -op-timeout and -lifetime must be positive, -kill-every not negative")
	case c.servers < 1:
		return c, errors.New("-servers must be 1 or more")
	case c.msgWorkers < 0 || c.streamWorkers < 0 || c.siwMsgWorkers < 0 || c.siwStreamWorker < 0:
		return c, errors.New("worker counts must not be negative")
	}
	if c.seed == 0 {
		c.seed = uint64(time.Now().UnixNano())
	}
	return c, nil
}

func (c config) msgConfig() msg.Config {
	if c.keepAlive <= 0 {
		return msg.Config{} // no probes
	}
	return msg.Config{KeepAlive: c.keepAlive, KeepAliveTimeout: c.keepAliveTimeout}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	c, err := parse(args, out)
	if err != nil {
		return err
	}
	if c.serveMsg != "" {
		return serve(ctx, c, out)
	}
	r, err := soak(ctx, c)
	if r == nil {
		return err
	}
	// A server that failed to restart still leaves a report of the run
	// so far: written before that error is returned.
	if c.out != "" {
		if werr := os.WriteFile(c.out, []byte(r.markdown()), 0o644); werr != nil {
			return errors.Join(err, werr)
		}
	}
	fmt.Fprintln(out, r.summary())
	if err != nil {
		return err
	}
	if f := r.failures(); len(f) > 0 {
		return fmt.Errorf("%d failure(s)", len(f))
	}
	return nil
}

// server is one server process.
type server struct {
	id                  int
	msgAddr, streamAddr string
	cmd                 *exec.Cmd
	stdin               io.WriteCloser
	lines               chan string // its standard output
	killed              atomic.Bool
	killedAt            atomic.Int64 // unix nanoseconds, set before the SIGKILL
	waited              chan struct{}
	waitErr             error
}

// device is one device under soak: its current server and its figures.
type device struct {
	name, kind, addr string
	base             int // first port
	st               *stats

	mu   sync.Mutex
	cur  []*server // the servers, one a slot; a killed one stays until its replacement listens
	next int       // incarnations so far
}

// current is the server of a random slot.
func (d *device) current(rng *rand.Rand) *server {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cur[rng.IntN(len(d.cur))]
}

// all is every slot's server.
func (d *device) all() []*server {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*server(nil), d.cur...)
}

// start starts a server process on new ports and waits until it listens.
func (d *device) start(c config) (*server, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	id := d.next
	d.next++
	d.mu.Unlock()
	port := d.base + 2*(id%400)
	s := &server{id: id, msgAddr: fmt.Sprintf("%s:%d", d.addr, port), streamAddr: fmt.Sprintf("%s:%d", d.addr, port+1),
		lines: make(chan string, 4), waited: make(chan struct{})}
	s.cmd = exec.Command(self, "-serve-msg", s.msgAddr, "-serve-stream", s.streamAddr, "-device", d.name,
		"-keepalive", c.keepAlive.String(), "-keepalive-timeout", c.keepAliveTimeout.String())
	s.cmd.Stderr = os.Stderr
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	d.st.add(func(ds *deviceStats) { ds.Servers++ })
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
		s.waitErr = s.cmd.Wait()
		close(s.waited)
	}()
	select {
	case l, ok := <-s.lines:
		if ok && l == "ready" {
			return s, nil
		}
		s.kill()
		return nil, fmt.Errorf("%s server %d: said %q instead of ready", d.name, id, l)
	case <-time.After(30 * time.Second):
		s.kill()
		return nil, fmt.Errorf("%s server %d: not ready within 30 s", d.name, id)
	}
}

// kill SIGKILLs s and waits for it.
func (s *server) kill() {
	s.killedAt.Store(time.Now().UnixNano())
	s.killed.Store(true)
	s.cmd.Process.Kill()
	for range s.lines {
	}
	<-s.waited
}

// stop closes s's standard input, which has it close everything and report
// its leaks, and waits for it.
func (s *server) stop() string {
	if s.killed.Swap(true) { // errors from here on are the stop's
		return "none" // killed, not restarted: the run failed anyway
	}
	s.stdin.Close()
	leaks := "no leak report"
	timeout := time.After(20 * time.Second)
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				<-s.waited
				return leaks
			}
			if rest, found := strings.CutPrefix(l, "leaks: "); found {
				leaks = rest
			}
		case <-timeout:
			s.kill()
			return "did not stop within 20 s"
		}
	}
}

func soak(ctx context.Context, c config) (*report, error) {
	topo, err := testbed.Load()
	if err != nil {
		return nil, err
	}
	var devs []*device
	for i, name := range strings.Split(c.devices, ",") {
		var found *testbed.Device
		for j := range topo.Devices {
			if topo.Devices[j].Name == name && topo.Devices[j].Netns == "" && topo.Devices[j].IPv4 != "" {
				found = &topo.Devices[j]
			}
		}
		if found == nil {
			return nil, fmt.Errorf("no device %q with an IPv4 address in this guest's initial namespace", name)
		}
		devs = append(devs, &device{name: name, kind: found.Kind, addr: found.IPv4, base: 17000 + 1000*i,
			st: newStats(name, found.Kind, found.IPv4)})
	}
	// librdmacm opens every device on first use and keeps them: before the
	// leak snapshot.
	if _, err := rdmacm.OpenDevice(devs[0].name); err != nil {
		return nil, err
	}
	snap, err := testbed.TakeSnapshot()
	if err != nil {
		return nil, err
	}
	r := &report{Start: time.Now()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		r.Kernel = strings.TrimSpace(string(b))
	}
	r.Settings = fmt.Sprintf("%d server processes per device; per rxe device %d msg and %d stream workers, per siw device %d and %d; connections live "+
		"up to %v; one of them killed every %v on average; keepalive %v, timeout %v; operation timeout %v; seed %d",
		c.servers, c.msgWorkers, c.streamWorkers, c.siwMsgWorkers, c.siwStreamWorker, c.lifetime, c.killEvery,
		c.keepAlive, c.keepAliveTimeout, c.opTimeout, c.seed)
	for _, d := range devs {
		for range c.servers {
			s, err := d.start(c)
			if err != nil {
				for _, d := range devs {
					for _, s := range d.all() {
						s.kill()
					}
				}
				return nil, err
			}
			d.cur = append(d.cur, s)
		}
	}

	runCtx, cancel := context.WithTimeout(ctx, c.duration)
	defer cancel()
	var wg sync.WaitGroup
	var startErrs []error
	var errMu sync.Mutex
	for di, d := range devs {
		nm, ns := c.msgWorkers, c.streamWorkers
		if d.kind == "siw" {
			nm, ns = c.siwMsgWorkers, c.siwStreamWorker
		}
		for i := 0; i < nm+ns; i++ {
			w := &worker{c: c, d: d, rng: rand.New(rand.NewPCG(c.seed, uint64(di<<16|i)))}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i < nm {
					w.loop(runCtx, w.msgConn)
				} else {
					w.loop(runCtx, w.streamConn)
				}
			}()
		}
		if c.killEvery > 0 {
			rng := rand.New(rand.NewPCG(c.seed, uint64(di<<16|0xffff)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := d.killer(runCtx, c, rng); err != nil {
					errMu.Lock()
					startErrs = append(startErrs, err)
					errMu.Unlock()
					cancel()
				}
			}()
		}
	}
	wg.Wait()
	r.Duration = time.Since(r.Start)
	for _, d := range devs {
		for _, s := range d.all() {
			if l := s.stop(); l != "none" {
				r.ServerLeaks = append(r.ServerLeaks, fmt.Sprintf("%s server %d: %s", d.name, s.id, l))
			}
		}
	}
	r.Leaks = testbed.LeaksSince(snap, 10*time.Second)
	for _, d := range devs {
		r.Devices = append(r.Devices, d.st.snapshot())
	}
	if len(startErrs) > 0 {
		return r, errors.Join(startErrs...)
	}
	return r, nil
}

// killer kills d's server at random intervals and starts another.
func (d *device) killer(ctx context.Context, c config, rng *rand.Rand) error {
	for {
		wait := c.killEvery/2 + time.Duration(rng.Int64N(int64(c.killEvery)+1))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		slot := rng.IntN(c.servers)
		old := d.all()[slot]
		old.kill()
		at := time.Unix(0, old.killedAt.Load())
		fmt.Fprintf(os.Stderr, "soak: %s %s: killed server %d (gone %v later)\n", at.Format("15:04:05.000"), d.name,
			old.id, time.Since(at).Round(time.Millisecond))
		d.st.add(func(ds *deviceStats) { ds.Kills++ })
		// Dials meanwhile go to the dead server's ports.
		time.Sleep(time.Duration(rng.Int64N(int64(500 * time.Millisecond))))
		s, err := d.start(c)
		if err != nil {
			return err
		}
		d.mu.Lock()
		d.cur[slot] = s
		d.mu.Unlock()
		fmt.Fprintf(os.Stderr, "soak: %s %s: server %d listens\n", time.Now().Format("15:04:05.000"), d.name, s.id)
	}
}
