package msg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmago/rdmago/internal/cmbridge"
	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// Config sizes a message connection. Its zero value is ready to use; zero
// fields take the defaults noted.
type Config struct {
	// MaxMessageSize is the largest message this side receives (default
	// 16 KiB). The connection's maximum, both ways, is the smaller of
	// both sides' (Conn.MaxMessageSize).
	MaxMessageSize int
	// Credits is how many messages the peer may have in flight to this
	// side, or held unreleased here (default 32): that many receive
	// buffers of MaxMessageSize are registered and posted.
	Credits int
	// SendBuffers is how many messages this side may have in flight
	// (default 32): Send copies each into one of that many registered
	// buffers, free again when the device has sent it. When SendBuffers is
	// at least the peer's Credits, messages of 4 KiB or more mostly go
	// without a completion of their own (siw can then send them from the
	// buffer rather than copy them), and their buffers are free again once
	// the peer's grant shows they arrived.
	SendBuffers int
	// CloseTimeout bounds how long Close waits to pass the end of the
	// stream (FIN) and the messages still in flight to the peer (default
	// 2 s); the disconnect that follows has the rdmacm ConnConfig's own.
	// It bounds CloseSend's wait for a send buffer the same way, and the
	// wait for the connection's end after the device refused a post or
	// flushed the receives (a teardown under way), so that calls report
	// that end rather than its first symptom.
	CloseTimeout time.Duration

	// KeepAlive, when positive, has the connection probe a silent peer:
	// once this long has passed without a frame from it, this side posts an
	// 8-byte RDMA READ of memory the peer named for it in its hello, which
	// the peer's device answers without its
	// application (a peer program that is busy or stopped still answers; a
	// host that is gone or a cut link does not). When no answer comes
	// within KeepAliveTimeout, or the probe fails, the connection fails
	// with an error matching ErrPeerUnresponsive: every pending and later
	// call returns it, and the connection disconnects. A dead peer is
	// noticed within 2 × KeepAlive + KeepAliveTimeout (and the timers'
	// slack); a peer whose link went down on its own side learns of it
	// from its device at once.
	// Zero (the default) sends no probes: a peer that vanishes without a
	// word is then noticed only when a transfer to it fails, which on iWARP
	// waits for TCP to give up (minutes). The probe needs the peer to accept
	// one RDMA READ (its ConnConfig.ResponderResources not negative).
	KeepAlive time.Duration
	// KeepAliveTimeout bounds the wait for a probe's answer (default:
	// KeepAlive).
	KeepAliveTimeout time.Duration
}

const (
	defaultMaxMessage  = 16 << 10
	defaultCredits     = 32
	defaultSendBuffers = 32
	// replySlots is how many CREDIT frames a peer may have outstanding to
	// this side, and how many this side sends at once.
	replySlots = 4
	// slotAlign rounds buffer slots up, so that each starts on a cache line.
	slotAlign = 64
)

func (c *Config) resolve() (Config, error) {
	var o Config
	if c != nil {
		o = *c
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
	if o.CloseTimeout == 0 {
		o.CloseTimeout = 2 * time.Second
	}
	switch {
	case o.MaxMessageSize < 1 || o.MaxMessageSize > maxMessageCap:
		return o, fmt.Errorf("Config.MaxMessageSize %d outside 1 to %d", o.MaxMessageSize, maxMessageCap)
	case o.Credits < 1 || o.Credits > maxCredits-1:
		return o, fmt.Errorf("Config.Credits %d outside 1 to %d", o.Credits, maxCredits-1)
	case o.SendBuffers < 1 || o.SendBuffers > maxCredits:
		return o, fmt.Errorf("Config.SendBuffers %d outside 1 to %d", o.SendBuffers, maxCredits)
	case o.CloseTimeout < 0:
		return o, fmt.Errorf("Config.CloseTimeout %v is negative", o.CloseTimeout)
	case o.KeepAlive < 0:
		return o, fmt.Errorf("Config.KeepAlive %v is negative", o.KeepAlive)
	case o.KeepAliveTimeout < 0:
		return o, fmt.Errorf("Config.KeepAliveTimeout %v is negative", o.KeepAliveTimeout)
	case o.KeepAliveTimeout > 0 && o.KeepAlive == 0:
		return o, errors.New("Config.KeepAliveTimeout is set but KeepAlive is not: probes are off")
	}
	if o.KeepAlive > 0 && o.KeepAliveTimeout == 0 {
		o.KeepAliveTimeout = o.KeepAlive
	}
	return o, nil
}

// creditBuffers is how many receive buffers take credit-using frames:
// one per credit, and one more kept for the end of the stream (FIN), so
// that a reader slow to release cannot hold a Close's FIN back.
func (o *Config) creditBuffers() int { return o.Credits + 1 }

func (o *Config) hello() hello {
	return hello{version: Version, replySlots: replySlots, credits: uint32(o.creditBuffers()), maxMessage: uint32(o.MaxMessageSize)}
}

// qpCap is the QP the flow control needs: a send queue for every send
// buffer, CREDIT frame and the keepalive probe, a receive queue for every
// credit and reply slot.
func (o *Config) qpCap() verbs.QPCap {
	return verbs.QPCap{MaxSendWR: uint32(o.SendBuffers + replySlots + 1), MaxRecvWR: uint32(o.creditBuffers() + replySlots),
		MaxSendSGE: 1, MaxRecvSGE: 1}
}

func slotSize(max int) int { return (HeaderSize + max + slotAlign - 1) / slotAlign * slotAlign }

// postPool registers the receive buffers and posts them, before the
// connect request or the accept goes out.
func postPool(s rdmacm.Setup, o *Config) (*verbs.MR, error) {
	n, size := o.creditBuffers()+replySlots, slotSize(o.MaxMessageSize)
	mr, err := s.RegisterMemory(n*size, verbs.AccessLocalWrite)
	if err != nil {
		return nil, fmt.Errorf("register %d receive buffers of %d bytes: %w", n, size, err)
	}
	wrs := make([]verbs.RecvWR, n)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: uint64(i), SGEs: []verbs.SGE{mr.SGE(i*size, size)}}
	}
	if err := s.QP().PostRecv(wrs...); err != nil {
		return nil, fmt.Errorf("post %d receive buffers: %w", n, err)
	}
	return mr, nil
}

// Conn is a message connection: whole messages, in order, with credit-based
// flow control over an RC connection of package rdmacm. Send, Recv, Release
// and Close may be called from any goroutine.
//
// Recv takes the receive completions itself (waiting on Go's runtime
// poller), checks each frame and queues the messages; one goroutine per
// connection sends the grants that wait for a buffer, ends the connection
// after a failure, and takes the receive completions for a Send waiting
// for credit. Send posts from the caller's goroutine and, when the send
// buffers run out, waits for the device's send completions itself.
//
// A Conn that becomes unreachable without Close is closed by the garbage
// collector, as an *os.File is: its connection would otherwise keep its QP,
// its registered memory and its goroutine for ever. When that happens is up
// to the collector, so a program should Close what it is done with.
type Conn struct {
	*conn   // what the connection's goroutine and messages refer to: never the Conn
	cleanup runtime.Cleanup
}

// wrap gives the application its handle on c.
func wrap(c *conn) *Conn {
	h := &Conn{conn: c}
	h.cleanup = runtime.AddCleanup(h, closeDropped, c)
	return h
}

// closeDropped closes the connection of a Conn dropped without Close, on a
// goroutine of its own: a cleanup should not block others, and a Close may
// wait for the peer up to Config.CloseTimeout.
func closeDropped(c *conn) { go c.close() }

