package verbs

import "syscall"

// ErrNoInitiatorDepth is why [QP.PostSend] refuses an RDMA READ or atomic on
// a QP that reports an initiator depth of 0 (see initDepthProblem). It
// matches syscall.EINVAL too.
var ErrNoInitiatorDepth error = noInitiatorDepth{}

type noInitiatorDepth struct{}

func (noInitiatorDepth) Error() string {
	return "the QP's initiator depth is 0: it may have no RDMA READ or atomic outstanding"
}

func (noInitiatorDepth) Is(target error) bool { return target == syscall.EINVAL }

// readsOrAtomic says whether the request takes one of the QP's initiator
// resources: an RDMA READ or an atomic.
func (o Opcode) readsOrAtomic() bool {
	return o == OpRDMARead || o == OpAtomicCmpAndSwp || o == OpAtomicFetchAdd
}

// siwVendorID is the vendor ID the kernel's siw reports (SIW_VENDOR_ID);
// erdmaVendorID erdma's (PCI_VENDOR_ID_ALIBABA), whose query reports the
// read queues the other way round, as siw's does.
const (
	siwVendorID   = 0x626d74
	erdmaVendorID = 0x1ded
)

// depthUnchecked marks a QP whose depth is not checked (initDepth).
const depthUnchecked = 1 << 30

// initDepthProblem says why an RDMA READ or atomic cannot leave this QP, or
// returns "". A QP whose initiator depth (max_rd_atomic; on iWARP the ORD)
// is 0 does not send one: rxe and siw keep the request at the head of the
// send queue, waiting for a slot that never frees, and every request posted
// after it waits behind it, with neither an error nor a completion. The
// depth is what the QP was given at RTR→RTS (AttrMaxQPRdAtomic) or what the
// CM negotiated, as the device reports it in RTS: mlx5, whose smallest
// depth is 1, reports 1 for a 0 it was given. It is read at the first such
// request after a Modify, and kept. Of the iWARP devices only siw is
// checked: cxgb4 and irdma leave the depth out of their query, and siw
// reports it in the other field; erdma, which reports it there too, is
// not checked on either transport. The caller holds q.mu.
func (q *QP) initDepthProblem(iwarp bool) string {
	if q.Type != QPTypeRC {
		return ""
	}
	if q.initDepth < 0 {
		da, err := q.pd.dev.Query()
		switch {
		case err != nil:
			return "" // the provider decides
		case iwarp && da.VendorID == siwVendorID:
			return q.siwORDProblem()
		case iwarp || da.VendorID == erdmaVendorID:
			q.initDepth = depthUnchecked
			return ""
		}
		a, err := q.qp.Query(uint32(AttrState | AttrMaxQPRdAtomic))
		if err != nil || QPState(a.State) != QPStateRTS {
			// Before RTS (or in SQD, where it may still change) the
			// depth is not settled; the provider decides.
			return ""
		}
		q.initDepth = int(a.MaxRdAtomic)
	}
	if q.initDepth > 0 {
		return ""
	}
	return "the device does not send such a request (rxe keeps it at the head of the send queue for ever, and every " +
		"request after it): give the QP a MaxRdAtomic of at least 1 at RTR→RTS (AttrMaxQPRdAtomic); on a connection " +
		"made by rdmacm, neither this side's ConnConfig.InitiatorDepth nor the peer's ResponderResources may be negative"
}

// siwORDProblem is initDepthProblem on iWARP. siw_query_qp reports its read
// queues the other way round (the inbound, IRD, as max_rd_atomic; the
// outbound, ORD, as max_dest_rd_atomic) and leaves the state out, and siw
// sets the ORD when the QP goes to RTS: a nonzero ORD is kept, a zero one
// (the connection's, or that of a QP not connected yet) asked for again.
func (q *QP) siwORDProblem() string {
	a, err := q.qp.Query(uint32(AttrState | AttrMaxDestRdAtomic))
	if err != nil {
		return ""
	}
	if a.MaxDestRdAtomic > 0 {
		q.initDepth = int(a.MaxDestRdAtomic)
		return ""
	}
	return "siw keeps such a READ at the head of the send queue for ever, and every request after it: the " +
		"connection was made without READs (with rdmacm: this side's ConnConfig.InitiatorDepth is negative), or " +
		"it is not established yet"
}
