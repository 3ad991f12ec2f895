package verbs

import (
	"errors"
	"testing"
	"time"
)

// FuzzValidate checks Validate's contract on arbitrary input: it never
// panics, accepts exactly the masks within the rule, and names precisely what
// is missing and what is not accepted.
func FuzzValidate(f *testing.F) {
	f.Add(int(QPTypeRC), int(QPStateInit), int(QPStateRTR), uint32(AttrState|AttrAV))
	f.Add(int(QPTypeUD), int(QPStateReset), int(QPStateInit), uint32(AttrState|AttrQKey|AttrPort|AttrPKeyIndex))
	f.Add(int(QPTypeUC), int(QPStateSQE), int(QPStateRTS), uint32(0xffffffff))
	f.Fuzz(func(t *testing.T, qpType, from, to int, mask uint32) {
		err := Validate(QPType(qpType), QPState(from), QPState(to), AttrMask(mask))
		rule, ok := Rule(QPType(qpType), Transition{QPState(from), QPState(to)})
		if !ok {
			if err == nil {
				t.Fatalf("accepted a transition with no rule")
			}
			return
		}
		// What uverbs drops from an XRC mask is dropped before the rule.
		m := AttrMask(mask) &^ KernelIgnored(QPType(qpType))
		fits := m&rule.Required == rule.Required && m&^rule.Accepted() == 0
		if fits != (err == nil) {
			t.Fatalf("mask %v against %+v: err %v", m, rule, err)
		}
		var te *TransitionError
		if err != nil {
			if !errors.As(err, &te) {
				t.Fatalf("want *TransitionError, got %T", err)
			}
			if te.Mask != AttrMask(mask) {
				t.Fatalf("the error reports mask %v, the caller gave %v", te.Mask, AttrMask(mask))
			}
			if te.Missing != rule.Required&^m || te.NotAccepted != m&^rule.Accepted() {
				t.Fatalf("wrong report %+v for mask %v", te, m)
			}
			_ = te.Error()
		}
	})
}

// FuzzTimerEncoders checks that the encoders pick the smallest sufficient code.
func FuzzTimerEncoders(f *testing.F) {
	f.Add(int64(67 * time.Millisecond))
	f.Add(int64(0))
	f.Add(int64(500 * time.Millisecond))
	f.Fuzz(func(t *testing.T, n int64) {
		d := time.Duration(n)
		if c, err := ACKTimeoutFor(d); err == nil {
			got, ok := c.Duration()
			if !ok || got < d {
				t.Fatalf("ACKTimeoutFor(%v) = %v, too short", d, c)
			}
			if prev, ok := (c - 1).Duration(); ok && prev >= d {
				t.Fatalf("ACKTimeoutFor(%v) = %v, but %v suffices", d, c, c-1)
			}
		} else if d > 0 && d <= ackTimeoutUnit<<MaxACKTimeout {
			t.Fatalf("ACKTimeoutFor(%v) failed: %v", d, err)
		}
		if c, err := RNRTimerFor(d); err == nil {
			got, _ := c.Duration()
			if got < d {
				t.Fatalf("RNRTimerFor(%v) = %v, too short", d, c)
			}
			for other := RNRTimer(0); other <= MaxRNRTimer; other++ {
				if od, _ := other.Duration(); od >= d && od < got {
					t.Fatalf("RNRTimerFor(%v) = %v, but %v is shorter and suffices", d, c, other)
				}
			}
		} else if d >= 0 && d <= 655360*time.Microsecond {
			t.Fatalf("RNRTimerFor(%v) failed: %v", d, err)
		}
	})
}
