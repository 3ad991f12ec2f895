//go:build linux && cgo

package ibv

/*
#cgo LDFLAGS: -libverbs
#define _GNU_SOURCE
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_user_rxe.h>

// librxe's private structs (rdma-core 44, providers/rxe/rxe.h), copied to
// find the queues it mapped; what rdmago_rxe_qp and rdmago_rxe_cq check
// catches a copy that does not match, and the QP or CQ then keeps going
// through librxe. verbs_cq and verbs_qp are libibverbs' (driver.h).
struct rdmago_rxe_cq {
	union { struct ibv_cq cq; struct ibv_cq_ex cq_ex; } vcq;
	struct mminfo mmap_info;
	struct rxe_queue_buf *queue;
};
struct rdmago_rxe_wq {
	struct rxe_queue_buf *queue;
	int lock; // pthread_spinlock_t
	unsigned int max_sge, max_inline;
};
struct rdmago_rxe_qp {
	union { struct ibv_qp qp; struct ibv_qp_ex qp_ex; } vqp;
	uint32_t comp_mask;
	void *xrcd;
	struct mminfo rq_mmap_info;
	struct rdmago_rxe_wq rq;
	struct mminfo sq_mmap_info;
	struct rdmago_rxe_wq sq;
};
// Whether these copies, built with this machine's headers, have the
// offsets bench/cgofree.md read off librxe 44 on x86-64. struct ibv_qp_ex
// grew in rdma-core 44 (wr_atomic_write) and 45 (wr_flush), which moves
// rxe_qp's queues, though every release from 34 to 56 names its librxe
// librxe-rdmav34.so: with other headers, rxe takes the C path.
static int rdmago_rxe_layout_44(void) {
	return offsetof(struct rdmago_rxe_cq, queue) == 304 && offsetof(struct rdmago_rxe_qp, rq) == 384 &&
		offsetof(struct rdmago_rxe_qp, sq) == 424;
}

static int rdmago_find_ibverbs(struct dl_phdr_info *info, size_t size, void *data) {
	const char *name = info->dlpi_name;
	if (name != NULL && strstr(name, "/libibverbs.so") != NULL) {
		*(char **)data = realpath(name, NULL);
		return 1;
	}
	return 0;
}

// rdmago_ibverbs_path is the file the process's libibverbs was loaded
// from, links resolved (libibverbs.so.1.14.44.0), for free(); or NULL.
static char *rdmago_ibverbs_path(void) {
	char *path = NULL;
	dl_iterate_phdr(rdmago_find_ibverbs, &path);
	return path;
}

// A queue whose mapping is as the kernel sized it (rxe_queue_init,
// rxe_create_mmap_info): a power of two of slots of at least min bytes,
// at least slots, the whole the mapping's size rounded up to pages.
static int rxe_queue_ok(struct rxe_queue_buf *q, struct mminfo *m, uint32_t min, uint32_t slots) {
	if (q == NULL || ((uintptr_t)q & 4095) != 0 || q->log2_elem_size > 16) {
		return 0;
	}
	uint64_t n = (uint64_t)q->index_mask + 1;
	uint64_t size = sizeof(struct rxe_queue_buf) + (n << q->log2_elem_size);
	return (n & (n - 1)) == 0 && n >= slots && (1u << q->log2_elem_size) >= min &&
		m->size == ((size + 4095) & ~(uint64_t)4095);
}

// A POST_SEND command with nothing in it (librxe's post_send_db), with
// its response word, in C memory; and a REQ_NOTIFY_CQ for the next
// completion (what ibv_cmd_req_notify_cq sends through write()).
struct rdmago_post_send_db {
	uint32_t command;
	uint16_t in_words, out_words;
	uint64_t response;
	uint32_t qp_handle, wr_count, sge_count, wqe_size;
	uint32_t resp;
};
struct rdmago_req_notify {
	uint32_t command;
	uint16_t in_words, out_words;
	uint32_t cq_handle, solicited_only;
};
_Static_assert(offsetof(struct rdmago_post_send_db, resp) == 32 && sizeof(struct rdmago_req_notify) == 16, "commands");

struct rdmago_rxe_qp_queues {
	struct rxe_queue_buf *sq, *rq;
	unsigned int sq_max_sge, max_inline, rq_max_sge;
	uint32_t *state;
	struct rdmago_post_send_db *db; // to free when the QP goes
	int cmd_fd;
	const char *why;
};
static struct rdmago_rxe_qp_queues rdmago_rxe_qp(struct ibv_qp *base) {
	struct rdmago_rxe_qp_queues r = {0};
	struct rdmago_rxe_qp *qp = (struct rdmago_rxe_qp *)base;
	if (base->qp_type != IBV_QPT_RC && base->qp_type != IBV_QPT_UC) {
		r.why = "a UD QP (its sends name address handles, left to librxe)";
		return r;
	}
	if (base->srq != NULL) {
		r.why = "the QP receives through an SRQ";
		return r;
	}
	unsigned int sq_min = 16 * qp->sq.max_sge > qp->sq.max_inline ? 16 * qp->sq.max_sge : qp->sq.max_inline;
	if (qp->sq.max_sge > 1024 || qp->rq.max_sge > 1024 ||
			!rxe_queue_ok(qp->sq.queue, &qp->sq_mmap_info, sizeof(struct rxe_send_wqe) + sq_min, 2) ||
			!rxe_queue_ok(qp->rq.queue, &qp->rq_mmap_info, sizeof(struct rxe_recv_wqe) + 16 * qp->rq.max_sge, 1)) {
		r.why = "librxe's struct rxe_qp is not laid out as in rdma-core 44";
		return r;
	}
	struct rdmago_post_send_db *db = calloc(1, sizeof(*db));
	if (db == NULL) {
		r.why = "no memory for the doorbell";
		return r;
	}
	db->command = 28; // IB_USER_VERBS_CMD_POST_SEND
	db->in_words = 8;
	db->out_words = 1;
	db->response = (uintptr_t)&db->resp;
	db->qp_handle = base->handle;
	db->wqe_size = sizeof(struct ibv_send_wr);
	r.sq = qp->sq.queue;
	r.rq = qp->rq.queue;
	r.sq_max_sge = qp->sq.max_sge;
	r.max_inline = qp->sq.max_inline;
	r.rq_max_sge = qp->rq.max_sge;
	r.state = (uint32_t *)&base->state;
	r.db = db;
	r.cmd_fd = base->context->cmd_fd;
	return r;
}

struct rdmago_rxe_cq_queue {
	struct rxe_queue_buf *q;
	struct rdmago_req_notify *arm; // to free when the CQ goes
	int cmd_fd;
	const char *why;
};
static struct rdmago_rxe_cq_queue rdmago_rxe_cq(struct ibv_cq *base) {
	struct rdmago_rxe_cq_queue r = {0};
	struct rdmago_rxe_cq *cq = (struct rdmago_rxe_cq *)base;
	if (base->cqe < 1 || !rxe_queue_ok(cq->queue, &cq->mmap_info, sizeof(struct ibv_wc), (uint32_t)base->cqe + 1)) {
		r.why = "librxe's struct rxe_cq is not laid out as in rdma-core 44";
		return r;
	}
	struct rdmago_req_notify *arm = calloc(1, sizeof(*arm));
	if (arm == NULL) {
		r.why = "no memory for the arming command";
		return r;
	}
	arm->command = 23; // IB_USER_VERBS_CMD_REQ_NOTIFY_CQ
	arm->in_words = 4;
	arm->cq_handle = base->handle;
	r.q = cq->queue;
	r.arm = arm;
	r.cmd_fd = base->context->cmd_fd;
	return r;
}
*/
import "C"

