package stream

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/rdmacm/msg"
)

// Accept passes over one dialer's failure, but returns running out of a
// local resource, which would fail every dialer, as a temporary error (a
// server loop backs off and tries again).
func TestAcceptReturnsOnlyLocalExhaustion(t *testing.T) {
	from := netip.MustParseAddrPort("10.0.0.2:40000")
	for _, err := range []error{
		&msg.OpError{Op: "accept", Remote: from, Err: msg.ErrHandshake},
		&msg.OpError{Op: "accept", Remote: from, Err: &rdmacm.OpError{Op: "accept", Kind: rdmacm.ErrTimeout}},
		&msg.OpError{Op: "accept", Remote: from, Err: &rdmacm.OpError{Op: "accept", Err: syscall.EINVAL}},
	} {
		assert.False(t, outOfResources(err), "%v", err)
	}
	for _, err := range []error{
		&msg.OpError{Op: "accept", Remote: from, Err: fmt.Errorf("register 37 receive buffers: %w", syscall.ENOMEM)},
		&msg.OpError{Op: "accept", Remote: from, Err: syscall.EMFILE},
		// siw's queue mappings used up: an EIO, which rdmacm marks.
		&msg.OpError{Op: "accept", Remote: from, Err: &rdmacm.OpError{Op: "create CQ", Kind: rdmacm.ErrNoResources, Err: syscall.EIO}},
	} {
		assert.True(t, outOfResources(err), "%v", err)
	}
	// http.Serve asks the error for Temporary() (deprecated in net.Error,
	// still what it checks) and backs off.
	var ne error = &net.OpError{Op: "accept", Net: Network, Err: temporary{syscall.ENOMEM}}
	tmp, ok := ne.(interface{ Temporary() bool })
	assert.True(t, ok && tmp.Temporary(), "a server loop backs off on it")
	assert.True(t, errors.Is(ne, syscall.ENOMEM))
}
