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

// A read of the event channel that runs out of memory (rdma_get_cm_event's
// malloc) leaves its event queued, and the poller would not report the
// descriptor again for it: the source reads again, for as long as memory
// is short. Any other failure is the descriptor's own, and ends the
// channel at once, saying why.
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
	read := func(t *testing.T, s *cmaSource) (rawEvent, error) {
		type result struct {
			re  rawEvent
			err error
		}
		got := make(chan result, 1)
		go func() {
			re, err := s.read()
			got <- result{re, err}
		}()
		select {
		case r := <-got:
			return r.re, r.err
		case <-time.After(10 * time.Second):
			t.Fatal("the read waited for the descriptor after a failed read")
			return rawEvent{}, nil
		}
	}
	nomem := func([]cma.Event) (int, bool, error) { return 0, false, syscall.ENOMEM }
	one := func(dst []cma.Event) (int, bool, error) {
		dst[0] = cma.Event{Type: int(EventEstablished), Token: 42}
		return 1, false, nil
	}

	t.Run("short of memory", func(t *testing.T) {
		re, err := read(t, source(t, nomem, nomem, nomem, nomem, nomem, nomem, nomem, one))
		require.NoError(t, err)
		assert.Equal(t, uint64(42), re.token)
		assert.Equal(t, EventEstablished, re.ev.Type)
	})
	t.Run("refused", func(t *testing.T) {
		_, err := read(t, source(t, func([]cma.Event) (int, bool, error) { return 0, false, syscall.EACCES }, one))
		require.Error(t, err)
		assert.ErrorIs(t, err, syscall.EACCES)
		assert.ErrorContains(t, err, "rdma_get_cm_event")
	})
}
