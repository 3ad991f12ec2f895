package rdmacm

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
)

// Kinds of failure. Every error from this package that has one wraps it, so
// errors.Is(err, rdmacm.ErrRejected) and the like tell what happened; the
// cause (a syscall.Errno, a context error, a *RejectedError) is wrapped too.
var (
	ErrAddrResolution  = errors.New("address resolution failed")
	ErrRouteResolution = errors.New("route resolution failed")
	ErrUnreachable     = errors.New("peer unreachable")
	ErrRejected        = errors.New("connection rejected")
	// ErrBacklogFull: an rdmago listener refused the request because its
	// backlog was full; a retry may succeed. It implies ErrRejected.
	ErrBacklogFull   = errors.New("listener backlog full")
	ErrConnect       = errors.New("connection failed")
	ErrDisconnected  = errors.New("disconnected")
	ErrDeviceRemoved = errors.New("RDMA device removed")
	ErrAddrChanged   = errors.New("local address changed")
	// ErrEnded: the connection had ended (its Done was closed) when the
	// call was made, or ended while the call waited. Conn.Err matches it
	// too, and the error of such a call wraps Err, so that it also
	// matches the reason: ErrDisconnected, ErrDeviceRemoved,
	// ErrAddrChanged or ErrClosed.
	ErrEnded = errors.New("connection ended")
	// ErrTimeout: a step got no answer within its timeout.
	ErrTimeout = errors.New("timed out")
	// ErrPrivateDataTooLong: private data that does not fit its CM message
	// (see PrivateDataError), refused before anything was sent.
	ErrPrivateDataTooLong = errors.New("private data too long")
	// ErrSharedCQ: a Conn helper that waits for its own completions was
	// called on a connection whose CQ is ConnConfig.SendCQ or RecvCQ.
	ErrSharedCQ = errors.New("the connection's CQ is shared")
	// ErrClosed: the Conn or Listener was closed. It also matches
	// net.ErrClosed, as package net's errors do.
	ErrClosed error = &alsoNetClosed{errors.New("use of closed RDMA connection or listener")}
	// ErrNoResources: this host could not make a connection's CQ, QP or
	// PD (out of memory, descriptors, locked memory or the provider's
	// queue mappings): every connection fails alike until some are closed
	// or a limit is raised. The errno is wrapped too.
	ErrNoResources = errors.New("out of local resources")
	// ErrEventChannel: the process's rdma_cm event channel failed, so no
	// CM event can arrive; ids made afterwards use a new channel.
	ErrEventChannel = errors.New("rdma_cm event channel failed")
	// ErrNoCgo: the binary was built without cgo, so librdmacm is unavailable.
	ErrNoCgo = errors.New("rdmacm: built without cgo; librdmacm needs cgo")
)

// alsoNetClosed is ErrClosed: matched by errors.Is(err, net.ErrClosed),
// which is how code written for package net's connections tells a
// close from a failure.
type alsoNetClosed struct{ error }

func (e *alsoNetClosed) Is(target error) bool { return target == net.ErrClosed }

// OpError describes a failed step of a connection: which step, between which
// addresses, on which device, the CM event and status that ended it, and
// what usually causes that.
type OpError struct {
	Op     string // "resolve address", "resolve route", "connect", "accept", "listen", ...
	Local  netip.AddrPort
	Remote netip.AddrPort
	Device string // RDMA device, once known
	Port   int
	QPN    uint32
	Event  string // the CM event that ended the step, if one did
	Status int    // its status: a negative errno, or an IB CM reason
	Kind   error  // one of the Err* kinds above, or nil
	Err    error  // the cause
	Hint   string

	thin bool // from an ID method: a convenient-layer step that wraps it says where itself
}

// cause is err without the ID method's OpError around it, for a step of
// the convenient layer that says where and what itself: its message then
// names the connection once.
func cause(err error) error {
	if oe, ok := err.(*OpError); ok && oe.thin {
		return oe.Err
	}
	return err
}

func (e *OpError) Error() string {
	var b strings.Builder
	b.WriteString("rdmacm: ")
	b.WriteString(e.Op)
	b.WriteString(e.where())
	b.WriteString(": ")
	var hints []string
	e.writeBody(&b, &hints)
	for _, h := range hints {
		b.WriteString("; ")
		b.WriteString(h)
	}
	return b.String()
}

// where is the connection the error belongs to: " A -> B (device, port, QP)".
func (e *OpError) where() string {
	var b strings.Builder
	if e.Local.IsValid() && (!e.Local.Addr().IsUnspecified() || e.Local.Port() != 0) {
		fmt.Fprintf(&b, " %v", e.Local)
	}
	if e.Remote.IsValid() {
		fmt.Fprintf(&b, " -> %v", e.Remote)
	}
	var where []string
	if e.Device != "" {
		where = append(where, "device "+e.Device)
	}
	if e.Port != 0 {
		where = append(where, fmt.Sprintf("port %d", e.Port))
	}
	if e.QPN != 0 {
		where = append(where, fmt.Sprintf("QP %#x", e.QPN))
	}
	if len(where) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(where, ", "))
	}
	return b.String()
}

