package rdmacm

import (
	"fmt"

	"github.com/rdmago/rdmago/verbs"
)

// Private data travels in the CM's messages, whose sizes the transport and
// the port space fix. A receiver can see more bytes than were sent
// (InfiniBand and RoCE pad the field to its full size with zeros), so
// rdmago carries the real length in a header of its own: magic, version,
// length, and the sender's active MTU (which the manual mode needs to agree
// on a path MTU).
const (
	headerMagic   = 0xd7
	headerVersion = 1
	headerLen     = 4
	// refusalVersion marks a reject that an rdmago listener sent by itself,
	// before any application saw the request: the header's third byte is
	// then the Refusal, and no data follows. A peer that does not know it
	// sees four bytes of private data.
	refusalVersion = 0x81
)

// Private data limits: bytes on the wire, of which rdmago's header takes 4
// unless ConnConfig.RawPrivateData. They depend on the message (connect,
// accept, reject), on the transport and on the port space, and rdmago
// checks them before anything is sent. The numbers are the Linux kernel's
// (6.1; they have not changed in years):
//
// InfiniBand and RoCE use the IB CM, whose messages have fixed fields
// (include/rdma/ib_cm.h, enum ib_cm_data_size: REQ 92, REP 196, REJ 148,
// SIDR REQ 216, SIDR REP 136; drivers/infiniband/core/cm.c refuses more with
// EINVAL). On PS_TCP and PS_UDP rdma_cm puts a 36-byte header of its own
// (struct cma_hdr, the addresses and ports) at the start of a REQ or SIDR
// REQ (drivers/infiniband/core/cma.c, cma_user_data_offset), which leaves 56
// and 180 bytes for the caller. Replies and rejects carry no such header. A
// reject on PS_UDP is a SIDR REP with status REJECT. A reject carries less
// than an accept: 148 bytes, not 196.
//
// iWARP carries private data in MPA frames. Its length is 8 bits in
// librdmacm (rdma_reject, struct rdma_conn_param), in the kernel's rdma_cm
// (struct rdma_ucm_conn_param, struct rdma_conn_param) and in the events
// iw_cm hands up (struct iw_cm_event), so at most 255 bytes. MPA version 2,
// which siw and the iWARP adapters speak, puts 4 bytes of IRD and ORD
// (struct mpa_v2_data) in front of them, and siw adds those 4 in an 8-bit
// length too (drivers/infiniband/sw/siw/siw_cm.c, siw_send_mpareqrep):
// with more than 251 bytes the frame announces a wrapped length, and the
// peer drops the connection.
const (
	MaxConnectDataTCP = 56  // InfiniBand and RoCE, PS_TCP: REQ (92 less rdma_cm's 36-byte header)
	MaxAcceptDataTCP  = 196 // InfiniBand and RoCE, PS_TCP: REP
	MaxRejectDataTCP  = 148 // InfiniBand and RoCE, PS_TCP: REJ
	MaxConnectDataUDP = 180 // InfiniBand and RoCE, PS_UDP: SIDR REQ (216 less rdma_cm's 36-byte header)
	MaxAcceptDataUDP  = 136 // InfiniBand and RoCE, PS_UDP: SIDR REP
	MaxRejectDataUDP  = 136 // InfiniBand and RoCE, PS_UDP: SIDR REP with status REJECT
	// MaxPrivateDataIWARP is an iWARP MPA request, reply or reject's:
	// 255 less MPA version 2's 4 bytes of IRD and ORD.
	MaxPrivateDataIWARP = 251
)

// messageKind names the CM message private data rides in.
type messageKind int

const (
	msgConnect messageKind = iota
	msgAccept
	msgReject
)

func (k messageKind) String() string {
	return [...]string{"connect", "accept", "reject"}[k]
}

// cmKind is the connection manager that carries a message: the IB CM
// (InfiniBand and RoCE) or MPA (iWARP). cmUnknown is a connect request's
// before address resolution has bound it to a device.
type cmKind int

const (
	cmUnknown cmKind = iota
	cmIB
	cmIWARP
)

func (c cmKind) String() string {
	switch c {
	case cmIB:
		return "InfiniBand/RoCE"
	case cmIWARP:
		return "iWARP"
	}
	return "any transport"
}

