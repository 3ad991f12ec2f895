package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RNRCounters reads, inside a guest, a device's counters of
// receiver-not-ready events (RNR NAKs sent and received, RNR retries
// exceeded), those it has: rxe has them; siw has none, as iWARP has no RNR
// (a SEND that finds no receive ends the connection).
func RNRCounters(dev string) (map[string]uint64, error) {
	dir := filepath.Join("/sys/class/infiniband", dev, "ports/1/hw_counters")
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	counts := map[string]uint64{}
	for _, e := range ents {
		if !strings.Contains(e.Name(), "rnr") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("testbed: %w", err)
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("testbed: %s: %w", e.Name(), err)
		}
		counts[e.Name()] = n
	}
	return counts, nil
}

// CheckNoRNR fails tb, when it ends, if dev counted a receiver-not-ready
// event meanwhile: with credit-based flow control a sender never sends to
// a receive queue with nothing posted, so one is a bug, which RC's default
// endless RNR retry would otherwise turn into a slow test, not a failed
// one. The counters are the device's: tests that run one at a time.
func CheckNoRNR(tb testing.TB, dev string) {
	tb.Helper()
	before, err := RNRCounters(dev)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			return
		}
		after, err := RNRCounters(dev)
		if err != nil {
			tb.Error(err)
			return
		}
		if !reflect.DeepEqual(before, after) {
			tb.Errorf("%s counted receiver-not-ready events during the test (%v before, %v after): "+
				"a SEND found no receive posted, which the credits are there to prevent", dev, before, after)
		}
	})
}

// WaitPortActive waits, inside a guest, until port 1 of dev is ACTIVE (a
// device just added, or a netdev just brought up, takes a moment), and
// fails tb after 10 s.
func WaitPortActive(tb testing.TB, dev string) {
	tb.Helper()
	path := filepath.Join("/sys/class/infiniband", dev, "ports/1/state")
	var last string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(path)
		last = strings.TrimSpace(string(b))
		if err == nil && strings.Contains(last, "ACTIVE") {
			return
		}
		if err != nil {
			last = err.Error()
		}
	}
	tb.Fatalf("testbed: %s port 1 not ACTIVE after 10 s: %s", dev, last)
}
