// Package testbed runs real RDMA devices, Soft-RoCE (rxe) and Soft-iWARP
// (siw), for tests on machines whose kernel has no RDMA support.
//
// A guest is a qemu virtual machine booting Debian's own kernel with rdma_rxe
// and an out-of-tree siw module. It sees the host's file system read-only
// (with a throw-away overlay on top), so host binaries, including go test
// binaries linked against the host's libibverbs, run in it unchanged. A small
// agent in the guest runs commands for the host; Guest.Command has the shape
// of os/exec.
//
// Two layouts exist. Boot starts the default single guest: rxe0 on a veth
// with IPv4, IPv6 and a VLAN upper; siw0 on a dummy; and two siw hosts (siwa,
// siwb) in network namespaces joined by a veth pair. BootPair starts two
// guests joined by two virtual links, each with an rxe and a siw device: two
// rxe devices in one kernel cannot reach each other, so two RoCE hosts need
// two kernels. Inside a guest, Load (or Require in tests) returns the
// Topology.
//
// The command rdmavm (test/testbed/cmd/rdmavm) wraps this package for
// 'go test -exec', for running a command in a guest and for a debugging shell.
package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rdmago/rdmago/test/testbed/internal/agent"
)

// Options configure how guests boot. The zero value is ready to use.
type Options struct {
	// Cache holds the prepared kernel, modules and initramfs. Default:
	// $RDMAGO_TESTBED_CACHE, else the user cache directory's rdmago/testbed.
	Cache string
	// Writable host directories, mounted read-write in the guest at the same
	// paths (everything else is read-only). Default: the Go module root
	// enclosing the current directory, or the current directory.
	Writable []string
	// CPUs and MemoryMB per guest. Defaults: 2 and 2048. One vCPU makes
	// busy-polling ping-pong about a hundred times slower under emulation.
	CPUs     int
	MemoryMB int
	// Progress receives what the test bed is doing ("preparing…", "booting…").
	// Default: os.Stderr. Use io.Discard to silence it.
	Progress io.Writer
	// BootTimeout bounds the wait for a guest's agent. Default: 3 minutes.
	BootTimeout time.Duration
	// CostModel boots a guest whose clock counts instructions instead of
	// following the host's: single-threaded emulation with qemu's
	// -icount shift=0,sleep=off, so that one guest nanosecond is one guest
	// instruction and idle time jumps to the next timer. Timings inside it
	// repeat within a few percent whatever else the host is doing, which
	// makes Go-against-C ratios comparable to a few percent (see
	// bench/notes.md). It always emulates (KVM has no instruction count)
	// and runs one vCPU: with two, the guest hangs bringing up the second
	// CPU. Busy-polling ends sharing that vCPU measure the scheduler, not
	// the device: measure them on a normal guest.
	CostModel bool
}

func (o *Options) progress() io.Writer {
	if o.Progress == nil {
		return os.Stderr
	}
	return o.Progress
}

func (o *Options) logf(format string, args ...any) {
	fmt.Fprintf(o.progress(), "testbed: "+format+"\n", args...)
}

func (o *Options) withDefaults() (Options, error) {
	r := *o
	if r.Cache == "" {
		r.Cache = os.Getenv("RDMAGO_TESTBED_CACHE")
	}
	if r.Cache == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return r, fmt.Errorf("testbed: no cache directory: set RDMAGO_TESTBED_CACHE: %w", err)
		}
		r.Cache = filepath.Join(dir, "rdmago", "testbed")
	}
	abs, err := filepath.Abs(r.Cache)
	if err != nil {
		return r, err
	}
	r.Cache = abs
	if len(r.Writable) == 0 {
		r.Writable = []string{WorkDir()}
	}
	if r.CostModel && r.CPUs > 1 {
		return r, fmt.Errorf("testbed: a cost-model guest runs one vCPU, not %d (qemu's instruction counting hangs bringing up a second)", r.CPUs)
	}
	if r.CPUs == 0 {
		r.CPUs = 2
		if r.CostModel {
			r.CPUs = 1
		}
	}
	if r.MemoryMB == 0 {
		r.MemoryMB = 2048
	}
	if r.BootTimeout == 0 {
		r.BootTimeout = 3 * time.Minute
	}
	return r, nil
}

