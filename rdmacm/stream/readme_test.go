package stream

import (
	"bytes"
	"os"
	"testing"
)

// The README shows the net.Conn example that TestREADMEStreamExample runs
// on rxe and siw, word for word.
func TestREADMEShowsTheTestedStreamExample(t *testing.T) {
	src, err := os.ReadFile("readme_example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := bytes.Cut(src, []byte("// README begin\n"))
	code, _, ok2 := bytes.Cut(rest, []byte("\n// README end"))
	if !ok || !ok2 {
		t.Fatal("readme_example_test.go lost its README markers")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := append(append([]byte("```go\n"), bytes.TrimSpace(code)...), "\n```"...)
	if !bytes.Contains(readme, block) {
		t.Fatalf("README.md does not show the tested example; its code block must be:\n%s", block)
	}
}
