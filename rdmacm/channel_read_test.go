package rdmacm

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/internal/cma"
	"github.com/rdmago/rdmago/internal/fdwait"
)

// A read of the event channel that fails (rdma_get_cm_event's malloc, say)
// leaves its event queued, and the poller would not report the descriptor
// again for it: the source reads again, and gives up only when the reads
// keep failing, saying why.
func TestEventReadRetriesAFailedRead(t *testing.T) {
	source := func(t *testing.T, reads ...func([]cma.Event) (int, bool, error)) *cmaSource {
		r, w, err := os.Pipe() // never readable: every read is the fake's
		require.NoError(t, err)
		t.Cleanup(func() { r.Close(); w.Close() })
		fw, err := fdwait.New(int(r.Fd()), "test channel")
		require.NoError(t, err)
		t.Cleanup(func() { fw.Close() })
		calls := 0
		return &cmaSource{w: fw, getEvents: func(dst []cma.Event) (int, bool, error) {
			f := reads[min(calls, len(reads)-1)]
			calls++
			return f(dst)
		}}
	}
	nomem := func([]cma.Event) (int, bool, error) { return 0, false, syscall.ENOMEM }
	one := func(dst []cma.Event) (int, bool, error) {
		dst[0] = cma.Event{Type: int(EventEstablished), Token: 42}
		return 1, false, nil
	}

	t.Run("once", func(t *testing.T) {
		s := source(t, nomem, one)
		type result struct {
			re  rawEvent
			err error
		}
		got := make(chan result, 1)
		go func() {
			re, err := s.read()
			got <- result{re, err}
		}()
		var r result
		select {
		case r = <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("the read waited for the descriptor after a failed read")
		}
		re, err := r.re, r.err
		require.NoError(t, err)
		assert.Equal(t, uint64(42), re.token)
		assert.Equal(t, EventEstablished, re.ev.Type)
	})
	t.Run("for good", func(t *testing.T) {
		_, err := source(t, nomem).read()
		require.Error(t, err)
		assert.ErrorIs(t, err, syscall.ENOMEM)
		assert.ErrorContains(t, err, "rdma_get_cm_event")
		assert.ErrorContains(t, err, "5 times in a row")
	})
}
