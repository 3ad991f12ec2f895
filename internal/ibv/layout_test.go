//go:build linux && cgo

package ibv

import "testing"

// The descriptors Go fills in C memory, and the completions C writes into
// Go memory, are laid out field for field as their C structs.
func TestGoDescriptorsMatchC(t *testing.T) {
	if bad := layoutMismatch(); bad != "" {
		t.Fatal(bad)
	}
}
