package testbed

import (
	"strings"
	"testing"
)

func TestStartedSinceTellsGoroutinesApartByID(t *testing.T) {
	dump := func(ids ...string) [][]byte {
		var d [][]byte
		for _, id := range ids {
			d = append(d, []byte("goroutine "+id+" [chan receive]:\nmain.f()\n\t/x.go:1 +0x1"))
		}
		return d
	}
	before := goroutineIDs(dump("1", "7", "12"))
	if len(before) != 3 || !before[1] || !before[7] || !before[12] {
		t.Fatalf("goroutineIDs = %v, want 1, 7 and 12", before)
	}
	// 7 ended and 13 started: as many as before, one of them new.
	started := startedSince(dump("1", "12", "13"), before)
	if len(started) != 1 || !strings.HasPrefix(string(started[0]), "goroutine 13 ") {
		t.Errorf("startedSince = %q, want goroutine 13 alone", started)
	}
	// What cannot be read is not taken for an old goroutine.
	if started := startedSince([][]byte{[]byte("garbage")}, before); len(started) != 1 {
		t.Errorf("an unreadable stack: startedSince = %q, want it listed", started)
	}
}
