//go:build linux && cgo

package ibv

import (
	"errors"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A failed poll (C's -1 and -2) is an I/O error; a failed arming carries
// its errno as a NotifyError.
func TestPolledResults(t *testing.T) {
	n, err := polled(3)
	assert.Equal(t, 3, n)
	assert.NoError(t, err)
	for _, r := range []int{-1, -2} {
		_, err = polled(r)
		assert.ErrorIs(t, err, syscall.EIO, "result %d", r)
	}
	_, err = polled(-2 - int(syscall.EAGAIN))
	var ne *NotifyError
	assert.True(t, errors.As(err, &ne))
	assert.Equal(t, syscall.EAGAIN, ne.Err)
}
