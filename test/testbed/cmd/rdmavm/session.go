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
	// go test builds its test binaries under GOTMPDIR and has them write
	// their logs beside them: the guest must be able to write there.
	gotmp := filepath.Join(tmp, "go")
	if err := os.Mkdir(gotmp, 0o755); err != nil {
		return 0, err
	}
	opts.Writable = []string{testbed.WorkDir(), gotmp}
	s := &session{ctx: ctx, opts: opts}
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

	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), sessionEnv+"="+sock,
		sessionWritableEnv+"="+strings.Join(opts.Writable, string(os.PathListSeparator)), "GOTMPDIR="+gotmp)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() > 0 {
		return exit.ExitCode(), nil
	}
	if err != nil {
		return 0, fmt.Errorf("session: %s: %w", argv[0], err)
	}
	return 0, nil
}

// session is the host side of one session's guest.
type session struct {
	ctx  context.Context
	opts testbed.Options

	// mu makes commands take turns, so that a kernel report is blamed on
	// the command it came with (or, if it came between two, on the next).
	mu    sync.Mutex
	guest *testbed.Guest
	lost  bool   // the guest died under the last command, or was left changed
	state string // the guest's network and RDMA links, as booted
	conns sync.WaitGroup
}

func (s *session) serve(ln net.Listener) {
	defer s.conns.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.conns.Add(1)
		go func() {
			defer s.conns.Done()
			defer c.Close()
			s.handle(agent.NewConn(c))
		}()
	}
}

// handle runs one rdmavm exec's command. The client sends one start
// message and then nothing: when its end of the socket closes (go test's
// timeout killed it), the command is killed.
func (s *session) handle(conn *agent.Conn) {
	m, err := conn.Receive()
	if err != nil || m.Type != agent.TypeStart || len(m.Argv) == 0 {
		_ = conn.Send(&agent.Message{Type: agent.TypeExit, Code: -1, Err: "session: want one start message with a command"})
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	go func() {
		_, _ = conn.Receive()
		cancel()
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.replaceLostGuest(ctx); err != nil {
		_ = conn.Send(&agent.Message{Type: agent.TypeExit, Code: -1, Err: err.Error()})
		return
	}
	g := s.guest
	// Each command is judged by the kernel log since the last one: read it
	// and clear it, even when the client is gone.
	kernelLog := func() string {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := g.Command(c, "dmesg", "--read-clear").CombinedOutput()
		if err != nil {
			return g.KernelLog(c)
		}
		return string(out)
	}
	stderr := &outputWriter{conn, 2}
	code, lost := runJudged(ctx, g, m.Argv, withoutSession(m.Env), m.Dir, &outputWriter{conn, 1}, stderr, kernelLog)
	if lost {
		s.lost = true
	} else if changed := s.changes(); changed != "" {
		// Blame the command that changed the guest, not the next one
		// that trips over it, and give the next a fresh guest.
		fmt.Fprintf(stderr, "rdmavm: %s left the session's guest changed (a test must undo what it changes in "+
			"a guest that later packages share); its links and addresses, - as booted, + now:\n%s",
			filepath.Base(m.Argv[0]), changed)
		code = max(code, 1)
		s.lost = true
	}
	_ = conn.Send(&agent.Message{Type: agent.TypeExit, Code: code})
}

// boot starts the session's guest and records its state.
func (s *session) boot(ctx context.Context) error {
	g, err := testbed.Boot(ctx, s.opts)
	if err != nil {
		return err
	}
	state, err := guestState(ctx, g)
	if err != nil {
		g.Close()
		return fmt.Errorf("session: %w", err)
	}
	s.guest, s.state, s.lost = g, state, false
	return nil
}

// guestState lists the guest's netdevs with their addresses and state, in
// every namespace of the topology, and its RDMA links.
func guestState(ctx context.Context, g *testbed.Guest) (string, error) {
	script := "ip -br addr show; for ns in $(ip netns list | cut -d' ' -f1); do echo \"netns $ns:\"; " +
		"ip -n \"$ns\" -br addr show; done; rdma link show"
	out, err := g.Command(ctx, "/bin/sh", "-c", script).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("reading the guest's links: %v: %s", err, out)
	}
	return string(out), nil
}

// changes returns how the guest differs from its booted state, after
// giving it a few seconds to settle (a netdev deleted in a test's cleanup
// goes once its last user has), or "".
func (s *session) changes() string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var now string
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		if now, err = guestState(ctx, s.guest); err != nil {
			return err.Error() + "\n"
		}
		if now == s.state || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	return lineDiff(s.state, now)
}

// lineDiff returns the lines only in a, marked -, then those only in b,
// marked +.
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

// replaceLostGuest boots a new guest if the last command lost the old one
// (a kernel panic) or left it changed, so that one package's fault fails
// that package, not every later one.
func (s *session) replaceLostGuest(ctx context.Context) error {
	if !s.lost {
		return nil
	}
	s.guest.Kill()
	if err := s.boot(ctx); err != nil {
		return fmt.Errorf("session: booting a guest to replace the last one: %w", err)
	}
	return nil
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
// every directory it must write is writable there. Otherwise exec boots a
// guest of its own.
func sessionFor(opts testbed.Options) (string, bool) {
	sock := os.Getenv(sessionEnv)
	if sock == "" || opts.CostModel || opts.CPUs != 0 {
		return "", false
	}
	writable := filepath.SplitList(os.Getenv(sessionWritableEnv))
	for _, dir := range opts.Writable {
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
