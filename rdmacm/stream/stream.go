// Package stream is a net.Conn and a net.Listener over the message
// transport of package github.com/rdmago/rdmago/rdmacm/msg: a byte stream
// on RDMA (RoCE, iWARP) for code written against package net.
//
// Write splits its bytes into messages of the connection's maximum size;
// Read hands them out, copying from the registered receive buffer straight
// into the caller's slice. Deadlines interrupt blocked calls with
// os.ErrDeadlineExceeded; Close sends what was written, tells the peer
// (its Read returns io.EOF) and disconnects, bounded by
// msg.Config.CloseTimeout when the peer is gone; CloseWrite half-closes.
// A peer whose process exits is noticed at once (its kernel disconnects);
// one that vanishes silently (its host, or the link) shows only when a
// write fails, unless msg.Config.KeepAlive probes it.
//
//	l, _ := stream.Listen(ctx, nil, "10.0.0.1:7471", nil)
//	go http.Serve(l, handler)
//	var d stream.Dialer
//	c, _ := d.DialContext(ctx, "rdma", "10.0.0.1:7471")
package stream

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/rdmacm/msg"
)

// Network is the network name of the addresses here.
const Network = "rdma"

// Addr is an RDMA endpoint's IP address and port (rdma_cm's port space
// for reliable connections).
type Addr struct{ netip.AddrPort }

// Network is "rdma".
func (a Addr) Network() string { return Network }

// Conn is a net.Conn over a message connection. One that becomes
// unreachable without Close is closed by the garbage collector (see New).
type Conn struct {
	c             *msg.Conn
	local, remote Addr

	// closeCtx is the parent of every deadline's context: Close cancels
	// it, which wakes every blocked call.
	closeCtx    context.Context
	closeCancel context.CancelFunc
	rd, wd      deadline

	rmu sync.Mutex // one Read at a time; Close takes it before the buffers go
	cur *msg.Message
	off int
	wmu sync.Mutex // one Write at a time, so that writes do not interleave

	closing atomic.Bool // Close has begun
}

// New makes a net.Conn of a message connection, which it then owns.
//
// A Conn that becomes unreachable without Close is closed by the garbage
// collector, as an *os.File is, through its message connection's own
// cleanup (see msg.Conn): the Conn is all that refers to it. When that
// happens is up to the collector, so a program should Close what it is
// done with.
func New(c *msg.Conn) *Conn {
	s := &Conn{c: c, local: Addr{c.LocalAddr()}, remote: Addr{c.RemoteAddr()}}
	s.closeCtx, s.closeCancel = context.WithCancel(context.Background())
	s.rd.init(s.closeCtx)
	s.wd.init(s.closeCtx)
	return s
}

// Msg is the message connection underneath. It belongs to s: s's Close
// closes it. Dropped without Close, the connection is closed once neither
// s nor the message connection is reachable.
func (s *Conn) Msg() *msg.Conn { return s.c }

func (s *Conn) LocalAddr() net.Addr  { return s.local }
func (s *Conn) RemoteAddr() net.Addr { return s.remote }

func (s *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: Network, Source: s.local, Addr: s.remote, Err: err}
}

// ioError turns an error of package msg into Read's or Write's, given the
// deadline the call waited under. A failure of the connection is reported
// as such, even if the deadline passed meanwhile.
func (s *Conn) ioError(op string, err error, d *deadline) error {
	switch {
	case s.closeCtx.Err() != nil || errors.Is(err, msg.ErrClosed):
		return s.opError(op, net.ErrClosed)
	case d.expired() && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return s.opError(op, os.ErrDeadlineExceeded)
	}
	return s.opError(op, err)
}