// WorkDir is the default writable directory: the Go module root enclosing
// the current directory, or the current directory.
func WorkDir() string {
	cwd, err := os.Getwd()
	if err != nil {
		return "/"
	}
	for dir := cwd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if dir == filepath.Dir(dir) {
			return cwd
		}
	}
}

// Guest is one running virtual machine.
type Guest struct {
	// Topology is what the guest built, as it reported it.
	Topology *Topology

	opts    Options
	qemu    *exec.Cmd
	tmp     string // console log, control socket
	conn    *agent.Conn
	sock    net.Conn
	exited  chan struct{} // closed when qemu has exited
	readerr chan struct{} // closed when the agent connection has ended

	mu     sync.Mutex
	nextID uint64
	cmds   map[uint64]*Cmd
	err    error // why the connection ended
	closed bool
}

// Boot starts the default single guest and waits until its devices are up.
func Boot(ctx context.Context, opts Options) (*Guest, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	a, err := Prepare(ctx, o)
	if err != nil {
		return nil, err
	}
	return boot(ctx, o, a, "single", nil)
}

// BootPair starts two guests, "a" and "b", joined by two point-to-point links
// (eth0 carries rxe0, eth1 carries siw0 in each). They boot in parallel.
func BootPair(ctx context.Context, opts Options) (a, b *Guest, err error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, nil, err
	}
	assets, err := Prepare(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	// Each link is a pair of UDP sockets on the host's loopback: neither
	// guest has to be up before the other.
	ports, err := freeUDPPorts(4)
	if err != nil {
		return nil, nil, err
	}
	link := func(self, peer int, idx int, role string) []string {
		mac := fmt.Sprintf("52:54:00:12:%02x:%02x", idx, map[string]int{"a": 1, "b": 2}[role])
		id := fmt.Sprintf("n%d", idx)
		return []string{
			"-netdev", fmt.Sprintf("socket,id=%s,udp=127.0.0.1:%d,localaddr=127.0.0.1:%d", id, peer, self),
			"-device", fmt.Sprintf("virtio-net-pci,netdev=%s,mac=%s", id, mac),
		}
	}
	netA := append(link(ports[0], ports[1], 0, "a"), link(ports[2], ports[3], 1, "a")...)
	netB := append(link(ports[1], ports[0], 0, "b"), link(ports[3], ports[2], 1, "b")...)
	type result struct {
		g   *Guest
		err error
	}
	ca, cb := make(chan result, 1), make(chan result, 1)
	go func() { g, err := boot(ctx, o, assets, "a", netA); ca <- result{g, err} }()
	go func() { g, err := boot(ctx, o, assets, "b", netB); cb <- result{g, err} }()
	ra, rb := <-ca, <-cb
	if ra.err != nil || rb.err != nil {
		for _, r := range []result{ra, rb} {
			if r.g != nil {
				r.g.Kill()
			}
		}
		return nil, nil, errors.Join(ra.err, rb.err)
	}
	return ra.g, rb.g, nil
}

func freeUDPPorts(n int) ([]int, error) {
	var conns []net.PacketConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var ports []int
	for range n {
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testbed: picking a loopback port for a guest link: %w", err)
		}
		conns = append(conns, c)
		ports = append(ports, c.LocalAddr().(*net.UDPAddr).Port)
	}
	return ports, nil
}

// kernelArgs are the guest kernel's command line for one role and mode.
func kernelArgs(o Options, a *Assets, role, mode, agentPath string) (string, error) {
	for _, p := range append([]string{agentPath, a.Dir, a.Scripts}, o.Writable...) {
		if strings.ContainsAny(p, " ,\t\n\"") {
			return "", fmt.Errorf("testbed: path %q cannot be passed to the guest (no spaces, commas or quotes)", p)
		}
	}
	args := []string{
		"console=ttyS0", "panic=-1", "loglevel=4",
		// Under TCG the kernel falls back to the HPET, where every
		// clock_gettime costs microseconds (an emulated MMIO read); the
		// emulated TSC is monotonic across vCPUs and costs nanoseconds,
		// as on real hardware, which timing-heavy code (benchmarks, the Go
		// runtime's scheduler) needs.
		"clocksource=tsc", "tsc=reliable",
		"rdmago.stage2=" + filepath.Join(a.Scripts, "stage2"),
		"rdmago.modules=" + filepath.Join(a.Dir, "modules"),
		"rdmago.rw=" + strings.Join(o.Writable, ","),
		"rdmago.role=" + role,
		"rdmago.mode=" + mode,
	}
	if agentPath != "" {
		args = append(args, "rdmago.agent="+agentPath)
	}
	return strings.Join(args, " "), nil
}

