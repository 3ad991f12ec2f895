package rdmacm

import (
	"fmt"

	"github.com/rdmago/rdmago/verbs"
)

// Private data travels in the CM's messages, whose sizes the port space
// fixes. A receiver can see more bytes than were sent (InfiniBand and RoCE
// pad the field to its full size), so rdmago carries the real length in a
// header of its own: magic, version, length, and the sender's active MTU
// (which the manual mode needs to agree on a path MTU).
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

// Private data limits of the CM messages (bytes on the wire, before our header).
const (
	MaxConnectDataTCP = 56  // REQ on PS_TCP
	MaxAcceptDataTCP  = 196 // REP and REJ on PS_TCP
	MaxConnectDataUDP = 180 // SIDR REQ on PS_UDP
	MaxAcceptDataUDP  = 136 // SIDR REP on PS_UDP
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

// privateDataLimit is how many bytes of user data fit in a message: the
// wire limit minus our header unless raw.
func privateDataLimit(ps PortSpace, k messageKind, raw bool) int {
	n := MaxAcceptDataTCP
	switch {
	case ps == PortSpaceUDP && k == msgConnect:
		n = MaxConnectDataUDP
	case ps == PortSpaceUDP:
		n = MaxAcceptDataUDP
	case k == msgConnect:
		n = MaxConnectDataTCP
	}
	if !raw {
		n -= headerLen
	}
	return n
}

// encodePrivateData frames data for a message, refusing what would not fit.
func encodePrivateData(ps PortSpace, k messageKind, raw bool, mtu verbs.MTU, data []byte) ([]byte, error) {
	if limit := privateDataLimit(ps, k, raw); len(data) > limit {
		how := ""
		if !raw {
			how = fmt.Sprintf(" (the %v limit less rdmago's %d-byte header)", ps, headerLen)
		}
		return nil, fmt.Errorf("%w: %d bytes of %s private data, at most %d fit%s",
			ErrPrivateDataTooLong, len(data), k, limit, how)
	}
	if raw {
		return data, nil
	}
	out := make([]byte, headerLen+len(data))
	out[0], out[1], out[2], out[3] = headerMagic, headerVersion, byte(len(data)), byte(mtu)
	copy(out[headerLen:], data)
	return out, nil
}

// decodePrivateData strips our header. Data without a valid header (from a
// peer that does not use rdmago, e.g. a C program) is returned whole, with
// mtu 0.
func decodePrivateData(b []byte, raw bool) (data []byte, mtu verbs.MTU) {
	if raw || len(b) < headerLen || b[0] != headerMagic || b[1] != headerVersion || int(b[2]) > len(b)-headerLen {
		return b, 0
	}
	m := verbs.MTU(b[3])
	if !m.Valid() {
		m = 0
	}
	return b[headerLen : headerLen+int(b[2])], m
}

// encodeRefusal is the private data of a reject the listener sends by itself.
func encodeRefusal(r Refusal) []byte {
	return []byte{headerMagic, refusalVersion, byte(r), 0}
}

// decodeRefusal recognizes encodeRefusal's data (padded, on InfiniBand and
// RoCE, to the message's full size).
func decodeRefusal(b []byte) Refusal {
	if len(b) < headerLen || b[0] != headerMagic || b[1] != refusalVersion {
		return RefusalNone
	}
	switch r := Refusal(b[2]); r {
	case RefusalBacklogFull, RefusalListenerClosed:
		return r
	}
	return RefusalNone
}
