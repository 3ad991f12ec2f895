//go:build linux && cgo

package ibv

/*
#cgo LDFLAGS: -libverbs
#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

// libsiw's private structs (rdma-core 44, providers/siw/siw.h), copied to
// find the rings it mapped: libibverbs exports no way to reach them. A
// copy that does not match what libsiw built is caught at run time by the
// signatures rdmago_siw_qp and rdmago_siw_cq check, and the QP or CQ then
// keeps going through libsiw.
struct rdmago_post_send_cmd { // struct ibv_post_send (kern-abi.h)
	uint32_t command;
	uint16_t in_words, out_words;
	uint64_t response;
	uint32_t qp_handle, wr_count, sge_count, wqe_size;
};
struct rdmago_siw_qp {
	struct ibv_qp base_qp;
	void *siw_dev;
	uint32_t id;
	int sq_lock, rq_lock; // pthread_spinlock_t
	struct rdmago_post_send_cmd db_req;
	uint32_t db_resp; // struct ib_uverbs_post_send_resp
	uint32_t num_sqe, sq_put;
	int sq_sig_all;
	void *sendq;
	uint32_t num_rqe, rq_put;
	void *recvq;
	void *srq;
};
struct rdmago_siw_cq {
	struct ibv_cq base_cq;
	void *siw_dev;
	uint32_t id;
	void *ctrl;
	int num_cqe;
	uint32_t cq_get;
	void *queue;
	int lock;
};
// The offsets bench/cgofree.md read off libsiw 44 on x86-64.
_Static_assert(sizeof(struct ibv_qp) == 160 && offsetof(struct rdmago_siw_qp, db_req) == 184 &&
	offsetof(struct rdmago_siw_qp, db_resp) == 216 && offsetof(struct rdmago_siw_qp, sq_put) == 224 &&
	offsetof(struct rdmago_siw_qp, sendq) == 232 && offsetof(struct rdmago_siw_qp, rq_put) == 244 &&
	offsetof(struct rdmago_siw_qp, recvq) == 248, "struct siw_qp");
_Static_assert(sizeof(struct ibv_cq) == 128 && offsetof(struct rdmago_siw_cq, ctrl) == 144 &&
	offsetof(struct rdmago_siw_cq, num_cqe) == 152 && offsetof(struct rdmago_siw_cq, cq_get) == 156 &&
	offsetof(struct rdmago_siw_cq, queue) == 160, "struct siw_cq");

static int pow2(uint64_t n) { return n > 0 && (n & (n - 1)) == 0; }
static int page_aligned(void *p) { return p != NULL && ((uintptr_t)p & 4095) == 0; }

// What Go needs of a siw QP (libsiw's: the caller asked providerOf); why
// is NULL when it matches every check, else names the first that failed
// (for a debugger).
struct rdmago_siw_qp_rings {
	void *sendq, *recvq, *db_req;
	uint32_t *sq_put, *rq_put;
	uint32_t num_sqe, num_rqe;
	int sig_all, cmd_fd;
	const char *why;
};
static struct rdmago_siw_qp_rings rdmago_siw_qp(struct ibv_qp *base) {
	struct rdmago_siw_qp_rings r = {0};
	struct rdmago_siw_qp *qp = (struct rdmago_siw_qp *)base;
	struct rdmago_post_send_cmd *db = &qp->db_req;
	if (db->command != 28 || db->in_words != 8 || db->out_words != 1 ||
			db->response != (uintptr_t)&qp->db_resp || db->qp_handle != base->handle ||
			db->wr_count != 0 || db->sge_count != 0 || db->wqe_size != sizeof(struct ibv_send_wr) ||
			qp->id != base->qp_num) {
		r.why = "libsiw's struct siw_qp is not laid out as in rdma-core 44 (doorbell request)";
	} else if (!pow2(qp->num_sqe) || !pow2(qp->num_rqe) || !page_aligned(qp->sendq) ||
			!page_aligned(qp->recvq)) {
		r.why = "libsiw's struct siw_qp is not laid out as in rdma-core 44 (rings)";
	} else if (qp->srq != NULL || base->srq != NULL) {
		r.why = "the QP receives through an SRQ";
	} else {
		r.sendq = qp->sendq;
		r.recvq = qp->recvq;
		r.db_req = db;
		r.sq_put = &qp->sq_put;
		r.rq_put = &qp->rq_put;
		r.num_sqe = qp->num_sqe;
		r.num_rqe = qp->num_rqe;
		r.sig_all = qp->sq_sig_all != 0;
		r.cmd_fd = base->context->cmd_fd;
	}
	return r;
}

struct rdmago_siw_cq_ring {
	void *queue;
	uint32_t *ctrl, *cq_get;
	uint32_t num_cqe;
	const char *why;
};
static struct rdmago_siw_cq_ring rdmago_siw_cq(struct ibv_cq *base) {
	struct rdmago_siw_cq_ring r = {0};
	struct rdmago_siw_cq *cq = (struct rdmago_siw_cq *)base;
	if (!pow2((uint64_t)(int64_t)cq->num_cqe) || cq->num_cqe != base->cqe || !page_aligned(cq->queue) ||
			(char *)cq->ctrl != (char *)cq->queue + 32 * (size_t)cq->num_cqe) {
		r.why = "libsiw's struct siw_cq is not laid out as in rdma-core 44";
	} else {
		r.queue = cq->queue;
		r.ctrl = (uint32_t *)cq->ctrl;
		r.cq_get = &cq->cq_get;
		r.num_cqe = cq->num_cqe;
	}
	return r;
}
*/
import "C"

import (
	"syscall"
	"unsafe"
)

// siwQPFor returns the Go data path for a libsiw QP (providerOf), or nil.
func siwQPFor(qp *C.struct_ibv_qp) *siwQP {
	r := C.rdmago_siw_qp(qp)
	if r.why != nil {
		return nil
	}
	fd, req := int(r.cmd_fd), unsafe.Pointer(r.db_req)
	return &siwQP{
		sq: r.sendq, rq: r.recvq, sqSize: uint32(r.num_sqe), rqSize: uint32(r.num_rqe),
		sqPut: (*uint32)(unsafe.Pointer(r.sq_put)), rqPut: (*uint32)(unsafe.Pointer(r.rq_put)),
		sigAll: r.sig_all != 0,
		// libsiw's own doorbell request and response word, in C memory;
		// siw sends inside the write without sleeping (MSG_DONTWAIT).
		doorbell: func() syscall.Errno { return rawWrite(fd, req, 32) },
	}
}

// siwCQFor returns the Go data path for a libsiw CQ (providerOf), or nil.
func siwCQFor(cq *C.struct_ibv_cq) *siwCQ {
	r := C.rdmago_siw_cq(cq)
	if r.why != nil {
		return nil
	}
	return &siwCQ{ring: r.queue, size: uint32(r.num_cqe), get: (*uint32)(unsafe.Pointer(r.cq_get)),
		ctrl: (*uint32)(unsafe.Pointer(r.ctrl))}
}