// qemuArgs is everything but the console and the agent port.
func qemuArgs(o Options, a *Assets, accel, cmdline string) []string {
	args := []string{
		"-cpu", "max", "-smp", strconv.Itoa(o.CPUs), "-m", strconv.Itoa(o.MemoryMB),
		"-nodefaults", "-display", "none", "-no-reboot",
		"-kernel", filepath.Join(a.Dir, "vmlinux"),
		"-initrd", filepath.Join(a.Dir, "initramfs.cpio.gz"),
		"-append", cmdline,
		"-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
	}
	switch {
	case o.CostModel:
		// Instruction counting needs one emulation thread for all vCPUs.
		args = append(args, "-accel", "tcg,thread=single", "-icount", "shift=0,sleep=off")
	case accel == "kvm":
		args = append(args, "-accel", "kvm")
	default:
		args = append(args, "-accel", "tcg,thread=multi")
	}
	for i, dir := range o.Writable {
		args = append(args, "-virtfs",
			fmt.Sprintf("local,path=%s,mount_tag=rw%d,security_model=none,multidevs=remap", dir, i))
	}
	return args
}

func boot(ctx context.Context, o Options, a *Assets, role string, extra []string) (*Guest, error) {
	// This very binary serves as the guest's agent (see agentEnv).
	agentPath, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("testbed: locating the agent binary: %w", err)
	}
	cmdline, err := kernelArgs(o, a, role, "agent", agentPath)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "rdmago-guest-")
	if err != nil {
		return nil, err
	}
	g := &Guest{opts: o, tmp: tmp, exited: make(chan struct{}), readerr: make(chan struct{}), cmds: map[uint64]*Cmd{}}
	sockPath := filepath.Join(tmp, "agent.sock")
	args := append(qemuArgs(o, a, a.Accel, cmdline),
		"-serial", "file:"+g.ConsolePath(),
		"-device", "virtio-serial-pci",
		"-chardev", "socket,id=agent,path="+sockPath+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=rdmago.agent",
	)
	args = append(args, extra...)
	g.qemu = exec.Command("qemu-system-x86_64", args...)
	var qemuOut bytes.Buffer
	g.qemu.Stdout, g.qemu.Stderr = &qemuOut, &qemuOut
	// qemu must not outlive us even if we die without cleaning up.
	g.qemu.SysProcAttr = dieWithParent()
	how := a.Accel
	if o.CostModel {
		how = "cost model: tcg, instructions counted"
	}
	o.logf("booting guest %q (%s, %d vCPUs)", role, how, o.CPUs)
	start := time.Now()
	if err := g.qemu.Start(); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("testbed: starting qemu: %w (is qemu-system-x86 installed?)", err)
	}
	go func() {
		_ = g.qemu.Wait()
		close(g.exited)
	}()
	fail := func(err error) (*Guest, error) {
		g.stop()
		// Read qemu's output and the console before the directory goes.
		msg := fmt.Sprintf("testbed: guest %q: %v", role, err)
		if out := strings.TrimSpace(qemuOut.String()); out != "" {
			msg += "\nqemu said: " + out
		}
		msg += "\n" + g.consoleTail(60)
		os.RemoveAll(g.tmp)
		return nil, errors.New(msg)
	}

	bootCtx, cancel := context.WithTimeout(ctx, o.BootTimeout)
	defer cancel()
	for {
		c, err := net.Dial("unix", sockPath)
		if err == nil {
			g.sock = c
			break
		}
		select {
		case <-g.exited:
			return fail(errors.New("qemu exited before the guest started"))
		case <-bootCtx.Done():
			return fail(fmt.Errorf("no agent socket: %w", bootCtx.Err()))
		case <-time.After(20 * time.Millisecond):
		}
	}
	g.conn = agent.NewConn(g.sock)
	if err := g.conn.Send(&agent.Message{Type: agent.TypeHello}); err != nil {
		return fail(err)
	}
	ready := make(chan *agent.Message, 1)
	readyErr := make(chan error, 1)
	go func() {
		m, err := g.conn.Receive()
		if err != nil {
			readyErr <- err
			return
		}
		ready <- m
	}()
	var m *agent.Message
	select {
	case m = <-ready:
	case err := <-readyErr:
		return fail(fmt.Errorf("agent connection: %w", err))
	case <-g.exited:
		return fail(errors.New("the guest powered off before its agent was ready"))
	case <-bootCtx.Done():
		return fail(fmt.Errorf("agent not ready after %v: %w", time.Since(start).Round(time.Second), bootCtx.Err()))
	}
	if m.Type != agent.TypeReady {
		return fail(fmt.Errorf("agent sent %q, want %q", m.Type, agent.TypeReady))
	}
	topo, err := parseTopology(m.Topology)
	if err != nil {
		return fail(err)
	}
	g.Topology = topo
	o.logf("guest %q ready in %v", role, time.Since(start).Round(100*time.Millisecond))
	go g.read()
	return g, nil
}

