package stream

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A deadline's context ends when the deadline passes, or when the deadline
// is set again (so that a blocked call looks anew); only a passed one is
// expired; the parent's end ends it.
func TestDeadline(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	var d deadline
	d.init(parent)
	ctx := d.context()
	assert.NoError(t, ctx.Err(), "no deadline: waits for ever")
	assert.False(t, d.expired())

	d.set(time.Now().Add(time.Hour))
	assert.ErrorIs(t, ctx.Err(), context.Canceled, "setting wakes the waiter under the old one")
	assert.False(t, d.expired())
	ctx = d.context()
	assert.NoError(t, ctx.Err())

	d.set(time.Now().Add(20 * time.Millisecond))
	ctx = d.context()
	<-ctx.Done()
	assert.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
	assert.True(t, d.expired())

	d.set(time.Unix(1, 0))
	assert.Error(t, d.context().Err(), "a past deadline has ended already")
	assert.True(t, d.expired())

	d.set(time.Time{})
	assert.NoError(t, d.context().Err())
	assert.False(t, d.expired(), "cleared")

	ctx = d.context()
	cancel()
	assert.Error(t, ctx.Err(), "Close (the parent) ends it")
	d.stop()
}

func TestAddr(t *testing.T) {
	var a Addr
	assert.Equal(t, "rdma", a.Network())
}
