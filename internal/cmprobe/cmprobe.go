//go:build linux && cgo

// Package cmprobe asks the kernel's RDMA CM which source GID index it uses
// for a connection. It connects a source address to a destination (a
// listener in the same process), with QPs the CM owns and moves, and reads
// back the address vector the CM put into each QP. Tests use it as the
// oracle for package resolver; it is no connection API (see package rdmacm).
package cmprobe

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <stdlib.h>
#include <rdma/rdma_cma.h>

static int addr_of(const char *host, const char *port, struct sockaddr_storage *out) {
	struct addrinfo hints, *res;
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
	if (getaddrinfo(host, port, &hints, &res) != 0) return -1;
	memcpy(out, res->ai_addr, res->ai_addrlen);
	freeaddrinfo(res);
	return 0;
}

static int sgid_of(struct rdma_cm_id *id) {
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	if (!id->qp || ibv_query_qp(id->qp, &qa, IBV_QP_AV, &qi)) return -1;
	return qa.ah_attr.grh.sgid_index;
}

// rdmago_probe returns 0 and both sides' sgid_index, or -1 with a message.
static int rdmago_probe(const char *src, const char *dst, const char *port, int timeout_ms,
		int *active_sgid, int *passive_sgid, char *msg, int msglen) {
	struct sockaddr_storage s, d;
	struct rdma_event_channel *ch = NULL;
	struct rdma_cm_id *lid = NULL, *aid = NULL, *pid = NULL;
	struct rdma_cm_event *ev;
	struct ibv_qp_init_attr qattr;
	struct rdma_conn_param param;
	int established = 0, rc = -1;

	memset(&qattr, 0, sizeof(qattr));
	qattr.cap.max_send_wr = qattr.cap.max_recv_wr = 1;
	qattr.cap.max_send_sge = qattr.cap.max_recv_sge = 1;
	qattr.qp_type = IBV_QPT_RC;
	memset(&param, 0, sizeof(param));
	param.responder_resources = param.initiator_depth = 1;
	param.retry_count = param.rnr_retry_count = 7;
	*active_sgid = *passive_sgid = -1;

	if ((*src && addr_of(src, NULL, &s)) || addr_of(dst, port, &d)) {
		snprintf(msg, msglen, "bad address %s or %s", src, dst);
		return -1;
	}
	ch = rdma_create_event_channel();
	if (!ch) { snprintf(msg, msglen, "rdma_create_event_channel: %s", strerror(errno)); return -1; }
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	if (rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) || rdma_bind_addr(lid, (struct sockaddr *)&d) || rdma_listen(lid, 1)) {
		snprintf(msg, msglen, "listen on %s: %s", dst, strerror(errno)); goto out;
	}
	if (rdma_create_id(ch, &aid, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(aid, *src ? (struct sockaddr *)&s : NULL, (struct sockaddr *)&d, timeout_ms)) {
		snprintf(msg, msglen, "rdma_resolve_addr %s -> %s: %s", src, dst, strerror(errno)); goto out;
	}
	while (established < 2) {
		struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
		if (poll(&pfd, 1, timeout_ms) <= 0) { snprintf(msg, msglen, "no CM event within %d ms", timeout_ms); goto out; }
		if (rdma_get_cm_event(ch, &ev)) continue;
		enum rdma_cm_event_type type = ev->event;
		int status = ev->status;
		struct rdma_cm_id *id = ev->id;
		int err = 0;
		switch (type) {
		case RDMA_CM_EVENT_ADDR_RESOLVED:
			err = rdma_resolve_route(aid, timeout_ms);
			break;
		case RDMA_CM_EVENT_ROUTE_RESOLVED:
			err = rdma_create_qp(aid, NULL, &qattr) || rdma_connect(aid, &param);
			break;
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			pid = id;
			err = rdma_create_qp(pid, NULL, &qattr) || rdma_accept(pid, &param);
			break;
		case RDMA_CM_EVENT_ESTABLISHED:
			established++;
			break;
		default:
			snprintf(msg, msglen, "%s (status %d)", rdma_event_str(type), status);
			rdma_ack_cm_event(ev);
			goto out;
		}
		rdma_ack_cm_event(ev);
		if (err) { snprintf(msg, msglen, "after %s: %s", rdma_event_str(type), strerror(errno)); goto out; }
	}
	*active_sgid = sgid_of(aid);
	*passive_sgid = sgid_of(pid);
	rc = 0;
out:
	if (aid && aid->qp) rdma_destroy_qp(aid);
	if (pid && pid->qp) rdma_destroy_qp(pid);
	if (pid) rdma_destroy_id(pid);
	if (aid) rdma_destroy_id(aid);
	if (lid) rdma_destroy_id(lid);
	rdma_destroy_event_channel(ch);
	return rc;
}
*/
import "C"

import (
	"errors"
	"net/netip"
	"strconv"
	"time"
	"unsafe"
)

// SGIDIndexes connects src (the zero Addr: let the CM choose) to dst:port
// through the kernel CM and returns the source GID index the CM gave the
// active QP and the passive one.
func SGIDIndexes(src, dst netip.Addr, port uint16, timeout time.Duration) (active, passive int, err error) {
	srcText := ""
	if src.IsValid() {
		srcText = src.String()
	}
	cs, cd, cp := C.CString(srcText), C.CString(dst.String()), C.CString(strconv.Itoa(int(port)))
	defer C.free(unsafe.Pointer(cs))
	defer C.free(unsafe.Pointer(cd))
	defer C.free(unsafe.Pointer(cp))
	var a, p C.int
	msg := (*C.char)(C.calloc(256, 1))
	defer C.free(unsafe.Pointer(msg))
	if C.rdmago_probe(cs, cd, cp, C.int(timeout.Milliseconds()), &a, &p, msg, 256) != 0 {
		return -1, -1, errors.New("cmprobe: " + src.String() + " → " + dst.String() + ": " + C.GoString(msg))
	}
	return int(a), int(p), nil
}
