package msg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
)

// Kinds of failure. Errors from this package wrap one of them (or
// rdmacm.ErrEnded, when the connection underneath ended), so that
// errors.Is tells what happened.
var (
	// ErrClosed: the Conn or Listener was closed by this side. It also
	// matches net.ErrClosed, as package net's errors do; a connection
	// that the peer ended matches rdmacm.ErrEnded instead.
	ErrClosed error = &kindError{net.ErrClosed, errors.New("use of closed message connection")}
	// ErrProtocol: the peer broke the message protocol (garbage, a frame
	// larger than agreed, a frame without credit, another version); the
	// connection was ended. The error says what the peer sent.
	ErrProtocol = errors.New("peer broke the message protocol")
	// ErrHandshake: the hello in the connect request or the accept was
	// missing or unacceptable.
	ErrHandshake = errors.New("message protocol handshake failed")
	// ErrTooLarge: a message larger than the connection's MaxMessageSize.
	ErrTooLarge = errors.New("message too large")
	// ErrSendClosed: Send after CloseSend.
	ErrSendClosed = errors.New("sending side closed (CloseSend)")
	// ErrTransport: a work request failed on the device (the peer is
	// gone, or the path broke); the connection was ended.
	ErrTransport = errors.New("RDMA transfer failed")
	// ErrPeerUnresponsive: the peer's device stopped answering the
	// keepalive probes (Config.KeepAlive): its host is gone or the path to
	// it broke. The connection was ended.
	ErrPeerUnresponsive = errors.New("peer stopped answering")
)

// OpError is the error of a call on a message connection: what was being
// done, between which addresses, and why it failed.
type OpError struct {
	Op            string // "dial", "accept", "send", "receive", "close", ...
	Local, Remote netip.AddrPort
	Err           error
}

func (e *OpError) Error() string {
	s := "msg: " + e.Op
	switch {
	case e.Local.IsValid() && e.Remote.IsValid():
		s += fmt.Sprintf(" %v -> %v", e.Local, e.Remote)
	case e.Remote.IsValid():
		s += fmt.Sprintf(" to %v", e.Remote)
	case e.Local.IsValid():
		s += fmt.Sprintf(" on %v", e.Local)
	}
	return s + ": " + e.Err.Error()
}

func (e *OpError) Unwrap() error { return e.Err }

// Timeout reports whether the call failed because its context's deadline
// passed, as a net.Error says.
func (e *OpError) Timeout() bool {
	return errors.Is(e.Err, context.DeadlineExceeded) || errors.Is(e.Err, os.ErrDeadlineExceeded)
}

// ProtocolError says how the peer broke the protocol. It matches
// ErrProtocol.
type ProtocolError struct {
	// What the peer sent, e.g. "a DATA frame without credit: ...".
	What string
}

func (e *ProtocolError) Error() string { return "the peer sent " + e.What + ": connection ended" }

// Is makes errors.Is(err, ErrProtocol) true.
func (e *ProtocolError) Is(target error) bool { return target == ErrProtocol }

// kindError is a cause with its kind, both matched by errors.Is.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }
