package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmago/rdmago/internal/vbridge"
	"github.com/rdmago/rdmago/verbs"
)

// Route describes a connection's path as the CM set it up (librdmacm's
// rdma_route): addresses, device and port, kind of RDMA, GID and MTU.
type Route struct {
	Local, Remote netip.AddrPort
	Device        string
	Port          int
	Transport     verbs.Transport
	// Kind is what the port is: RoCE and InfiniBand share the IB
	// transport, and only the source GID's type tells them apart here.
	// KindUnknown if the GID could not be read (the device is gone).
	Kind verbs.Kind
	// GIDIndex is the source GID index the QP uses (RoCE and InfiniBand;
	// -1 on iWARP, which has none, and on the accepting side of UD, which
	// addresses each reply anew), and GIDType that entry's type: on RoCE,
	// v1 or v2, which both ends must agree on.
	GIDIndex int
	GIDType  verbs.GIDType
	// MTU is the QP's path MTU (0 on iWARP, where TCP segments instead).
	MTU  verbs.MTU
	Mode Mode
}

// String reads like "10.0.0.1:41618 -> 10.0.0.2:7471 on rxe0 port 1
// (RoCE v2, CM-managed), GID index 1, MTU 1024".
func (p Route) String() string {
	s := fmt.Sprintf("%v -> %v on %s port %d (%s, %v)", p.Local, p.Remote, p.Device, p.Port, p.kindName(), p.Mode)
	if p.GIDIndex >= 0 {
		s += fmt.Sprintf(", GID index %d", p.GIDIndex)
	}
	if p.MTU != 0 {
		s += fmt.Sprintf(", MTU %v", p.MTU)
	}
	return s
}

// UDPeer addresses a UD endpoint: where SendTo sends.
type UDPeer struct {
	AH   *verbs.AH
	QPN  uint32
	QKey uint32
}

// conn is what every kind of connection (Conn, UDConn, MulticastConn) is
// made of: a QP with its CQs and PD, the CM id that set it up, and the
// helpers that post on it and wait. Each kind embeds it and adds the
// methods that apply to it.
//
// Every method may be called from several goroutines at once. The
// senders (Send, RDMAWrite, RDMARead, SendTo) post one request and wait
// for its completion on the send CQ, which one of them at a time does:
// concurrent calls take turns, each returning when its own request has
// completed. Recv likewise hands each receive completion to one caller.
// PostRecv, RegisterMemory and the accessors do not wait, and a sender, a
// receiver and PostRecv run side by side. Close, from any goroutine,
// first wakes the calls still waiting (they fail with ErrEnded) and then
// releases what they used.
type conn struct {
	qp  *verbs.QP
	scq *verbs.CQ
	rcq *verbs.CQ
	pd  *verbs.PD
	dev *verbs.Device

	path Route
	// pathMu guards the part of path that Route fills in on first use.
	pathMu    sync.Mutex
	pathKnown bool
	peerData  []byte
	peer      UDPeer     // UD: the dialed peer, or the multicast group
	group     netip.Addr // multicast: the group joined
	opts      settings

	id  *ID // nil for a connection made by package oob
	res *resources
	// oob: the socket the QP data crossed, kept as liveness signal.
	tcp     net.Conn
	tcpDone chan struct{}
	keepTCP bool // a failed oob exchange: the socket goes back to its caller

	done     chan struct{}
	doneOnce sync.Once
	err      error // why done closed; set before

	// endCtx is cancelled when done closes: waits that the end must
	// interrupt run under it. Made on the first wait.
	endMu     sync.Mutex
	endCtx    context.Context
	endCancel context.CancelFunc

	closeOnce sync.Once
	closeErr  error

	disconnectOnce sync.Once
	disconnectErr  error
	// sendDisconnectOnce guards the disconnect request, sent at
	// disconnectSent.
	sendDisconnectOnce sync.Once
	sendDisconnectErr  error
	disconnectSent     time.Time
	disconnecting      atomic.Bool // this side sent a disconnect: the peer's answer needs none

	// sendMu is held by a helper waiting for its send completion, recvMu
	// by Recv: one waiter per CQ. Close takes both, and mrMu, before it
	// releases the objects, once the end has woken the waiters.
	sendMu sync.Mutex
	recvMu sync.Mutex
	// The contexts that end with a waiter's or the connection, kept
	// across waits with the same caller's context; guarded by sendMu and
	// recvMu.
	sendWait, recvWait mergedContext
	wrID               atomic.Uint64
	mrMu               sync.Mutex // guards res.mrs, res.ahs and replyAHs
	// replyAHs are the AHs ReplyTo made, by address: one per sender.
	replyAHs map[verbs.AHAttr]*verbs.AH
	// released: Close released the verbs objects. Written with sendMu,
	// recvMu and mrMu held: any one of them guards a read.
	released bool
}

// QP is the connection's queue pair, for work requests the helpers do not
// cover: post on it and poll the CQs yourself (but not while a helper
// waits on the same CQ, or the completions are split between you). Close
// releases the QP, and the CQs and PD unless the ConnConfig lent them.
func (c *conn) QP() *verbs.QP { return c.qp }

// SendCQ is the completion queue of the QP's sends (see QP).
func (c *conn) SendCQ() *verbs.CQ { return c.scq }