// read dispatches the agent's messages until the connection ends.
func (g *Guest) read() {
	var err error
	for {
		var m *agent.Message
		m, err = g.conn.Receive()
		if err != nil {
			break
		}
		g.mu.Lock()
		c := g.cmds[m.ID]
		g.mu.Unlock()
		if c == nil {
			continue
		}
		switch m.Type {
		case agent.TypeOutput:
			w := c.Stdout
			if m.FD == 2 {
				w = c.Stderr
			}
			if w != nil {
				_, _ = w.Write(m.Data)
			}
		case agent.TypeExit:
			g.mu.Lock()
			delete(g.cmds, m.ID)
			g.mu.Unlock()
			c.finish(m.Code, false, m.Err)
		}
	}
	g.lost(err)
	close(g.readerr)
}

// lost ends the commands still running when the agent's connection ended
// with err, and every later one: with the guest's console tail, unless
// the guest was shut down.
func (g *Guest) lost(err error) {
	g.mu.Lock()
	closed := g.closed
	if closed {
		err = errors.New("guest shut down")
	} else {
		err = fmt.Errorf("lost the guest's agent (guest crashed or was killed): %w\n%s", err, g.consoleTail(40))
	}
	g.err = err
	cmds := g.cmds
	g.cmds = map[uint64]*Cmd{}
	g.mu.Unlock()
	for _, c := range cmds {
		c.finish(-1, !closed, err.Error())
	}
}

// Role is "single", "a" or "b".
func (g *Guest) Role() string { return g.Topology.Role }

// Err is why the guest can no longer run commands (it crashed, was killed
// or shut down), or nil while it can.
func (g *Guest) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// maxPanicLines bounds how far back consoleTail looks for a panic's headline.
const maxPanicLines = 150

// ConsolePath is the file receiving the guest's serial console (kernel log).
func (g *Guest) ConsolePath() string { return filepath.Join(g.tmp, "console.log") }

// consoleTail returns the last n lines of the console log, labelled. A
// kernel panic's headline opens the tail even when its call trace runs
// longer than n lines (one of about 40 once pushed it out of a 40-line tail).
func (g *Guest) consoleTail(n int) string {
	b, _ := os.ReadFile(g.ConsolePath())
	lines := logTail(string(b), n)
	return "--- guest console (last " + strconv.Itoa(len(lines)) + " lines) ---\n" + strings.Join(lines, "\n") + "\n--- end of guest console ---"
}

// KernelLogTail returns the last n lines of a kernel log, labelled, or
// more: from the first line of an oops, panic or warning among the last
// maxPanicLines, whose call trace may run longer than n.
func KernelLogTail(log string, n int) string {
	lines := logTail(log, n)
	return "--- guest kernel log (last " + strconv.Itoa(len(lines)) + " lines) ---\n" + strings.Join(lines, "\n") + "\n--- end of guest kernel log ---\n"
}

// oopsHeadlines open a kernel's report of a panic, BUG, oops or warning.
var oopsHeadlines = []string{"Kernel panic", "BUG:", "kernel BUG at", "------------[ cut here ]", "Oops:", "general protection fault"}

