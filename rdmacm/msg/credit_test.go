package msg

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// side is one end of a simulated connection: the ledger and what Conn
// does around it, with receive buffers counted instead of posted.
type side struct {
	t        *testing.T
	name     string
	led      ledger
	posted   int // receive buffers posted and not yet consumed
	held     int // messages the application holds
	released int // released, not yet posted again
	wire     *[]header
	sentData int
	gotData  int
	credits  int // CREDIT frames sent
}

func newPair(t *testing.T, a, b hello) (*side, *side) {
	var ab, ba []header
	x := &side{t: t, name: "A", led: newLedger(a, b), posted: int(a.credits) + int(a.replySlots), wire: &ab}
	y := &side{t: t, name: "B", led: newLedger(b, a), posted: int(b.credits) + int(b.replySlots), wire: &ba}
	return x, y
}

func (s *side) flush(force bool) {
	if s.released == 0 || (!force && uint32(s.released) < s.led.batch() && !s.led.starving()) {
		return
	}
	s.posted += s.released
	s.led.reposted(s.released)
	s.released = 0
}

func (s *side) sendData() bool {
	if !s.led.canSend(frameData) {
		return false
	}
	s.flush(true)
	*s.wire = append(*s.wire, s.led.outgoing(frameData))
	s.sentData++
	return true
}

// sendCredits is Conn.sendCreditsLocked.
func (s *side) sendCredits() {
	for s.led.wantCredit() && s.led.canSendCredit() {
		*s.wire = append(*s.wire, s.led.outgoing(frameCredit))
		s.credits++
	}
}

// deliver takes the oldest frame from the peer's wire.
func (s *side) deliver(peer *side) bool {
	w := peer.wire
	if len(*w) == 0 {
		return false
	}
	h := (*w)[0]
	*w = (*w)[1:]
	require.Positive(s.t, s.posted, "%s: a frame arrived with no receive buffer posted (receiver not ready)", s.name)
	s.posted--
	require.NoError(s.t, s.led.incoming(h), "%s", s.name)
	if h.typ == frameCredit {
		s.posted++
	} else {
		s.held++
		s.gotData++
	}
	// What Conn.tookLocked does after the frames it took.
	if s.released > 0 && s.led.starving() {
		s.flush(false)
	}
	s.sendCredits()
	return true
}

// release is Conn.release, for each of n messages.
func (s *side) release(n int) {
	for range min(n, s.held) {
		s.held--
		s.released++
		s.flush(false)
		s.sendCredits()
	}
}

// deliverAll takes every frame on the way, both ways.
func deliverAll(a, b *side) {
	for a.deliver(b) || b.deliver(a) {
	}
}

// checkWaitsOnlyWhenHeld asserts the ledger's promise: once every frame
// has arrived, a side waits for credit only while its peer's application
// holds all its credits but the one kept for FIN.
func checkWaitsOnlyWhenHeld(t *testing.T, seed uint64, step int, s, peer *side) {
	t.Helper()
	if !s.led.canSend(frameData) && peer.held < int(peer.led.credits)-1 {
		t.Fatalf("seed %d, step %d: %s waits for credit while %s holds %d messages of its %d credits (%+v)",
			seed, step, s.name, peer.name, peer.held, peer.led.credits, peer.led)
	}
}

// Random traffic both ways, with applications that hold messages for a
// while: a frame never finds the receive queue empty, and whenever every
// message is released, sending goes on.
func TestLedgerNeverOverrunsAndNeverStalls(t *testing.T) {
	seeds := uint64(256)
	if raceEnabled {
		seeds = 32 // the ledger has no goroutines; the run without -race covers all 256
	}
	for seed := range seeds {
		r := rand.New(rand.NewPCG(seed, 1))
		ha := hello{version: 1, replySlots: uint16(1 + r.IntN(4)), credits: uint32(2 + r.IntN(40)), maxMessage: 1}
		hb := hello{version: 1, replySlots: uint16(1 + r.IntN(4)), credits: uint32(2 + r.IntN(40)), maxMessage: 1}
		a, b := newPair(t, ha, hb)
		for step := 0; step < 4000; step++ {
			switch r.IntN(6) {
			case 0:
				a.sendData()
			case 1:
				b.sendData()
			case 2:
				a.deliver(b)
			case 3:
				b.deliver(a)
			case 4:
				a.release(r.IntN(3))
			case 5:
				b.release(r.IntN(3))
			}
			if step%50 == 49 {
				deliverAll(a, b)
				checkWaitsOnlyWhenHeld(t, seed, step, a, b)
				checkWaitsOnlyWhenHeld(t, seed, step, b, a)
			}
		}
		// Drain: the applications release everything; then each side
		// must be able to send again.
		for range 1000 {
			a.release(a.held)
			b.release(b.held)
			if !a.deliver(b) && !b.deliver(a) {
				break
			}
		}
		assert.True(t, a.sendData(), "seed %d: A stalled with every message released (%+v)", seed, a.led)
		assert.True(t, b.sendData(), "seed %d: B stalled with every message released (%+v)", seed, b.led)
		if t.Failed() {
			return
		}
	}
}