// RecvCQ is the completion queue of the QP's receives (see QP).
func (c *conn) RecvCQ() *verbs.CQ { return c.rcq }

// PD is the protection domain of the QP and of RegisterMemory's memory.
func (c *conn) PD() *verbs.PD { return c.pd }

// Device is the RDMA device the connection goes through.
func (c *conn) Device() *verbs.Device { return c.dev }

// kindName is the kind of RDMA, with the RoCE version.
func (p Route) kindName() string {
	switch p.Kind {
	case verbs.KindRoCE:
		if p.GIDIndex >= 0 {
			return p.GIDType.String()
		}
	case verbs.KindUnknown:
		return p.Transport.String()
	}
	return p.Kind.String()
}

// Route is the connection's addresses, device, port, kind of RDMA (RoCE
// v1 or v2, InfiniBand, iWARP), GID index and MTU. On RoCE and InfiniBand the
// first call once the connection is up reads the source GID's type from
// the device: setup itself never needs it.
func (c *conn) Route() Route {
	c.pathMu.Lock()
	defer c.pathMu.Unlock()
	if !c.pathKnown {
		c.pathKnown = c.learnGIDType()
	}
	return c.path
}

// learnGIDType fills in the Kind and GIDType of a CM connection's path from
// its source GID entry. It reports false while there is nothing to go by
// yet: BeforeConnect's Conn has no GID index.
func (c *conn) learnGIDType() bool {
	p := &c.path
	switch {
	case p.Kind == verbs.KindIWARP:
		return true
	case p.GIDIndex < 0 || c.dev == nil:
		return false
	}
	e, err := c.dev.QueryGID(p.Port, p.GIDIndex)
	if err != nil {
		return true // the device is gone: Path says what it knows
	}
	p.GIDType = e.Type
	p.Kind = verbs.KindInfiniBand
	if e.Type == verbs.GIDTypeRoCEv1 || e.Type == verbs.GIDTypeRoCEv2 {
		p.Kind = verbs.KindRoCE
	}
	return true
}

// LocalAddr is the connection's local IP address and port.
func (c *conn) LocalAddr() netip.AddrPort { return c.path.Local }

// Done is closed when the connection ends: the peer disconnected (or its
// process exited, or its accept gave up on a dialed connection before the
// handshake reached it), the device went away, the local address moved,
// or this side ended it (Conn.Disconnect, Close). Err then says which.
//
// From then on every call that uses the connection (the senders, Recv,
// PostRecv, ReplyTo, RegisterMemory) fails at once, and one waiting when
// it ends returns at once, with an error that matches ErrEnded and wraps
// Err. Recv first returns the completions already there: messages that
// arrived before the end, then the receives the end flushed (see Recv).
// Conn.Disconnect returns nil, as there is nothing left to end; Close is
// still needed to release the connection.
func (c *conn) Done() <-chan struct{} { return c.done }

// Err is nil while the connection is up, then the reason it ended. It
// matches ErrEnded, and the reason: errors.Is with ErrDisconnected,
// ErrDeviceRemoved, ErrAddrChanged or ErrClosed.
func (c *conn) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// end records why the connection ended, once, and flushes the QP: work
// requests still posted complete with WR_FLUSH_ERR instead of hanging.
// It wakes the calls waiting on the connection.
func (c *conn) end(kind error, ev *Event) {
	c.doneOnce.Do(func() {
		cause := kind
		if ev != nil && ev.Type == eventChannelFailed {
			cause, ev = ev.err, nil // no CM event ended it
		}
		e := c.opError(opConnection, ErrEnded, cause)
		e.Hint = endHint(kind, c.disconnecting.Load())
		if ev != nil && ev.Type == EventMulticastError {
			e.Hint = hintFor(ev.Type, ev.Status, false)
		} else if ev != nil && ev.Type != EventDisconnected && kind == ErrDisconnected {
			e.Hint = "the peer gave up on the connection after this side had it established: most often the " +
				"peer's accept timed out (its ConnectTimeout) before this side's answer to its reply arrived, " +
				"as happens under load; Close this side and dial again"
		}
		if ev != nil {
			e.Event, e.Status = ev.Type.String(), ev.Status
		}
		c.err = e
		if c.qp != nil {
			// UD too: left in RTS, its posted receives would keep
			// taking datagrams into buffers the caller now thinks idle.
			c.qp.Modify(&verbs.QPAttr{State: verbs.QPStateErr}, verbs.AttrState)
		}
		close(c.done)
		c.endMu.Lock()
		if c.endCancel != nil {
			c.endCancel()
		}
		c.endMu.Unlock()
	})
}

// endHint says what ended the connection, by the kind of end and whether
// this side had sent a disconnect.
func endHint(kind error, disconnecting bool) string {
	switch {
	case kind == ErrDisconnected && disconnecting:
		return "this side disconnected (Disconnect or Close)"
	case kind == ErrDisconnected:
		return "the peer disconnected or closed the connection, or its process exited; Close this side to release it"
	case kind == ErrDeviceRemoved:
		return "the RDMA device went away (driver unloaded, rdma link delete); Close the connection"
	case kind == ErrAddrChanged:
		return "the local address moved to another device or went away; Close the connection and dial again"
	case kind == ErrClosed:
		return "this side ended it: Disconnect or Close was called"
	}
	return ""
}

