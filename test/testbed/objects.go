package testbed

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// ObjectKinds are the RDMA objects Objects counts.
var ObjectKinds = []string{"cm_id", "qp", "cq", "mr", "pd"}

// Objects counts, inside a guest, the RDMA objects of each kind that this
// process holds, as 'rdma resource show' lists them. The kernel names an
// object's owner by the thread that made it, not the process: a Go program
// makes them on whichever thread its goroutine ran, so every thread of the
// process counts.
func Objects() (map[string]int, error) {
	tids, err := threadIDs()
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	for _, kind := range ObjectKinds {
		out, err := exec.Command("rdma", "resource", "show", kind).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("testbed: rdma resource show %s: %w: %s", kind, err, out)
		}
		if n := countOwned(string(out), tids); n > 0 {
			counts[kind] = n
		}
	}
	return counts, nil
}

// threadIDs lists this process's threads.
func threadIDs() (map[int]bool, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("testbed: listing this process's threads: %w", err)
	}
	tids := map[int]bool{}
	for _, e := range ents {
		if id, err := strconv.Atoi(e.Name()); err == nil {
			tids[id] = true
		}
	}
	return tids, nil
}

// countOwned counts the lines of 'rdma resource show' output whose "pid"
// is one of tids. Objects the kernel owns have no pid.
func countOwned(out string, tids map[int]bool) int {
	n := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "pid" {
				if id, err := strconv.Atoi(f[i+1]); err == nil && tids[id] {
					n++
				}
				break
			}
		}
	}
	return n
}

// RegisteredBytes sums, inside a guest, the lengths of the memory regions
// this process holds (every thread's), as 'rdma resource show mr' lists
// them.
func RegisteredBytes() (int, error) {
	tids, err := threadIDs()
	if err != nil {
		return 0, err
	}
	out, err := exec.Command("rdma", "resource", "show", "mr").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("testbed: rdma resource show mr: %w: %s", err, out)
	}
	return sumOwned(string(out), "mrlen", tids), nil
}

// sumOwned sums the field named key of the lines of 'rdma resource show'
// output whose "pid" is one of tids.
func sumOwned(out, key string, tids map[int]bool) int {
	sum := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		owned, v := false, 0
		for i := 0; i+1 < len(f); i++ {
			switch f[i] {
			case "pid":
				if id, err := strconv.Atoi(f[i+1]); err == nil && tids[id] {
					owned = true
				}
			case key:
				v, _ = strconv.Atoi(f[i+1])
			}
		}
		if owned {
			sum += v
		}
	}
	return sum
}