// Send sends p as one message. It returns once p is copied into a send
// buffer and posted: many messages may be in flight. When the peer has no
// credit left for this side (its application holds that many messages) or
// every send buffer is in flight, Send waits, until ctx ends; that is
// backpressure, never an error. A ctx that has ended already sends
// nothing. A message longer than MaxMessageSize fails with ErrTooLarge; on
// a connection that ended, Send fails with the reason (rdmacm.ErrEnded,
// ErrProtocol, ErrTransport). Once this side's Close has begun, Send, and a
// Send waiting for credit, fail with ErrClosed, which also matches
// net.ErrClosed; after CloseSend, with ErrSendClosed.
func (c *Conn) Send(ctx context.Context, p []byte) error {
	err := c.send(ctx, p)
	runtime.KeepAlive(c)
	return err
}

// CloseSend tells the peer that no more messages follow: its Recv returns
// io.EOF once it has received the messages sent before. It needs no
// credit, but may wait for a send buffer, and on an accepted connection
// for the dialer's HELLO frame: until ctx ends, and at most
// Config.CloseTimeout, as Close (a peer gone silent acknowledges none of
// the messages in flight, and on iWARP TCP would retry for minutes). The
// error then wraps context.DeadlineExceeded, and the end was not sent.
// Receiving goes on.
func (c *Conn) CloseSend(ctx context.Context) error {
	err := c.closeSend(ctx)
	runtime.KeepAlive(c)
	return err
}

// Recv returns the next message, waiting for one until ctx ends (a ctx
// that has ended already takes none). Release it when done. After the
// peer's CloseSend (or Close) and the messages before it, Recv returns
// io.EOF; on a connection that ended otherwise it fails with the reason
// (rdmacm.ErrEnded, ErrProtocol, ErrTransport, ErrClosed), once the
// messages that arrived before the end are taken.
//
// A Recv with nothing queued takes the receive completions itself, and
// waits for them on Go's runtime poller: no other goroutine hands them
// over.
func (c *Conn) Recv(ctx context.Context) (*Message, error) {
	m, err := c.recv(ctx)
	runtime.KeepAlive(c) // a Recv waiting for a message keeps its Conn
	return m, err
}

// Close ends the connection: it tells the peer no more messages follow
// (its Recv returns io.EOF), waits for the messages in flight to reach it,
// both within Config.CloseTimeout, and then disconnects and releases
// everything: the QP, the buffers and the goroutine. Calls waiting in other
// goroutines (a Send waiting for credit too) return errors that match
// ErrClosed and net.ErrClosed, as do later calls.
//
// Messages that Recv returned and that are not released yet stay valid:
// their Bytes are intact, and Release may still be called. The buffers and
// the connection underneath (QP, protection domain) are then released with
// the last of them, by its Release, or once the garbage collector finds
// the last of them unreachable; Close's error does not cover that. Messages
// that had arrived but that Recv had not returned are dropped.
func (c *Conn) Close() error {
	c.cleanup.Stop()
	return c.close()
}

// conn is a Conn's connection.
type conn struct {
	rc            *rdmacm.Conn
	qp            *verbs.QP
	scq           *verbs.CQ
	local, remote netip.AddrPort
	max           int
	closeTimeout  time.Duration

	recvMR   *verbs.MR
	recvSize int
	nRecv    int
	sendMR   *verbs.MR
	sendSize int
	nSend    int
	// registered is the bytes of the connection's MRs (Registered).
	registered int

	mu      sync.Mutex
	led     ledger
	changed chan struct{} // closed and replaced when anything a waiter waits for changes
	// changedTaken: a waiter holds changed; a broadcast with none replaces nothing.
	changedTaken bool
	queue        []*Message
	queueBuf     []*Message // queue's array, taken again whenever it empties
	freeSend     []int
	freeCtl      []int
	// Large data frames go without a completion of their own when
	// zeroCopy (see unsignaledMin). Their buffers are free again only once
	// both hold: a later send's completion took the work request off the
	// send queue (unsignaled, in post order), and the peer's grant shows
	// it received the frame (awaitGrant, in post order).
	zeroCopy   bool
	unsignaled []int
	awaitGrant []int
	inSQ       int // data send buffers whose work request is on the send queue
	posts      uint64
	framesOut  uint32 // credit-using frames posted
	// By send buffer, for the frame in it: posts and framesOut when it
	// was posted, and whether it asked for a completion.
	postSeq  []uint64
	frameSeq []uint32
	signaled []bool
	ctlSeq   [replySlots]uint64
	released []int // receive buffers given back, to post again
	// The work requests that post them, kept for the next time.
	repost     []verbs.RecvWR
	repostSGEs []verbs.SGE
	// msgs are the Messages not yet released, by receive buffer, and out
	// how many there are; after Close, msgs is nil and out counts those
	// still held by the application.
	msgs      []*Message
	out       int
	peerReady bool // the dialer's HELLO arrived (accepting side); always on the dialing side
	peerFin   bool
	finSent   bool
	// helloSent: the dialer's HELLO went out (the accepting side sends
	// none, and starts with it set).
	helloSent bool
	// closing: Close has begun; Send and CloseSend fail with ErrClosed
	// (Close's own FIN still goes).
	closing  bool
	copying  int // Sends copying their message into a send buffer, without the lock
	finWaits int // FINs waiting to be sent (CloseSend, Close)
	closed   bool
	// tornDown: Close is done but for the resources underneath, which
	// wait for the last held Message; freed: they are released (or being).
	tornDown bool
	freed    bool
	freedCh  chan struct{} // closed once they are released
	failed   error         // the peer broke the protocol or a transfer failed
	// rxDone: no more receive completions are taken: the connection
	// failed or ended, and those that arrived before are queued. Recv
	// reports why once the queue is empty. flushPending: receives were
	// flushed, or a post refused (refused), for a reason not known yet;
	// the goroutine finds it (flushedByEnd) and clears it.
	rxDone       bool
	flushPending bool
	refused      error
	// recvSeen: Recv has taken receive completions itself; from then on
	// the connection's goroutine takes them only for a Send waiting for
	// credit. loopOnCQ: the goroutine is waiting on the
	// receive CQ, holding rcqMu; wake makes it let go.
	recvSeen bool
	loopOnCQ bool
	// creditWaits: Sends waiting for credit (or the HELLO), which the
	// goroutine takes the receive CQ for; recvWaits: Recvs waiting for
	// the receive CQ, which it then leaves to them.
	creditWaits int
	recvWaits   int
	// bufWaits: Sends waiting for a send buffer.
	bufWaits int
	wake     context.CancelFunc
	wakeReq  bool
	// fault, set by tests only, makes housekeep fail with it: the
	// failures it stands for (a post the device refuses) cannot be had
	// on demand.
	fault error

	ka keepalive

	// scqMu is held by whoever polls the send CQ: one at a time.
	scqMu sync.Mutex
	// rcqMu is held by whoever polls the receive CQ, and across the
	// handling of what it took (under mu), so that frames are handled in
	// the order they arrived. rxWait is its holder's wait context, kept
	// for the next wait with the same one; rxWCs its completions.
	rcqMu  sync.Mutex
	rcq    *verbs.CQ
	rxWait mergedWait
	rxWCs  [16]verbs.WorkCompletion
	// rxEnd ends with loopCtx, or when the connection ends (or fails): the
	// waits on the receive CQ and for send completions end with it.
	rxEnd       context.Context
	rxEndCancel context.CancelFunc
	// sqStop ends every wait for send completions (reapWait) when the
	// connection fails or a post is refused (and with rxEnd): none may come
	// then (a QP siw reset flushes nothing), and the waiters, the
	// connection's goroutine among them, have the end to see to.
	sqStop       context.Context
	sqStopCancel context.CancelFunc
	// closingCtx ends when Close begins (and with rxEnd): a Send waiting
	// for credit on the receive CQ wakes to fail with ErrClosed.
	closingCtx    context.Context
	closingCancel context.CancelFunc

	loopCtx   context.Context
	loopStop  context.CancelFunc
	loopDone  chan struct{}
	closeOnce sync.Once
	closeErr  error
}

