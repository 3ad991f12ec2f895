// Package cma is rdmago's only door into librdmacm: the C calls and the
// rdma_cm_id and event channel handles live here, so that package rdmacm is
// pure Go and has the same API in every build. Built without cgo (or off
// Linux), creating a channel fails with ibv.ErrNoCgo.
package cma

import (
	"net/netip"

	"github.com/rdmago/rdmago/internal/ibv"
)

// Event is one CM event, copied out of librdmacm and acked.
type Event struct {
	Type, Status int
	// ID is a connect request's new id; nil for other events.
	ID *ID
	// Token is the context of the id the event belongs to: for a connect
	// request, the listener's.
	Token       uint64
	UD          bool
	PrivateData []byte
	Param       ConnParam
	QKey        uint32
	AH          ibv.AHAttr
}

// ConnParam is struct rdma_conn_param without the private data.
type ConnParam struct {
	ResponderResources, InitiatorDepth uint8
	FlowControl                        bool
	RetryCount, RNRRetryCount          uint8
	SRQ                                bool
	QPNum                              uint32
}

// Options of rdma_set_option at level RDMA_OPTION_ID.
const (
	OptTOS        = 0
	OptReuseAddr  = 1
	OptAFOnly     = 2
	OptACKTimeout = 3
)

// SockAddr is a socket address: an IPv6 address's zone travels as its
// scope id, which the caller resolves (netip keeps zones as names).
type SockAddr struct {
	AP    netip.AddrPort // without zone
	Scope uint32
}