// writeBody writes what went wrong, without the prefix and the place, and
// collects the hints, which go last. An OpError of the same connection in
// Kind or Err (a call failing because the connection had ended, say) is
// written the same way: the place is said once.
func (e *OpError) writeBody(b *strings.Builder, hints *[]string) {
	sep := ""
	for _, err := range []error{e.Kind, e.Err} {
		if err == nil {
			continue
		}
		b.WriteString(sep)
		sep = ": "
		if in, ok := err.(*OpError); ok && in.where() == e.where() {
			if in.Op != e.Op && in.Op != opConnection {
				b.WriteString(in.Op)
				b.WriteString(": ")
			}
			in.writeBody(b, hints)
			continue
		}
		b.WriteString(err.Error())
	}
	if e.Event != "" {
		fmt.Fprintf(b, " [event %s, status %d]", e.Event, e.Status)
	}
	if e.Hint != "" {
		*hints = append(*hints, e.Hint)
	}
}

// opConnection is the Op of a Conn's Err: the connection as a whole.
const opConnection = "connection"

func (e *OpError) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// Timeout reports whether the step timed out (as net.Error does).
func (e *OpError) Timeout() bool {
	return errors.Is(e, ErrTimeout) || errors.Is(e, syscall.ETIMEDOUT)
}

// RejectedError is the peer's (or its kernel's) refusal of a connection.
type RejectedError struct {
	// Status is the CM's reason: on InfiniBand and RoCE an IB CM reject
	// reason (8: no listener on that port; 28: the application rejected),
	// on iWARP a negative errno (-111: nobody listens, the TCP connection
	// was refused; -104: the peer rejected the MPA request), on PS_UDP
	// (UD) a SIDR REP status (2: the peer rejected).
	Status int
	// PrivateData is what the peer application passed to Reject, without
	// rdmago's header: exactly what it sent, and empty when the CM or the
	// listener rejected by itself. From a peer that frames no header (a C
	// program, or with ConnConfig.RawPrivateData) it arrives as the transport
	// delivers it: on InfiniBand and RoCE padded with zeros to the
	// message's size.
	PrivateData []byte
	// Refusal is set when an rdmago listener refused the request by itself,
	// before its application saw it.
	Refusal Refusal

	ud bool // a PS_UDP (SIDR) reject, whose statuses are not the REJ's
}

// Refusal is why an rdmago listener refused a connect request without its
// application's say.
type Refusal uint8

const (
	// RefusalNone: the application rejected, or no rdmago listener said why.
	RefusalNone Refusal = iota
	// RefusalBacklogFull: ListenConfig.Backlog requests were already waiting for
	// Request or Accept. A later attempt may succeed.
	RefusalBacklogFull
	// RefusalListenerClosed: the listener closed with the request waiting.
	RefusalListenerClosed
)

func (r Refusal) String() string {
	switch r {
	case RefusalNone:
		return "none"
	case RefusalBacklogFull:
		return "the listener's backlog was full"
	case RefusalListenerClosed:
		return "the listener closed before taking the request"
	}
	return fmt.Sprintf("Refusal(%d)", uint8(r))
}

// hint is what a dialer can do about the refusal.
func (r Refusal) hint() string {
	switch r {
	case RefusalBacklogFull:
		return "the server takes requests (Request, Accept) slower than they arrive: retry later, " +
			"or have it take them faster or raise its ListenConfig.Backlog"
	case RefusalListenerClosed:
		return "the server stopped listening: is it shutting down?"
	}
	return ""
}

func (e *RejectedError) Error() string {
	s := fmt.Sprintf("rejected with status %d", e.Status)
	if e.Refusal != RefusalNone {
		return s + " (" + e.Refusal.String() + ")"
	}
	if m := e.meaning(); m != "" {
		s += " (" + m + ")"
	}
	// Zeros alone are the padding of a reject without data, as a raw
	// dialer sees it on InfiniBand and RoCE: nothing anyone sent.
	if !allZero(e.PrivateData) {
		s += fmt.Sprintf(", %d bytes of private data", len(e.PrivateData))
	}
	return s
}

// meaning says what Status means.
func (e *RejectedError) meaning() string {
	if e.ud {
		return sidrMeaning(e.Status)
	}
	if e.Status == rejectConsumer && e.Refusal == RefusalNone && allZero(e.PrivateData) {
		// The peer's CM sends this reason with no data when its rdma_cm
		// finds no listener for a request, or when an id in the middle of
		// the handshake is destroyed, as its application does on reject.
		return "the peer application rejected the request, or the peer's CM did without data: no listener " +
			"for that address (one on the port bound to another), or the peer's id destroyed mid-handshake"
	}
	return rejectMeaning(e.Status)
}

// Is makes errors.Is(err, ErrRejected) true, and errors.Is(err,
// ErrBacklogFull) for that refusal.
func (e *RejectedError) Is(target error) bool {
	return target == ErrRejected || target == ErrBacklogFull && e.Refusal == RefusalBacklogFull
}

