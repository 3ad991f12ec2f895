package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/test/testbed/internal/agent"
)

// The environment of a session's command: the socket rdmavm exec asks, and
// the host directories the session's guest may write (a list, as in PATH).
const (
	sessionEnv         = "RDMAGO_TESTBED_SESSION"
	sessionWritableEnv = "RDMAGO_TESTBED_SESSION_WRITABLE"
)

// runSession boots a guest, runs argv on the host with the session in its
// environment, serves the rdmavm exec commands started under it, and
// returns argv's exit status.
func runSession(ctx context.Context, opts testbed.Options, argv []string) (int, error) {
	if opts.CostModel {
		return 0, errors.New("session: the cost model boots a guest per measurement")
	}
	tmp, err := os.MkdirTemp("", "rdmavm-session-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	// go test builds its test binaries under GOTMPDIR. There they are in
	// a directory the guest mounts read-write: one the session has (see
	// sessionFor), and whose files the guest sees as the host writes them,
	// where its view of the host's root may keep what it read before.
	gotmp := filepath.Join(tmp, "go")
	if err := os.Mkdir(gotmp, 0o755); err != nil {
		return 0, err
	}
	opts.Writable = []string{testbed.WorkDir(), gotmp}
	// Ends the commands still running in the guest when the session is
	// signalled or argv has ended.
	serveCtx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	s := &session{ctx: serveCtx, opts: opts}
	if err := s.boot(ctx); err != nil {
		return 0, err
	}
	defer func() { s.guest.Close() }()
	sock := filepath.Join(tmp, "exec.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return 0, err
	}
	var serving sync.WaitGroup
	serving.Add(1)
	go func() {
		defer serving.Done()
		s.serve(ln)
	}()
	defer serving.Wait()
	defer ln.Close()
	defer stopServing()

	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), sessionEnv+"="+sock,
		sessionWritableEnv+"="+strings.Join(opts.Writable, string(os.PathListSeparator)), "GOTMPDIR="+gotmp)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Signalled, the session asks its command to end (SIGTERM) rather than
	// killing it outright, so that make and go test can end their own.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	err = cmd.Run()
	stopServing()
	ln.Close()
	serving.Wait()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit) && exit.ExitCode() > 0:
		code = exit.ExitCode()
	case err != nil:
		return 0, fmt.Errorf("session: %s: %w", argv[0], err)
	}
	if problem := s.afterTheLast(); problem != "" {
		fmt.Fprintln(os.Stderr, "rdmavm: session:", problem)
		code = max(code, 1)
	}
	return code, nil
}

// afterTheLast judges what the guest did after the last command passed
// (as the next command would have been judged): a crash, or a kernel
// report. After a failed command the guest was condemned already.
func (s *session) afterTheLast() string {
	if s.replace != "" {
		return ""
	}
	if err := s.guest.Err(); err != nil {
		return fmt.Sprintf("the guest died after its last command had passed: %v", err)
	}
	reports := testbed.KernelReports(readAndClearKernelLog(s.guest))
	if len(reports) == 0 {
		return ""
	}
	return fmt.Sprintf("the guest's kernel reported %d problem(s) after the last command had passed:\n%s",
		len(reports), strings.Join(reports, "\n---\n"))
}

// session is the host side of one session's guest.
type session struct {
	ctx  context.Context
	opts testbed.Options

	// mu makes commands take turns, so that a kernel report is blamed on
	// the command it came with (or, if it came between two, on the next).
	mu    sync.Mutex
	guest *testbed.Guest
	// why the next command needs a new guest, or "": the last one failed
	// (what it left behind is unknown), changed the guest, or lost it.
	replace string
	// why the guest died after the last command passed, or "": the next
	// command fails for it, as for a kernel report between two commands.
	diedBetween string
	state       string // the guest's links, addresses and routes, as booted
	conns       sync.WaitGroup
}

func (s *session) serve(ln net.Listener) {
	defer s.conns.Wait()
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // out of descriptors, say: try again
			time.Sleep(100 * time.Millisecond)
			continue
		}
		s.conns.Add(1)
		go func() {
			defer s.conns.Done()
			defer c.Close()
			s.handle(c)
		}()
	}
}