// Read reads what the peer wrote, waiting until something arrives, the
// read deadline passes, or the connection ends. After the peer's Close or
// CloseWrite and everything written before it, Read returns io.EOF.
func (s *Conn) Read(p []byte) (int, error) {
	if s.closeCtx.Err() != nil { // without waiting for a Close under way
		return 0, s.opError("read", net.ErrClosed)
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for {
		if s.closeCtx.Err() != nil {
			return 0, s.opError("read", net.ErrClosed)
		}
		if len(p) == 0 {
			return 0, nil // before the deadline, as a net.TCPConn's
		}
		ctx := s.rd.context()
		if ctx.Err() != nil && s.rd.expired() {
			return 0, s.opError("read", os.ErrDeadlineExceeded)
		}
		if s.cur != nil {
			b := s.cur.Bytes()
			n := copy(p, b[s.off:])
			s.off += n
			if s.off == len(b) {
				s.cur.Release()
				s.cur, s.off = nil, 0
			}
			return n, nil
		}
		m, err := s.c.Recv(ctx)
		switch {
		case err == nil:
			if len(m.Bytes()) == 0 {
				m.Release()
				continue
			}
			s.cur = m
			continue
		case err == io.EOF:
			return 0, io.EOF
		case ctx.Err() != nil && !s.rd.expired() && s.closeCtx.Err() == nil:
			continue // the deadline moved: wait under the new one
		}
		return 0, s.ioError("read", err, &s.rd)
	}
}

// Write sends p, split into messages of at most the connection's maximum
// size, waiting while the peer has no room (its reader is behind) until
// the write deadline passes or the connection ends. It returns how much was
// sent and, if not all, why.
func (s *Conn) Write(p []byte) (int, error) {
	if s.closeCtx.Err() != nil {
		return 0, s.opError("write", net.ErrClosed)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	max := s.c.MaxMessageSize()
	n := 0
	for {
		if s.closeCtx.Err() != nil {
			return n, s.opError("write", net.ErrClosed)
		}
		ctx := s.wd.context()
		if ctx.Err() != nil && s.wd.expired() {
			return n, s.opError("write", os.ErrDeadlineExceeded)
		}
		if n == len(p) {
			return n, nil
		}
		chunk := p[n:min(len(p), n+max)]
		err := s.c.Send(ctx, chunk)
		switch {
		case err == nil:
			n += len(chunk)
			if testHookSent != nil {
				testHookSent()
			}
			if n == len(p) {
				// Sent: a deadline or Close that came meanwhile is for
				// the next call, or a caller would resend what the peer
				// has.
				return n, nil
			}
			continue
		case ctx.Err() != nil && !s.wd.expired() && s.closeCtx.Err() == nil:
			continue
		}
		return n, s.ioError("write", err, &s.wd)
	}
}

// testHookSent runs after each message a Write sent.
var testHookSent func()

// CloseWrite tells the peer that nothing more will be written: its Read
// returns io.EOF once it has read everything before. Reading goes on.
//
// As with TCP, CloseWrite does not wait for a Write blocked on another
// goroutine, whose rest then fails (what it sent before the end arrives
// first), and the write deadline does not apply to it. It may wait for a
// send buffer, at most msg.Config.CloseTimeout (msg.Conn.CloseSend), so
// that a peer gone silent does not hold it up; the end is then not sent,
// and writing goes on.
func (s *Conn) CloseWrite() error {
	if s.closeCtx.Err() != nil {
		return s.opError("close write", net.ErrClosed)
	}
	if err := s.c.CloseSend(s.closeCtx); err != nil {
		switch {
		case s.closeCtx.Err() != nil || errors.Is(err, msg.ErrClosed):
			return s.opError("close write", net.ErrClosed)
		case errors.Is(err, msg.ErrSendClosed):
			return nil // a second CloseWrite, as shutdown(2) takes one
		}
		return s.opError("close write", err) // the write deadline is not CloseWrite's
	}
	return nil
}

// Close sends what was written and the end of the stream to the peer, then
// disconnects and releases the connection; a peer that does not take them
// within msg.Config.CloseTimeout does not hold it up. Blocked Reads and
// Writes return net.ErrClosed, and so does a second Close, at once, as a
// net.TCPConn's does.
func (s *Conn) Close() error {
	if !s.closing.CompareAndSwap(false, true) {
		return s.opError("close", net.ErrClosed)
	}
	s.closeCancel()
	// Blocked calls return now; once they have, the message being read
	// goes back before Close, so that Close releases everything.
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.cur != nil {
		s.cur.Release()
		s.cur = nil
	}
	s.rd.stop()
	s.wd.stop()
	if err := s.c.Close(); err != nil {
		return s.opError("close", err)
	}
	return nil
}

// SetDeadline sets the read and write deadlines; after Close it fails
// with net.ErrClosed, as a net.TCPConn's does.
func (s *Conn) SetDeadline(t time.Time) error {
	if s.closeCtx.Err() != nil {
		return s.opError("set", net.ErrClosed)
	}
	s.rd.set(t)
	s.wd.set(t)
	return nil
}

func (s *Conn) SetReadDeadline(t time.Time) error {
	if s.closeCtx.Err() != nil {
		return s.opError("set", net.ErrClosed)
	}
	s.rd.set(t)
	return nil
}

func (s *Conn) SetWriteDeadline(t time.Time) error {
	if s.closeCtx.Err() != nil {
		return s.opError("set", net.ErrClosed)
	}
	s.wd.set(t)
	return nil
}

// deadline is one direction's deadline as a context: setting it cancels
// the context a blocked call waits under, which then looks again.
type deadline struct {
	mu     sync.Mutex
	parent context.Context
	t      time.Time
	ctx    context.Context
	cancel context.CancelFunc
}

func (d *deadline) init(parent context.Context) {
	d.parent = parent
	d.ctx, d.cancel = context.WithCancel(parent)
}

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cancel()
	d.t = t
	if t.IsZero() {
		d.ctx, d.cancel = context.WithCancel(d.parent)
	} else {
		d.ctx, d.cancel = context.WithDeadline(d.parent, t)
	}
}

func (d *deadline) context() context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ctx
}