// ended reports whether the connection has ended.
func (c *conn) ended() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// endedError is op's error on a connection that has ended: Err, which
// says why and matches ErrEnded, in op's place.
func (c *conn) endedError(op string) error {
	return c.opError(op, nil, c.err)
}

// endContext is a context that the end of the connection cancels.
func (c *conn) endContext() context.Context {
	c.endMu.Lock()
	defer c.endMu.Unlock()
	if c.endCtx == nil {
		c.endCtx, c.endCancel = context.WithCancel(context.Background())
		if c.ended() {
			c.endCancel()
		}
	}
	return c.endCtx
}

// pollWait polls cq into wcs and waits, if it is empty, until a completion
// arrives, ctx ends or the connection ends. A wait the end interrupts
// polls once more, for a completion that came with it, and otherwise
// fails with the ended error. The caller holds the CQ's lock (sendMu or
// recvMu), which guards m, and has checked released.
func (c *conn) pollWait(ctx context.Context, op string, cq *verbs.CQ, m *mergedContext, wcs []verbs.WorkCompletion) (int, error) {
	var wctx context.Context
	if ctx.Done() == nil {
		wctx = c.endContext() // nothing to merge
	} else {
		wctx = m.get(ctx, c.endContext())
	}
	n, err := cq.PollWait(wctx, wcs)
	if err == nil {
		return n, nil
	}
	if ctx.Err() == nil && c.ended() {
		if n, _ := cq.Poll(wcs); n > 0 {
			return n, nil
		}
		return 0, c.endedError(op)
	}
	return 0, c.opError(op, nil, err)
}

// mergedContext is a context that ends with either of two, kept for the
// next wait with the same first one: a loop that waits again and again
// with one context sets none up per wait.
//
// The same context is known by its Done channel: contexts are not
// comparable values in general (a context type may hold a slice), and two
// with one Done channel end together.
type mergedContext struct {
	done   <-chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	stop   func() bool
}

// get returns a context that ends when parent or end does.
func (m *mergedContext) get(parent, end context.Context) context.Context {
	done := parent.Done()
	if m.ctx != nil && m.done == done {
		return m.ctx
	}
	m.release()
	ctx, cancel := context.WithCancel(parent)
	*m = mergedContext{done: done, ctx: ctx, cancel: cancel, stop: context.AfterFunc(end, cancel)}
	return ctx
}

func (m *mergedContext) release() {
	if m.ctx != nil {
		m.stop()
		m.cancel()
		*m = mergedContext{}
	}
}

// onEvent handles the events of an established connection. ESTABLISHED
// repeats and TIMEWAIT_EXIT (the QP may be reused) need nothing: the
// dispatcher has acked them already.
func (c *conn) onEvent(ev *Event) {
	switch ev.Type {
	case EventDisconnected:
		// Answer the peer's disconnect now: on InfiniBand and RoCE its
		// side waits for our reply (the DREP), which would otherwise go
		// out only when this side is closed. The id cannot be destroyed
		// meanwhile: handlers run under its lock.
		if !c.disconnecting.Load() {
			c.id.Disconnect()
		}
		c.end(ErrDisconnected, ev)
	case EventDeviceRemoval:
		c.end(ErrDeviceRemoved, ev)
	case EventAddrChange:
		c.end(ErrAddrChanged, ev)
	case EventMulticastError:
		// After the join: the membership is gone (on InfiniBand an SM
		// reregister or a port error; rdma_join_multicast(3) says to join
		// again). Left up, the connection would look alive and receive
		// nothing.
		if c.group.IsValid() {
			c.end(ErrDisconnected, ev)
		}
	case EventRejected, EventUnreachable, EventConnectError:
		// A dialer's connection is up once its CM has answered the
		// listener's reply (the RTU), but the listener's accept may have
		// timed out before that answer arrived: its CM then rejects the
		// connection, and librdmacm moves this side's QP to the error
		// state. Left up, the connection would look alive with a dead QP.
		if c.qp.Type != verbs.QPTypeUD {
			c.end(ErrDisconnected, ev)
		}
	case eventChannelFailed:
		c.end(ErrEventChannel, ev)
	}
}

func (c *conn) opError(op string, kind, err error) *OpError {
	return &OpError{Op: op, Local: c.path.Local, Remote: c.path.Remote, Device: c.path.Device, Port: c.path.Port,
		QPN: c.qp.QPN, Kind: kind, Err: cause(err)}
}

// disconnectWait is Conn.Disconnect: UD connections, and those that
// package oob made, have no CM connection to end and just end here
// (the latter by closing the socket).
func (c *conn) disconnectWait(ctx context.Context) error {
	c.disconnectOnce.Do(func() { c.disconnectErr = c.disconnect(ctx) })
	return c.disconnectErr
}

// startDisconnect sends the disconnect; Done closes when the CM reports
// the end. UD connections and oob's end here at once.
func (c *conn) startDisconnect() error {
	if c.tcp != nil || c.qp.Type == verbs.QPTypeUD {
		return c.disconnectWait(context.Background())
	}
	c.sendDisconnectOnce.Do(func() { c.sendDisconnectErr = c.sendDisconnect() })
	return c.sendDisconnectErr
}

