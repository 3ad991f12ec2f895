//go:build integration || testbed

package msg

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/rdmago/test/testbed"
)

// The fault matrix (TestFaultMatrix in one guest, TestTwoGuestsFaultMatrix
// across two): one row per fault and transport, printed by the test and,
// when $RDMAGO_FAULT_TABLE_DIR is set (make test sets it to bench/), kept
// there as a Markdown table.

type faultRow struct {
	fault, transport string
	bound            time.Duration // what the configuration promises; 0: none applies
	detect           time.Duration // from the fault to the application's first failed call; 0: none failed
	errors           string        // what the application saw
	leaked           string        // "none", or what was left
	lost             string        // messages the sender was told were sent, that never arrived
	failed           bool          // the connection ended, though detection was not timed
}

type faultTable struct {
	mu   sync.Mutex
	rows []faultRow
}

func (ft *faultTable) add(r faultRow) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	ft.rows = append(ft.rows, r)
}

func (ft *faultTable) markdown(title string) string {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "## %s\n\n", title)
	b.WriteString("| fault | transport | detected after | bound | errors the application saw | leaked | lost messages |\n|---|---|---:|---:|---|---|---:|\n")
	for _, r := range ft.rows {
		detect, bound := "not an error", "–"
		switch {
		case r.detect > 0:
			detect = r.detect.Round(time.Millisecond).String()
		case r.failed:
			detect = "failed (not timed)"
		}
		if r.bound > 0 {
			bound = r.bound.String()
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", r.fault, r.transport, detect, bound,
			strings.ReplaceAll(r.errors, "|", "\\|"), r.leaked, r.lost)
	}
	return b.String()
}

// write logs the table and keeps it in $RDMAGO_FAULT_TABLE_DIR/name.
func (ft *faultTable) write(t *testing.T, name, title, intro string) {
	md := ft.markdown(title)
	t.Log("\n" + md)
	dir := os.Getenv("RDMAGO_FAULT_TABLE_DIR")
	if dir == "" || t.Failed() {
		return
	}
	text := fmt.Sprintf("%s\n%s\nWritten by `make test` on %s.\n", md, intro, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
		t.Errorf("keeping the fault table: %v", err)
	}
}

// leaksSince says what this process holds beyond s ("none"), after giving
// closed connections' goroutines up to 5 s to exit.
func leaksSince(s testbed.Snapshot) string {
	if leaks := testbed.LeaksSince(s, 5*time.Second); leaks != nil {
		return strings.Join(leaks, ", ")
	}
	return "none"
}

// payload is message i of a stream: its number, then bytes that depend on
// it, of a length that varies up to max.
func payload(i, max int) []byte {
	n := 8 + (i*7919)%(max-7)
	b := make([]byte, n)
	binary.BigEndian.PutUint64(b, uint64(i))
	for j := 8; j < n; j++ {
		b[j] = byte(i + j)
	}
	return b
}