import (
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// rxeUsable tells whether librxe's structs are rdma-core 44's, which the
// Go path reads: in the headers this package was built with, and in the
// libibverbs the process runs with (its librxe comes from the same
// release). A binary built on Debian 12 and run with rdma-core 39 would
// otherwise read a pointer where librxe 39 keeps a lock, and fault.
var rxeUsable = sync.OnceValue(func() bool {
	return rxeLayout44() && rdmaCoreRelease(ibverbsPath()) == 44
})

// rxeLayout44 tells whether the headers this package was built with lay
// librxe's structs out as rdma-core 44's.
func rxeLayout44() bool { return C.rdmago_rxe_layout_44() != 0 }

// ibverbsPath is the file the process's libibverbs was loaded from, links
// resolved, or "".
func ibverbsPath() string {
	p := C.rdmago_ibverbs_path()
	if p == nil {
		return ""
	}
	defer C.free(unsafe.Pointer(p))
	return C.GoString(p)
}

// rdmaCoreRelease is the rdma-core release of a libibverbs file, named
// libibverbs.so.1.<ABI>.<release>.<patch>: 44 for libibverbs.so.1.14.44.0;
// -1 for another name.
func rdmaCoreRelease(path string) int {
	rest, ok := strings.CutPrefix(filepath.Base(path), "libibverbs.so.1.")
	if !ok {
		return -1
	}
	parts := strings.Split(rest, ".")
	if len(parts) < 2 {
		return -1
	}
	n, err := strconv.Atoi(parts[1])
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// rxeQueueOf reads a queue's element size and mask once: the kernel keeps
// its own copies and never reads them back, and they do not change.
func rxeQueueOf(q *C.struct_rxe_queue_buf) rxeQueue {
	return rxeQueue{buf: unsafe.Pointer(q), log2: uint32(q.log2_elem_size), mask: uint32(q.index_mask)}
}

// rawWrite writes an rdma-core command to the device's command fd without
// the runtime's syscall bookkeeping: rxe sends inside the doorbell's write
// without sleeping, and an arming only takes a lock.
func rawWrite(fd int, cmd unsafe.Pointer, size uintptr) syscall.Errno {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(cmd), size)
	if e == 0 && n != size {
		e = syscall.EIO
	}
	return e
}

// rxeQPFor returns the Go data path for a librxe (providerOf) RC or UC QP
// and the C memory it holds (freed with the QP), or nil.
func rxeQPFor(qp *C.struct_ibv_qp) (*rxeQP, unsafe.Pointer) {
	if !rxeUsable() {
		return nil, nil
	}
	r := C.rdmago_rxe_qp(qp)
	if r.why != nil { // names the check that failed, for a debugger
		return nil, nil
	}
	fd, db := int(r.cmd_fd), unsafe.Pointer(r.db)
	return &rxeQP{
		sq: rxeQueueOf(r.sq), rq: rxeQueueOf(r.rq),
		sqMaxSGE: uint32(r.sq_max_sge), maxInl: uint32(r.max_inline), rqMaxSGE: uint32(r.rq_max_sge),
		state:    (*uint32)(unsafe.Pointer(r.state)),
		doorbell: func() syscall.Errno { return rawWrite(fd, db, 32) },
	}, db
}

// rxeCQFor returns the Go data path for a librxe CQ (providerOf) and the C
// memory it holds, or nil.
func rxeCQFor(cq *C.struct_ibv_cq) (*rxeCQ, unsafe.Pointer) {
	if !rxeUsable() {
		return nil, nil
	}
	r := C.rdmago_rxe_cq(cq)
	if r.why != nil { // names the check that failed, for a debugger
		return nil, nil
	}
	fd, arm := int(r.cmd_fd), unsafe.Pointer(r.arm)
	return &rxeCQ{q: rxeQueueOf(r.q), notify: func() syscall.Errno { return rawWrite(fd, arm, 16) }}, arm
}
