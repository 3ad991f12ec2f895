package testbed

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// CheckNoLeaks asserts, when tb ends, that every RDMA object the kernel
// lists for this process (cm_ids, QPs, CQs, MRs, PDs), every file
// descriptor and every goroutine started during the test is gone.
// Goroutines are told apart by id, so one that ended does not hide one that
// leaked. Goroutines of closed connections may exit just after Close
// returns: it waits up to 5 s for them. A test that failed is not checked
// again.
func CheckNoLeaks(tb testing.TB) {
	tb.Helper()
	objects, err := Objects()
	if err != nil {
		tb.Fatalf("testbed: counting RDMA objects: %v", err)
	}
	fds, before := OpenFDs(tb), goroutineIDs(Goroutines())
	tb.Cleanup(func() {
		if tb.Failed() {
			return
		}
		deadline := time.Now().Add(5 * time.Second)
		var started [][]byte
		var counts []int // one per second, for the failure message
		for i := 0; ; i++ {
			started = startedSince(Goroutines(), before)
			if i%50 == 0 {
				counts = append(counts, len(started))
			}
			if len(started) == 0 || time.Now().After(deadline) {
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
		if len(started) > 0 {
			tb.Errorf("%d goroutines started during the test still run (their number over the wait, each second: %v):\n%s",
				len(started), counts, bytes.Join(started, []byte("\n\n")))
		}
	})
}

// goroutineIDs returns the ids of the goroutines in a dump of Goroutines.
func goroutineIDs(dump [][]byte) map[int64]bool {
	ids := make(map[int64]bool, len(dump))
	for _, g := range dump {
		if id, ok := goroutineID(g); ok {
			ids[id] = true
		}
	}
	return ids
}

// startedSince returns the goroutines of dump that are not among before.
func startedSince(dump [][]byte, before map[int64]bool) [][]byte {
	var started [][]byte
	for _, g := range dump {
		if id, ok := goroutineID(g); !ok || !before[id] {
			started = append(started, g)
		}
	}
	return started
}

// goroutineID reads the id from a stack's first line, "goroutine 7 [...]:".
func goroutineID(stack []byte) (int64, bool) {
	rest, ok := bytes.CutPrefix(stack, []byte("goroutine "))
	if !ok {
		return 0, false
	}
	digits, _, ok := bytes.Cut(rest, []byte(" "))
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseInt(string(digits), 10, 64)
	return id, err == nil
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
// LeaksSince after; tests use CheckNoLeaks. LeaksSince tells goroutines
// apart by id, which only TakeSnapshot records: Goroutines is their number,
// for reports.
type Snapshot struct {
	Objects    map[string]int
	FDs        int
	Goroutines int

	goroutines map[int64]bool // by id
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
	ids := goroutineIDs(Goroutines())
	return Snapshot{Objects: objects, FDs: len(fds), Goroutines: len(ids), goroutines: ids}, nil
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
			if started := startedSince(Goroutines(), s.goroutines); len(started) > 0 {
				leaks = append(leaks, fmt.Sprintf("%d goroutines", len(started)))
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
