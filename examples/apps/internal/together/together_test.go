package together

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The requests of a round go on once all are in, and each round is its own.
func TestWaitReleasesARoundOnceAllAreIn(t *testing.T) {
	var g Gates
	var wg sync.WaitGroup
	for _, round := range []string{"a", "b"} {
		for range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				assert.NoError(t, g.Wait(context.Background(), round, 5))
			}()
		}
	}
	wg.Wait()
	assert.Empty(t, g.rounds, "finished rounds are forgotten")
}

// A request whose round never fills gives up with its context, and a bad
// count is refused.
func TestWaitGivesUp(t *testing.T) {
	var g Gates
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, g.Wait(ctx, "c", 2), context.Canceled)
	assert.Equal(t, 0, g.rounds["c"].in, "a request that gave up is not counted")
	assert.ErrorContains(t, g.Wait(context.Background(), "d", 0), "want 1 or more")
}