// sendDisconnect is rdma_disconnect; disconnectSent records when it went
// out, and stays zero when there was nothing to end.
func (c *conn) sendDisconnect() error {
	select {
	case <-c.done:
		return nil
	default:
	}
	sent := time.Now()
	c.disconnecting.Store(true)
	if err := c.id.Disconnect(); err != nil {
		select {
		case <-c.done:
			return nil // the peer's disconnect came first
		default:
		}
		c.end(ErrClosed, nil)
		return c.opError("disconnect", nil, err)
	}
	c.disconnectSent = sent
	return nil
}

func (c *conn) disconnect(ctx context.Context) error {
	if c.tcp != nil {
		c.end(ErrClosed, nil) // before the watcher sees its own close as the peer's
		if !c.keepTCP {
			c.tcp.Close()
		}
		if c.tcpDone != nil { // nil when the watcher never started
			<-c.tcpDone
		}
		return nil
	}
	if c.qp.Type == verbs.QPTypeUD {
		c.end(ErrClosed, nil)
		return nil
	}
	if err := c.startDisconnect(); err != nil || c.disconnectSent.IsZero() {
		return err
	}
	start := c.disconnectSent
	t := time.NewTimer(c.opts.CloseTimeout)
	defer t.Stop()
	select {
	case <-c.done:
		c.opts.trace(StepDisconnect, start)
		return nil
	case <-t.C:
		c.end(ErrClosed, nil)
		oe := c.opError("disconnect", ErrTimeout, fmt.Errorf("no DISCONNECTED event within %v", c.opts.CloseTimeout))
		oe.Hint = "the peer did not answer the disconnect (it may be gone); the QP is in the error state regardless"
		return oe
	case <-ctx.Done():
		c.end(ErrClosed, nil)
		return c.opError("disconnect", nil, ctx.Err())
	}
}

// Close ends the connection (a reliable connection's with a disconnect,
// see Conn.Disconnect; a multicast membership by leaving the group) and
// releases the QP, MRs made with RegisterMemory, CQs, PD and the CM id,
// in that order. A disconnect that
// gets no answer within CloseTimeout does not stop the release; Close
// reports only what releasing the objects reported. Calls waiting on the
// connection in other goroutines return (with ErrEnded) before anything
// is released.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		c.disconnectWait(context.Background())
		var leaveErr error
		if c.group.IsValid() {
			if err := c.id.LeaveMulticast(c.group); err != nil {
				// librdmacm has detached the QP (it ignores how that
				// went) and dropped its record when the kernel's leave
				// fails: the membership then ends with the id, below.
				oe := c.opError("leave multicast group "+c.group.String(), nil, err)
				oe.Hint = "the kernel's membership ends at the latest with the CM id, which Close destroys next"
				leaveErr = oe
			}
		}
		c.end(ErrClosed, nil)
		// The end woke the helpers' waits: once they have let go of
		// the CQs, nothing polls them while they are destroyed.
		c.sendMu.Lock()
		c.recvMu.Lock()
		c.mrMu.Lock()
		c.released = true
		c.sendWait.release()
		c.recvWait.release()
		start := time.Now()
		c.closeErr = errors.Join(leaveErr, c.res.close())
		c.mrMu.Unlock()
		c.recvMu.Unlock()
		c.sendMu.Unlock()
		c.opts.trace(StepDestroyQP, start)
		if c.id != nil {
			start := time.Now()
			c.id.Close()
			c.opts.trace(StepDestroyID, start)
		}
	})
	return c.closeErr
}

// RegisterMemory registers size bytes of memory outside the Go heap for the
// connection's PD; Close releases it. A receive (PostRecv) or an RDMA READ
// (RDMARead) into it needs verbs.AccessLocalWrite.
//
// Close unmaps the memory: a slice taken from the region's Bytes before
// must not be touched once Close may have run, as the access would fault
// the process (Go cannot recover from it). Let the goroutines that read
// the region finish before closing, or use package msg, which frees a
// message's buffer only when the message is released.
func (c *conn) RegisterMemory(size int, access verbs.AccessFlags) (*verbs.MR, error) {
	c.mrMu.Lock()
	defer c.mrMu.Unlock()
	if c.ended() {
		return nil, c.endedError("register memory")
	}
	mr, err := c.pd.RegisterMemory(size, access)
	if err != nil {
		return nil, err
	}
	c.res.mrs = append(c.res.mrs, mr)
	return mr, nil
}

// checkLocal refuses a local buffer that the device would refuse only
// later, in a failed completion: a range outside mr or, when the device
// writes into it (a receive, an RDMA READ), memory registered without
// local write access.
func (c *conn) checkLocal(op string, mr *verbs.MR, off, n int, deviceWrites bool) error {
	if mr == nil {
		return c.opError(op, nil, errors.New("the memory region is nil"))
	}
	if mr.Bytes() == nil {
		// Closed: by the caller, or with the connection, whose end then
		// is the reason every call fails.
		if c.ended() {
			return c.endedError(op)
		}
		return c.opError(op, nil, errors.New("the memory region is closed"))
	}
	if size := len(mr.Bytes()); off < 0 || n < 0 || off > size || n > size-off {
		oe := c.opError(op, nil, fmt.Errorf("%d bytes at offset %d do not lie within the %d-byte memory region", n, off, size))
		oe.Hint = "off and n address the region: 0 <= off and off+n <= its size"
		return oe
	}
	if n > math.MaxUint32 {
		// A scatter/gather element's length is 32 bits: more would wrap.
		return c.opError(op, nil, fmt.Errorf("%d bytes in one work request, more than its 32-bit length holds", n))
	}
	if !deviceWrites || n == 0 {
		return nil
	}
	if a := mr.Access(); a&verbs.AccessLocalWrite == 0 {
		oe := c.opError(op, nil, fmt.Errorf("the memory region was registered without verbs.AccessLocalWrite (access %v), "+
			"and the device writes into it", a))
		oe.Hint = "register it with verbs.AccessLocalWrite; otherwise the device fails only when it writes " +
			"(a receive: on rxe as LOC_QP_OP_ERR, the sender's as REM_OP_ERR; on siw as GENERAL_ERR)"
		return oe
	}
	return nil
}

