package msg

import (
	"errors"
	"fmt"
	"time"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// probeID is the work request ID of the keepalive probe.
const probeID = 1 << 33

// probeSize is how many bytes a probe reads. A probe must read at least
// one: siw answers a zero-length READ with whatever its send slot last
// held (see registerProbe), which ends busy connections.
const probeSize = 8

// registerProbe registers, during the handshake, the memory of this side's
// probes and of its peer's: the peer's probes read its first probeSize
// bytes (zeros; nothing else is in it), this side's land in the next
// probeSize. Its key and address go into hello (from marshalProbe), which
// rdmacm reads after the setup.
//
// Why not a zero-length READ, which needs no memory: siw (Linux
// drivers/infiniband/sw/siw) mishandles it twice. libsiw copies no SGE into
// the send queue slot for a READ without one, and the kernel takes the
// READ's sink and length from that slot's first SGE all the same
// (siw_activate_tx sets num_sge to 1): once the queue has wrapped, the
// request asks for the length of an earlier SEND from rkey 0, and the
// peer refuses it with a TERMINATE (RDMAP, remote protection, invalid
// STag) that ends the connection. And with a zero-length SGE, a peer whose
// transmit slot is busy queues the answer without its SGE
// (siw_init_rresp: num_sge 0; siw_activate_tx then keeps the slot's
// earlier SGE, and siw_qp_sq_proc_tx sends as many bytes as that said),
// and the requester refuses a READ response longer than asked.
func registerProbe(s rdmacm.Setup, hello []byte) (*verbs.MR, error) {
	mr, err := s.RegisterMemory(2*probeSize, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		return nil, fmt.Errorf("register the keepalive probes' %d bytes: %w", 2*probeSize, err)
	}
	putProbe(hello, mr.RKey, mr.Addr())
	return mr, nil
}

// keepalive is the state of Config.KeepAlive; guarded by Conn.mu.
type keepalive struct {
	every, timeout time.Duration
	timer          *time.Timer
	heard          uint64    // frames received (handle counts them)
	seen           uint64    // heard at the last tick
	aliveAt        time.Time // the last sign of life: a tick that found frames heard, or a probe's answer
	answeredAt     time.Time // the last probe's answer
	probeOut       bool      // a probe is posted and not completed
	probeAt        time.Time // when it was posted
	probes         int       // probes sent
	// wr is the probe: a probeSize READ of the peer's probe memory into
	// this side's, or, from a peer whose hello names none (an rdmago from
	// before), a zero-length READ.
	wr  verbs.SendWR
	sge [1]verbs.SGE
}

// startKeepalive arms the first tick, when the Config asks for probes.
func (c *conn) startKeepalive(o *Config, mr *verbs.MR, peer hello) {
	if o.KeepAlive <= 0 {
		return
	}
	c.mu.Lock() // the first tick waits for the timer to be recorded
	defer c.mu.Unlock()
	c.ka.wr = verbs.SendWR{ID: probeID, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled}
	if peer.probe && mr != nil {
		c.ka.sge[0] = mr.SGE(probeSize, probeSize)
		c.ka.wr.SGEs, c.ka.wr.RemoteAddr, c.ka.wr.RKey = c.ka.sge[:], peer.probeAddr, peer.probeKey
	}
	c.ka.every, c.ka.timeout, c.ka.aliveAt = o.KeepAlive, o.KeepAliveTimeout, time.Now()
	c.ka.timer = time.AfterFunc(o.KeepAlive, c.keepaliveTick)
}

// checkKeepalive refuses probes that the connection could not send.
func checkKeepalive(o *Config, cc *rdmacm.ConnConfig) error {
	if o.KeepAlive > 0 && cc.InitiatorDepth < 0 {
		return errors.New("Config.KeepAlive probes with an RDMA READ, but ConnConfig.InitiatorDepth is negative (no READs)")
	}
	return nil
}

// stopKeepalive stops the ticks; Close calls it once closed is set.
func (c *conn) stopKeepalive() {
	c.mu.Lock()
	t := c.ka.timer
	c.mu.Unlock()
	if t != nil {
		t.Stop()
	}
}

// keepaliveTick runs every KeepAlive (sooner when a probe's answer is
// due). A period without a frame from the peer sends a probe; a probe not
// answered within KeepAliveTimeout, with nothing heard since it went, fails
// the connection. The ticks see frames only as a count, so silence is
// timed from the tick that last saw one: a dead peer is noticed within
// 2 × KeepAlive + KeepAliveTimeout.
func (c *conn) keepaliveTick() {
	c.mu.Lock()
	if c.closed || c.failed != nil || c.refused != nil || c.rc.Err() != nil {
		c.mu.Unlock()
		return
	}
	ka := &c.ka
	c.reapLocked()       // the probe's answer, if it came
	if c.failed != nil { // the probe failed: probeDoneLocked said why
		c.mu.Unlock()
		c.disconnect()
		return
	}
	now := time.Now()
	if ka.heard != ka.seen {
		ka.seen, ka.aliveAt = ka.heard, now
	}
	if ka.answeredAt.After(ka.aliveAt) {
		ka.aliveAt = ka.answeredAt
	}
	switch {
	case ka.probeOut && now.Sub(ka.probeAt) >= ka.timeout && !ka.aliveAt.After(ka.probeAt):
		c.failLocked(&kindError{ErrPeerUnresponsive, fmt.Errorf("no answer from the peer's device to a keepalive "+
			"probe (an RDMA READ) within %v, and no frame from it for %v: its host is gone or "+
			"the path to it broke", ka.timeout, now.Sub(ka.aliveAt).Round(time.Millisecond))})
		c.mu.Unlock()
		c.disconnect()
		return
	case !ka.probeOut && now.Sub(ka.aliveAt) >= ka.every:
		err := c.qp.PostSend(ka.wr)
		if errors.Is(err, verbs.ErrNoInitiatorDepth) {
			// Refused in Go, nothing posted: no teardown to wait for.
			c.failLocked(&kindError{ErrTransport, fmt.Errorf("Config.KeepAlive probes with an RDMA READ, and this "+
				"connection has none: the peer granted no responder resources (its ConnConfig.ResponderResources "+
				"is negative); turn KeepAlive off on one side or grant reads on the other: %w", err)})
			c.mu.Unlock()
			c.disconnect()
			return
		}
		if err != nil {
			if c.rc.Err() == nil {
				c.refusedLocked(&kindError{ErrTransport, fmt.Errorf("post a keepalive probe: %w", err)})
			}
			failed := c.failed != nil
			c.mu.Unlock()
			if failed {
				c.disconnect()
			}
			// Otherwise the goroutine waits for the end the refusal
			// foretells, and ends the connection if it does not come.
			return
		}
		ka.probeOut, ka.probeAt = true, now
		ka.probes++
	}
	next := ka.every
	if ka.probeOut {
		next = min(next, max(ka.probeAt.Add(ka.timeout).Sub(now), time.Millisecond))
	}
	ka.timer.Reset(next)
	c.mu.Unlock()
}

// probeDoneLocked takes the probe's completion.
func (c *conn) probeDoneLocked(wc verbs.WorkCompletion) {
	c.ka.probeOut = false
	switch wc.Status {
	case verbs.WCSuccess:
		c.ka.answeredAt = time.Now()
	case verbs.WCWRFlushErr:
		// Flushed by the connection's end, which says why.
	case verbs.WCRemInvReqErr:
		c.failLocked(&kindError{ErrTransport, fmt.Errorf("the peer refused the keepalive probe, an RDMA READ: "+
			"it accepts none (its ConnConfig.ResponderResources is negative): %w", &verbs.CompletionError{WC: wc})})
	case verbs.WCRemAccessErr:
		// The device answered, so the peer is alive; what it named in its
		// hello is not memory this side may read.
		c.failLocked(&ProtocolError{What: fmt.Sprintf("a hello naming keepalive probe memory (key %#x, address %#x) "+
			"that its device refuses to let this side read (%v)", c.ka.wr.RKey, c.ka.wr.RemoteAddr, &verbs.CompletionError{WC: wc})})
	default:
		c.failLocked(&kindError{ErrPeerUnresponsive, fmt.Errorf("the keepalive probe (an RDMA READ) failed: %w",
			&verbs.CompletionError{WC: wc})})
	}
}
