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

// librxe's structs are read only where they are rdma-core 44's: the
// release comes from the name of the libibverbs file the process loaded.
func TestRDMACoreRelease(t *testing.T) {
	for name, want := range map[string]int{
		"/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0": 44,
		"libibverbs.so.1.14.39.0":                           39,
		"/usr/lib64/libibverbs.so.1.14.56.0":                56,
		"/usr/lib/x86_64-linux-gnu/libibverbs.so.1":         -1, // a link not resolved
		"libibverbs.so.1.14":                                -1,
		"libibverbs.so.1.14.x.0":                            -1,
		"librxe-rdmav34.so":                                 -1,
	} {
		if got := rdmaCoreRelease(name); got != want {
			t.Errorf("rdmaCoreRelease(%q) = %d, want %d", name, got, want)
		}
	}
	path := ibverbsPath()
	release := rdmaCoreRelease(path)
	t.Logf("libibverbs: %q (rdma-core %d); headers of rdma-core 44's layout: %v; rxe's Go path: %v",
		path, release, rxeLayout44(), rxeUsable())
	if release < 17 { // the first release with this file naming
		t.Fatalf("%q: no rdma-core release in the name of the loaded libibverbs", path)
	}
	if want := release == 44 && rxeLayout44(); rxeUsable() != want {
		t.Errorf("rxeUsable() = %v with rdma-core %d", rxeUsable(), release)
	}
}
