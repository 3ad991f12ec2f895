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
	rounds := flag.Int("rounds", 5, "rounds per measurement (the median is reported)")
	costModel := flag.Bool("cost-model", false, "this guest is a cost-model one (rdmavm exec -cost-model): measure in event mode")
	appendTo := flag.Bool("append", false, "append the report to -out instead of replacing it")
	only := flag.String("only", "", "measure only these sections, comma-separated (setup, many, latency, bandwidth, streams, gobench); for A/B runs while closing a gap")
	flag.Parse()
	if err := benchmark(*bin, *out, *rounds, *costModel, *appendTo, *only); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// benchmark measures, writes the report to out and prints it. The copies of the
// Go tools go away on every path.
func benchmark(bin, out string, rounds int, costModel, appendTo bool, only string) error {
	// A thousand connections hold two descriptors each (their CQ
	// channels) on either side; the guest runs us as root, so the hard
	// limit can be raised too.
	lim := unix.Rlimit{Cur: 1 << 16, Max: 1 << 16}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("raising the descriptor limit: %w", err)
	}
	if costModel {
		if err := warm(); err != nil {
			return err
		}
	}
	// The guest's time: in the cost model it runs ahead of the host's
	// while the guest waits for the host (see startWithin).
	limit := 45 * time.Minute
	if costModel {
		limit = 6 * time.Hour
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	local, err := localCopies(bin, "cmtime", "pingpong", "streambench", "rdmacm.bench.test")
	if err != nil {
		return err
	}
	defer os.RemoveAll(local)
	b := &bench{bin: local, rounds: rounds, profiles: filepath.Join(filepath.Dir(out), "profiles"), costModel: costModel, only: only}
	if err := os.MkdirAll(b.profiles, 0o755); err != nil {
		return err
	}
	report, err := b.run(ctx)
	if err != nil {
		return err
	}
	if appendTo {
		before, err := os.ReadFile(out)
		if err != nil {
			return fmt.Errorf("appending to the report: %w", err)
		}
		report = string(before) + "\n" + report
	}
	if err := os.WriteFile(out, []byte(report), 0o644); err != nil {
		return err
	}
	fmt.Print(report)
	return nil
}

// localCopies copies the Go tools into a new directory on the guest's
// tmpfs and returns it. The guest reads the C tools from the host's root,
// mounted with a cache that outlives each process, but our work tree (where
// the Go tools are built) without one: a fresh Go process would fetch its
// binary's pages from the host over 9p at each first touch, inside the
// timed steps. Copies in memory load as the C tools do, and as binaries
// on a local disk would on a real machine.
func localCopies(dir string, names ...string) (string, error) {
	tmp, err := os.MkdirTemp("", "rdmago-bench-")
	if err != nil {
		return "", err
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err == nil {
			err = os.WriteFile(filepath.Join(tmp, n), b, 0o755)
		}
		if err != nil {
			os.RemoveAll(tmp)
			return "", fmt.Errorf("copying the Go tools out of the work tree: %w", err)
		}
	}
	return tmp, nil
}
