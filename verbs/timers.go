package verbs

import (
	"fmt"
	"time"
)

// ACKTimeout is the 5-bit local ACK timeout code of an RC QP: the sender
// waits 4.096 µs × 2^code for an ACK before retransmitting. Code 0 means wait
// forever: a single lost packet then stalls the QP for good (see [Warnings]).
type ACKTimeout uint8

// ACKTimeoutInfinite is code 0: never retransmit.
const ACKTimeoutInfinite ACKTimeout = 0

// MaxACKTimeout is the largest code (31, about 2.4 hours).
const MaxACKTimeout ACKTimeout = 31

const ackTimeoutUnit = 4096 * time.Nanosecond

// Duration returns the timeout the code stands for, and false for code 0
// (infinite) or a code above 31.
func (t ACKTimeout) Duration() (time.Duration, bool) {
	if t == 0 || t > MaxACKTimeout {
		return 0, false
	}
	return ackTimeoutUnit << t, true
}

func (t ACKTimeout) String() string {
	if t == 0 {
		return "0 (infinite: never retransmit)"
	}
	d, ok := t.Duration()
	if !ok {
		return fmt.Sprintf("%d (invalid: timeout is 5 bits)", uint8(t))
	}
	return fmt.Sprintf("%d (%v)", uint8(t), d)
}

// ACKTimeoutFor returns the smallest code whose timeout is at least d
// (14 ≈ 67 ms is a common choice). It fails for d ≤ 0 (use
// [ACKTimeoutInfinite] deliberately, never by accident) and above code 31.
func ACKTimeoutFor(d time.Duration) (ACKTimeout, error) {
	if d <= 0 {
		return 0, fmt.Errorf("verbs: ACK timeout %v: must be positive (code 0, never retransmit, is ACKTimeoutInfinite)", d)
	}
	for c := ACKTimeout(1); c <= MaxACKTimeout; c++ {
		if got, _ := c.Duration(); got >= d {
			return c, nil
		}
	}
	max, _ := MaxACKTimeout.Duration()
	return 0, fmt.Errorf("verbs: ACK timeout %v exceeds the largest code 31 (%v)", d, max)
}

// RNRTimer is the 5-bit minimum RNR NAK timer code of an RC QP: how long a
// sender that got "receiver not ready" waits before retrying. The code is not
// linear and 0 is the largest value (655.36 ms), not zero.
type RNRTimer uint8

// MaxRNRTimer is the largest code.
const MaxRNRTimer RNRTimer = 31

// rnrTimerMicros is the IBTA table, in microseconds, indexed by code.
var rnrTimerMicros = [32]int64{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
	163840, 245760, 327680, 491520,
}

// Duration returns the delay the code stands for; false above code 31.
func (r RNRTimer) Duration() (time.Duration, bool) {
	if r > MaxRNRTimer {
		return 0, false
	}
	return time.Duration(rnrTimerMicros[r]) * time.Microsecond, true
}

func (r RNRTimer) String() string {
	d, ok := r.Duration()
	if !ok {
		return fmt.Sprintf("%d (invalid: RNR timer is 5 bits)", uint8(r))
	}
	return fmt.Sprintf("%d (%v)", uint8(r), d)
}

// RNRTimerFor returns the code of the shortest delay that is at least d.
// 0.01 ms and below give code 1; above 491.52 ms gives code 0 (655.36 ms).
func RNRTimerFor(d time.Duration) (RNRTimer, error) {
	if d < 0 {
		return 0, fmt.Errorf("verbs: RNR timer %v: must not be negative", d)
	}
	best, bestD := RNRTimer(0), time.Duration(-1)
	for c := RNRTimer(0); c <= MaxRNRTimer; c++ {
		got, _ := c.Duration()
		if got >= d && (bestD < 0 || got < bestD) {
			best, bestD = c, got
		}
	}
	if bestD < 0 {
		return 0, fmt.Errorf("verbs: RNR timer %v exceeds the largest delay (655.36 ms, code 0)", d)
	}
	return best, nil
}

// RNRRetryInfinite as a QP's RNR retry count means retry forever.
const RNRRetryInfinite uint8 = 7