// One way only, a receiver that releases one message at a time: the grants
// must come back in CREDIT frames, in batches, and the sender must never
// wait while the receiver holds nothing.
func TestLedgerOneWay(t *testing.T) {
	a, b := newPair(t, hello{version: 1, replySlots: 4, credits: 32, maxMessage: 1},
		hello{version: 1, replySlots: 4, credits: 32, maxMessage: 1})
	const n = 10000
	for a.sentData < n {
		if !a.sendData() {
			require.True(t, b.deliver(a) || b.held > 0, "A waits for credit with nothing in flight and nothing held (%+v)", b.led)
		}
		for b.deliver(a) {
			b.release(1)
		}
		for a.deliver(b) {
		}
	}
	assert.Equal(t, n, b.gotData)
	assert.Less(t, b.credits, n/4, "grants go back in batches, not one CREDIT frame per message")
	assert.Zero(t, a.credits, "the sender sends no CREDIT frames: it was granted nothing")
}

// A receiver that holds every message: the sender stops after the credits,
// and goes on when they are released.
func TestLedgerBackpressure(t *testing.T) {
	a, b := newPair(t, hello{version: 1, replySlots: 2, credits: 8, maxMessage: 1},
		hello{version: 1, replySlots: 2, credits: 8, maxMessage: 1})
	for a.sendData() {
	}
	assert.Equal(t, 7, a.sentData, "the peer's credits but the one kept for FIN")
	assert.True(t, a.led.canSend(frameFin), "the end of the stream can follow a full window")
	for b.deliver(a) {
	}
	for a.deliver(b) {
	}
	assert.False(t, a.sendData(), "nothing released, no credit")
	b.release(1)
	for a.deliver(b) {
	}
	assert.True(t, a.sendData(), "a single release reaches a starved sender at once")
}

// Frames that break the flow control are refused with what the peer did.
func TestLedgerRefuses(t *testing.T) {
	h := hello{version: 1, replySlots: 2, credits: 2, maxMessage: 1}
	fresh := func() *ledger { l := newLedger(h, h); return &l }

	l := fresh()
	require.NoError(t, l.incoming(header{typ: frameData, grant: 2}))
	require.NoError(t, l.incoming(header{typ: frameData, grant: 2}))
	err := l.incoming(header{typ: frameData, grant: 2})
	assert.ErrorContains(t, err, "a DATA frame without credit: 3 credit-using frames arrived, 2 were granted")

	l = fresh()
	assert.ErrorContains(t, l.incoming(header{typ: frameCredit, grant: 2}), "a CREDIT frame without a reply slot")

	l = fresh()
	assert.ErrorContains(t, l.incoming(header{typ: frameData, grant: 1}), "grant 1 goes back from 2")

	l = fresh()
	assert.ErrorContains(t, l.incoming(header{typ: frameData, grant: 3}), "granting 3 credits beyond what this side sent, more than the 2 buffers")

	l = fresh()
	require.NoError(t, l.incoming(header{typ: frameData, grant: 2, flags: flagSlot}))
	require.NoError(t, l.incoming(header{typ: frameData, grant: 2, flags: flagSlot}))
	l.reposted(1)
	l.outgoing(frameData) // announces one more credit
	assert.ErrorContains(t, l.incoming(header{typ: frameFin, grant: 2, flags: flagSlot}), "giving a reply slot beyond the 2 it announced")

	// Counters wrap: a connection past 2^32 frames goes on.
	l = fresh()
	l.announced, l.received, l.granted = 1, 0xffffffff, 1
	assert.NoError(t, l.incoming(header{typ: frameData, grant: 2}))
}

// taggedContext is a context whose type holds a slice: comparing two such
// interface values with == panics.
type taggedContext struct {
	context.Context
	tags []string
}

// A kept wait context is known by its contexts' Done channels: any context
// works, also one that cannot be compared.
func TestMergedWaitTakesContextsThatDoNotCompare(t *testing.T) {
	end, endCancel := context.WithCancel(context.Background())
	defer endCancel()
	parent, cancel := context.WithCancel(context.Background())
	var m mergedWait
	defer m.release()
	first := m.get(taggedContext{parent, []string{"a"}}, end)
	assert.Equal(t, first, m.get(taggedContext{parent, []string{"b"}}, end), "kept for a context with the same Done channel")
	got := m.get(taggedContext{parent, nil}, end)
	cancel()
	<-got.Done()
}
