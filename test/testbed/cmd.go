package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rdmago/rdmago/test/testbed/internal/agent"
)

// Cmd is a command run inside a guest, in the manner of os/exec.Cmd.
type Cmd struct {
	Args []string
	// Env defaults to the host process's environment: the guest runs the
	// host's binaries on the host's file system.
	Env []string
	// Dir defaults to the host process's working directory.
	Dir string
	// Netns runs the command in that network namespace of the guest (for
	// the siw hosts of the single guest, see Device.Netns).
	Netns  string
	Stdout io.Writer
	Stderr io.Writer

	ctx   context.Context
	guest *Guest
	id    uint64
	done  chan struct{}
	once  sync.Once
	code  int
	msg   string
	lost  bool // the guest died under the command
}

// ExitError reports a command that ended unsuccessfully in a guest.
type ExitError struct {
	Guest string
	Args  []string
	Code  int    // exit status, -1 when killed or never started
	Msg   string // why, when there is no exit status
	// GuestLost: the guest died or was killed under the command, and Msg
	// ends with its console's tail.
	GuestLost bool
}

func (e *ExitError) Error() string {
	s := fmt.Sprintf("guest %q: %s: ", e.Guest, strings.Join(e.Args, " "))
	if e.Msg != "" {
		return s + e.Msg
	}
	return s + fmt.Sprintf("exit status %d", e.Code)
}

// Command returns a Cmd that runs name with args in the guest. Cancelling ctx
// kills the command (its whole process group).
func (g *Guest) Command(ctx context.Context, name string, args ...string) *Cmd {
	return &Cmd{Args: append([]string{name}, args...), ctx: ctx, guest: g, done: make(chan struct{})}
}

// Start starts the command without waiting for it.
func (c *Cmd) Start() error {
	if c.id != 0 {
		return errors.New("testbed: Cmd already started")
	}
	g := c.guest
	argv := c.Args
	if c.Netns != "" {
		argv = append([]string{"ip", "netns", "exec", c.Netns}, argv...)
	}
	env := c.Env
	if env == nil {
		env = os.Environ()
	}
	dir := c.Dir
	if dir == "" {
		dir, _ = os.Getwd()
	}
	g.mu.Lock()
	if g.err != nil {
		err := g.err
		g.mu.Unlock()
		return err
	}
	g.nextID++
	c.id = g.nextID
	g.cmds[c.id] = c
	g.mu.Unlock()
	if err := g.conn.Send(&agent.Message{Type: agent.TypeStart, ID: c.id, Argv: argv, Env: env, Dir: dir}); err != nil {
		g.mu.Lock()
		delete(g.cmds, c.id)
		g.mu.Unlock()
		return fmt.Errorf("testbed: guest %q: starting %s: %w", g.Role(), c.Args[0], err)
	}
	if c.ctx != nil && c.ctx.Done() != nil {
		go func() {
			select {
			case <-c.ctx.Done():
				_ = c.Signal(syscall.SIGKILL)
				t := time.NewTimer(killGrace)
				defer t.Stop()
				select {
				case <-c.done:
				case <-t.C:
					// No end reported for a killed command: the guest is
					// wedged (a task in uninterruptible sleep, a lockup).
					// Fail the command with the console, and stop the guest.
					c.finish(-1, true, fmt.Sprintf("the guest did not report the end of %s within %v of killing it; "+
						"it is stopped. Its console:\n%s", c.Args[0], killGrace, g.consoleTail(40)))
					g.stop()
				}
			case <-c.done:
			}
		}()
	}
	return nil
}

// killGrace is how long a killed command's end may take to be reported
// before its guest is taken for wedged.
const killGrace = 10 * time.Second

// finish records the command's end once; lost: the guest died (or was
// stopped) under it.
func (c *Cmd) finish(code int, lost bool, msg string) {
	c.once.Do(func() {
		c.code, c.lost, c.msg = code, lost, msg
		close(c.done)
	})
}

// Signal delivers sig to the command's process group in the guest.
func (c *Cmd) Signal(sig syscall.Signal) error {
	select {
	case <-c.done:
		return nil
	default:
	}
	return c.guest.conn.Send(&agent.Message{Type: agent.TypeSignal, ID: c.id, Signal: int(sig)})
}

// Wait waits for the command to end. It returns nil for exit status 0 and an
// *ExitError otherwise (also when the guest died under the command).
func (c *Cmd) Wait() error {
	if c.id == 0 {
		return errors.New("testbed: Cmd not started")
	}
	<-c.done
	if c.code == 0 && c.msg == "" {
		return nil
	}
	msg := c.msg
	if c.ctx != nil && c.ctx.Err() != nil {
		msg = strings.TrimSpace(msg + " (" + c.ctx.Err().Error() + ")")
	}
	return &ExitError{Guest: c.guest.Role(), Args: c.Args, Code: c.code, Msg: msg, GuestLost: c.lost}
}

// Run starts the command and waits for it.
func (c *Cmd) Run() error {
	if err := c.Start(); err != nil {
		return err
	}
	return c.Wait()
}

// Output runs the command and returns its standard output.
func (c *Cmd) Output() ([]byte, error) {
	var out bytes.Buffer
	c.Stdout = &out
	err := c.Run()
	return out.Bytes(), err
}

// CombinedOutput runs the command and returns its standard output and error.
func (c *Cmd) CombinedOutput() ([]byte, error) {
	var out lockedBuffer
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	return out.Bytes(), err
}

// lockedBuffer is safe for concurrent writers (Stdout and Stderr may be the
// same buffer, and a test may read it while the command runs).
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf.Bytes()...)
}

func (b *lockedBuffer) String() string { return string(b.Bytes()) }