const ctlID = 1 << 32

func newConn(rc *rdmacm.Conn, o *Config, local, peer hello, pool, probe *verbs.MR, accepting bool) (*conn, error) {
	max := min(int(local.maxMessage), int(peer.maxMessage))
	c := &conn{
		rc: rc, qp: rc.QP(), scq: rc.SendCQ(), local: rc.LocalAddr(), remote: rc.RemoteAddr(), max: max,
		closeTimeout: o.CloseTimeout,
		recvMR:       pool, recvSize: slotSize(o.MaxMessageSize), nRecv: o.creditBuffers() + replySlots,
		sendSize: slotSize(max), nSend: o.SendBuffers,
		led: newLedger(local, peer), changed: make(chan struct{}), peerReady: !accepting, helloSent: accepting,
		loopDone: make(chan struct{}), freedCh: make(chan struct{}),
	}
	c.repost, c.repostSGEs = make([]verbs.RecvWR, c.nRecv), make([]verbs.SGE, c.nRecv)
	c.msgs = make([]*Message, c.nRecv)
	c.queueBuf = make([]*Message, 0, c.nRecv)
	c.queue = c.queueBuf
	c.rcq = rc.RecvCQ()
	mr, err := rc.RegisterMemory((c.nSend+replySlots)*c.sendSize, 0)
	if err != nil {
		return nil, fmt.Errorf("register %d send buffers of %d bytes: %w", c.nSend+replySlots, c.sendSize, err)
	}
	c.sendMR = mr
	c.registered = len(pool.Bytes()) + len(mr.Bytes())
	if probe != nil {
		c.registered += len(probe.Bytes())
	}
	c.postSeq, c.frameSeq, c.signaled = make([]uint64, c.nSend), make([]uint32, c.nSend), make([]bool, c.nSend)
	// Reuse then waits for the peer's grants. With at least as many buffers
	// as the peer has credits for messages (its hello counts one more, kept
	// for FIN), buffers waiting for grants leave this side nearly out of
	// credit as well, and a Send waiting for credit has the grants read
	// (creditWaits). With fewer, a Send that also receives would leave
	// grants unread, and the sends would go one completion at a time.
	c.zeroCopy = c.nSend >= int(peer.credits)-1
	c.unsignaled, c.awaitGrant = make([]int, 0, c.nSend), make([]int, 0, c.nSend)
	for i := c.nSend - 1; i >= 0; i-- {
		c.freeSend = append(c.freeSend, i)
	}
	for i := replySlots - 1; i >= 0; i-- {
		c.freeCtl = append(c.freeCtl, i)
	}
	c.loopCtx, c.loopStop = context.WithCancel(context.Background())
	c.rxEnd, c.rxEndCancel = context.WithCancel(c.loopCtx)
	// rxEnd ends with the connection straight from rdmacm, not only when the
	// goroutine sees it: the goroutine may be waiting for scqMu, which a
	// Send holds while it waits for completions that the end must cut short.
	context.AfterFunc(cmbridge.EndContext(rc), c.rxEndCancel)
	c.closingCtx, c.closingCancel = context.WithCancel(c.rxEnd)
	c.sqStop, c.sqStopCancel = context.WithCancel(c.rxEnd)
	go c.loop()
	c.startKeepalive(o, probe, peer)
	return c, nil
}

// MaxMessageSize is the largest message either side may send: the smaller
// of both sides' Config.MaxMessageSize.
func (c *Conn) MaxMessageSize() int { return c.max }

// Registered is how many bytes of memory the connection registered with
// its device, pinned for its life: its receive and send buffers (see
// Config) and the keepalive probes' few bytes.
func (c *Conn) Registered() int { return c.registered }

// LocalAddr and RemoteAddr are the connection's IP addresses and ports.
func (c *Conn) LocalAddr() netip.AddrPort  { return c.local }
func (c *Conn) RemoteAddr() netip.AddrPort { return c.remote }

// Route is the path of the connection underneath (device, kind of RDMA, MTU).
func (c *Conn) Route() rdmacm.Route { return c.rc.Route() }

func (c *conn) opError(op string, err error) error {
	return &OpError{Op: op, Local: c.local, Remote: c.remote, Err: err}
}

// broadcastLocked wakes every waiter.
func (c *conn) broadcastLocked() {
	if c.changedTaken {
		close(c.changed)
		c.changed = make(chan struct{})
		c.changedTaken = false
	}
}

// changedLocked is the channel a waiter waits on for the next change.
func (c *conn) changedLocked() <-chan struct{} {
	c.changedTaken = true
	return c.changed
}

// sendErrLocked is why nothing can be sent, or nil; byClose: the frame is
// Close's own FIN.
func (c *conn) sendErrLocked(byClose bool) error {
	switch {
	case c.closed, c.closing && !byClose:
		return ErrClosed
	case c.failed != nil:
		return c.failed
	}
	if err := c.rc.Err(); err != nil {
		return err
	}
	if c.finSent {
		return ErrSendClosed
	}
	return nil
}

// send is Send's work.
func (c *conn) send(ctx context.Context, p []byte) error {
	if len(p) > c.max {
		return c.opError("send", &kindError{ErrTooLarge, fmt.Errorf("a %d-byte message; the connection's maximum is %d", len(p), c.max)})
	}
	return c.sendFrame(ctx, nil, "send", frameData, p, false)
}

// closeSend is CloseSend's work.
func (c *conn) closeSend(ctx context.Context) error {
	limit, cancel := context.WithTimeout(ctx, c.closeTimeout)
	defer cancel()
	return c.sendFrame(ctx, limit, "close send", frameFin, nil, false)
}

