package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The C tools, their libraries and the test bed's helpers come from the
// host's root over 9p. In the cost-model guest a page fetched from the host
// is time the guest spends idle, and with -icount sleep=off idle time jumps
// the clock to the next timer: a tool's first start can take tens of
// seconds of guest time, and every timeout in the guest runs out early.
// warm reads each file once, so that the guest's page cache (the root is
// mounted with a lasting one) holds it before anything is timed, as a local
// disk's would after the first run.
var warmTools = []string{
	"cmtime", "ib_send_lat", "ib_send_bw", "ib_write_bw", "perf", "rdma", "ip",
}

func warm() error {
	files := map[string]bool{}
	for _, t := range warmTools {
		path, err := exec.LookPath(t)
		if err != nil {
			return fmt.Errorf("warming the page cache: %w", err)
		}
		files[path] = true
		// ldd lists the shared libraries it loads: "name => /path (addr)".
		out, err := exec.Command("ldd", path).Output()
		if err != nil {
			return fmt.Errorf("warming the page cache: ldd %s: %w", path, err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			for _, f := range strings.Fields(l) {
				if strings.HasPrefix(f, "/") {
					files[f] = true
				}
			}
		}
	}
	// libibverbs loads its providers by name at run time.
	providers, _ := filepath.Glob("/usr/lib/*/libibverbs/*.so")
	for _, p := range providers {
		files[p] = true
	}
	for f := range files {
		if err := readAll(f); err != nil {
			return fmt.Errorf("warming the page cache: %w", err)
		}
	}
	return nil
}

func readAll(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(io.Discard, f)
	return err
}
