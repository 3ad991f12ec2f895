package stream

import (
	"testing"

	"github.com/rdmago/rdmago/internal/readmecheck"
)

// The README shows the net.Conn example that TestREADMEStreamExample runs
// on rxe and siw, word for word.
func TestREADMEShowsTheTestedStreamExample(t *testing.T) {
	readmecheck.Shows(t, "../../README.md", "readme_example_test.go")
}
