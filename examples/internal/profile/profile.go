// Package profile gives the examples a -cpuprofile flag, so that a
// benchmark that misses its target can say where the time went.
package profile

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
)

// Flag adds -cpuprofile to fs.
func Flag(fs *flag.FlagSet) *string {
	return fs.String("cpuprofile", "", "write a CPU profile (go tool pprof format) to `file`")
}

// Start profiles the process into path until stop is called; with an
// empty path it does nothing.
func Start(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile %s: %w", path, err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("cpu profile %s: %w", path, err)
		}
		return nil
	}, nil
}
