//go:build linux && cgo

package ibv

/*
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <infiniband/verbs.h>

// Which provider fn is code of, by the file it was loaded from: 1 for
// libsiw, 2 for librxe, of private ABI 34 (rdma-core 34 to 56), 3 and 4 for
// their other builds, 0 for another. Only a QP or CQ whose functions are
// libsiw's or librxe's is that provider's struct, and only the rdmav34
// builds have the struct layouts that the checks of siwQPFor and rxeQPFor
// read: an older librxe's structs are smaller, and reading past them could
// fault. (librxe's also moved within the rdmav34 builds: rxeUsable.) The
// others take the C path.
static int rdmago_provider_of(void *fn) {
	Dl_info info;
	if (fn == NULL || dladdr(fn, &info) == 0 || info.dli_fname == NULL) {
		return 0;
	}
	const char *base = strrchr(info.dli_fname, '/');
	base = base ? base + 1 : info.dli_fname;
	if (strcmp(base, "libsiw-rdmav34.so") == 0) {
		return 1;
	}
	if (strcmp(base, "librxe-rdmav34.so") == 0) {
		return 2;
	}
	if (strncmp(base, "libsiw-", 7) == 0) {
		return 3;
	}
	if (strncmp(base, "librxe-", 7) == 0) {
		return 4;
	}
	return 0;
}
*/
import "C"

import (
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// fastPathOff is set when RDMAGO_FASTPATH=off: every QP and CQ then goes
// through the provider's C functions, a way out should the Go data path
// ever be suspected. It is also set on a big-endian machine: the Go path
// writes the rings' words as a little-endian one lays them out (siw's
// flags, SGE count and opcode in one 32-bit store; rxe's immediate data
// swapped to network order unconditionally).
var fastPathOff = os.Getenv("RDMAGO_FASTPATH") == "off" || !littleEndian()

func littleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// The providers whose queues have a Go data path.
const (
	providerOther = iota
	providerSiw   // the rdmav34 builds, whose layouts the Go path knows
	providerRxe
	providerSiwOtherBuild // C path only
	providerRxeOtherBuild
)

// providers holds providerOf's verdicts by function address.
var providers sync.Map

// providerOf tells which provider the function at fn belongs to. dladdr,
// which walks the loaded objects under the loader's lock, runs once per
// function (a provider's post_send and poll_cq) and process, not for every
// QP and CQ: a provider stays loaded once libibverbs loaded it.
func providerOf(fn unsafe.Pointer) int {
	if p, ok := providers.Load(fn); ok {
		return p.(int)
	}
	p := int(C.rdmago_provider_of(fn))
	providers.Store(fn, p)
	return p
}

// libsiw reports whether the function at fn is libsiw's, of any build.
func libsiw(fn unsafe.Pointer) bool {
	p := providerOf(fn)
	return p == providerSiw || p == providerSiwOtherBuild
}

// LaterPostRings reports whether a later post rings the doorbell for
// requests that a failed one left queued: the Go paths and librxe do;
// libsiw rings only for a send queue it finds idle, which those requests
// make it look busy.
func (q *QP) LaterPostRings() bool {
	if q.fast != nil {
		return true
	}
	return !libsiw(unsafe.Pointer(q.p.context.ops.post_send))
}

// choose picks the QP's data path, at its first post.
func (q *QP) choose() {
	q.chosen = true
	if fastPathOff {
		return
	}
	switch providerOf(unsafe.Pointer(q.p.context.ops.post_send)) {
	case providerSiw:
		if siw := siwQPFor(q.p); siw != nil {
			q.fast = siw
		}
	case providerRxe:
		if rxe, cmem := rxeQPFor(q.p); rxe != nil {
			q.fast, q.cmem = rxe, cmem
		}
	}
}

// KeptOnFailedDestroy reports whether a QP whose Destroy failed is still
// whole. libsiw (rdma-core 44, siw_destroy_qp) unmaps the send and receive
// queues before it asks the kernel, and does not map them again when the
// kernel refuses: any post after that, from Go or C, would fault.
func (q *QP) KeptOnFailedDestroy() bool {
	return !libsiw(unsafe.Pointer(q.p.context.ops.post_send))
}

// KeptOnFailedDestroy reports whether a CQ whose Destroy failed is still
// whole. libsiw (rdma-core 44, siw_destroy_cq) unmaps the CQ's ring before
// it asks the kernel, and does not map it again when the kernel refuses:
// any poll or arm after that would fault.
func (c *CQ) KeptOnFailedDestroy() bool {
	return !libsiw(unsafe.Pointer(c.cq.context.ops.poll_cq))
}

// choose picks the CQ's data path, when it is created (its completion
// channel is non-blocking by then: the raw reads must never wait).
func (c *CQ) choose() {
	if fastPathOff {
		return
	}
	switch providerOf(unsafe.Pointer(c.cq.context.ops.poll_cq)) {
	case providerSiw:
		if siw := siwCQFor(c.cq); siw != nil {
			c.fast = siw
		}
	case providerRxe:
		if rxe, cmem := rxeCQFor(c.cq); rxe != nil {
			c.fast, c.cmem = rxe, cmem
		}
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