// sendFrame sends a frame of type t, waiting for credit and a send buffer;
// byClose: it is Close's FIN, which goes although Close has begun. The wait
// for a send buffer ends with bufCtx too, if not nil (CloseSend's limit).
func (c *conn) sendFrame(ctx, bufCtx context.Context, op string, t frameType, p []byte, byClose bool) error {
	if bufCtx == nil {
		bufCtx = ctx
	}
	if err := ctx.Err(); err != nil {
		return c.opError(op, err)
	}
	if t == frameFin {
		defer func() {
			c.mu.Lock()
			c.finWaits--
			c.broadcastLocked()
			c.mu.Unlock()
		}()
		c.mu.Lock()
		c.finWaits++
		c.mu.Unlock()
	}
	for {
		c.mu.Lock()
		if err := c.sendErrLocked(byClose); err != nil {
			c.mu.Unlock()
			return c.opError(op, err)
		}
		if c.refused != nil {
			// A post was refused: the connection is ending. Nothing more
			// is posted; the end (or the refusal) is the answer.
			err := c.settledErrLocked(ctx)
			c.mu.Unlock()
			return c.opError(op, err)
		}
		// A FIN goes after the messages whose Send took a credit before it
		// (copying), and before those that come after it (finWaits).
		var ready bool
		switch t {
		case frameFin:
			ready = c.peerReady && c.led.canSend(t) && c.copying == 0
		case frameData:
			ready = c.peerReady && c.led.canSend(t) && c.finWaits == 0
		default:
			ready = c.peerReady && c.led.canSend(t)
		}
		if ready && len(c.freeSend) == 0 {
			c.reapLocked()
		}
		if ready && len(c.freeSend) > 0 {
			slot := c.freeSend[len(c.freeSend)-1]
			c.freeSend = c.freeSend[:len(c.freeSend)-1]
			off := slot * c.sendSize
			c.led.reserve(t)
			if len(p) > 0 {
				// The slot and the credit are this call's: the copy needs
				// no lock, and Recv, Release and other Sends go on. A FIN
				// waits for it, and the buffers stay until it is done.
				c.copying++
				c.mu.Unlock()
				copy(c.sendMR.Bytes()[off+HeaderSize:off+HeaderSize+len(p)], p)
				c.mu.Lock()
				c.copying--
				if c.copying == 0 && c.finWaits > 0 {
					c.broadcastLocked() // the FIN may go
				}
				if err := c.sendErrLocked(true); err != nil { // closed or failed meanwhile
					c.freeSend = append(c.freeSend, slot)
					last := c.lastLocked()
					c.mu.Unlock()
					if last {
						c.free()
					}
					return c.opError(op, err)
				}
			}
			c.flushLocked(true)
			if c.refused != nil { // the reposts were refused: the connection is ending
				c.freeSend = append(c.freeSend, slot)
				err := c.settledErrLocked(ctx)
				c.mu.Unlock()
				return c.opError(op, err)
			}
			h := c.led.header(t)
			h.length = uint32(len(p))
			// A post that leaves no buffer free, or is made while a Send
			// waits for one, asks for a completion: a Send short of buffers
			// always has one to wait for, though a grant may free a buffer
			// meanwhile. So at most nSend-1 buffers wait for grants, and a
			// FIN always finds one.
			signaled := !c.zeroCopy || t != frameData || len(p) < unsignaledMin || len(c.freeSend) == 0 || c.bufWaits > 0
			err := c.postLocked(uint64(slot), off, h, signaled)
			switch t {
			case frameFin:
				c.finSent = true
			case frameHello:
				c.helloSent = true
			}
			if err != nil && c.refused != nil {
				err = c.settledErrLocked(ctx)
			}
			c.mu.Unlock()
			if err != nil {
				return c.opError(op, err)
			}
			return nil
		}
		// No buffer is free and none is on the send queue: one is being
		// copied into, and its post wakes this Send. (That they all wait
		// for grants cannot be, by the rule above; were it so, the grants
		// come in a frame, as credit does.)
		noBuffer := ready && len(c.freeSend) == 0 && c.inSQ == 0
		grantWait := noBuffer && c.copying == 0
		if !c.peerReady || !c.led.canSend(t) || grantWait {
			// Credit (or the dialer's HELLO) comes in a frame. A Recv
			// taking frames hands it over; otherwise the connection's
			// goroutine takes them while a Send waits. (A Send that took
			// them itself made siw's stream 14 % slower in the cost model,
			// reason not found.)
			c.creditWaits++
			if !c.loopOnCQ {
				c.wakeLocked()
			}
			end := c.closingCtx
			if byClose {
				end = c.rxEnd
			}
			ch := c.changedLocked()
			awaited := "credit"
			if !c.peerReady {
				awaited = "HELLO frame"
			}
			c.mu.Unlock()
			var err error
			select {
			case <-ch:
			case <-end.Done():
			case <-c.rc.Done():
			case <-bufCtx.Done(): // ctx's, or CloseSend's limit
				err = bufCtx.Err()
			}
			c.mu.Lock()
			c.creditWaits--
			c.mu.Unlock()
			if err != nil && ctx.Err() == nil {
				return c.opError(op, fmt.Errorf("the peer's %s did not come within Config.CloseTimeout (%v), so the end was not "+
					"sent (is the peer gone?): %w", awaited, c.closeTimeout, err))
			}
			if err != nil {
				return c.opError(op, err)
			}
			continue
		}
		ch := c.changedLocked()
		if ready {
			c.bufWaits++
		}
		c.mu.Unlock()
		var err error
		if ready && !noBuffer && c.scqMu.TryLock() {
			if e := c.reapWait(bufCtx); e != nil && bufCtx.Err() != nil {
				err = bufCtx.Err()
			}
			c.scqMu.Unlock()
			if err != nil {
				// Sends that found the send CQ taken wait for this one to
				// free a buffer; giving up, it wakes them, and one of them
				// waits on the CQ instead.
				c.mu.Lock()
				c.broadcastLocked()
				c.mu.Unlock()
			}
		} else {
			select {
			case <-ch:
			case <-c.rc.Done():
				// The next round says why.
			case <-bufCtx.Done():
				err = bufCtx.Err()
			}
		}
		if ready {
			c.mu.Lock()
			c.bufWaits--
			c.mu.Unlock()
		}
		if err != nil && ctx.Err() == nil {
			return c.opError(op, fmt.Errorf("no send buffer came free within Config.CloseTimeout (%v), so the end was not sent: "+
				"the peer has acknowledged none of the messages in flight (is it gone?): %w", c.closeTimeout, err))
		}
		if err != nil {
			return c.opError(op, err)
		}
	}
}

// unsignaledMin is the smallest data frame that may go without a
// completion of its own. siw hands TCP the pages of a work request of a
// page or more that asks for none, to send without a copy, and copies one
// that asks for a completion into the socket's buffers first; a smaller
// frame saves nothing there. (The test bed's Debian 6.1.192 copies both:
// its siw passes the pages with MSG_SPLICE_PAGES, which its TCP does not
// know. The gain measured there, bench/notes.md: siw's stream with 64 KiB
// writes, 205 to 214-216 MB/s in the cost model, comes from elsewhere,
// the fewer completions likeliest.)
//
// Such a buffer is reused only once the peer's grant covers its frame,
// not at the completion of a later send: on siw a completion means handed
// to TCP, which retransmits from the pages as they are then, so a buffer
// reused at a completion could go out again carrying the next message.
// Grants count buffers the peer reposted, each a frame it received, and
// frames arrive in order: a grant of credits + k means the first k
// credit-using frames arrived.
const unsignaledMin = 4096

// postLocked writes the frame's header into the send buffer at off, where
// its message already is, and posts it; signaled: it asks for a completion
// of its own (control frames always do).
func (c *conn) postLocked(id uint64, off int, h header, signaled bool) error {
	h.put(c.sendMR.Bytes()[off : off+HeaderSize])
	wr := verbs.SendWR{ID: id, Opcode: verbs.OpSend,
		SGEs: []verbs.SGE{c.sendMR.SGE(off, HeaderSize+int(h.length))}}
	if signaled {
		wr.Flags = verbs.SendSignaled
	}
	if err := c.qp.PostSend(wr); err != nil {
		if e := c.rc.Err(); e != nil {
			return e
		}
		err = &kindError{ErrTransport, fmt.Errorf("post a %v frame: %w", h.typ, err)}
		c.refusedLocked(err)
		return err
	}
	c.posts++
	if id&ctlID != 0 {
		c.ctlSeq[id&^ctlID] = c.posts
		return nil
	}
	if h.typ.usesCredit() {
		c.framesOut++
	}
	c.postSeq[id], c.frameSeq[id], c.signaled[id] = c.posts, c.framesOut, signaled
	if c.inSQ++; c.inSQ == 1 && len(c.freeSend) == 0 {
		c.broadcastLocked() // a Send that found no buffer free and none on the send queue waits for this
	}
	if !signaled {
		c.unsignaled = append(c.unsignaled, int(id))
	}
	return nil
}

