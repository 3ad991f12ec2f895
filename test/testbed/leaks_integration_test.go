//go:build integration

package testbed

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// leakRecorder is a testing.TB whose cleanups and errors the test runs
// and reads itself.
type leakRecorder struct {
	testing.TB
	cleanups []func()
	errors   []string
}

func (r *leakRecorder) Helper()          {}
func (r *leakRecorder) Failed() bool     { return false }
func (r *leakRecorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *leakRecorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// CheckNoLeaks reports a descriptor and a goroutine left behind, and
// nothing when all is released.
func TestCheckNoLeaksSeesLeaks(t *testing.T) {
	clean := &leakRecorder{TB: t}
	CheckNoLeaks(clean)
	for _, f := range clean.cleanups {
		f()
	}
	if len(clean.errors) != 0 {
		t.Fatalf("a test that released everything was reported: %q", clean.errors)
	}

	leaky := &leakRecorder{TB: t}
	CheckNoLeaks(leaky)
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	go func() { <-stop }()
	for _, f := range leaky.cleanups {
		f()
	}
	close(stop)
	f.Close()
	all := strings.Join(leaky.errors, "\n")
	for _, want := range []string{"file descriptors not released", "goroutines before"} {
		if !strings.Contains(all, want) {
			t.Errorf("the leak check missed it: want %q in %q", want, all)
		}
	}
}

// LeaksSince names a descriptor and a goroutine held beyond the snapshot,
// and nothing once they are gone.
func TestLeaksSinceSeesLeaks(t *testing.T) {
	s, err := TakeSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	if leaks := LeaksSince(s, 0); leaks != nil {
		t.Fatalf("nothing was made, yet: %q", leaks)
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { <-stop; close(done) }()
	all := strings.Join(LeaksSince(s, 0), "\n")
	for _, want := range []string{"1 descriptors", "1 goroutines"} {
		if !strings.Contains(all, want) {
			t.Errorf("want %q in %q", want, all)
		}
	}
	close(stop)
	<-done
	f.Close()
	if leaks := LeaksSince(s, 5*time.Second); leaks != nil {
		t.Errorf("everything was released, yet: %q", leaks)
	}
}
