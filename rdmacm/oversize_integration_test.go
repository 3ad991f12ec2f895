//go:build integration

package rdmacm_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// A message longer than the receive the peer posted fails with statuses
// that differ by device and side (rxe: REM_OP_ERR at the sender,
// LOC_QP_OP_ERR at the receiver; siw: LOC_LEN_ERR at the receiver only);
// each error says the buffer was too small.
func TestOversizeMessageSaysWhy(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		client, server := pair(t, d, rdmacm.ConnConfig{})
		ctx := ctxFor(t, 20*time.Second)
		smr, err := server.RegisterMemory(4096, access)
		require.NoError(t, err)
		cmr, err := client.RegisterMemory(8192, access)
		require.NoError(t, err)
		require.NoError(t, server.PostRecv(smr, 0, 1024))
		sendErr := client.Send(ctx, cmr, 0, 4096)
		_, recvErr := server.Recv(ctx)
		require.Error(t, recvErr)
		t.Logf("sender: %v", sendErr)
		t.Logf("receiver: %v", recvErr)
		var ce *verbs.CompletionError
		require.ErrorAs(t, recvErr, &ce)
		assert.Contains(t, recvErr.Error(), "longer than", "%v", ce.WC.Status)
		assert.Contains(t, recvErr.Error(), "PostRecv's n")
		assert.NotErrorIs(t, recvErr, rdmacm.ErrEnded, "the receive's own failure (siw ends the connection for it) is not the end's")
		if !d.iwarp {
			require.Error(t, sendErr, "the sender hears of it on RoCE")
			assert.Contains(t, sendErr.Error(), "4096-byte message")
			assert.Contains(t, sendErr.Error(), "longer than the receive buffer the peer posted")
		}
	})
}

// A receive posted past PostRecv's check into memory without local write
// access fails when a message arrives (rxe: LOC_QP_OP_ERR, siw:
// GENERAL_ERR); the error names the missing right.
func TestReceiveWithoutLocalWriteSaysWhy(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		client, server := pair(t, d, rdmacm.ConnConfig{})
		ctx := ctxFor(t, 20*time.Second)
		readOnly, err := server.RegisterMemory(4096, verbs.AccessRemoteRead)
		require.NoError(t, err)
		require.NoError(t, server.QP().PostRecv(verbs.RecvWR{ID: 7, SGEs: []verbs.SGE{readOnly.SGE(0, 1024)}}))
		cmr, err := client.RegisterMemory(4096, access)
		require.NoError(t, err)
		sendErr := client.Send(ctx, cmr, 0, 64)
		wc, recvErr := server.Recv(ctx)
		require.Error(t, recvErr)
		t.Logf("sender: %v", sendErr)
		t.Logf("receiver: %v", recvErr)
		assert.Equal(t, uint64(7), wc.ID)
		assert.Contains(t, recvErr.Error(), "AccessLocalWrite")
		if sendErr != nil {
			assert.Contains(t, sendErr.Error(), "AccessLocalWrite")
		}
	})
}