// cmKindOf is the CM of a device's transport. Anything but iWARP is taken
// for the IB CM, whose limits are the smaller.
func cmKindOf(t verbs.Transport) cmKind {
	if t == verbs.TransportIWARP {
		return cmIWARP
	}
	return cmIB
}

// ibMessage is the IB CM message of a kind in a port space: its private
// data field, and what of it is the caller's.
type ibMessage struct {
	name        string
	field, size int
}

var ibMessages = map[PortSpace][3]ibMessage{
	PortSpaceTCP: {
		msgConnect: {"REQ", 92, MaxConnectDataTCP},
		msgAccept:  {"REP", MaxAcceptDataTCP, MaxAcceptDataTCP},
		msgReject:  {"REJ", MaxRejectDataTCP, MaxRejectDataTCP},
	},
	PortSpaceUDP: {
		msgConnect: {"SIDR REQ", 216, MaxConnectDataUDP},
		msgAccept:  {"SIDR REP", MaxAcceptDataUDP, MaxAcceptDataUDP},
		msgReject:  {"SIDR REP (status REJECT)", MaxRejectDataUDP, MaxRejectDataUDP},
	},
}

var mpaMessages = [3]string{msgConnect: "MPA request", msgAccept: "MPA reply", msgReject: "MPA reject"}

// wireLimit is how many bytes of private data message k carries through cm
// in port space ps, and why, as an error says it. Before the device is
// known a connect request is held to the largest of any transport's; the
// real limit is checked once it is.
func wireLimit(cm cmKind, ps PortSpace, k messageKind) (int, string) {
	if ps != PortSpaceUDP {
		ps = PortSpaceTCP
	}
	ib := ibMessages[ps][k]
	switch {
	case cm == cmIWARP:
		return MaxPrivateDataIWARP, fmt.Sprintf("an %s carries %d (255, the kernel's 8-bit length, less MPA version 2's 4 bytes of IRD and ORD)",
			mpaMessages[k], MaxPrivateDataIWARP)
	case cm == cmUnknown && ps == PortSpaceTCP:
		// iWARP carries the most. (PS_UDP exists on InfiniBand and RoCE
		// alone.)
		return MaxPrivateDataIWARP, fmt.Sprintf("no transport carries more than iWARP's %d (InfiniBand and RoCE: %d), "+
			"and which one applies is known once the address is resolved", MaxPrivateDataIWARP, ib.size)
	case ib.field != ib.size:
		return ib.size, fmt.Sprintf("an IB CM %s carries %d, of which rdma_cm's address header takes %d", ib.name, ib.field, ib.field-ib.size)
	}
	return ib.size, fmt.Sprintf("an IB CM %s carries %d", ib.name, ib.size)
}

// privateDataLimit is how many bytes of the application's data fit in
// message k: the wire limit less our header unless raw.
func privateDataLimit(cm cmKind, ps PortSpace, k messageKind, raw bool) int {
	n, _ := wireLimit(cm, ps, k)
	if !raw {
		n -= headerLen
	}
	return n
}

// PrivateDataError is private data refused before anything was sent: it
// does not fit the CM message it would ride in. It matches
// ErrPrivateDataTooLong. An Accept or Reject it refuses leaves the request
// pending, to be accepted or rejected again.
type PrivateDataError struct {
	Message   string // "connect", "accept" or "reject"
	Transport string // "InfiniBand/RoCE", "iWARP", or "any transport" before the device is known
	PortSpace PortSpace
	Len       int // bytes the application gave
	Limit     int // bytes of the application's data that fit
	// Header is what rdmago's header takes of the message: 4 bytes, or 0
	// with ConnConfig.RawPrivateData.
	Header int
	why    string // the wire limit and where it comes from
}

func (e *PrivateDataError) Error() string {
	s := fmt.Sprintf("%v: %d bytes of %s private data, at most %d fit on %s (%v): %s",
		ErrPrivateDataTooLong, e.Len, e.Message, e.Limit, e.Transport, e.PortSpace, e.why)
	if e.Header > 0 {
		s += fmt.Sprintf(", less rdmago's %d-byte header (ConnConfig.RawPrivateData leaves it out)", e.Header)
	}
	return s
}

// Is makes errors.Is(err, ErrPrivateDataTooLong) true.
func (e *PrivateDataError) Is(target error) bool { return target == ErrPrivateDataTooLong }