// handle runs one rdmavm exec's command. The client sends one start
// message and then nothing: when its end of the socket closes (go test's
// timeout killed it), the command is killed.
func (s *session) handle(c net.Conn) {
	conn := agent.NewConn(c)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	m, err := conn.Receive()
	if err != nil || m.Type != agent.TypeStart || len(m.Argv) == 0 {
		_ = conn.Send(&agent.Message{Type: agent.TypeExit, Code: -1, Err: "session: want one start message with a command"})
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	go func() {
		_, _ = conn.Receive()
		cancel()
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Err() != nil { // gone while it waited its turn
		return
	}
	stderr := &outputWriter{conn, 2}
	prog := filepath.Base(m.Argv[0])
	if err := s.freshGuestIfNeeded(prog, stderr); err != nil {
		_ = conn.Send(&agent.Message{Type: agent.TypeExit, Code: -1, Err: err.Error()})
		return
	}
	if ctx.Err() != nil { // gone while a guest booted for it
		return
	}
	g := s.guest
	err = run(ctx, g, m.Argv, withoutSession(m.Env), m.Dir, &outputWriter{conn, 1}, stderr)
	// What the command's end set off in the kernel (netdevs and namespaces
	// going) belongs to it: the guest settles, as far as the state check
	// sees, before its kernel log is read and cleared for the next command.
	changed, stateErr := "", error(nil)
	if g.Err() == nil {
		changed, stateErr = s.changes(g)
	}
	code, lost := judge(err, m.Argv[0], readAndClearKernelLog(g), stderr)
	if s.diedBetween != "" {
		fmt.Fprintf(stderr, "rdmavm: failing %s: the session's guest died after the command before it had passed "+
			"(%s), and what comes between two commands is blamed on the next\n", prog, s.diedBetween)
		code, s.diedBetween = max(code, 1), ""
	}
	switch {
	case lost:
		s.replace = "lost under " + prog
	case stateErr != nil:
		fmt.Fprintf(stderr, "rdmavm: after %s: %v\n", prog, stateErr)
		code, s.replace = max(code, 1), "state unreadable after "+prog
	case changed != "":
		// Blame the command that changed the guest, not the next one
		// that trips over it.
		fmt.Fprintf(stderr, "rdmavm: %s left the session's guest changed (a test must undo what it changes in "+
			"a guest that later packages share); its links, addresses and routes, - as booted, + now:\n%s", prog, changed)
		code, s.replace = max(code, 1), "changed by "+prog
	case code != 0 || ctx.Err() != nil:
		// A failed or killed test may have skipped its cleanups, and left
		// what the state check does not look at.
		s.replace = prog + " failed in it"
	}
	_ = conn.Send(&agent.Message{Type: agent.TypeExit, Code: code})
}

// freshGuestIfNeeded boots a new guest if the last command failed, lost
// or changed the old one, or the old one died since: one package's fault
// fails that package, not every later one. It boots for the session, not
// for the client, which may leave meanwhile.
func (s *session) freshGuestIfNeeded(prog string, stderr *outputWriter) error {
	if s.replace == "" {
		err := s.guest.Err()
		if err == nil {
			return nil
		}
		s.replace = fmt.Sprintf("died after its last command: %v", err)
		s.diedBetween = err.Error()
	}
	fmt.Fprintf(stderr, "rdmavm: a new guest for %s (the last: %s)\n", prog, s.replace)
	s.guest.Kill()
	if err := s.boot(s.ctx); err != nil {
		return fmt.Errorf("session: booting a new guest (%s): %w", s.replace, err)
	}
	return nil
}

// boot starts the session's guest and records its state once it holds
// still for a moment (ports and link-local addresses settle just after a
// boot), lest the first command be blamed for the settling.
func (s *session) boot(ctx context.Context) error {
	g, err := testbed.Boot(ctx, s.opts)
	if err != nil {
		return err
	}
	state, err := guestState(ctx, g)
	for deadline := time.Now().Add(10 * time.Second); err == nil; {
		time.Sleep(300 * time.Millisecond)
		var again string
		if again, err = guestState(ctx, g); err != nil || again == state {
			break
		}
		if time.Now().After(deadline) {
			err = fmt.Errorf("the guest's links did not hold still after its boot; the last two reads, - then +:\n%s",
				lineDiff(state, again))
			break
		}
		state = again
	}
	if err != nil {
		g.Close()
		return fmt.Errorf("session: %w", err)
	}
	s.guest, s.state, s.replace = g, state, ""
	return nil
}

// guestState lists the guest's netdevs with their addresses and state,
// and its routes (every table, both families), in every namespace; its
// RDMA links; and the one network setting a test changes
// (ip_local_port_range). Neighbours are left out: they come and go by
// themselves.
func guestState(ctx context.Context, g *testbed.Guest) (string, error) {
	// One ip per namespace (route show table all, with no family, lists
	// both): every process costs time under emulation.
	script := "show() { printf 'addr show\\nroute show table all\\n' | ip $1 -br -batch -; }; show; " +
		"for ns in $(ip netns list | cut -d' ' -f1); do echo \"netns $ns:\"; show \"-n $ns\"; done; rdma link show; " +
		"echo \"ip_local_port_range $(cat /proc/sys/net/ipv4/ip_local_port_range)\""
	out, err := g.Command(ctx, "/bin/sh", "-c", script).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("reading the guest's links: %v: %s", err, out)
	}
	return inNamespaces(string(out)), nil
}

// inNamespaces prefixes each line after a "netns NAME:" header with
// "NAME: ", so that a line of the diff says where it is, and a route gone
// from one namespace and added to another is two changes, not none. The
// RDMA links and the setting after the namespaces are the host's.
func inNamespaces(state string) string {
	var b strings.Builder
	ns := ""
	for _, l := range strings.SplitAfter(state, "\n") {
		switch {
		case strings.HasPrefix(l, "netns ") && strings.HasSuffix(strings.TrimSpace(l), ":"):
			ns = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(l), "netns "), ":") + ": "
		case strings.HasPrefix(l, "link ") || strings.HasPrefix(l, "ip_local_port_range "):
			ns = "" // rdma link show, then the setting: after every namespace
		}
		if ns != "" && !strings.HasPrefix(l, "netns ") && l != "" {
			l = ns + l
		}
		b.WriteString(l)
	}
	return b.String()
}

