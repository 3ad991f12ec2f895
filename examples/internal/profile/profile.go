// Package profile gives the examples a -cpuprofile flag, so that a
// benchmark that misses its target can say where the time went.
package profile

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
)

// Flag adds -cpuprofile to fs.
func Flag(fs *flag.FlagSet) *string {
	return fs.String("cpuprofile", "", "write a CPU profile (go tool pprof format) to `file`")
}

// Run runs f with the process's CPU profile written to path; with an empty
// path it just runs f. An error closing the profile joins f's.
func Run(path string, f func() error) (err error) {
	if path == "" {
		return f()
	}
	file, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(file); err != nil {
		file.Close()
		return fmt.Errorf("cpu profile %s: %w", path, err)
	}
	defer func() {
		pprof.StopCPUProfile()
		if cerr := file.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cpu profile %s: %w", path, cerr))
		}
	}()
	return f()
}
