//go:build integration

package rdmacm_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// A receive the device would fail only when a message arrives (memory
// without local write access, a range outside the region) is refused when
// posted, saying what to change; so is an RDMA READ into such memory.
func TestPostRecvRefusesWhatWouldFailLater(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		client, server := pair(t, d, rdmacm.ConnConfig{})
		readOnly, err := server.RegisterMemory(4096, verbs.AccessRemoteRead)
		require.NoError(t, err)
		err = server.PostRecv(readOnly, 0, 64)
		require.Error(t, err, "a receive into memory without local write access")
		assert.Contains(t, err.Error(), "AccessLocalWrite")
		assert.Contains(t, err.Error(), "post receive")
		t.Log(err)
		err = server.RDMARead(ctxFor(t, 10*time.Second), readOnly, 0, 64, rdmacm.RemoteBufferOf(readOnly, 0, 64))
		require.Error(t, err, "an RDMA READ into memory without local write access")
		assert.Contains(t, err.Error(), "AccessLocalWrite")

		mr, err := server.RegisterMemory(4096, access)
		require.NoError(t, err)
		for _, r := range [][2]int{{4000, 200}, {-1, 64}, {0, 4097}} {
			err = server.PostRecv(mr, r[0], r[1])
			require.Error(t, err, "%d bytes at %d of a 4096-byte region", r[1], r[0])
			assert.Contains(t, err.Error(), "within the 4096-byte memory region")
		}
		assert.NoError(t, server.PostRecv(mr, 4032, 64), "the region's last bytes")

		// The connection still works: nothing of the refused ones was posted.
		cmr, err := client.RegisterMemory(4096, access)
		require.NoError(t, err)
		require.NoError(t, client.Send(ctxFor(t, 10*time.Second), cmr, 0, 64))
		wc, err := server.Recv(ctxFor(t, 10*time.Second))
		require.NoError(t, err)
		assert.Equal(t, mr.Addr()+4032, wc.ID)
	})
}

// Receives past the queue's size fail with an error that says the queue is
// full and which option sizes it (siw reported "errno -12 (errno -12)").
func TestPostRecvOnAFullQueueSaysSo(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		_, server := pair(t, d, rdmacm.ConnConfig{})
		mr, err := server.RegisterMemory(4096, access)
		require.NoError(t, err)
		posted := 0
		for ; posted < 256; posted++ {
			if err = server.PostRecv(mr, 0, 64); err != nil {
				break
			}
		}
		require.Error(t, err, "256 receives fit a queue of 16")
		assert.GreaterOrEqual(t, posted, 16, "ConnConfig.Cap.MaxRecvWR's default")
		t.Logf("after %d receives: %v", posted, err)
		assert.ErrorIs(t, err, syscall.ENOMEM)
		for _, want := range []string{"receive queue is full", "ConnConfig.Cap.MaxRecvWR", "16 here", d.name} {
			assert.Contains(t, err.Error(), want)
		}
		assert.NotContains(t, err.Error(), "errno -12")
	})
}

// A receive completion names its buffer (its ID is the buffer's address),
// and receives complete in the order they were posted.
func TestRecvCompletionNamesItsBuffer(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		client, server := pair(t, d, rdmacm.ConnConfig{})
		ctx := ctxFor(t, 20*time.Second)
		smr, err := server.RegisterMemory(8192, access)
		require.NoError(t, err)
		cmr, err := client.RegisterMemory(4096, access)
		require.NoError(t, err)
		offsets := []int{4096, 0, 2048}
		for _, off := range offsets {
			require.NoError(t, server.PostRecv(smr, off, 1024))
		}
		for i := range offsets {
			n := copy(cmr.Bytes(), fmt.Sprintf("message %d", i))
			require.NoError(t, client.Send(ctx, cmr, 0, n))
		}
		for i, off := range offsets {
			wc, err := server.Recv(ctx)
			require.NoError(t, err)
			got := wc.ID - smr.Addr()
			assert.Equal(t, uint64(off), got, "completion %d names the buffer of receive %d", i, i)
			if got < uint64(len(smr.Bytes())) {
				assert.Equal(t, fmt.Sprintf("message %d", i), string(smr.Bytes()[got:got+uint64(wc.ByteLen)]))
			}
		}
	})
}
