// Package cmbridge lets package oob hand package rdmacm an RC QP that it
// connected without the CM, so that the connection gets rdmacm.Conn's
// data path, end and release without rdmacm exporting its constructor.
// Package rdmacm sets AdoptRC when it is initialised; oob imports rdmacm,
// so it is set before oob runs.
package cmbridge

import (
	"bufio"
	"net"
	"net/netip"

	"github.com/rdmago/rdmago/verbs"
)

// RC is a connected RC QP and what it was made with.
type RC struct {
	Dev      *verbs.Device
	PD       *verbs.PD
	SendCQ   *verbs.CQ
	RecvCQ   *verbs.CQ
	QP       *verbs.QP
	Cap      verbs.QPCap
	SharedPD bool // PD (and Dev) are the caller's
	// SharedSendCQ, SharedRecvCQ: the CQs are the caller's, and the
	// helpers that wait on them refuse to.
	SharedSendCQ, SharedRecvCQ bool

	Local, Remote netip.AddrPort
	Port          int
	Kind          verbs.Kind
	GIDIndex      int
	GIDType       verbs.GIDType

	// TCP is the socket the QP data crossed, kept as the connection's
	// liveness signal; Reader reads it past the exchange.
	TCP    net.Conn
	Reader *bufio.Reader
}

// AdoptRC makes a *rdmacm.Conn of rc, which from then on owns its objects
// and the socket.
var AdoptRC func(rc RC) any
