package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSignaledSends(t *testing.T) {
	counted := func(n int) (signaled int) {
		for k := 1; k <= 4*signalEvery; k++ {
			if signaledSend(n, k) {
				signaled++
			}
		}
		return signaled
	}
	// The device reads a send's buffer until it completes, unless the
	// send is inline: every such send is waited for.
	assert.Equal(t, 4*signalEvery, counted(inline+1), "sends of %d bytes, not inline", inline+1)
	assert.Equal(t, 4*signalEvery, counted(4096), "sends of 4 KiB")
	// Inline sends only retire the ones before them, every signalEvery-th.
	assert.Equal(t, 4, counted(inline), "inline sends of %d bytes", inline)
	assert.Equal(t, 4, counted(1), "inline sends of 1 byte")
	// The empty goodbye is waited for before the client closes.
	assert.True(t, signaledSend(0, 1), "the goodbye")
}
