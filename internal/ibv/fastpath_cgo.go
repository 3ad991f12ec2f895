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
	q.chosen = true
	if fastPathOff {
		return
	}
	if siw := siwQPFor(q.p); siw != nil {
		q.fast = siw
	} else if rxe, cmem := rxeQPFor(q.p); rxe != nil {
		q.fast, q.cmem = rxe, cmem
	}
}

// choose picks the CQ's data path, when it is created. The completion
// channel is made non-blocking for the Go path, whose raw reads must never
// wait.
func (c *CQ) choose() {
	if fastPathOff || syscall.SetNonblock(int(c.ch.fd), true) != nil {
		return
	}
	if siw := siwCQFor(c.cq); siw != nil {
		c.fast = siw
	} else if rxe, cmem := rxeCQFor(c.cq); rxe != nil {
		c.fast, c.cmem = rxe, cmem
	}
}

// readCompEvent takes one event off a non-blocking completion channel
// with a raw read: what ibv_get_cq_event reads (rxe and siw have no
// cq_event hook). False when none is queued.
func readCompEvent(fd int) bool {
	var desc uint64 // struct ib_uverbs_comp_event_desc: the CQ's user handle
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&desc)), 8)
	return e == 0 && n == 8
}