// ConsumerReject reports whether the peer application (or its CM) refused
// the request, as opposed to no one listening.
func (e *RejectedError) ConsumerReject() bool {
	if e.ud {
		return e.Status == sidrReject
	}
	return e.Status == rejectConsumer || e.Status == rejectIWARPMPA
}

const (
	rejectNoListener   = 8  // IB_CM_REJ_INVALID_SERVICE_ID
	rejectStale        = 10 // IB_CM_REJ_STALE_CONN
	rejectConsumer     = 28 // IB_CM_REJ_CONSUMER_DEFINED
	rejectVendorOption = 35 // IB_CM_REJ_VENDOR_OPTION_NOT_SUPPORTED: rdma_reject_ece, with the application's data
	// The SIDR REP statuses of a PS_UDP request that the peer answered
	// without a QP (enum ib_cm_sidr_status), which reach the dialer as
	// UNREACHABLE with that status: positive, where a timeout is negative.
	sidrNoListener = 1 // IB_SIDR_UNSUPPORTED: no listener for the service ID
	sidrReject     = 2 // IB_SIDR_REJECT: rdma_reject
	sidrNoQP       = 3
	sidrRedirect   = 4
	sidrBadVersion = 5
	rejectIWARP    = -int(syscall.ECONNREFUSED)
	rejectIWARPMPA = -int(syscall.ECONNRESET)
)

// sidrMeaning says what a positive UD UNREACHABLE status (a SIDR REP's) means.
func sidrMeaning(status int) string {
	switch status {
	case sidrNoListener:
		return "UD: no listener on that address and port at the peer (SIDR status 1, service ID unsupported)"
	case sidrReject:
		// The peer's CM sends it too when its rdma_cm finds no listener
		// for the address (cm_destroy_id in SIDR_REQ_RCVD).
		return "UD: the peer rejected the service ID request, or its rdma_cm found no listener for that " +
			"address (one on the port bound to another)"
	case sidrNoQP:
		return "UD: the peer's listener has no QP for the request (SIDR status 3)"
	case sidrRedirect:
		return "UD: the peer redirected the request (SIDR status 4), which rdma_cm does not follow"
	case sidrBadVersion:
		return "UD: the peer does not support the request's SIDR version (status 5)"
	}
	if status > 0 {
		return fmt.Sprintf("UD: the peer answered with SIDR status %d", status)
	}
	return ""
}

func rejectMeaning(status int) string {
	switch status {
	case rejectNoListener:
		return "no listener on that address and port"
	case rejectStale:
		return "stale connection: the peer still holds an old connection with this QP number"
	case rejectConsumer:
		return "the peer application rejected the request"
	case rejectIWARP:
		return "iWARP: the TCP connection was refused, usually no listener on that address and port " +
			"(some devices, cxgb4 among them, report the peer's MPA reject this way too)"
	case rejectIWARPMPA:
		return "iWARP: the peer rejected the MPA request (the application rejected, or its CM refused)"
	}
	return ""
}

// hintFor says what usually causes a failing event, from the field notes
// the library is built on. iwarpDialer says the event came to the dialing
// side of an iWARP connection, whose CONNECT_ERROR has a cause of its own.
func hintFor(ev EventType, status int, iwarpDialer bool) string {
	switch ev {
	case EventAddrError:
		switch status {
		case -int(syscall.ENODEV):
			return "the source address is not on an RDMA netdev, or the route to the destination leaves by a netdev without an RDMA device"
		case -int(syscall.ETIMEDOUT):
			return "neighbour (ARP/ND) resolution of the destination timed out: is the peer up and on-link?"
		case -int(syscall.ENETUNREACH), -int(syscall.EHOSTUNREACH):
			return "no route to the destination"
		}
		return "the destination could not be mapped to a local RDMA device"
	case EventRouteError:
		return "the CM found no path to the destination; it is retried a few times before giving up"
	case EventUnreachable:
		if m := sidrMeaning(status); m != "" {
			return m
		}
		return "the CM's messages timed out: the peer is gone, unreachable, or never completed the handshake"
	case EventConnectError:
		if iwarpDialer {
			return iwarpConnectErrorHint
		}
		return "librdmacm could not move the QP on the peer's reply, or the transport failed"
	case EventRejected:
		return rejectMeaning(status)
	case EventMulticastError:
		return "the group membership failed or was lost (on InfiniBand: the SA refused it, or an SM reregister or port error ended it): join again"
	}
	return ""
}

// iwarpConnectErrorHint explains a dialer's CONNECT_ERROR on iWARP: siw
// reports every failure to take the peer's MPA reply as status -22, and the
// one an application causes is a peer that sent before the dialer did.
const iwarpConnectErrorHint = "iWARP: the peer's MPA reply could not be taken; most often the accepting side sent a " +
	"message before this side's first one (on iWARP the dialing side must send first), else the IRD/ORD did not fit"

// deterministic ADDR_ERROR and ROUTE_ERROR statuses, which a retry cannot change.
func retryable(status int) bool {
	switch -status {
	case int(syscall.ENODEV), int(syscall.ENETUNREACH), int(syscall.EHOSTUNREACH), int(syscall.EADDRNOTAVAIL), int(syscall.EINVAL):
		return false
	}
	return true
}