// RemoteBufferOf describes n bytes of mr from off, for the peer.
func RemoteBufferOf(mr *verbs.MR, off, n int) RemoteBuffer {
	return RemoteBuffer{Addr: mr.Addr() + uint64(off), RKey: mr.RKey, Len: uint32(n)}
}

// PostRecv posts a receive of up to n bytes into mr at off. Post receives
// before the peer sends: on RoCE a SEND without a posted receive waits for
// one (RNR) and fails after the RNR retries; on iWARP it ends the
// connection; on UD (UDConn, MulticastConn) the datagram is dropped
// without a trace.
//
// The receive's completion, which Recv returns, names its buffer: its ID
// is the buffer's address, mr.Addr()+off, so the message is at offset
// wc.ID-mr.Addr() of mr, wc.ByteLen bytes long. On UD those bytes begin
// with the verbs.GRHSize (40) bytes the device writes before the data:
// the datagram is wc.ByteLen-verbs.GRHSize bytes at offset+verbs.GRHSize,
// and a UD receive must be longer than the GRH.
// Receives also complete in the order they were posted.
//
// A range outside mr, and memory that RegisterMemory registered without
// verbs.AccessLocalWrite, are refused here rather than failing when a
// message arrives. The receive queue holds ConnConfig.Cap.MaxRecvWR
// receives (or a few more, as the device rounds it up): each keeps its
// slot until Recv takes its completion.
func (c *conn) PostRecv(mr *verbs.MR, off, n int) error {
	const op = "post receive"
	if c.ended() {
		return c.endedError(op)
	}
	if err := c.checkLocal(op, mr, off, n, true); err != nil {
		return err
	}
	if c.qp.Type == verbs.QPTypeUD && n <= verbs.GRHSize {
		oe := c.opError(op, nil, fmt.Errorf("a UD receive of %d bytes has no room for data after the %d-byte GRH", n, verbs.GRHSize))
		oe.Hint = "post verbs.GRHSize plus the largest datagram expected"
		return oe
	}
	err := c.qp.PostRecv(verbs.RecvWR{ID: mr.Addr() + uint64(off), SGEs: []verbs.SGE{sgeOf(mr, off, n)}})
	switch {
	case err == nil:
		return nil
	case !isENOMEM(err) && c.endingAfter():
		return c.endedError(op)
	case isENOMEM(err):
		oe := c.opError(op, nil, &explained{"the receive queue is full (ibv_post_recv: ENOMEM)", []error{syscall.ENOMEM, err}})
		oe.Hint = fmt.Sprintf("a posted receive keeps its slot until Recv takes its completion; the queue holds "+
			"ConnConfig.Cap.MaxRecvWR receives (%d here; the device may round it up): take completions before "+
			"posting more, or raise it", c.opts.Cap.MaxRecvWR)
		return oe
	}
	return c.opError(op, nil, err)
}

// endingAfter reports, after a post failed, whether the connection has
// ended or is ending: this side's disconnect (a Close on another
// goroutine) moves the QP at once (siw refuses the doorbell with
// ENOTCONN), and the end follows within CloseTimeout; the post's error is
// then the end's.
func (c *conn) endingAfter() bool {
	if c.disconnecting.Load() && !c.ended() {
		t := time.NewTimer(c.opts.CloseTimeout)
		select {
		case <-c.done:
		case <-t.C:
		}
		t.Stop()
	}
	return c.ended()
}

// isENOMEM reports whether a post failed with ENOMEM, a full queue. Some
// providers (siw in rdma-core 44) return it negated.
func isENOMEM(err error) bool {
	var errno syscall.Errno
	return errors.As(err, &errno) && (errno == syscall.ENOMEM || int(errno) == -int(syscall.ENOMEM))
}

// explained is a cause put into words; it still matches what it explains.
type explained struct {
	msg  string
	errs []error
}

func (e *explained) Error() string   { return e.msg }
func (e *explained) Unwrap() []error { return e.errs }

// Recv waits for the next receive completion, in the order the receives
// were posted; its ID names the buffer (see PostRecv). A failed receive
// comes with its completion and an error. Once the connection has ended,
// Recv returns the completions still queued (messages that arrived
// before the end, then the receives the end flushed, as errors), then
// fails at once with ErrEnded.
func (c *conn) Recv(ctx context.Context) (verbs.WorkCompletion, error) {
	if c.opts.RecvCQ != nil {
		return verbs.WorkCompletion{}, c.sharedCQError("receive", "RecvCQ")
	}
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	if c.released {
		return verbs.WorkCompletion{}, c.endedError("receive")
	}
	var wc [1]verbs.WorkCompletion
	if c.ended() {
		// What arrived before the end, and the flushed receives.
		if n, _ := c.rcq.Poll(wc[:]); n == 0 {
			return verbs.WorkCompletion{}, c.endedError("receive")
		}
	} else if _, err := c.pollWait(ctx, "receive", c.rcq, &c.recvWait, wc[:]); err != nil {
		return verbs.WorkCompletion{}, err
	}
	if wc[0].Status != verbs.WCSuccess {
		return wc[0], c.completionError("receive", wc[0], 0)
	}
	return wc[0], nil
}

