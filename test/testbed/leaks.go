package testbed

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"testing"
	"time"
)

// CheckNoLeaks asserts, when tb ends, that every RDMA object the kernel
// lists for this process (cm_ids, QPs, CQs, MRs, PDs), every file
// descriptor and every goroutine made during the test is gone. Goroutines
// of closed connections may exit just after Close returns: it waits up to
// 5 s for them. A test that failed is not checked again.
func CheckNoLeaks(tb testing.TB) {
	tb.Helper()
	objects, err := Objects()
	if err != nil {
		tb.Fatalf("testbed: counting RDMA objects: %v", err)
	}
	fds, goroutines := OpenFDs(tb), len(Goroutines())
	tb.Cleanup(func() {
		if tb.Failed() {
			return
		}
		// Goroutines are counted in the same stop-the-world dump that is
		// shown on failure: runtime.NumGoroutine, read apart from the dump,
		// once reported 324 where the dump a moment later listed 3.
		deadline := time.Now().Add(5 * time.Second)
		var dump [][]byte
		var counts []int // one per second, for the failure message
		for i := 0; ; i++ {
			dump = Goroutines()
			if i%50 == 0 {
				counts = append(counts, len(dump))
			}
			if len(dump) <= goroutines || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		after, err := Objects()
		switch {
		case err != nil:
			tb.Errorf("testbed: counting RDMA objects: %v", err)
		case !reflect.DeepEqual(objects, after):
			tb.Errorf("RDMA objects not released: %v before the test, %v after", objects, after)
		}
		if n := OpenFDs(tb); n != fds {
			tb.Errorf("file descriptors not released: %d before the test, %d after", fds, n)
		}
		if len(dump) > goroutines {
			tb.Errorf("%d goroutines before, %d after (counts over the wait: %v):\n%s", goroutines, len(dump), counts,
				bytes.Join(dump, []byte("\n\n")))
		}
	})
}

// Goroutines is every goroutine's stack, one entry per goroutine.
func Goroutines() [][]byte {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Split(bytes.TrimSpace(buf[:n]), []byte("\n\n"))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// OpenFDs is how many file descriptors this process has open.
func OpenFDs(tb testing.TB) int {
	tb.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatal(fmt.Errorf("testbed: %w", err))
	}
	return len(ents)
}

// Snapshot is what a process holds at one moment, inside a guest: its RDMA
// objects (as Objects counts them), open descriptors and goroutines. A
// program that is not a test finds its leaks with TakeSnapshot before and
// LeaksSince after; tests use CheckNoLeaks.
type Snapshot struct {
	Objects    map[string]int
	FDs        int
	Goroutines int
}

// TakeSnapshot reads what this process holds now.
func TakeSnapshot() (Snapshot, error) {
	objects, err := Objects()
	if err != nil {
		return Snapshot{}, err
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return Snapshot{}, fmt.Errorf("testbed: %w", err)
	}
	return Snapshot{Objects: objects, FDs: len(fds), Goroutines: len(Goroutines())}, nil
}

// LeaksSince lists what this process holds beyond s, one entry per kind,
// after waiting up to wait for what closed connections release late (their
// goroutines, their objects); nil when everything is back.
func LeaksSince(s Snapshot, wait time.Duration) []string {
	deadline := time.Now().Add(wait)
	for {
		var leaks []string
		now, err := TakeSnapshot()
		switch {
		case err != nil:
			leaks = append(leaks, fmt.Sprintf("unknown: %v", err))
		default:
			if !reflect.DeepEqual(now.Objects, s.Objects) {
				leaks = append(leaks, fmt.Sprintf("RDMA objects %v (before: %v)", now.Objects, s.Objects))
			}
			if now.FDs > s.FDs {
				leaks = append(leaks, fmt.Sprintf("%d descriptors", now.FDs-s.FDs))
			}
			if now.Goroutines > s.Goroutines {
				leaks = append(leaks, fmt.Sprintf("%d goroutines", now.Goroutines-s.Goroutines))
			}
		}
		if len(leaks) == 0 || time.Now().After(deadline) {
			return leaks
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CheckCount adds a count of the package's own to the leak check: at the
// end of the test, count must be back where it was (waiting up to 5 s, as
// for goroutines). For what the kernel does not list, such as a CM id that
// never bound to a device (rdmacm.OpenIDs).
func CheckCount(tb testing.TB, what string, count func() int) {
	tb.Helper()
	before := count()
	tb.Cleanup(func() {
		if tb.Failed() {
			return
		}
		n := count()
		for deadline := time.Now().Add(5 * time.Second); n > before && time.Now().Before(deadline); n = count() {
			time.Sleep(20 * time.Millisecond)
		}
		if n > before {
			tb.Errorf("%s not released: %d before the test, %d after", what, before, n)
		}
	})
}
