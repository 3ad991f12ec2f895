//go:build integration

package verbs

import "golang.org/x/sys/unix"

// EventQueued reports whether c's completion channel holds an event,
// without reading it.
func EventQueued(c *CQ) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	fds := []unix.PollFd{{Fd: int32(c.cq.ChannelFD()), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n == 1 && fds[0].Revents&unix.POLLIN != 0
}

// DrainEvents reads every event queued on c's channel and returns how
// many there were; c is left unarmed.
func DrainEvents(c *CQ) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for c.cq.GetEvent() {
		n++
	}
	c.armed.Store(false)
	return n
}

// Armed reports whether c is marked armed with its event unread.
func Armed(c *CQ) bool { return c.armed.Load() }

// Waiting reports whether a goroutine is in a wait on c's channel (past
// Wait's arming, or in PollWait's steps).
func Waiting(c *CQ) bool {
	c.mu.Lock()
	w := c.wait
	c.mu.Unlock()
	return w != nil && w.Busy()
}
