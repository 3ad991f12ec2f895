package verbs

import "fmt"

// EventType is an asynchronous event's type (enum ibv_event_type).
type EventType int

const (
	EventCQErr EventType = iota
	EventQPFatal
	EventQPReqErr
	EventQPAccessErr
	EventCommEst
	EventSQDrained
	EventPathMig
	EventPathMigErr
	EventDeviceFatal
	EventPortActive
	EventPortErr
	EventLIDChange
	EventPKeyChange
	EventSMChange
	EventSRQErr
	EventSRQLimitReached
	EventQPLastWQEReached
	EventClientReregister
	EventGIDChange
	EventWQFatal
)

var eventNames = [...]string{"CQ_ERR", "QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR", "COMM_EST", "SQ_DRAINED",
	"PATH_MIG", "PATH_MIG_ERR", "DEVICE_FATAL", "PORT_ACTIVE", "PORT_ERR", "LID_CHANGE", "PKEY_CHANGE",
	"SM_CHANGE", "SRQ_ERR", "SRQ_LIMIT_REACHED", "QP_LAST_WQE_REACHED", "CLIENT_REREGISTER", "GID_CHANGE",
	"WQ_FATAL"}

func (e EventType) String() string {
	if e >= 0 && int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("EventType(%d)", int(e))
}

// isPortEvent reports events whose element is a port number.
func (e EventType) isPortEvent() bool {
	switch e {
	case EventPortActive, EventPortErr, EventLIDChange, EventPKeyChange, EventSMChange,
		EventClientReregister, EventGIDChange:
		return true
	}
	return false
}

// isQPEvent reports events whose element is a QP.
func (e EventType) isQPEvent() bool {
	switch e {
	case EventQPFatal, EventQPReqErr, EventQPAccessErr, EventCommEst, EventSQDrained, EventPathMig,
		EventPathMigErr, EventQPLastWQEReached:
		return true
	}
	return false
}

// AsyncEvent is an asynchronous device event (struct ibv_async_event).
type AsyncEvent struct {
	Device string
	Type   EventType
	Port   int    // port events (PORT_ACTIVE, PORT_ERR, GID_CHANGE, …)
	QPN    uint32 // QP events (QP_FATAL, COMM_EST, …)
}

func (e AsyncEvent) String() string {
	switch {
	case e.Type.isPortEvent():
		return fmt.Sprintf("%s port %d: %v", e.Device, e.Port, e.Type)
	case e.Type.isQPEvent():
		return fmt.Sprintf("%s QP %#x: %v", e.Device, e.QPN, e.Type)
	}
	return fmt.Sprintf("%s: %v", e.Device, e.Type)
}
