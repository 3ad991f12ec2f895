//go:build linux && cgo

package ibv

import (
	"os"
	"syscall"
	"unsafe"
)

// fastPathOff is set when RDMAGO_FASTPATH=off: every QP and CQ then goes
// through the provider's C functions, a way out should the Go data path
// ever be suspected.
var fastPathOff = os.Getenv("RDMAGO_FASTPATH") == "off"

// choose picks the QP's data path, at its first post.
func (q *QP) choose() {
	q.path.chosen = true
	if fastPathOff {
		q.path.why = "RDMAGO_FASTPATH=off"
		return
	}
	siw, why := siwQPFor(q.p)
	if siw != nil {
		q.fast = siw
		return
	}
	rxe, cmem, whyRXE := rxeQPFor(q.p)
	if rxe != nil {
		q.fast, q.cmem = rxe, cmem
		return
	}
	q.path.why = why + "; " + whyRXE
}

// choose picks the CQ's data path, when it is created. The completion
// channel is made non-blocking for the Go path, whose raw reads must never
// wait.
func (c *CQ) choose() {
	c.path.chosen = true
	if fastPathOff {
		c.path.why = "RDMAGO_FASTPATH=off"
		return
	}
	if err := syscall.SetNonblock(int(c.ch.fd), true); err != nil {
		c.path.why = "the completion channel cannot be made non-blocking: " + err.Error()
		return
	}
	siw, why := siwCQFor(c.cq)
	if siw != nil {
		c.fast = siw
		return
	}
	rxe, cmem, whyRXE := rxeCQFor(c.cq)
	if rxe != nil {
		c.fast, c.cmem = rxe, cmem
		return
	}
	c.path.why = why + "; " + whyRXE
}

// readCompEvent takes one event off a non-blocking completion channel
// with a raw read: what ibv_get_cq_event reads (rxe and siw have no
// cq_event hook). False when none is queued.
func readCompEvent(fd int) bool {
	var desc uint64 // struct ib_uverbs_comp_event_desc: the CQ's user handle
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&desc)), 8)
	return e == 0 && n == 8
}
