package msg

import "fmt"

// ledger is one connection's flow control, both ways. It does no I/O: the
// connection asks it what may be sent and tells it what was sent, received
// and given back, under the connection's lock.
//
// Credits. Each side posts credits+replySlots receive buffers before the
// connection is up and announces credits in its hello. A frame that uses a
// credit (HELLO, DATA, FIN) may be sent only while the sender has sent
// fewer such frames than the peer's grant: the header's grant field, a
// running total of the buffers the peer has made available (its initial
// credits plus every buffer reposted since). A receiver reposts a buffer
// only when its message is released, and counts it in the grant only once
// it is posted again, so a granted buffer is always a posted one.
//
// Reply slots. A grant travels in every frame's header, for free when
// messages flow both ways. When they do not, the receiver must send a
// CREDIT frame, which needs a receive buffer at the peer too; CREDIT frames
// therefore use reply slots, not credits. A side gives its peer a reply slot
// by setting flagSlot on a frame it sends, while fewer than its replySlots
// are outstanding (given and not yet used), and keeps replySlots buffers
// posted beyond its credits for them; a CREDIT frame's buffer is reposted as
// soon as it is read, and the slot may be given again. A CREDIT frame is
// sent only to pass on grants made by releases, never to answer one, so
// CREDIT frames never answer each other.
//
// Why no side waits for ever: a sender out of credits sent its last frames
// with flagSlot while it had slots to give; the receiver therefore holds a
// reply slot (or has a CREDIT frame on the way), and grants as soon as its
// application releases a message. A grant made while the receiver's slots
// were all used by CREDIT frames waits for the frames those CREDIT frames
// let the sender send: they give slots back, and their arrival sends it
// (checked by TestLedgerNeverOverrunsAndNeverStalls after every burst, and
// on the devices by TestGrantOwedForWantOfAReplySlotGoesOutWithTheNextSlot).
// So receive buffers never run out on
// either side (no receiver-not-ready), and a side waits for credits only
// while its peer's application holds that many messages.
type ledger struct {
	// Receiving: what this side granted and what arrived.
	credits    uint32 // announced in our hello
	replySlots uint32 // announced in our hello
	granted    uint32 // buffers made available in all: credits + reposted
	announced  uint32 // the grant last sent
	received   uint32 // credit-using frames received
	slotsGiven uint32 // flagSlot frames sent
	creditsIn  uint32 // CREDIT frames received

	// Sending: what the peer granted and what was sent.
	peerCredits    uint32
	peerReplySlots uint32
	peerGrant      uint32
	sent           uint32 // credit-using frames sent
	slotsHeld      uint32 // flagSlot frames received
	creditsOut     uint32 // CREDIT frames sent
}

func newLedger(local, peer hello) ledger {
	return ledger{
		credits: local.credits, replySlots: uint32(local.replySlots), granted: local.credits, announced: local.credits,
		peerCredits: peer.credits, peerReplySlots: uint32(peer.replySlots), peerGrant: peer.credits,
	}
}

// after reports whether counter a is past b, for counters that wrap.
func after(a, b uint32) bool { return int32(a-b) > 0 }

// canSend reports whether a credit-using frame of type t may be sent now.
// The last credit is kept for FIN: the peer announced one buffer more than
// its messages' credits for it, so DATA stops one short of the grant and
// the end of the stream can always follow.
func (l *ledger) canSend(t frameType) bool {
	if t == frameFin || t == frameHello {
		return after(l.peerGrant, l.sent)
	}
	return after(l.peerGrant, l.sent+1)
}

// outgoing counts a frame as sent and fills in its header: reserve, then
// header.
func (l *ledger) outgoing(t frameType) header {
	l.reserve(t)
	return l.header(t)
}

// reserve counts a frame of type t as sent: it takes a credit (or a reply
// slot) now, though its header may be made a little later, when it is
// posted.
func (l *ledger) reserve(t frameType) {
	if t.usesCredit() {
		l.sent++
	} else {
		l.creditsOut++
	}
}

// header fills in the grant and flags of a frame about to be posted. Made
// in the order frames are posted, grants never go back.
func (l *ledger) header(t frameType) header {
	h := header{typ: t, grant: l.granted}
	l.announced = l.granted
	if l.slotsGiven-l.creditsIn < l.replySlots {
		h.flags |= flagSlot
		l.slotsGiven++
	}
	return h
}

// incoming checks a received frame's header against the flow control and
// takes it into account. Its error says how the peer broke the rules.
func (l *ledger) incoming(h header) error {
	// The peer's grant: never back, never past the buffers it announced
	// (it cannot have reposted more than it received).
	if after(l.peerGrant, h.grant) {
		return fmt.Errorf("a %v frame whose grant %d goes back from %d", h.typ, h.grant, l.peerGrant)
	}
	if after(h.grant-l.sent, l.peerCredits) {
		return fmt.Errorf("a %v frame granting %d credits beyond what this side sent, more than the %d buffers it announced",
			h.typ, h.grant-l.sent, l.peerCredits)
	}
	if h.typ.usesCredit() {
		if !after(l.announced, l.received) {
			return fmt.Errorf("a %v frame without credit: %d credit-using frames arrived, %d were granted", h.typ, l.received+1, l.announced)
		}
		l.received++
	} else {
		if l.slotsGiven-l.creditsIn == 0 {
			return fmt.Errorf("a CREDIT frame without a reply slot (%d given so far, all used)", l.slotsGiven)
		}
		l.creditsIn++
	}
	if h.flags&flagSlot != 0 {
		if l.slotsHeld-l.creditsOut >= l.peerReplySlots {
			return fmt.Errorf("a %v frame giving a reply slot beyond the %d it announced", h.typ, l.peerReplySlots)
		}
		l.slotsHeld++
	}
	l.peerGrant = h.grant
	return nil
}

// reposted counts n credit-using buffers posted again.
func (l *ledger) reposted(n int) { l.granted += uint32(n) }

// pending is how many reposted buffers the peer has not been told of yet.
func (l *ledger) pending() uint32 { return l.granted - l.announced }

// peerLeft is how many credits the peer has left as far as this side
// knows (it may have used some that are still on their way).
func (l *ledger) peerLeft() uint32 { return l.announced - l.received }

// batch is how many grants a CREDIT frame waits for, and low how few
// credits the peer may have left before any grant goes out at once.
func (l *ledger) batch() uint32 { return max(1, l.credits/2) }
func (l *ledger) low() uint32   { return l.credits / 4 }

// starving reports whether the peer is (nearly) out of credits; the one
// kept for FIN does not count.
func (l *ledger) starving() bool { return l.peerLeft() <= l.low()+1 }

// wantCredit reports whether a CREDIT frame should go out for grants
// waiting: a batch of them, or any when the peer is nearly out of credits.
func (l *ledger) wantCredit() bool {
	p := l.pending()
	return p > 0 && (p >= l.batch() || l.starving())
}

// canSendCredit reports whether this side holds a reply slot.
func (l *ledger) canSendCredit() bool { return l.slotsHeld != l.creditsOut }