// completedLocked takes the unsignalled work requests posted up to post
// number seq off the send queue: a send completed (sends complete in
// order; a flushed one completes even if it asked for no completion).
// Their buffers wait for the peer's grant, unless the connection failed
// (nothing will use them).
func (c *conn) completedLocked(seq uint64) {
	n := 0
	for ; n < len(c.unsignaled) && c.postSeq[c.unsignaled[n]] <= seq; n++ {
		slot := c.unsignaled[n]
		c.inSQ--
		if c.failed != nil {
			c.freeSend = append(c.freeSend, slot)
		} else {
			c.awaitGrant = append(c.awaitGrant, slot)
		}
	}
	c.unsignaled = c.unsignaled[:copy(c.unsignaled, c.unsignaled[n:])]
	if n > 0 {
		c.grantedLocked()
	}
}

// grantedLocked frees the buffers whose frames the peer's grant shows it
// received.
func (c *conn) grantedLocked() {
	if len(c.awaitGrant) == 0 {
		return
	}
	arrived := c.led.peerGrant - c.led.peerCredits
	n := 0
	for ; n < len(c.awaitGrant) && (c.failed != nil || !after(c.frameSeq[c.awaitGrant[n]], arrived)); n++ {
		c.freeSend = append(c.freeSend, c.awaitGrant[n])
	}
	if n > 0 {
		c.awaitGrant = c.awaitGrant[:copy(c.awaitGrant, c.awaitGrant[n:])]
		c.broadcastLocked()
	}
}

// refusedLocked records a post the device refused. Posts are refused once
// the QP has left RTS, and a teardown does that just before rdmacm reports
// the end: the peer's disconnect moves it to ERR, and siw resets the QPs of
// a netdev that went down. So the goroutine waits for the end
// (flushedByEnd), and the calls report that end, as they do when it comes
// first; only if it does not come within CloseTimeout is the refusal the
// reason. A full queue (ENOMEM) is no teardown and fails at once. The
// error decides, not the QP's state: siw (Linux 6.1) leaves the state out
// of its query.
func (c *conn) refusedLocked(err error) {
	if c.failed != nil || c.refused != nil {
		return
	}
	if errors.Is(err, syscall.ENOMEM) {
		c.failLocked(err)
		return
	}
	c.refused, c.flushPending = err, true
	c.broadcastLocked()
	c.wakeLocked()
	c.sqStopCancel()
}

// settledErrLocked waits, after a post was refused, until the goroutine
// knows why, and returns the reason: the connection's end, or the
// refusal. The goroutine settles it within CloseTimeout (flushedByEnd);
// the wait ends sooner with ctx (nil: none) or this side's Close, and then
// the refusal, or ErrClosed, is the answer. It is called and returns with
// mu held.
func (c *conn) settledErrLocked(ctx context.Context) error {
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	limit := time.NewTimer(c.closeTimeout + time.Second)
	defer limit.Stop()
	for c.flushPending && c.failed == nil && c.rc.Err() == nil && !c.closing && !c.closed {
		ch := c.changedLocked()
		c.mu.Unlock()
		timedOut := false
		select {
		case <-ch:
		case <-c.rc.Done():
		case <-done:
			timedOut = true
		case <-limit.C:
			timedOut = true
		}
		c.mu.Lock()
		if timedOut {
			break
		}
	}
	switch {
	case c.failed != nil:
		return c.failed
	case c.rc.Err() != nil:
		return c.rc.Err()
	case c.closing, c.closed:
		return ErrClosed
	case ctx != nil && ctx.Err() != nil:
		// The caller gave up first; the connection is ending all the same.
		return fmt.Errorf("%w, while the connection was ending: %w", ctx.Err(), c.refused)
	}
	return c.refused
}

var errFlushed = &kindError{ErrTransport, errors.New("the receives were flushed: the QP is in the error state")}

// failLocked records why the connection can no longer be used, once, and
// has the connection's goroutine end it.
func (c *conn) failLocked(err error) {
	if c.failed == nil {
		c.failed = err
		c.broadcastLocked()
		c.wakeLocked()
		c.sqStopCancel()
	}
}

// reapLocked takes the send completions already there, if no one else is
// polling the send CQ.
func (c *conn) reapLocked() {
	if !c.scqMu.TryLock() {
		return
	}
	defer c.scqMu.Unlock()
	if c.bufWaits > 0 {
		// A Send that needs a buffer may have found the send CQ taken by
		// this look and waits for a change; if this frees nothing, it
		// must come back and wait on the CQ itself.
		defer c.broadcastLocked()
	}
	var wcs [16]verbs.WorkCompletion
	for {
		n, err := c.scq.Poll(wcs[:])
		if err != nil {
			c.failLocked(&kindError{ErrTransport, fmt.Errorf("poll the send CQ: %w", err)})
			return
		}
		c.sentLocked(wcs[:n])
		if n < len(wcs) {
			return
		}
	}
}

// reapWait waits for send completions and takes them, until ctx ends or
// the connection is closed. The caller holds scqMu.
func (c *conn) reapWait(ctx context.Context) error {
	c.mu.Lock()
	closed := c.closed
	// Another reaper may have taken every completion while the caller
	// waited for scqMu: with nothing in flight none would come, and the
	// wait would outlive the connection. Holding scqMu, no one else takes
	// them now, and whatever is in flight completes or is flushed.
	idle := c.inSQ == 0 && len(c.freeCtl) == replySlots
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if idle {
		return nil
	}
	// The wait ends with the connection too: a request posted after the QP
	// went to the error state, before the end was known, may never
	// complete (siw takes it onto its send queue and flushes nothing), and
	// the caller then learns of the end from rc.
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.sqStop, cancel)
	var wcs [16]verbs.WorkCompletion
	n, err := c.scq.PollWait(wctx, wcs[:])
	stop()
	cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil && c.sqStop.Err() == nil {
			c.failLocked(&kindError{ErrTransport, fmt.Errorf("wait for send completions: %w", err)})
		}
		return err
	}
	c.sentLocked(wcs[:n])
	return nil
}

// sentLocked frees the buffers of completed sends. A failed one ends the
// connection: the peer is gone or the path broke.
func (c *conn) sentLocked(wcs []verbs.WorkCompletion) {
	for _, wc := range wcs {
		if wc.ID == probeID {
			c.probeDoneLocked(wc)
			continue
		}
		// A flushed send says only that the QP is in the error state: the
		// cause is the connection's end, or the failed request before it.
		if wc.Status != verbs.WCSuccess && wc.Status != verbs.WCWRFlushErr {
			c.failLocked(&kindError{ErrTransport, fmt.Errorf("a send failed: %w", &verbs.CompletionError{WC: wc})})
		}
		if wc.ID&ctlID != 0 {
			slot := int(wc.ID &^ ctlID)
			c.completedLocked(c.ctlSeq[slot])
			c.freeCtl = append(c.freeCtl, slot)
		} else if slot := int(wc.ID); slot < c.nSend {
			c.completedLocked(c.postSeq[slot])
			if c.signaled[slot] {
				// On siw its bytes were copied, on RoCE the peer
				// acknowledged them: reusable now.
				c.inSQ--
				c.freeSend = append(c.freeSend, slot)
			}
		}
	}
	if len(wcs) > 0 {
		c.broadcastLocked()
	}
}

