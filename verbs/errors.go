package verbs

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
)

// OpError is the error of a verbs call: which operation failed, where, the
// errno the driver returned and, where the cause is known, what to change.
type OpError struct {
	Op     string // e.g. "ibv_open_device", "modify QP"
	Device string // device name, if known
	Port   int    // port number, 0 if not applicable
	QPN    uint32 // QP number, 0 if not applicable
	// Detail describes the call further (e.g. "INIT→RTR").
	Detail string
	Err    error // usually a syscall.Errno
	// Hint says what usually causes this error here and what to do.
	Hint string
}

func (e *OpError) Error() string {
	var b strings.Builder
	b.WriteString("verbs: ")
	b.WriteString(e.Op)
	if e.Detail != "" {
		b.WriteString(" ")
		b.WriteString(e.Detail)
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
		b.WriteString(" (" + strings.Join(where, ", ") + ")")
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
		var errno syscall.Errno
		if errors.As(e.Err, &errno) {
			fmt.Fprintf(&b, " (errno %d)", int(errno))
		}
	}
	if e.Hint != "" {
		b.WriteString(": ")
		b.WriteString(e.Hint)
	}
	return b.String()
}

func (e *OpError) Unwrap() error { return e.Err }

// ErrNoCgo is returned by every call that needs libibverbs in a binary built
// without cgo. The pure-Go parts of the package (attribute models, transition
// validation, encoders) work without it.
var ErrNoCgo = errors.New("verbs: built without cgo: libibverbs is not available (build with CGO_ENABLED=1 and libibverbs-dev)")

// PostError is a batch the provider took only in part: the first Posted
// work requests were posted and will complete (or be flushed), the rest
// were not. A caller that posts again must start at Posted, or the
// requests before it go out twice. Err is the provider's errno.
type PostError struct {
	Posted int
	Err    error
}

func (e *PostError) Error() string {
	return fmt.Sprintf("%v (the %d work requests before it were posted)", e.Err, e.Posted)
}

func (e *PostError) Unwrap() error { return e.Err }