// reportHeadlines open a report that KernelReports returns: oopsHeadlines,
// a warning without its "cut here" line, and the hung-task detector's.
var reportHeadlines = append([]string{"WARNING: CPU:", "blocked for more than"}, oopsHeadlines...)

// maxReportLines bounds one report: a call trace is some tens of lines.
const maxReportLines = 60

// KernelReports returns the reports of a panic, BUG, oops, warning or hung
// task in a kernel log, each from its headline to its "end trace" line (or
// maxReportLines). A run that passed while the kernel reported one has met a
// kernel defect, ours to work around or to report, and proves little.
func KernelReports(log string) []string {
	var reports []string
	var cur []string
	end := func() {
		if cur != nil {
			reports = append(reports, strings.Join(cur, "\n"))
			cur = nil
		}
	}
	for _, line := range strings.Split(log, "\n") {
		if cur != nil && strings.Contains(line, "------------[ cut here ]") {
			end()
		}
		if cur == nil {
			for _, h := range reportHeadlines {
				if strings.Contains(line, h) {
					cur = []string{}
					break
				}
			}
			if cur == nil {
				continue
			}
		}
		cur = append(cur, line)
		if strings.Contains(line, "---[ end trace") || len(cur) == maxReportLines {
			end()
		}
	}
	end()
	return reports
}

func logTail(log string, n int) []string {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	from := max(len(lines)-n, 0)
find:
	for i := max(len(lines)-maxPanicLines, 0); i < from; i++ {
		for _, h := range oopsHeadlines {
			if strings.Contains(lines[i], h) {
				from = i
				break find
			}
		}
	}
	return lines[from:]
}

// KernelLog returns the guest's dmesg, unlabelled (for KernelLogTail), for
// failure reports; when dmesg cannot run (a guest that crashed), the
// console's output, which carries the kernel's messages too.
func (g *Guest) KernelLog(ctx context.Context) string {
	out, err := g.Command(ctx, "dmesg").CombinedOutput()
	if err != nil {
		b, _ := os.ReadFile(g.ConsolePath())
		return string(b)
	}
	return string(out)
}

// Close asks the guest to power off and waits for it (10 s at most, then it
// is killed). Commands still running are killed.
func (g *Guest) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		<-g.exited
		return nil
	}
	g.closed = true
	g.mu.Unlock()
	_ = g.conn.Send(&agent.Message{Type: agent.TypeShutdown})
	select {
	case <-g.exited:
	case <-time.After(10 * time.Second):
		_ = g.qemu.Process.Kill()
		<-g.exited
	}
	g.sock.Close()
	os.RemoveAll(g.tmp)
	return nil
}

// Kill stops the guest at once, like pulling its power cord: its peers see a
// host that vanished. Commands still running fail.
func (g *Guest) Kill() {
	g.stop()
	os.RemoveAll(g.tmp)
}

// stop kills qemu and waits for it, keeping the console log.
func (g *Guest) stop() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	if g.qemu != nil && g.qemu.Process != nil {
		_ = g.qemu.Process.Kill()
		<-g.exited
	}
	if g.sock != nil {
		g.sock.Close()
	}
}

// SetLink takes one of the guest's netdevs down or up (ip link set), which
// moves the RDMA port on it DOWN or back ACTIVE. In a pair, cutting eth0 on
// one side cuts the rxe link between the guests.
func (g *Guest) SetLink(ctx context.Context, netdev string, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	out, err := g.Command(ctx, "ip", "link", "set", netdev, state).CombinedOutput()
	if err != nil {
		return fmt.Errorf("testbed: guest %q: ip link set %s %s: %v: %s", g.Role(), netdev, state, err, out)
	}
	return nil
}

// Shell boots the single guest with an interactive shell on the terminal
// instead of the agent, for debugging. It returns when the shell exits (the
// guest powers off).
func Shell(ctx context.Context, opts Options) error {
	o, err := opts.withDefaults()
	if err != nil {
		return err
	}
	a, err := Prepare(ctx, o)
	if err != nil {
		return err
	}
	cmdline, err := kernelArgs(o, a, "single", "shell", "")
	if err != nil {
		return err
	}
	args := append(qemuArgs(o, a, a.Accel, cmdline), "-serial", "stdio")
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	o.logf("booting guest with a shell on this terminal (%s); 'exit' powers it off", a.Accel)
	return cmd.Run()
}
