//go:build linux && cgo

package verbs

/*
#include <infiniband/verbs.h>
*/
import "C"

import (
	"errors"
	"unsafe"
)

// Interop with C libraries that own verbs objects themselves, such as
// librdmacm, which opens its own device contexts and creates and moves the
// QPs of CM-managed connections. Pointers are struct ibv_* pointers.

// BorrowContext wraps a struct ibv_context that another library owns. Close
// stops the Events reader but leaves the context open.
func BorrowContext(ctx unsafe.Pointer) (*Device, error) {
	if ctx == nil {
		return nil, errors.New("verbs: BorrowContext: nil context")
	}
	c := (*C.struct_ibv_context)(ctx)
	return &Device{Info: deviceInfo(c.device), ctx: c, borrowed: true}, nil
}

// CPointer is the struct ibv_context (nil once closed), for C libraries
// that take one.
func (d *Device) CPointer() unsafe.Pointer {
	d.mu.Lock()
	defer d.mu.Unlock()
	return unsafe.Pointer(d.ctx)
}

// CPointer is the struct ibv_pd, for C libraries that take one.
func (p *PD) CPointer() unsafe.Pointer { return unsafe.Pointer(p.pd) }

// CPointer is the struct ibv_cq, for C libraries that take one.
func (c *CQ) CPointer() unsafe.Pointer { return unsafe.Pointer(c.cq) }

// AdoptQP wraps a struct ibv_qp that another library created on pd and will
// move through its states: State queries the QP, and Close calls destroy
// (e.g. rdma_destroy_qp) instead of ibv_destroy_qp. Modify still validates.
func AdoptQP(pd *PD, qp unsafe.Pointer, t QPType, destroy func()) *QP {
	q := (*C.struct_ibv_qp)(qp)
	return &QP{Type: t, QPN: uint32(q.qp_num), pd: pd, qp: q, state: QPState(q.state), adopted: true, destroy: destroy}
}

// QPAttrFromC converts a struct ibv_qp_attr (e.g. from rdma_init_qp_attr).
func QPAttrFromC(p unsafe.Pointer) QPAttr {
	return attrFromC((*C.struct_ibv_qp_attr)(p))
}

// AHAttrFromC converts a struct ibv_ah_attr (e.g. from an rdma_cm UD event).
func AHAttrFromC(p unsafe.Pointer) AHAttr {
	return ahFromC((*C.struct_ibv_ah_attr)(p))
}
