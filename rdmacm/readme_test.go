package rdmacm

import (
	"testing"

	"github.com/rdmago/rdmago/internal/readmecheck"
)

// The README shows the example that TestREADMEExample runs on rxe and siw,
// word for word.
func TestREADMEShowsTheTestedExample(t *testing.T) {
	readmecheck.Shows(t, "../README.md", "readme_example_test.go")
}
