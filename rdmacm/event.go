package rdmacm

import "fmt"

// EventType is an rdma_cm event (enum rdma_cm_event_type).
type EventType int

// The values are librdmacm's.
const (
	EventAddrResolved EventType = iota
	EventAddrError
	EventRouteResolved
	EventRouteError
	EventConnectRequest
	EventConnectResponse
	EventConnectError
	EventUnreachable
	EventRejected
	EventEstablished
	EventDisconnected
	EventDeviceRemoval
	EventMulticastJoin
	EventMulticastError
	EventAddrChange
	EventTimewaitExit
)

var eventNames = [...]string{
	"ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR", "CONNECT_REQUEST",
	"CONNECT_RESPONSE", "CONNECT_ERROR", "UNREACHABLE", "REJECTED", "ESTABLISHED", "DISCONNECTED",
	"DEVICE_REMOVAL", "MULTICAST_JOIN", "MULTICAST_ERROR", "ADDR_CHANGE", "TIMEWAIT_EXIT",
}

func (e EventType) String() string {
	if e == eventChannelFailed {
		return "event channel failed"
	}
	if e >= 0 && int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("EventType(%d)", int(e))
}

// ConnParam is what one side of a connection asks of or grants the other
// (struct rdma_conn_param without the private data).
type ConnParam struct {
	// ResponderResources is how many RDMA reads and atomics a side accepts
	// in flight as responder; InitiatorDepth how many it issues. In
	// Connect and Accept they are this side's; in a CONNECT_REQUEST and
	// in the reply's event the CM has turned the peer's around to this side's
	// view (its initiator depth is our responder resources), ready to be
	// capped and passed to Accept.
	ResponderResources uint8
	InitiatorDepth     uint8
	FlowControl        bool
	RetryCount         uint8
	RNRRetryCount      uint8
	SRQ                bool
	QPNum              uint32
}

// PortSpace is an rdma_cm port space (enum rdma_port_space).
type PortSpace int

// Port spaces. TCP carries reliable (RC) connections, UDP unreliable
// datagram (UD) endpoints.
const (
	PortSpaceTCP PortSpace = 0x0106
	PortSpaceUDP PortSpace = 0x0111
)

func (p PortSpace) String() string {
	switch p {
	case PortSpaceTCP:
		return "RDMA_PS_TCP"
	case PortSpaceUDP:
		return "RDMA_PS_UDP"
	}
	return fmt.Sprintf("PortSpace(%#x)", int(p))
}
