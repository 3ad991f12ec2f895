// Package vbridge lets package rdmacm reach the internal/ibv handles inside
// package verbs' objects, and wrap librdmacm's handles as verbs objects,
// without verbs exporting either. Package verbs fills the functions in when
// it is initialised; rdmacm imports verbs, so they are set before rdmacm
// runs. The any values are verbs' own types (*verbs.PD, verbs.QPAttr, …).
package vbridge

import "github.com/rdmago/rdmago/internal/ibv"

var (
	// Context is a *verbs.Device's context, nil once it is closed.
	Context func(dev any) *ibv.Context
	// PD is a *verbs.PD's handle, nil once it is closed.
	PD func(pd any) *ibv.PD
	// InPD runs fn with a *verbs.PD's handle (nil once it is closed),
	// which the PD's Close waits for: for what is made on the PD in C.
	InPD func(pd any, fn func(*ibv.PD) error) error
	// CQ is a *verbs.CQ's handle, nil once it is closed.
	CQ func(cq any) *ibv.CQ
	// AH is a *verbs.AH's handle, nil once closed.
	AH func(ah any) *ibv.AH
	// Device wraps a context librdmacm owns as a *verbs.Device whose Close
	// leaves it open.
	Device func(c *ibv.Context) any
	// UseCQs counts a QP about to be made on two *verbs.CQs among their
	// users (a CQ with users refuses to close) and returns their handles,
	// nil for a closed one; use is for UnuseCQs or AdoptQP.
	UseCQs func(send, recv any) (use any, s, r *ibv.CQ)
	// UnuseCQs ends what UseCQs counted, for a QP that was not made.
	UnuseCQs func(use any)
	// AdoptQP wraps a QP librdmacm created on the *verbs.PD pd and the
	// CQs that UseCQs counted as a *verbs.QP of type qpType, whose Close
	// ends the count.
	AdoptQP func(pd any, qp *ibv.QP, qpType int, cqs any) any
	// QPAttr converts to a verbs.QPAttr.
	QPAttr func(a *ibv.QPAttr) any
	// AHAttr converts to a verbs.AHAttr.
	AHAttr func(a *ibv.AHAttr) any
	// QPCap converts a verbs.QPCap.
	QPCap func(c any) ibv.QPCap
)
