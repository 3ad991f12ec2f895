package verbs

// readsOrAtomic says whether the request takes one of the QP's initiator
// resources: an RDMA READ or an atomic.
func (o Opcode) readsOrAtomic() bool {
	return o == OpRDMARead || o == OpAtomicCmpAndSwp || o == OpAtomicFetchAdd
}

// siwVendorID is the vendor ID the kernel's siw reports (SIW_VENDOR_ID).
const siwVendorID = 0x626d74

// initDepthProblem says why an RDMA READ or atomic cannot leave this QP, or
// returns "". A QP whose initiator depth (max_rd_atomic; on iWARP the ORD)
// is 0 never sends one: rxe and siw keep the request at the head of the
// send queue, waiting for a slot that never frees, and every request posted
// after it waits behind it, with neither an error nor a completion. The
// depth is what the QP was given at RTR→RTS (AttrMaxQPRdAtomic) or what the
// CM negotiated (with rdmacm: this side's InitiatorDepth against the peer's
// ResponderResources), as the device reports it: mlx5, whose smallest depth
// is 1, reports 1 for a 0 it was given. It is read at the first such
// request after a Modify, and kept. The caller holds q.mu.
func (q *QP) initDepthProblem(iwarp bool) string {
	if q.Type != QPTypeRC {
		return ""
	}
	if q.initDepth < 0 {
		a, err := q.qp.Query(uint32(AttrState | AttrMaxQPRdAtomic | AttrMaxDestRdAtomic))
		if err != nil {
			return "" // the provider decides
		}
		depth := int(a.MaxRdAtomic)
		if iwarp {
			if da, err := q.pd.dev.Query(); err == nil && da.VendorID == siwVendorID {
				// siw_query_qp reports its read queues the other way
				// round: the inbound (IRD) as max_rd_atomic, the
				// outbound (ORD) as max_dest_rd_atomic.
				depth = int(a.MaxDestRdAtomic)
			}
		}
		switch state := QPState(a.State); {
		case state == QPStateRTS || state == QPStateSQD:
		case iwarp && depth > 0:
			// siw leaves the state out of its query (it reads as
			// RESET), and sets the ORD only when the QP goes to RTS.
		case iwarp:
			// Not kept: the next request asks again.
			return "the QP's ORD (iWARP's initiator depth: the RDMA READs it may have outstanding) is 0: either " +
				"the connection was made without READs (with rdmacm: this side's ConnConfig.InitiatorDepth or " +
				"the peer's ResponderResources is negative) or it is not established yet. siw would keep the " +
				"READ at the head of the send queue for ever, and every request after it"
		default:
			return "" // before RTS the depth is not set yet; the provider refuses the post
		}
		q.initDepth = depth
	}
	switch {
	case q.initDepth > 0:
		return ""
	case iwarp:
		return "the QP's ORD (iWARP's initiator depth: the RDMA READs it may have outstanding) is 0: the " +
			"connection was made without READs (with rdmacm: this side's ConnConfig.InitiatorDepth or the peer's " +
			"ResponderResources is negative), so the device never sends this request"
	}
	return "the QP's initiator depth (max_rd_atomic: the RDMA READs and atomics it may have outstanding) is 0, " +
		"so the device never sends this request: rxe and siw keep it at the head of the send queue for ever, " +
		"and every request after it. Give the QP a MaxRdAtomic of at least 1 at RTR→RTS (AttrMaxQPRdAtomic); " +
		"with rdmacm, neither this side's ConnConfig.InitiatorDepth nor the peer's ResponderResources may be negative"
}
