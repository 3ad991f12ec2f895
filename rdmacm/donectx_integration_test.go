//go:build integration

package rdmacm_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
)

// A call whose context has ended does nothing: a Send, RDMA WRITE or RDMA
// READ posts no work request (a caller told of the failure retries without
// sending twice and reuses its buffer at once), and an Accept takes no
// request, which the next Accept gets.
func TestCallsWithAnEndedContextDoNothing(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		client, server := pair(t, d, rdmacm.ConnConfig{})
		ctx := ctxFor(t, 20*time.Second)
		cmr, err := client.RegisterMemory(1<<16, access)
		require.NoError(t, err)
		smr, err := server.RegisterMemory(1<<16, access)
		require.NoError(t, err)
		done, cancel := context.WithCancel(ctx)
		cancel()

		require.NoError(t, server.PostRecv(smr, 0, 4096))
		copy(cmr.Bytes(), "never sent")
		assert.ErrorIs(t, client.Send(done, cmr, 0, 10), context.Canceled)
		copy(cmr.Bytes()[1024:], "never written")
		assert.ErrorIs(t, client.RDMAWrite(done, cmr, 1024, 13, rdmacm.RemoteBufferOf(smr, 16384, 4096)), context.Canceled)
		copy(smr.Bytes()[8192:], "never read")
		assert.ErrorIs(t, client.RDMARead(done, cmr, 2048, 10, rdmacm.RemoteBufferOf(smr, 8192, 4096)), context.Canceled)

		short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = server.Recv(short)
		stop()
		assert.ErrorIs(t, err, context.DeadlineExceeded, "nothing arrived")
		assert.Equal(t, make([]byte, 13), smr.Bytes()[16384:16397], "the write never landed")
		assert.Equal(t, make([]byte, 10), cmr.Bytes()[2048:2058], "the read never landed")

		copy(cmr.Bytes(), "sent once")
		require.NoError(t, client.Send(ctx, cmr, 0, 9))
		wc, err := server.Recv(ctx)
		require.NoError(t, err)
		assert.Equal(t, "sent once", string(smr.Bytes()[:wc.ByteLen]))

		// Accepts with an ended context while a request arrives and waits:
		// none takes it, and the next Accept does.
		l, addr := listen(t, d, nil)
		dialed := make(chan error, 1)
		go func() {
			dl := &rdmacm.Dialer{}
			dl.ConnectTimeout = 15 * time.Second // it waits for the Accepts below
			c, err := dl.Dial(ctx, addr)
			if err == nil {
				defer c.Close()
			}
			dialed <- err
		}()
		n := 0
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); n++ {
			_, err := l.Accept(done)
			require.ErrorIs(t, err, context.Canceled)
			time.Sleep(time.Millisecond)
		}
		c, err := l.Accept(ctx)
		require.NoError(t, err, "the request waited through %d Accepts whose context had ended", n)
		require.NoError(t, <-dialed)
		require.NoError(t, c.Close())
	})
}
