// Package cmbridge lets package oob hand package rdmacm an RC QP that it
// connected without the CM, so that the connection gets rdmacm.Conn's
// data path, end and release without rdmacm exporting its constructor;
// and package msg end its waits with an rdmacm.Conn. Package rdmacm sets
// the functions when it is initialised; oob and msg import rdmacm, so they
// are set before those run.
package cmbridge

import (
	"bufio"
	"context"
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
	// liveness signal.
	TCP net.Conn
}

// AdoptRC makes a *rdmacm.Conn of rc, which from then on owns its objects
// and the socket. It does not watch the socket yet: StartRC starts that,
// once the exchange on it is over, or AbortRC releases the objects and
// leaves the socket to the caller.
var AdoptRC func(rc RC) any

// StartRC watches the socket of an adopted connection (conn, a
// *rdmacm.Conn), read through r from now on: its close is the
// connection's end.
var StartRC func(conn any, r *bufio.Reader)

// AbortRC closes an adopted connection that StartRC never started,
// releasing its objects and the memory it registered, but not its socket.
var AbortRC func(conn any)

// SetupOf is an adopted connection's rdmacm.Setup, for a BeforeConnect.
var SetupOf func(conn any) any

// EndContext returns a context that the end of conn (a *rdmacm.Conn)
// cancels: when its Done is closed, with its Err set. A wait that merges
// it ends with the connection without a goroutine of its own.
var EndContext func(conn any) context.Context
