// Package readmecheck holds a README to the code its tests run: the code
// between a test file's "// README begin" and "// README end" markers must
// appear in the README as a Go code block, word for word.
package readmecheck

import (
	"bytes"
	"os"
	"testing"
)

// Shows fails t unless readme shows, as a Go code block, the code marked
// in the test file src.
func Shows(t testing.TB, readme, src string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := bytes.Cut(b, []byte("// README begin\n"))
	code, _, ok2 := bytes.Cut(rest, []byte("\n// README end"))
	if !ok || !ok2 {
		t.Fatalf("%s lost its README markers", src)
	}
	r, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	block := append(append([]byte("```go\n"), bytes.TrimSpace(code)...), "\n```"...)
	if !bytes.Contains(r, block) {
		t.Fatalf("%s does not show the tested example of %s; its code block must be:\n%s", readme, src, block)
	}
}