// checkPrivateData refuses data that would not fit message k.
func checkPrivateData(cm cmKind, ps PortSpace, k messageKind, raw bool, data []byte) *PrivateDataError {
	if cm == cmUnknown && ps == PortSpaceUDP {
		cm = cmIB // PS_UDP exists on InfiniBand and RoCE alone
	}
	wire, why := wireLimit(cm, ps, k)
	e := &PrivateDataError{Message: k.String(), Transport: cm.String(), PortSpace: ps, Len: len(data), Limit: wire, why: why}
	if !raw {
		e.Header = headerLen
		e.Limit -= headerLen
	}
	if len(data) <= e.Limit {
		return nil
	}
	return e
}

// encodePrivateData frames data for a message; checkPrivateData has
// admitted it.
func encodePrivateData(raw bool, mtu verbs.MTU, data []byte) []byte {
	if raw {
		return data
	}
	out := make([]byte, headerLen+len(data))
	out[0], out[1], out[2], out[3] = headerMagic, headerVersion, byte(len(data)), byte(mtu)
	copy(out[headerLen:], data)
	return out
}

// decodePrivateData strips our header; framed says it found one. Data
// without a valid header (from a peer that does not use rdmago, e.g. a C
// program) is returned whole, with mtu 0. A header is valid when its length
// fits what arrived, its MTU is 0 or a valid one, and only the zeros of the
// IB CM's padding follow the data: a C peer's data that happens to start
// with the magic and version is then still taken whole, almost always.
func decodePrivateData(b []byte, raw bool) (data []byte, mtu verbs.MTU, framed bool) {
	if raw || len(b) < headerLen || b[0] != headerMagic || b[1] != headerVersion {
		return b, 0, false
	}
	n, m := int(b[2]), verbs.MTU(b[3])
	if n > len(b)-headerLen || (m != 0 && !m.Valid()) || !allZero(b[headerLen+n:]) {
		return b, 0, false
	}
	return b[headerLen : headerLen+n], m, true
}

// receivedData is what a receiver reports of private data b: decoded
// unless raw, and nothing at all for a field without a header that holds
// only zeros on InfiniBand or RoCE. The IB CM pads every message's field
// to its full size, so that is what arrives from a peer that sent nothing
// (C programs such as rping, ucmatose, udaddy and cmtime send none); a
// peer whose own format puts zeros there is talked to with
// ConnConfig.RawPrivateData, which reports the field as it arrived. On iWARP
// the length is exact and the data is taken as it is.
func receivedData(b []byte, raw, iwarp bool) (data []byte, mtu verbs.MTU) {
	data, mtu, framed := decodePrivateData(b, raw)
	if !framed && !raw && !iwarp && allZero(data) {
		return nil, 0
	}
	return data, mtu
}

// allZero reports whether b holds nothing but zeros (or nothing).
func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// rejectData is what a dialer reports of a reject's private data b: the
// peer application's data, exactly, and nothing that no one sent.
// InfiniBand and RoCE pad a reject's private data with zeros to the
// message's size (148 bytes in a REJ, 136 in a SIDR REP) whatever was
// sent, even when nothing was: when the CM rejected by itself (no
// listener, say), or when a listener rejected without data (a failed
// accept, a raw listener's refusal). An rdmago listener's own refusal is
// recognized, raw or not: it is never application data.
func rejectData(b []byte, rej *RejectedError, iwarp, raw bool) ([]byte, Refusal) {
	if why := decodeRefusal(b); why != RefusalNone {
		return nil, why
	}
	if !iwarp && !rej.ConsumerReject() && rej.Status != rejectVendorOption {
		// The IB CM rejected by itself: its REJ carries no private data.
		return nil, RefusalNone
	}
	data, _ := receivedData(b, raw, iwarp)
	return data, RefusalNone
}

// encodeRefusal is the private data of a reject the listener sends by itself.
func encodeRefusal(r Refusal) []byte {
	return []byte{headerMagic, refusalVersion, byte(r), 0}
}

// decodeRefusal recognizes encodeRefusal's data (padded with zeros, on
// InfiniBand and RoCE, to the message's full size).
func decodeRefusal(b []byte) Refusal {
	if len(b) < headerLen || b[0] != headerMagic || b[1] != refusalVersion || b[3] != 0 || !allZero(b[headerLen:]) {
		return RefusalNone
	}
	switch r := Refusal(b[2]); r {
	case RefusalBacklogFull, RefusalListenerClosed:
		return r
	}
	return RefusalNone
}