// flushLocked posts the released receive buffers again and counts them in
// the grant: all of them when force (a frame is about to carry the grant),
// else when a batch has gathered or the peer is short of credits.
func (c *conn) flushLocked(force bool) {
	n := len(c.released)
	if n == 0 || c.closed || c.failed != nil || c.refused != nil {
		return
	}
	if !force && uint32(n) < c.led.batch() && !c.led.starving() {
		return
	}
	wrs, sges := c.repost[:n], c.repostSGEs[:n]
	for i, idx := range c.released {
		sges[i] = c.recvMR.SGE(idx*c.recvSize, c.recvSize)
		wrs[i] = verbs.RecvWR{ID: uint64(idx), SGEs: sges[i : i+1 : i+1]}
	}
	if err := c.qp.PostRecv(wrs...); err != nil {
		if c.rc.Err() == nil {
			c.refusedLocked(&kindError{ErrTransport, fmt.Errorf("post %d receive buffers again: %w", n, err)})
		}
		return
	}
	c.released = c.released[:0]
	c.led.reposted(n)
}

// Message is a received message, in the connection's registered receive
// buffer: no copy was made. Release gives the buffer back.
type Message struct {
	c    *conn
	idx  int
	b    []byte
	done atomic.Bool
	// cleanup, set by Close (under c.mu), frees the connection's
	// resources if the Message is dropped without Release.
	cleanup runtime.Cleanup
}

// Bytes is the message. It is valid until Release, also after the
// connection's Close, which keeps the buffers of the messages not yet
// released (see Conn.Close). After Release, Bytes is nil. After Close the
// bytes live outside Go's heap for as long as the Message is reachable:
// a Message dropped without Release is freed by the garbage collector,
// buffers and all, so keep the *Message (not only its Bytes) until done.
func (m *Message) Bytes() []byte { return m.b }

// Release gives the message's buffer back: it is posted again and the peer
// is granted the credit (in batches). Holding messages holds credits: the
// peer's Send waits once this side holds Config.Credits of them. After the
// connection's Close, releasing the last message held frees the buffers
// and the connection underneath. Calling Release again does nothing.
func (m *Message) Release() {
	if m.done.Swap(true) {
		return
	}
	m.b = nil
	m.c.release(m)
}

func (c *conn) release(m *Message) {
	c.mu.Lock()
	m.cleanup.Stop()
	c.out--
	if c.closed {
		last := c.lastLocked()
		c.mu.Unlock()
		if last {
			c.free()
		}
		return
	}
	defer c.mu.Unlock()
	c.msgs[m.idx] = nil
	c.released = append(c.released, m.idx)
	c.flushLocked(false)
	if !c.sendCreditsLocked() {
		c.wakeLocked() // its goroutine waits for a control buffer
	}
}

// sendCreditsLocked sends the CREDIT frames the peer should have now,
// without waiting. It reports false when one should go but every control
// buffer is still in flight: waiting for one is the connection
// goroutine's job (housekeep).
func (c *conn) sendCreditsLocked() bool {
	for c.led.wantCredit() && c.led.canSendCredit() {
		if c.closed || c.failed != nil || c.refused != nil || c.rc.Err() != nil {
			return true
		}
		if len(c.freeCtl) == 0 {
			c.reapLocked()
		}
		if len(c.freeCtl) == 0 {
			return false
		}
		slot := c.freeCtl[len(c.freeCtl)-1]
		c.freeCtl = c.freeCtl[:len(c.freeCtl)-1]
		h := c.led.outgoing(frameCredit)
		if err := c.postLocked(ctlID|uint64(slot), (c.nSend+slot)*c.sendSize, h, true); err != nil {
			return true // the connection failed or is ending, which postLocked recorded
		}
	}
	return true
}

// wakeLocked has the connection's goroutine look for work (a CREDIT frame
// to send).
func (c *conn) wakeLocked() {
	if c.wake != nil {
		c.wake()
	} else {
		c.wakeReq = true
	}
}

// recv is Recv's work.
func (c *conn) recv(ctx context.Context) (*Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, c.opError("receive", err)
	}
	c.mu.Lock()
	for {
		switch {
		case c.closed:
			c.mu.Unlock()
			return nil, c.opError("receive", ErrClosed)
		case len(c.queue) > 0:
			m := c.queue[0]
			c.queue[0] = nil
			c.queue = c.queue[1:]
			if len(c.queue) == 0 {
				c.queue = c.queueBuf[:0]
			}
			c.mu.Unlock()
			return m, nil
		case c.failed != nil && c.rxDone:
			err := c.failed
			c.mu.Unlock()
			return nil, c.opError("receive", err)
		case c.failed != nil:
			// Take what arrived before the failure first.
		case c.peerFin:
			c.mu.Unlock()
			return nil, io.EOF
		case c.rxDone && !c.flushPending:
			err := c.rc.Err()
			if err == nil {
				err = ErrClosed
			}
			c.mu.Unlock()
			return nil, c.opError("receive", err)
		}
		if err := c.receiveLocked(ctx, c.rxEnd); err != nil {
			c.mu.Unlock()
			return nil, c.opError("receive", err)
		}
	}
}

// receiveLocked takes the receive completions there are and handles them,
// waiting for one (on the completion channel, in Go's poller) when there
// are none, until ctx or end ends; or, when another goroutine is taking
// them, waits for it to be done. After a failure it only takes what is
// there, without waiting, and sets rxDone when nothing is. It is called
// and returns with mu held; its error is ctx's.
func (c *conn) receiveLocked(ctx, end context.Context) error {
	c.recvSeen = true
	if c.rxDone || !c.rcqMu.TryLock() {
		if c.loopOnCQ {
			c.wakeLocked() // the goroutine lets go of the receive CQ
		}
		c.recvWaits++
		ch := c.changedLocked()
		c.mu.Unlock()
		var err error
		select {
		case <-ch:
		case <-end.Done():
		case <-c.rc.Done():
		case <-ctx.Done():
			err = ctx.Err()
		}
		c.mu.Lock()
		c.recvWaits--
		if c.recvWaits == 0 && c.creditWaits > 0 && !c.loopOnCQ {
			// This Recv gave up (its deadline) while the goroutine left
			// the receive CQ to it: the Sends waiting for credit need the
			// goroutine back on it, or the peer's CREDIT frame lies unread.
			c.wakeLocked()
		}
		return err
	}
	drain := c.failed != nil
	c.mu.Unlock()
	wcs := c.rxWCs[:]
	var n int
	var err error
	if drain {
		n, err = c.rcq.Poll(wcs)
	} else {
		n, err = c.rcq.PollWait(c.rxWait.get(ctx, end), wcs)
		if err != nil && ctx.Err() == nil && c.rc.Err() != nil {
			// The end: the completions that came before it are still taken.
			n, err = c.rcq.Poll(wcs)
			drain = true
		}
	}
	c.mu.Lock()
	c.tookLocked(wcs[:n])
	var werr error
	switch {
	case err == nil:
		if n == 0 && drain {
			c.rxDone = true
		}
	case ctx.Err() != nil:
		werr = ctx.Err()
	case end.Err() != nil, c.closed:
	default:
		c.failLocked(&kindError{ErrTransport, fmt.Errorf("wait for receives: %w", err)})
		c.rxDone = true
	}
	c.rcqMu.Unlock()
	c.broadcastLocked()
	if c.creditWaits > 0 {
		c.wakeLocked() // the goroutine takes the receive CQ for them
	}
	return werr
}