// readAndClearKernelLog returns the guest's kernel log since the last call
// and clears it (--syslog: reading and clearing are then one step, and
// nothing logged between them is lost). When that fails, the console's
// copy is judged, and the log cleared apart.
func readAndClearKernelLog(g *testbed.Guest) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := g.Command(ctx, "dmesg", "--syslog", "--read-clear").CombinedOutput()
	if err == nil {
		return string(out)
	}
	log := g.KernelLog(ctx)
	_ = g.Command(ctx, "dmesg", "--clear").Run()
	return log
}

// changes returns how g differs from its booted state, after giving it up
// to 10 s to come back (a netdev deleted in a test's cleanup goes once its
// last user has), or "". It does not wait when nothing differs: work the
// state does not show (rxe freeing a QP) may still be under way.
func (s *session) changes(g *testbed.Guest) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for deadline := time.Now().Add(10 * time.Second); ; {
		now, err := guestState(ctx, g)
		if err != nil {
			return "", err
		}
		d := lineDiff(s.state, now)
		if d == "" || time.Now().After(deadline) {
			return d, nil
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// lineDiff returns the lines only in a, marked -, then those only in b,
// marked +, whatever their order.
func lineDiff(a, b string) string {
	count := map[string]int{}
	for _, l := range strings.Split(b, "\n") {
		count[l]++
	}
	var d strings.Builder
	for _, l := range strings.Split(a, "\n") {
		if count[l] > 0 {
			count[l]--
		} else {
			d.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if count[l] > 0 {
			count[l]--
			d.WriteString("+ " + l + "\n")
		}
	}
	return d.String()
}

// outputWriter sends what a command writes to fd to the rdmavm exec
// that asked for it.
type outputWriter struct {
	conn *agent.Conn
	fd   int
}

func (w *outputWriter) Write(p []byte) (int, error) {
	if err := w.conn.Send(&agent.Message{Type: agent.TypeOutput, FD: w.fd, Data: append([]byte(nil), p...)}); err != nil {
		return 0, err
	}
	return len(p), nil
}

func withoutSession(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, sessionEnv+"=") && !strings.HasPrefix(kv, sessionWritableEnv+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// sessionFor returns the socket of the session that exec should use: one
// is in the environment, the guest it asks for is the session's kind, and
// the directories it writes and the program's own are writable there. (A
// program elsewhere, built after the session's guest first looked, could
// be missing or stale in the guest's cached view of the host.) Otherwise
// exec boots a guest of its own.
func sessionFor(opts testbed.Options, prog string) (string, bool) {
	sock := os.Getenv(sessionEnv)
	if sock == "" || opts.CostModel || opts.CPUs != 0 {
		return "", false
	}
	need := append([]string{testbed.WorkDir()}, opts.Writable...)
	if strings.Contains(prog, "/") {
		need = append(need, filepath.Dir(prog))
	}
	writable := filepath.SplitList(os.Getenv(sessionWritableEnv))
	for _, dir := range need {
		if !underAny(dir, writable) {
			return "", false
		}
	}
	return sock, true
}

func underAny(path string, dirs []string) bool {
	for _, d := range dirs {
		if under(path, d) {
			return true
		}
	}
	return false
}

// execInSession runs argv in the session's guest and returns its exit status.
func execInSession(ctx context.Context, sock string, argv []string) (int, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return 0, fmt.Errorf("session %s: %w", sock, err)
	}
	defer c.Close()
	// A signal ends rdmavm; closing the socket tells the session to kill
	// the command.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	dir, err := os.Getwd()
	if err != nil {
		return 0, err
	}
	conn := agent.NewConn(c)
	if err := conn.Send(&agent.Message{Type: agent.TypeStart, Argv: argv, Env: os.Environ(), Dir: dir}); err != nil {
		return 0, fmt.Errorf("session %s: %w", sock, err)
	}
	for {
		m, err := conn.Receive()
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, fmt.Errorf("session %s ended before %s did: %w", sock, filepath.Base(argv[0]), err)
		}
		switch m.Type {
		case agent.TypeOutput:
			w := os.Stdout
			if m.FD == 2 {
				w = os.Stderr
			}
			_, _ = w.Write(m.Data)
		case agent.TypeExit:
			if m.Err != "" {
				fmt.Fprintln(os.Stderr, "rdmavm:", m.Err)
			}
			if m.Code == 0 && m.Err == "" {
				return 0, nil
			}
			return max(m.Code, 1), nil
		}
	}
}
