//go:build integration

package rdmacm

// DeliverEvent hands the connection an event of type t as the dispatcher
// would, for the events the test bed cannot have the kernel send (an
// address change, a multicast error).
func DeliverEvent(c interface{ Close() error }, t EventType) {
	switch c := c.(type) {
	case *UDConn:
		c.onEvent(&Event{Type: t})
	case *MulticastConn:
		c.onEvent(&Event{Type: t})
	case *Conn:
		c.onEvent(&Event{Type: t})
	}
}