// tookLocked handles receive completions in the order they came. After a
// failure, the end, or Close it takes no more.
func (c *conn) tookLocked(wcs []verbs.WorkCompletion) {
	for i := range wcs {
		if c.closed || c.rxDone {
			return
		}
		if wcs[i].Status != verbs.WCSuccess {
			c.recvFailedLocked(wcs[i])
			return
		}
		if err := c.handleLocked(wcs[i]); err != nil {
			c.failLocked(&ProtocolError{What: err.Error()})
			c.rxDone = true
			return
		}
	}
	// A release short of a batch waits for more; a peer that has since
	// run short of credit gets it now, not only at the next release
	// (which may not come while the application holds the rest).
	if len(c.released) > 0 && c.led.starving() {
		c.flushLocked(false)
	}
	// A grant that found no reply slot at its release goes out with the
	// first slot these frames gave back.
	if !c.sendCreditsLocked() {
		c.wakeLocked() // its goroutine waits for a control buffer
	}
}

// recvFailedLocked takes a receive that did not succeed: no more are taken.
func (c *conn) recvFailedLocked(wc verbs.WorkCompletion) {
	c.rxDone = true
	switch wc.Status {
	case verbs.WCLocLenErr, verbs.WCLocQPOpErr:
		// Our buffers are registered for local writes: a receive fails
		// only when the frame does not fit (rxe reports that as
		// LOC_QP_OP_ERR, siw as LOC_LEN_ERR).
		c.failLocked(&ProtocolError{What: fmt.Sprintf("a frame larger than this side's %d-byte receive buffers "+
			"(the receive failed with %v; the hello announced %d-byte messages)", c.recvSize, wc.Status, c.max)})
	case verbs.WCWRFlushErr:
		if c.failed != nil || c.rc.Err() != nil {
			return // the connection ended: Recv says so once the queue is empty
		}
		c.reapLocked() // a failed send flushes the receives too
		if c.failed == nil {
			// The end is probably on its way: the goroutine waits for it
			// (flushedByEnd) and says.
			c.flushPending = true
			c.wakeLocked()
		}
	default:
		c.failLocked(&kindError{ErrTransport, fmt.Errorf("a receive failed: %w", &verbs.CompletionError{WC: wc})})
	}
}

// mergedWait is a context that ends with either of two, kept for the next
// wait with the same pair: a Recv loop with one context sets none up per
// wait.
//
// Contexts are known by their Done channels: they are not comparable
// values in general (a context type may hold a slice), and two with one
// Done channel end together.
type mergedWait struct {
	done, endDone <-chan struct{}
	ctx           context.Context
	cancel        context.CancelFunc
	stop          func() bool
}

func (m *mergedWait) get(parent, end context.Context) context.Context {
	done := parent.Done()
	if done == nil {
		return end
	}
	endDone := end.Done()
	if m.ctx != nil && m.done == done && m.endDone == endDone {
		return m.ctx
	}
	m.release()
	ctx, cancel := context.WithCancel(parent)
	*m = mergedWait{done: done, endDone: endDone, ctx: ctx, cancel: cancel, stop: context.AfterFunc(end, cancel)}
	return ctx
}

func (m *mergedWait) release() {
	if m.ctx != nil {
		m.stop()
		m.cancel()
		*m = mergedWait{}
	}
}

// loop is the connection's goroutine. It sends the CREDIT frames that
// must wait for a control buffer, ends the connection after a failure,
// learns of the connection's end for the waits on the receive CQ, and,
// until the application first receives, takes the receive completions
// in the background.
func (c *conn) loop() {
	defer close(c.loopDone)
	var ctx context.Context
	cancel := context.CancelFunc(func() {})
	defer func() { cancel() }()
	ended := false
	for {
		err := c.housekeep()
		if c.loopCtx.Err() != nil {
			return
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return
		}
		if err != nil {
			c.failLocked(&kindError{ErrTransport, err}) // if nothing said why yet
		}
		failed, flush := c.failed != nil, c.flushPending
		c.mu.Unlock()
		if failed {
			// Here, or elsewhere (a send, a release, a keepalive probe,
			// a frame that broke the protocol): Recv takes the messages
			// that had arrived before it reports the failure.
			c.quit(nil)
			return
		}
		if flush {
			if !c.flushedByEnd() {
				if c.loopCtx.Err() != nil {
					return // Close stops the goroutine, and disconnects itself
				}
				c.mu.Lock()
				refused := c.refused // it may have come during the wait
				c.mu.Unlock()
				if refused == nil {
					refused = errFlushed
				}
				c.quit(refused)
				return
			}
			c.mu.Lock()
			c.flushPending = false
			c.broadcastLocked()
			c.mu.Unlock()
			continue
		}
		c.mu.Lock()
		if c.wakeReq {
			c.wakeReq = false
			c.mu.Unlock()
			continue
		}
		// One wait context serves until a wake-up ends it: rdmacm keeps
		// what it sets up for a context across waits with the same one.
		if ctx == nil || ctx.Err() != nil {
			ctx, cancel = context.WithCancel(c.loopCtx)
		}
		c.wake = cancel
		onCQ := (!c.recvSeen || c.creditWaits > 0) && c.recvWaits == 0 && !c.rxDone && !ended && c.rcqMu.TryLock()
		c.loopOnCQ = onCQ
		c.mu.Unlock()
		if onCQ {
			wc, err := c.rc.Recv(ctx)
			c.mu.Lock()
			c.wake, c.loopOnCQ = nil, false
			switch {
			case err == nil || wc.Status != verbs.WCSuccess:
				one := [1]verbs.WorkCompletion{wc}
				c.tookLocked(one[:])
			case errors.Is(err, rdmacm.ErrEnded):
				c.rxDone, ended = true, true
				c.rxEndCancel()
			case ctx.Err() != nil:
				// Woken: for a CREDIT frame, a failure, or a Recv.
			default:
				c.failLocked(&kindError{ErrTransport, fmt.Errorf("wait for receives: %w", err)})
				c.rxDone = true
			}
			c.rcqMu.Unlock()
			c.broadcastLocked()
			c.mu.Unlock()
			continue
		}
		var done <-chan struct{}
		if !ended {
			done = c.rc.Done()
		}
		select {
		case <-ctx.Done():
		case <-done:
			// Wake the waits on the receive CQ: the completions that came
			// before the end are taken, then Recv reports it.
			ended = true
			c.rxEndCancel()
		}
		c.mu.Lock()
		c.wake = nil
		c.mu.Unlock()
	}
}

// quit records err, unless the connection failed already, and ends the
// connection, so that the peer learns of it. Recv reports the failure
// once it has taken the messages that arrived before it.
func (c *conn) quit(err error) {
	c.mu.Lock()
	if err != nil {
		c.failLocked(err)
	}
	c.broadcastLocked()
	c.mu.Unlock()
	// A Recv waiting on the receive CQ learns of the failure now, not after
	// the disconnect (up to CloseTimeout); it still takes what arrived.
	c.rxEndCancel()
	c.disconnect()
}

// flushedByEnd tells whether receives were flushed because the connection
// ended (rdmacm moves the QP to the error state just before it reports the
// end, and siw flushes at once) rather than because a send failed here.
func (c *conn) flushedByEnd() bool {
	if c.rc.Err() != nil {
		return true
	}
	c.mu.Lock()
	c.reapLocked()
	failed := c.failed != nil
	c.mu.Unlock()
	if failed {
		return false
	}
	t := time.NewTimer(c.closeTimeout)
	defer t.Stop()
	select {
	case <-c.rc.Done():
		return true
	case <-t.C:
	case <-c.loopCtx.Done():
	}
	return false
}

// disconnect ends the connection underneath after a failure, so that the
// peer learns of it.
func (c *conn) disconnect() {
	ctx, cancel := context.WithTimeout(c.loopCtx, c.closeTimeout)
	defer cancel()
	c.rc.Disconnect(ctx)
}