// send sends n bytes of mr from off and waits for the completion.
func (c *conn) send(ctx context.Context, mr *verbs.MR, off, n int) error {
	if err := c.checkLocal("send", mr, off, n, false); err != nil {
		return err
	}
	return c.post(ctx, "send", verbs.SendWR{Opcode: verbs.OpSend, SGEs: []verbs.SGE{sgeOf(mr, off, n)}})
}

// rdmaWrite copies n bytes of mr from off into the peer's memory.
func (c *conn) rdmaWrite(ctx context.Context, mr *verbs.MR, off, n int, to RemoteBuffer) error {
	if err := c.checkLocal("RDMA write", mr, off, n, false); err != nil {
		return err
	}
	if uint64(n) > uint64(to.Len) {
		return c.opError("RDMA write", nil, fmt.Errorf("%d bytes do not fit the peer's %d-byte buffer", n, to.Len))
	}
	return c.post(ctx, "RDMA write", verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGEs: []verbs.SGE{sgeOf(mr, off, n)},
		RemoteAddr: to.Addr, RKey: to.RKey})
}

// rdmaRead copies n bytes of the peer's memory into mr at off.
func (c *conn) rdmaRead(ctx context.Context, mr *verbs.MR, off, n int, from RemoteBuffer) error {
	if err := c.checkLocal("RDMA read", mr, off, n, true); err != nil {
		return err
	}
	if uint64(n) > uint64(from.Len) {
		return c.opError("RDMA read", nil, fmt.Errorf("%d bytes exceed the peer's %d-byte buffer", n, from.Len))
	}
	return c.post(ctx, "RDMA read", verbs.SendWR{Opcode: verbs.OpRDMARead, SGEs: []verbs.SGE{sgeOf(mr, off, n)},
		RemoteAddr: from.Addr, RKey: from.RKey})
}

// sgeOf is mr's element for a range checkLocal let through. Not MR.SGE,
// which panics on a region closed meanwhile: a connection's Close may run
// on another goroutine between the check and the post, and the call must
// then fail with the connection's end (the post sees it), not crash.
func sgeOf(mr *verbs.MR, off, n int) verbs.SGE {
	return verbs.SGE{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.LKey}
}

// udPathMTU is a UD connection's MTU: this port's, or the peer's when it
// said a smaller one (in rdmago's private data header). A datagram above
// it is dropped on the way, silently: rxe even completes its send.
func udPathMTU(local, peer verbs.MTU) verbs.MTU {
	if peer.Valid() && (!local.Valid() || peer < local) {
		return peer
	}
	return local
}

// sendTo sends a UD datagram to peer.
func (c *conn) sendTo(ctx context.Context, mr *verbs.MR, off, n int, peer UDPeer) error {
	if err := c.checkLocal("send to", mr, off, n, false); err != nil {
		return err
	}
	if mtu := c.path.MTU; mtu.Valid() && n > mtu.Bytes() {
		oe := c.opError("send to", nil, fmt.Errorf("a datagram of %d bytes is larger than the path MTU, %d", n, mtu.Bytes()))
		oe.Hint = "a UD message must fit one packet: split it (the device would drop it, and rxe reports the send done)"
		return oe
	}
	return c.post(ctx, "send to", verbs.SendWR{Opcode: verbs.OpSend, SGEs: []verbs.SGE{sgeOf(mr, off, n)},
		AH: peer.AH, RemoteQPN: peer.QPN, RemoteQKey: peer.QKey})
}

// replyTo addresses the sender of a UD receive; the AH is released with
// the connection.
func (c *conn) replyTo(wc verbs.WorkCompletion, mr *verbs.MR, off int) (UDPeer, error) {
	c.mrMu.Lock()
	defer c.mrMu.Unlock()
	if c.ended() {
		return UDPeer{}, c.endedError("address the sender")
	}
	if err := c.checkLocal("address the sender", mr, off, verbs.GRHSize, false); err != nil {
		return UDPeer{}, err // the GRH is read from mr at off
	}
	grh := mr.Bytes()[off : off+verbs.GRHSize]
	var attr verbs.AHAttr
	var err error
	if src, dst, ok := grhAddrs(grh); ok && wc.Flags&verbs.WCWithGRH != 0 && dst.IsMulticast() {
		// Sent to a group: ibv_init_ah_from_wc looks the destination up
		// among the local GIDs to pick the source entry, and refuses a
		// multicast one. The reply leaves from the membership's entry.
		attr = verbs.AHAttr{DLID: wc.SLID, SL: wc.SL, PortNum: uint8(c.path.Port), IsGlobal: true,
			GRH: verbs.GlobalRoute{DGID: verbs.GIDFromIP(src), SGIDIndex: uint8(max(c.path.GIDIndex, 0)), HopLimit: 64}}
	} else if attr, err = c.pd.AHAttrFromWC(c.path.Port, wc, grh); err != nil {
		return UDPeer{}, c.opError("address the sender", nil, err)
	}
	// One AH per sender: a server answering every datagram would
	// otherwise make one per reply, until the device's AHs ran out.
	if ah, ok := c.replyAHs[attr]; ok && vbridge.AH(ah) != nil { // not one the caller closed
		return UDPeer{AH: ah, QPN: wc.SrcQP, QKey: udpQKey}, nil
	}
	ah, err := c.pd.CreateAH(attr)
	if err != nil {
		return UDPeer{}, c.opError("address the sender", nil, err)
	}
	if c.replyAHs == nil {
		c.replyAHs = make(map[verbs.AHAttr]*verbs.AH)
	}
	c.replyAHs[attr] = ah
	c.res.ahs = append(c.res.ahs, ah)
	return UDPeer{AH: ah, QPN: wc.SrcQP, QKey: udpQKey}, nil
}

