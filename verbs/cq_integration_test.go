//go:build integration

package verbs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

// Closing a CQ wakes a goroutine waiting on it, and destroys the channel
// only once that goroutine has left it: the wait fails, nothing crashes,
// and the CQ is gone.
func TestCloseWakesAWaiterFirst(t *testing.T) {
	for _, name := range []string{"rxe0", "siw0"} {
		t.Run(name, func(t *testing.T) {
			dev, err := verbs.Open(testbed.Require(t).MustDevice(t, name).Name)
			require.NoError(t, err)
			defer dev.Close()
			cq, err := dev.CreateCQ(4)
			require.NoError(t, err)
			waited := make(chan error, 1)
			go func() {
				_, err := cq.PollWait(context.Background(), make([]verbs.WorkCompletion, 1))
				waited <- err
			}()
			time.Sleep(50 * time.Millisecond) // let it reach the channel
			require.NoError(t, cq.Close())
			select {
			case err := <-waited:
				assert.Error(t, err, "the wait on a closed CQ fails")
			case <-time.After(5 * time.Second):
				t.Fatal("Close left a waiter waiting")
			}
			_, err = cq.Poll(make([]verbs.WorkCompletion, 1))
			assert.ErrorContains(t, err, "the CQ is closed")
			assert.NoError(t, cq.Close(), "twice")
		})
	}
}
