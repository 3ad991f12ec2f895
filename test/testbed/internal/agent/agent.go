// Package agent is the wire protocol between the test bed's host side and the
// process server that runs inside each guest.
//
// The two ends talk over one virtio-serial port in JSON lines. The host starts
// processes, signals them and asks the guest to power off; the guest streams
// each process's output and reports its exit. One port carries any number of
// concurrent processes, so a test can run a server and a client in the same
// guest, or in two guests, and wait for both.
package agent

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
)

// Message types.
const (
	TypeHello    = "hello"    // host → guest: the host is listening; reply with ready
	TypeReady    = "ready"    // guest → host: topology attached
	TypeStart    = "start"    // host → guest: start Argv
	TypeSignal   = "signal"   // host → guest: deliver Signal to process ID
	TypeShutdown = "shutdown" // host → guest: kill everything and power off
	TypeOutput   = "output"   // guest → host: Data written by process ID to FD
	TypeExit     = "exit"     // guest → host: process ID ended
)

// Message is one line on the wire. Fields are used according to Type.
type Message struct {
	Type     string          `json:"type"`
	ID       uint64          `json:"id,omitempty"`
	Argv     []string        `json:"argv,omitempty"`
	Env      []string        `json:"env,omitempty"`
	Dir      string          `json:"dir,omitempty"`
	Signal   int             `json:"signal,omitempty"`
	FD       int             `json:"fd,omitempty"`
	Data     []byte          `json:"data,omitempty"`
	Code     int             `json:"code"`
	Err      string          `json:"err,omitempty"`
	Topology json.RawMessage `json:"topology,omitempty"`
}

// Conn sends and receives messages; Send is safe for concurrent use.
type Conn struct {
	mu  sync.Mutex
	enc *json.Encoder
	dec *json.Decoder
}

// NewConn wraps a byte stream.
func NewConn(rw io.ReadWriter) *Conn {
	return &Conn{enc: json.NewEncoder(rw), dec: json.NewDecoder(bufio.NewReader(rw))}
}

// Send writes one message.
func (c *Conn) Send(m *Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.enc.Encode(m)
}

// Receive reads one message.
func (c *Conn) Receive() (*Message, error) {
	var m Message
	if err := c.dec.Decode(&m); err != nil {
		return nil, err
	}
	return &m, nil
}

// Serve runs the guest side on port until the host asks for shutdown or the
// port fails. topologyFile is sent to the host with the ready message.
func Serve(port string, topologyFile string) error {
	f, err := os.OpenFile(port, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("agent: opening %s: %w", port, err)
	}
	defer f.Close()
	topo, err := os.ReadFile(topologyFile)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	conn := NewConn(f)
	s := &server{conn: conn, procs: map[uint64]*os.Process{}}
	for {
		m, err := conn.Receive()
		if err != nil {
			s.killAll()
			return fmt.Errorf("agent: reading from host: %w", err)
		}
		switch m.Type {
		case TypeHello:
			if err := conn.Send(&Message{Type: TypeReady, Topology: topo}); err != nil {
				return err
			}
		case TypeStart:
			s.start(m)
		case TypeSignal:
			s.signal(m.ID, syscall.Signal(m.Signal))
		case TypeShutdown:
			s.killAll()
			s.wg.Wait()
			return nil
		}
	}
}

type server struct {
	conn  *Conn
	mu    sync.Mutex
	procs map[uint64]*os.Process
	wg    sync.WaitGroup
}

// streamWriter forwards a process's output as it is written, so a host-side
// reader sees progress (go test -v) as it happens.
type streamWriter struct {
	conn *Conn
	id   uint64
	fd   int
}

func (w *streamWriter) Write(p []byte) (int, error) {
	data := append([]byte(nil), p...)
	if err := w.conn.Send(&Message{Type: TypeOutput, ID: w.id, FD: w.fd, Data: data}); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s *server) start(m *Message) {
	if len(m.Argv) == 0 {
		_ = s.conn.Send(&Message{Type: TypeExit, ID: m.ID, Code: -1, Err: "empty command"})
		return
	}
	cmd := exec.Command(m.Argv[0], m.Argv[1:]...)
	cmd.Env = m.Env
	cmd.Dir = m.Dir
	cmd.Stdout = &streamWriter{conn: s.conn, id: m.ID, fd: 1}
	cmd.Stderr = &streamWriter{conn: s.conn, id: m.ID, fd: 2}
	// Own process group, so a signal from the host reaches the whole command
	// (ip netns exec, sh -c, and what they start).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = s.conn.Send(&Message{Type: TypeExit, ID: m.ID, Code: -1, Err: err.Error()})
		return
	}
	s.mu.Lock()
	s.procs[m.ID] = cmd.Process
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := cmd.Wait()
		s.mu.Lock()
		delete(s.procs, m.ID)
		s.mu.Unlock()
		exit := &Message{Type: TypeExit, ID: m.ID}
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			exit.Code = -1
			exit.Err = "killed by signal " + ws.Signal().String()
		} else {
			exit.Code = cmd.ProcessState.ExitCode()
			if err != nil && exit.Code == 0 {
				exit.Err = err.Error()
			}
		}
		_ = s.conn.Send(exit)
	}()
}

func (s *server) signal(id uint64, sig syscall.Signal) {
	s.mu.Lock()
	p := s.procs[id]
	s.mu.Unlock()
	if p != nil {
		_ = syscall.Kill(-p.Pid, sig)
	}
}

func (s *server) killAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	}
}