// grhAddrs reads a UD receive's source and destination from the 40
// bytes before its data: a GRH (InfiniBand, RoCE v1 and v2 over IPv6),
// or, on RoCE v2 over IPv4, an IPv4 header in the last 20, as
// ibv_init_ah_from_wc tells them apart.
func grhAddrs(grh []byte) (src, dst netip.Addr, ok bool) {
	if len(grh) < verbs.GRHSize {
		return src, dst, false
	}
	ip4 := grh[20:40]
	isV4 := ip4[0]>>4 == 4 && (grh[0]>>4 != 6 || ip4[0]&0xf == 5 && ipv4Checksum(ip4) == 0)
	if isV4 {
		return netip.AddrFrom4([4]byte(ip4[12:16])), netip.AddrFrom4([4]byte(ip4[16:20])), true
	}
	if grh[0]>>4 != 6 {
		return src, dst, false
	}
	return netip.AddrFrom16([16]byte(grh[8:24])).Unmap(), netip.AddrFrom16([16]byte(grh[24:40])).Unmap(), true
}

// ipv4Checksum is the one's-complement sum of an IPv4 header: 0 when its
// checksum field is right.
func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// post posts one signaled work request and waits for its completion. The
// helpers own the send CQ: completions of other work requests are dropped.
func (c *conn) post(ctx context.Context, op string, wr verbs.SendWR) error {
	if c.opts.SendCQ != nil {
		return c.sharedCQError(op, "SendCQ")
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if c.released || c.ended() {
		return c.endedError(op)
	}
	if err := ctx.Err(); err != nil {
		// Nothing posted: a caller told of a failure must be able to
		// retry without sending twice, and to reuse the buffer.
		return c.opError(op, nil, err)
	}
	wr.ID = c.wrID.Add(1)
	wr.Flags |= verbs.SendSignaled
	if err := c.qp.PostSend(wr); err != nil {
		if c.endingAfter() {
			return c.endedError(op)
		}
		return c.opError(op, nil, err)
	}
	var wcs [4]verbs.WorkCompletion
	for {
		var n int
		var err error
		if c.ended() {
			// Ours may be among the completions the end flushed.
			if n, _ = c.scq.Poll(wcs[:]); n == 0 {
				return c.endedError(op)
			}
		} else if n, err = c.pollWait(ctx, op, c.scq, &c.sendWait, wcs[:]); err != nil {
			return err
		}
		for _, wc := range wcs[:n] {
			if wc.ID != wr.ID {
				continue
			}
			if wc.Status != verbs.WCSuccess {
				return c.completionError(op, wc, int(wr.SGEs[0].Length))
			}
			return nil
		}
	}
}

// sharedCQError refuses a helper that would wait on a CQ the connection
// shares (ConnConfig.SendCQ or RecvCQ): it could take, and drop, another
// connection's completions.
func (c *conn) sharedCQError(op, field string) error {
	oe := c.opError(op, ErrSharedCQ, fmt.Errorf("its %s CQ is ConnConfig.%s, which other connections may share",
		strings.ToLower(strings.TrimSuffix(field, "CQ")), field))
	oe.Hint = fmt.Sprintf("post on the connection's QP and poll ConnConfig.%s yourself; completions name their QP (WorkCompletion.QPN, here %#x)", field, c.qp.QPN)
	return oe
}

// completionError is op's failed completion wc; n is the length of what
// op sent (0 for a receive).
func (c *conn) completionError(op string, wc verbs.WorkCompletion, n int) error {
	ce := &verbs.CompletionError{WC: wc, Hint: c.completionHint(op, wc.Status, n)}
	closing := c.disconnecting.Load()
	if wc.Status != verbs.WCWRFlushErr && !closing {
		// Its own failure, even if the connection ended since (siw ends
		// it on a receive that does not fit): the end is not the cause.
		return c.opError(op, nil, ce)
	}
	// A flush after the connection ended is that end, not a new failure;
	// so is any failure of a request that met this side's disconnect
	// (siw completes one posted after it with LOC_QP_OP_ERR). On iWARP the
	// peer's close flushes the QP before DISCONNECTED arrives: give the
	// event a moment to say so.
	if closing {
		c.endingAfter()
	}
	select {
	case <-c.done:
		ce.Hint = "the work request was flushed when the connection ended"
		if wc.Status != verbs.WCWRFlushErr {
			ce.Hint = "the work request met this side's disconnect"
		}
	case <-time.After(flushGrace):
	}
	return c.opError(op, c.Err(), ce)
}

// completionHint says what a failed send or receive usually means where
// the status alone says little: a message longer than the receive buffer
// shows as different statuses on each device and side (rxe: REM_OP_ERR
// at the sender, LOC_QP_OP_ERR at the receiver; siw: LOC_LEN_ERR at the
// receiver only), and so does a receive buffer without local write access
// (rxe: the same pair; siw: GENERAL_ERR). n is the length sent.
func (c *conn) completionHint(op string, st verbs.WCStatus, n int) string {
	ud := c.qp.Type == verbs.QPTypeUD
	switch op {
	case "receive":
		switch st {
		case verbs.WCLocLenErr:
			if ud {
				return "the datagram and the GRH before it (verbs.GRHSize bytes) were longer than the receive buffer: " +
					"post buffers of verbs.GRHSize plus the largest datagram"
			}
			return "the peer's message was longer than this receive's buffer (PostRecv's n): " +
				"post buffers as large as the largest message the peer sends"
		case verbs.WCLocQPOpErr:
			return "the incoming message did not fit this receive (as rxe reports it): it was longer than " +
				"the buffer (PostRecv's n: post buffers as large as the largest message the peer sends), " +
				"or the buffer's memory lacks verbs.AccessLocalWrite"
		case verbs.WCGeneralErr:
			return "the incoming message could not be placed in this receive (as siw reports it): " +
				"usually the buffer's memory lacks verbs.AccessLocalWrite"
		}
	case "send", "send to":
		switch st {
		case verbs.WCRemOpErr, verbs.WCRemInvReqErr:
			return fmt.Sprintf("the peer could not take this %d-byte message: usually it is longer than the "+
				"receive buffer the peer posted (its PostRecv's n; its Recv fails too, with LOC_QP_OP_ERR or "+
				"LOC_LEN_ERR), or that buffer's memory lacks verbs.AccessLocalWrite", n)
		case verbs.WCLocLenErr:
			if ud {
				return fmt.Sprintf("a UD datagram must fit the path MTU (%v); this one is %d bytes", c.path.MTU, n)
			}
			return fmt.Sprintf("the %d-byte message exceeds the device's maximum message size", n)
		case verbs.WCLocQPOpErr:
			return fmt.Sprintf("the device refused this %d-byte request: longer than its maximum message size, "+
				"or beyond what the QP was created for (ConnConfig.Cap)", n)
		}
	}
	return ""
}

// flushGrace is how long a flushed work request waits for the event that
// explains it.
const flushGrace = 500 * time.Millisecond

// resources are a connection's verbs objects, released in reverse.
type resources struct {
	dev      *verbs.Device
	pd       *verbs.PD
	sharedPD bool // ConnConfig.PD: pd and dev are the caller's
	scq, rcq *verbs.CQ
	qp       *verbs.QP
	ahs      []*verbs.AH
	mrs      []*verbs.MR // RegisterMemory's, released after the QP and before the PD

	// ConnConfig.SendCQ, RecvCQ: scq, rcq are the caller's, left open
	sharedSCQ, sharedRCQ bool
}

func (r *resources) close() error {
	var errs []error
	if r.qp != nil {
		errs = append(errs, r.qp.Close())
	}
	for _, ah := range r.ahs {
		errs = append(errs, ah.Close())
	}
	for _, mr := range r.mrs {
		errs = append(errs, mr.Close())
	}
	if r.scq != nil && !r.sharedSCQ {
		errs = append(errs, r.scq.Close())
	}
	if r.rcq != nil && !r.sharedRCQ {
		errs = append(errs, r.rcq.Close())
	}
	if r.pd != nil && !r.sharedPD {
		errs = append(errs, r.pd.Close())
	}
	if r.dev != nil && !r.sharedPD {
		r.dev.Close()
	}
	*r = resources{}
	return errors.Join(errs...)
}

// makeCQs takes the CQs o lends and creates the others on dev, sized by
// o.CQEntries or the QP's capacity.
func (r *resources) makeCQs(o *settings, dev *verbs.Device) error {
	sn, rn := int(o.Cap.MaxSendWR), int(o.Cap.MaxRecvWR)
	if o.CQEntries > 0 {
		sn, rn = o.CQEntries, o.CQEntries
	}
	var err error
	if o.SendCQ != nil {
		r.scq, r.sharedSCQ = o.SendCQ, true
	} else if r.scq, err = dev.CreateCQ(sn); err != nil {
		return err
	}
	if o.RecvCQ != nil {
		r.rcq, r.sharedRCQ = o.RecvCQ, true
	} else if r.rcq, err = dev.CreateCQ(rn); err != nil {
		return err
	}
	return nil
}

// deviceAttrs caches each device's capabilities, which do not change.
var deviceAttrs sync.Map // device name -> verbs.DeviceAttr

func queryDevice(d *verbs.Device) (verbs.DeviceAttr, error) {
	if a, ok := deviceAttrs.Load(d.Info.Name); ok {
		return a.(verbs.DeviceAttr), nil
	}
	a, err := d.Query()
	if err == nil {
		deviceAttrs.Store(d.Info.Name, a)
	}
	return a, err
}
