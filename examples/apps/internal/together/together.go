// Package together lets an example's server prove that a client's
// concurrent requests were in flight at once: it holds each request of a
// round until all of them have arrived.
package together

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Wait is how long a request waits for the rest of its round.
const Wait = 30 * time.Second

// Gates hold the requests of each round. The zero value is ready.
type Gates struct {
	mu     sync.Mutex
	rounds map[string]*gate
}

type gate struct {
	in   int
	open chan struct{}
}

// Wait holds a request of round until want of them are in, for at most
// Wait; it fails, saying how many came, if they do not.
func (g *Gates) Wait(ctx context.Context, round string, want int) error {
	if want < 1 {
		return fmt.Errorf("together: want %d requests: want 1 or more", want)
	}
	g.mu.Lock()
	if g.rounds == nil {
		g.rounds = map[string]*gate{}
	}
	r := g.rounds[round]
	if r == nil {
		r = &gate{open: make(chan struct{})}
		g.rounds[round] = r
	}
	r.in++
	if r.in == want {
		close(r.open)
		delete(g.rounds, round)
	}
	g.mu.Unlock()
	timer := time.NewTimer(Wait)
	defer timer.Stop()
	// A request that gives up is no longer in: it does not count towards
	// the round (a retry of it would count twice).
	// The round may open just as it gives up: then it was in after all.
	leave := func() (in int, opened bool) {
		g.mu.Lock()
		defer g.mu.Unlock()
		select {
		case <-r.open:
			return r.in, true
		default:
			r.in--
			return r.in + 1, false
		}
	}
	select {
	case <-r.open:
		return nil
	case <-ctx.Done():
		if _, opened := leave(); opened {
			return nil
		}
		return ctx.Err()
	case <-timer.C:
		in, opened := leave()
		if opened {
			return nil
		}
		return fmt.Errorf("only %d of %d requests of round %q were in the server together after %v", in, want, round, Wait)
	}
}