// expired reports whether the deadline is set and has passed: by the
// context's own timer (the monotonic clock), or by the wall clock.
func (d *deadline) expired() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return errors.Is(d.ctx.Err(), context.DeadlineExceeded) || !d.t.IsZero() && !time.Now().Before(d.t)
}

func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cancel()
}

// A stream's message connection takes these sizes for the zero fields of
// its msg.Config, not package msg's defaults (16 KiB, 32, 32): a 64 KiB
// Write is one message rather than four, which made the stream 15 % faster
// on rxe and 23 % on siw in the cost model (bench/notes.md), for about
// 1.6 MB of registered memory per connection rather than 1.2 MB.
const (
	defaultMaxMessage  = 64 << 10
	defaultCredits     = 8
	defaultSendBuffers = 8
)

// withDefaults is cfg with the stream's defaults in its zero sizes.
func withDefaults(cfg *msg.Config) *msg.Config {
	var o msg.Config
	if cfg != nil {
		o = *cfg
	}
	if o.MaxMessageSize == 0 {
		o.MaxMessageSize = defaultMaxMessage
	}
	if o.Credits == 0 {
		o.Credits = defaultCredits
	}
	if o.SendBuffers == 0 {
		o.SendBuffers = defaultSendBuffers
	}
	return &o
}

// Dialer dials stream connections. Its zero value is ready to use.
type Dialer struct {
	// RDMA is the dialer of the connection underneath (its PrivateData
	// must be empty: the message hello rides there).
	RDMA rdmacm.Dialer
	// Config sizes the message connection. Its zero sizes take the
	// stream's defaults: 64 KiB messages, 8 credits, 8 send buffers.
	Config msg.Config
	// Resolver looks up host names (nil: net.DefaultResolver).
	Resolver Resolver
}

// DialContext connects to the stream listener at address ("host:port").
// network may be "rdma", or "tcp", "tcp4" or "tcp6" for code that passes
// those through (http.Transport.DialContext, grpc.WithContextDialer);
// "tcp4" and "tcp6" keep to that address family. A host name is looked up
// and its addresses tried in turn, as net.Dialer does, until one connects
// or ctx ends; the error is then ctx's, else the first address's.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	switch network {
	case Network, "tcp", "tcp4", "tcp6", "":
	default:
		return nil, &net.OpError{Op: "dial", Net: network, Err: net.UnknownNetworkError(network)}
	}
	addrs, err := dialAddrs(ctx, d.Resolver, network, address)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: Network, Err: err}
	}
	var first error
	for _, ap := range addrs {
		c, err := msg.Dial(ctx, &d.RDMA, ap.String(), withDefaults(&d.Config))
		if err == nil {
			return New(c), nil
		}
		if ctx.Err() != nil {
			return nil, &net.OpError{Op: "dial", Net: Network, Addr: Addr{ap}, Err: ctx.Err()}
		}
		if first == nil {
			first = &net.OpError{Op: "dial", Net: Network, Addr: Addr{ap}, Err: err}
		}
	}
	return nil, first
}

