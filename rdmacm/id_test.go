package rdmacm

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEventErrSaysWhatFailed(t *testing.T) {
	for _, ok := range []EventType{EventAddrResolved, EventRouteResolved, EventConnectRequest, EventConnectResponse,
		EventEstablished, EventDisconnected, EventMulticastJoin, EventTimewaitExit, EventAddrChange} {
		assert.NoError(t, (&Event{Type: ok}).Err(), "%v is no failure", ok)
	}

	err := (&Event{Type: EventRejected, Status: 28, PrivateData: []byte("busy")}).Err()
	require.ErrorIs(t, err, ErrRejected)
	var rej *RejectedError
	require.True(t, errors.As(err, &rej))
	assert.Equal(t, 28, rej.Status)
	assert.Equal(t, []byte("busy"), rej.PrivateData)
	assert.ErrorContains(t, err, "REJECTED")

	err = (&Event{Type: EventAddrError, Status: -int(syscall.ETIMEDOUT)}).Err()
	assert.ErrorIs(t, err, ErrAddrResolution)
	assert.ErrorIs(t, err, syscall.ETIMEDOUT)
	assert.ErrorContains(t, err, "neighbour", "the status's usual meaning")

	for typ, kind := range map[EventType]error{EventRouteError: ErrRouteResolution, EventUnreachable: ErrUnreachable,
		EventConnectError: ErrConnect, EventMulticastError: ErrConnect, EventDeviceRemoval: ErrDeviceRemoved} {
		assert.ErrorIs(t, (&Event{Type: typ, Status: -5}).Err(), kind, "%v", typ)
	}
	assert.ErrorIs(t, (&Event{Type: eventChannelFailed, err: fmt.Errorf("%w: x", ErrEventChannel)}).Err(), ErrEventChannel)

	// A SIDR reject (PS_UDP) comes as UNREACHABLE, status 2.
	assert.ErrorIs(t, (&Event{Type: EventUnreachable, Status: 2, UD: true}).Err(), ErrRejected)
}
