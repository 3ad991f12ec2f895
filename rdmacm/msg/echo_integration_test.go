//go:build integration

package msg

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An echo server in one goroutine (Recv, Send, Release, as io.Copy over a
// stream does) against a client that writes and reads in two: large
// messages, which go without a completion of their own, and few credits,
// so that the server's Sends wait for credit while no Recv of its own
// runs and its connection goroutine sends CREDIT frames too. Every message
// comes back, in order, well before the deadline.
func TestEchoLargeMessagesFewCredits(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cfg := &Config{Credits: 4, SendBuffers: 8, MaxMessageSize: 16 << 10}
		addr := d.at(port())
		l, err := Listen(ctx, nil, addr, cfg)
		require.NoError(t, err)
		defer func() { assert.NoError(t, l.Close()) }()
		client, server := dialAccept(t, ctx, l, addr, cfg)

		served := make(chan error, 1)
		go func() {
			for {
				m, err := server.Recv(ctx)
				if err != nil {
					served <- err
					return
				}
				err = server.Send(ctx, m.Bytes())
				m.Release()
				if err != nil {
					served <- err
					return
				}
			}
		}()

		const n, size = 1500, 12 << 10
		sent := make(chan error, 1)
		go func() {
			p := make([]byte, size)
			for i := range n {
				binary.LittleEndian.PutUint32(p, uint32(i))
				if err := client.Send(ctx, p[:size-i%7]); err != nil {
					sent <- err
					return
				}
			}
			sent <- nil
		}()
		want := make([]byte, size)
		for i := range n {
			m, err := client.Recv(ctx)
			require.NoError(t, err, "echo %d of %d", i, n)
			binary.LittleEndian.PutUint32(want, uint32(i))
			require.True(t, bytes.Equal(want[:size-i%7], m.Bytes()), "echo %d: %d bytes, not the %d sent", i, len(m.Bytes()), size-i%7)
			m.Release()
		}
		require.NoError(t, <-sent)
		require.NoError(t, client.Close())
		assert.Error(t, <-served, "the server's Recv ends with the client's close")
		require.NoError(t, server.Close())
	})
}