// Dial connects to the stream listener at address with the zero Dialer.
func Dial(ctx context.Context, address string) (net.Conn, error) {
	var d Dialer
	return d.DialContext(ctx, Network, address)
}

// Listener is a net.Listener of stream connections. One dropped without
// Close is closed by the garbage collector, as its msg.Listener is.
type Listener struct {
	l           *msg.Listener
	addr        Addr
	closeCtx    context.Context
	closeCancel context.CancelFunc
	closing     atomic.Bool
}

// Listen listens for stream connections at address through lc (nil: the
// zero rdmacm.ListenConfig), with message connections sized by cfg (nil,
// and its zero sizes: the stream's defaults, 64 KiB messages, 8 credits,
// 8 send buffers). The address is numeric; without a host (":7471") it is
// 0.0.0.0, every RDMA device's IPv4 addresses (net.Listen's would be
// IPv6's too; listen on [::] for those).
func Listen(ctx context.Context, lc *rdmacm.ListenConfig, address string, cfg *msg.Config) (*Listener, error) {
	l, err := msg.Listen(ctx, lc, listenAddr(address), withDefaults(cfg))
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: Network, Err: err}
	}
	s := &Listener{l: l, addr: Addr{l.Addr()}}
	s.closeCtx, s.closeCancel = context.WithCancel(context.Background())
	return s, nil
}

// Accept waits for the next connection. Handshakes run in parallel (see
// msg.Listener.Accept), so a dialer that stalls in its own holds up no
// other. A dialer whose handshake fails is passed over; Accept returns an error once the listener is closed or
// broken, and a temporary one (Temporary reports true, as for a socket's
// EMFILE) when this host runs out of memory to register or descriptors.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.l.Accept(l.closeCtx)
		if err == nil {
			return New(c), nil
		}
		if l.closeCtx.Err() != nil {
			return nil, &net.OpError{Op: "accept", Net: Network, Addr: l.addr, Err: net.ErrClosed}
		}
		// One dialer's failed handshake names that dialer: the listener
		// goes on. Running out of a local resource (memory to register,
		// descriptors) would fail every dialer: that is returned, as a
		// temporary error, so that a server loop such as http.Serve's
		// backs off and tries again, as it does for a socket's EMFILE.
		var oe *msg.OpError
		switch {
		case !errors.As(err, &oe) || !oe.Remote.IsValid():
			return nil, &net.OpError{Op: "accept", Net: Network, Addr: l.addr, Err: err}
		case outOfResources(err):
			return nil, &net.OpError{Op: "accept", Net: Network, Addr: l.addr, Err: temporary{err}}
		}
	}
}

// outOfResources reports whether err is this host running out of
// something every connection needs.
func outOfResources(err error) bool {
	if errors.Is(err, rdmacm.ErrNoResources) {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.ENOMEM, syscall.EMFILE, syscall.ENFILE, syscall.ENOSPC, syscall.ENOBUFS} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// temporary marks an error as one that may pass (net.Error's Temporary).
type temporary struct{ error }

func (t temporary) Temporary() bool { return true }
func (t temporary) Timeout() bool   { return false }
func (t temporary) Unwrap() error   { return t.error }

// Close stops listening; a blocked Accept returns net.ErrClosed, and so
// does a second Close, as a net.TCPListener's does.
func (l *Listener) Close() error {
	if !l.closing.CompareAndSwap(false, true) {
		return &net.OpError{Op: "close", Net: Network, Addr: l.addr, Err: net.ErrClosed}
	}
	l.closeCancel()
	if err := l.l.Close(); err != nil {
		return &net.OpError{Op: "close", Net: Network, Addr: l.addr, Err: err}
	}
	return nil
}

// Addr is the address the listener is bound to.
func (l *Listener) Addr() net.Addr { return l.addr }
