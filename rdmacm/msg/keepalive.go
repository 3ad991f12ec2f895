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
}

// startKeepalive arms the first tick, when the Config asks for probes.
func (c *Conn) startKeepalive(o *Config) {
	if o.KeepAlive <= 0 {
		return
	}
	c.mu.Lock() // the first tick waits for the timer to be recorded
	defer c.mu.Unlock()
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
func (c *Conn) stopKeepalive() {
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
func (c *Conn) keepaliveTick() {
	c.mu.Lock()
	if c.closed || c.failed != nil || c.rc.Err() != nil {
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
			"probe (a zero-length RDMA READ) within %v, and no frame from it for %v: its host is gone or "+
			"the path to it broke", ka.timeout, now.Sub(ka.aliveAt).Round(time.Millisecond))})
		c.mu.Unlock()
		c.disconnect()
		return
	case !ka.probeOut && now.Sub(ka.aliveAt) >= ka.every:
		err := c.qp.PostSend(verbs.SendWR{ID: probeID, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled})
		if err != nil {
			if c.rc.Err() == nil {
				c.failLocked(&kindError{ErrTransport, fmt.Errorf("post a keepalive probe: %w", err)})
			}
			c.mu.Unlock()
			c.disconnect()
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
func (c *Conn) probeDoneLocked(wc verbs.WorkCompletion) {
	c.ka.probeOut = false
	switch wc.Status {
	case verbs.WCSuccess:
		c.ka.answeredAt = time.Now()
	case verbs.WCWRFlushErr:
		// Flushed by the connection's end, which says why.
	case verbs.WCRemInvReqErr:
		c.failLocked(&kindError{ErrTransport, fmt.Errorf("the peer refused the keepalive probe, an RDMA READ: "+
			"it accepts none (its ConnConfig.ResponderResources is negative): %w", &verbs.CompletionError{WC: wc})})
	default:
		c.failLocked(&kindError{ErrPeerUnresponsive, fmt.Errorf("the keepalive probe (a zero-length RDMA READ) failed: %w",
			&verbs.CompletionError{WC: wc})})
	}
}
