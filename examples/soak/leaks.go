package main

import (
	"fmt"
	"os"
	"reflect"
	"time"

	"github.com/rdmago/rdmago/test/testbed"
)

// snapshot is what a process holds before the soak: its RDMA objects, file
// descriptors and goroutines.
type snapshot struct {
	objects    map[string]int
	fds        int
	goroutines int
}

func takeSnapshot() (snapshot, error) {
	objects, err := testbed.Objects()
	if err != nil {
		return snapshot{}, err
	}
	fds, err := openFDs()
	if err != nil {
		return snapshot{}, err
	}
	return snapshot{objects, fds, len(testbed.Goroutines())}, nil
}

func openFDs() (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	return len(ents), err
}

// leaksSince lists what the process holds beyond s, waiting up to wait for
// goroutines of closed connections to exit (and their objects to go).
func leaksSince(s snapshot, wait time.Duration) []string {
	deadline := time.Now().Add(wait)
	for {
		var leaks []string
		objects, err := testbed.Objects()
		switch {
		case err != nil:
			leaks = append(leaks, fmt.Sprintf("counting RDMA objects: %v", err))
		case !reflect.DeepEqual(objects, s.objects):
			leaks = append(leaks, fmt.Sprintf("RDMA objects %v, %v before", objects, s.objects))
		}
		if n, err := openFDs(); err != nil || n != s.fds {
			leaks = append(leaks, fmt.Sprintf("file descriptors %d, %d before (%v)", n, s.fds, err))
		}
		if n := len(testbed.Goroutines()); n > s.goroutines {
			leaks = append(leaks, fmt.Sprintf("goroutines %d, %d before", n, s.goroutines))
		}
		if len(leaks) == 0 || time.Now().After(deadline) {
			return leaks
		}
		time.Sleep(100 * time.Millisecond)
	}
}
