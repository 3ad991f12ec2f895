//go:build integration

package testbed

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
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

	// A goroutine that was running before the test ends during it, and
	// one started during it leaks: the same number, but not the same ones.
	ending := make(chan struct{})
	ended := make(chan struct{})
	go func() { <-ending; close(ended) }()
	leaky := &leakRecorder{TB: t}
	CheckNoLeaks(leaky)
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	close(ending)
	<-ended
	stop := make(chan struct{})
	go func() { <-stop }()
	for _, f := range leaky.cleanups {
		f()
	}
	close(stop)
	f.Close()
	all := strings.Join(leaky.errors, "\n")
	for _, want := range []string{"file descriptors not released", "1 goroutines started during the test still run",
		"TestCheckNoLeaksSeesLeaks.func"} {
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

// The leak checks count the RDMA objects themselves, from the kernel's
// resource tracking: a PD and a CM id left open are named (by kind and
// count), whichever thread made them, and nothing once they are gone.
// Without this, a change in 'rdma resource show' would leave every
// package's leak check counting nothing and passing. The kernel tracks a
// CM id only once it is bound to a device (cma_attach_to_dev): an id that
// never resolved an address is invisible to these checks.
func TestLeakChecksSeeRDMAObjects(t *testing.T) {
	rxe := Require(t).MustDevice(t, "rxe0")
	dst := netip.AddrPortFrom(netip.MustParseAddr(rxe.IPv4), 7999)
	resolved := func() *rdmacm.ID {
		id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
		if err != nil {
			t.Fatal(err)
		}
		if err := id.ResolveAddr(netip.Addr{}, dst, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if ev, err := id.Event(ctx); err != nil || ev.Type != rdmacm.EventAddrResolved {
			t.Fatalf("resolving %v: %v %v", dst, ev, err)
		}
		return id
	}
	// librdmacm opens every device at its first resolve and keeps their
	// descriptors: before the snapshot. (The PD it allocates on a device
	// lives as long as an id is bound there: the second "pd" below.)
	if err := resolved().Close(); err != nil {
		t.Fatal(err)
	}
	s, err := TakeSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Objects) != 0 {
		t.Fatalf("no RDMA object before the test, not %v", s.Objects)
	}
	leaky := &leakRecorder{TB: t}
	CheckNoLeaks(leaky)
	dev, err := verbs.Open(rxe.Name)
	if err != nil {
		t.Fatal(err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	id := resolved()
	since := strings.Join(LeaksSince(s, 0), "\n")
	for _, f := range leaky.cleanups {
		f()
	}
	checked := strings.Join(leaky.errors, "\n")
	const want = "map[cm_id:1 pd:2]"
	if !strings.Contains(since, want) {
		t.Errorf("LeaksSince missed them: want %q in %q", want, since)
	}
	if !strings.Contains(checked, "RDMA objects not released") || !strings.Contains(checked, want) {
		t.Errorf("CheckNoLeaks missed them: want %q in %q", want, checked)
	}
	if err := id.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pd.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	if leaks := LeaksSince(s, 5*time.Second); leaks != nil {
		t.Errorf("everything was released, yet: %q", leaks)
	}
}

// An id that never bound to a device is missing from the kernel's list;
// rdmacm.OpenIDs counts it, and CheckCount sees it left open.
func TestCheckCountSeesAnUnboundID(t *testing.T) {
	leaky := &leakRecorder{TB: t}
	CheckCount(leaky, "CM ids", rdmacm.OpenIDs)
	id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
	if err != nil {
		t.Fatal(err)
	}
	objects, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	if objects["cm_id"] != 0 {
		t.Errorf("the kernel lists an unbound id after all (%v): the leak checks' note is out of date", objects)
	}
	for _, f := range leaky.cleanups {
		f()
	}
	if want := "CM ids not released"; !strings.Contains(strings.Join(leaky.errors, "\n"), want) {
		t.Errorf("CheckCount missed the open id: %q", leaky.errors)
	}
	if err := id.Close(); err != nil {
		t.Fatal(err)
	}
	clean := &leakRecorder{TB: t}
	CheckCount(clean, "CM ids", rdmacm.OpenIDs)
	for _, f := range clean.cleanups {
		f()
	}
	if len(clean.errors) != 0 {
		t.Errorf("nothing left open, yet: %q", clean.errors)
	}
}
