// Command bench runs inside a test bed guest (make bench) and measures
// rdmago's examples against rdma-core's and perftest's C tools, side by
// side in the same boot: connection setup per step (cmtime), many
// concurrent connections, send/recv latency (ib_send_lat), RDMA WRITE
// bandwidth (ib_write_bw), and cgo crossings per batch. perftest connects
// over rdma_cm (-R), as our examples do, on rxe and on siw. Each
// figure is the median of several rounds; the report goes to a Markdown
// file, and CPU profiles of the Go side go next to it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	bin := flag.String("bin", "bin", "directory of the built examples (cmtime, pingpong) and rdmacm.test")
	out := flag.String("out", "bench/results.md", "where to write the report")
	rounds := flag.Int("rounds", 3, "rounds per measurement (the median is reported)")
	flag.Parse()
	// A thousand connections hold two descriptors each (their CQ
	// channels) on either side; the guest runs us as root, so the hard
	// limit can be raised too.
	lim := unix.Rlimit{Cur: 1 << 16, Max: 1 << 16}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		fmt.Fprintln(os.Stderr, "bench: raising the descriptor limit:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	b := &bench{bin: *bin, rounds: *rounds, profiles: filepath.Join(filepath.Dir(*out), "profiles")}
	if err := os.MkdirAll(b.profiles, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	report, err := b.run(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, []byte(report), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	fmt.Print(report)
}
