package verbs

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestYielderLooksAtTheClockEvery64Polls(t *testing.T) {
	var y yielder
	y.last.Store(-int64(time.Hour)) // long ago
	for i := 1; i < checkEvery; i++ {
		assert.False(t, y.due(), "poll %d", i)
	}
	assert.True(t, y.due(), "poll %d, an hour after the last yield", checkEvery)
	for i := 1; i <= checkEvery; i++ {
		assert.False(t, y.due(), "poll %d after a yield, within %v", i, yieldEvery)
	}
}

func TestYielderYieldsAgainAfterYieldEvery(t *testing.T) {
	var y yielder
	y.last.Store(int64(time.Since(monotonicEpoch) - yieldEvery))
	yields := 0
	for i := 0; i < checkEvery; i++ {
		if y.due() {
			yields++
		}
	}
	assert.Equal(t, 1, yields, "a yield is due %v after the last", yieldEvery)
}