// handleLocked checks one received frame and acts on it.
func (c *conn) handleLocked(wc verbs.WorkCompletion) error {
	if wc.ID >= uint64(c.nRecv) {
		return fmt.Errorf("a receive completion for buffer %d, of %d (a receive posted outside this package?)", wc.ID, c.nRecv)
	}
	idx := int(wc.ID)
	off := idx * c.recvSize
	if int(wc.ByteLen) > c.recvSize {
		return fmt.Errorf("a %d-byte frame, larger than the %d-byte receive buffer", wc.ByteLen, c.recvSize)
	}
	end := off + int(wc.ByteLen)
	b := c.recvMR.Bytes()[off:end:end]
	h, payload, err := decodeFrame(b, c.max)
	if err != nil {
		return err
	}
	c.ka.heard++
	if err := c.led.incoming(h); err != nil {
		return err
	}
	c.grantedLocked()
	switch {
	case h.typ == frameHello && c.peerReady:
		return errors.New("a HELLO frame once the connection was set up (only the dialer sends one, first)")
	case h.typ != frameHello && !c.peerReady:
		return fmt.Errorf("a %v frame before its HELLO", h.typ)
	case h.typ == frameData && c.peerFin, h.typ == frameFin && c.peerFin:
		return fmt.Errorf("a %v frame after its FIN", h.typ)
	}
	switch h.typ {
	case frameHello:
		c.peerReady = true
		c.released = append(c.released, idx)
	case frameFin:
		c.peerFin = true
		c.released = append(c.released, idx)
	case frameData:
		m := &Message{c: c, idx: idx, b: payload}
		c.msgs[idx] = m
		c.out++
		c.queue = append(c.queue, m)
	case frameCredit:
		// Posted again at once, before this side can give the slot again.
		if !c.closed && c.failed == nil && c.refused == nil {
			if err := c.qp.PostRecv(verbs.RecvWR{ID: uint64(idx), SGEs: []verbs.SGE{c.recvMR.SGE(off, c.recvSize)}}); err != nil &&
				c.rc.Err() == nil {
				c.refusedLocked(&kindError{ErrTransport, fmt.Errorf("post a receive buffer again: %w", err)})
			}
		}
	}
	return nil
}

// housekeep posts released buffers and sends a CREDIT frame when the peer
// should hear of them. It fails only when it cannot go on.
func (c *conn) housekeep() error {
	c.mu.Lock()
	for {
		if c.closed || c.failed != nil || c.refused != nil || c.rc.Err() != nil {
			c.mu.Unlock()
			return nil
		}
		if c.fault != nil {
			c.failLocked(c.fault)
		}
		c.flushLocked(false)
		if c.sendCreditsLocked() {
			err := c.failed
			c.mu.Unlock()
			if err != nil && c.rc.Err() == nil {
				return err
			}
			return nil
		}
		c.mu.Unlock()
		c.scqMu.Lock()
		// A Send that held the send CQ may have taken the completions of
		// the control frames meanwhile: then a buffer is free and there is
		// nothing to wait for. Waiting regardless could be for ever: the
		// data frames still on the send queue may all be unsignaled, done
		// only with a later signaled one, which may wait for the very
		// credit this goroutine is to take from the receive CQ.
		c.mu.Lock()
		wait := len(c.freeCtl) == 0
		c.mu.Unlock()
		var err error
		if wait {
			err = c.reapWait(c.loopCtx)
		}
		c.scqMu.Unlock()
		if err != nil && (c.loopCtx.Err() != nil || c.sqStop.Err() == nil) {
			return err
		}
		// Reaped, or the connection ended, failed or had a post refused
		// (which the check above sees: rdmacm sets Err before it ends
		// rxEnd, and failed and refused are set before sqStop ends).
		c.mu.Lock()
	}
}

// close is Close's work, also for a Conn dropped without Close, and for
// connections Accept never returned.
func (c *conn) close() error {
	c.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.closeTimeout)
		defer cancel()
		c.mu.Lock()
		c.closing = true
		c.broadcastLocked()
		// No FIN before the dialer's HELLO: the peer would take it for a
		// broken protocol.
		fin := c.helloSent && !c.finSent && c.failed == nil && c.refused == nil && c.rc.Err() == nil
		c.mu.Unlock()
		c.closingCancel() // a Send waiting for credit on the receive CQ
		if fin {
			c.sendFrame(ctx, nil, "close", frameFin, nil, true)
		}
		c.drain(ctx)
		c.mu.Lock()
		c.closed = true
		c.broadcastLocked()
		c.mu.Unlock()
		c.stopKeepalive()
		c.loopStop()
		<-c.loopDone
		// A Recv waiting on the receive CQ woke with loopStop; once it has
		// let go, no one takes it again (closed).
		c.rcqMu.Lock()
		c.rxWait.release()
		c.rcqMu.Unlock()
		c.mu.Lock()
		// The goroutine is gone: what is queued stays with the connection.
		for _, m := range c.queue {
			m.done.Store(true)
			m.b = nil
			c.out--
		}
		c.queue = nil
		// Held messages keep everything until they are released, or
		// dropped: only they refer to the connection now.
		for _, m := range c.msgs {
			if m != nil && !m.done.Load() {
				m.cleanup = runtime.AddCleanup(m, (*conn).dropped, c)
			}
		}
		c.msgs = nil
		c.tornDown = true
		last := c.lastLocked()
		c.mu.Unlock()
		if last {
			c.closeErr = c.free()
			return
		}
		// The peer learns of the end now, not when the last message goes.
		c.rc.Disconnect(context.Background())
	})
	return c.closeErr
}

// dropped is the cleanup of a Message held at Close that became
// unreachable without Release.
func (c *conn) dropped() {
	c.mu.Lock()
	c.out--
	last := c.lastLocked()
	c.mu.Unlock()
	if last {
		// Cleanups run one after another: the teardown (a disconnect,
		// destroying a QP, which can wait seconds on iWARP) must not
		// hold up the process's others.
		go c.free()
	}
}

// lastLocked reports whether the resources are to be released now: Close
// is done and no message holds them. It reports true once.
func (c *conn) lastLocked() bool {
	if !c.tornDown || c.out > 0 || c.copying > 0 || c.freed {
		return false
	}
	c.freed = true
	return true
}

// free releases the connection underneath and, with it, every buffer.
func (c *conn) free() error {
	defer close(c.freedCh)
	c.scqMu.Lock()
	defer c.scqMu.Unlock()
	if err := c.rc.Close(); err != nil {
		return c.opError("close", err)
	}
	return nil
}

// drain waits until every send has completed, the connection failed, or
// ctx ends. It never waits for the send CQ itself: another goroutine may
// be reaping it (a Send short of buffers under its own context, the
// connection's goroutine short of a control buffer until loopStop, which
// comes after drain), and a silent peer completes nothing. drain then
// watches what that reaper takes, and looks for the CQ again now and then,
// as the reaper may stop without taking anything.
func (c *conn) drain(ctx context.Context) {
	for ctx.Err() == nil {
		c.mu.Lock()
		busy := c.inSQ > 0 || len(c.freeCtl) < replySlots
		dead := c.failed != nil || c.refused != nil || c.rc.Err() != nil
		if !busy || dead {
			c.mu.Unlock()
			return
		}
		if !c.scqMu.TryLock() {
			ch := c.changedLocked()
			c.mu.Unlock()
			t := time.NewTimer(10 * time.Millisecond)
			select {
			case <-ch:
			case <-t.C:
			case <-c.rc.Done():
			case <-ctx.Done():
			}
			t.Stop()
			continue
		}
		c.mu.Unlock()
		err := c.reapWait(ctx)
		c.scqMu.Unlock()
		if err != nil {
			return
		}
	}
}
