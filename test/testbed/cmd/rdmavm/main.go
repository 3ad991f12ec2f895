// Command rdmavm runs commands against real Soft-RoCE (rxe) and Soft-iWARP
// (siw) devices in a qemu guest, on hosts whose kernel has no RDMA.
//
//	rdmavm prepare                            fetch and build the guest kernel, siw and initramfs
//	rdmavm exec [-cost-model] PROGRAM [ARGS...]  run PROGRAM in a fresh guest (or the session's); exit with its status
//	rdmavm shell [-cost-model]                    a shell in a guest, for debugging
//	rdmavm session COMMAND [ARGS...]              run COMMAND on the host; its rdmavm execs share one guest
//
// exec is shaped for go test:
//
//	go test -exec "$(go env GOPATH)/bin/rdmavm exec" -tags integration ./...
//
// builds the test binaries on the host and runs each in a guest of its own. The
// guest's topology is in /run/rdmago/topology.json (package testbed reads it).
// When the program fails, the guest's kernel log is printed after its output.
//
// session boots one guest for a whole run of go test (about 7 s saved per
// package under emulation): the rdmavm exec commands started under COMMAND
// find the session in their environment and run in its guest, one at a
// time, each a process of its own as before and judged only by what the
// guest's kernel reported since the one before. One that leaves the guest's
// links, addresses, routes or RDMA devices changed fails, and after a failure the
// next gets a new guest. A crash or kernel report after a command passed
// fails the next one, or the session after its last. make test runs its
// single-guest packages that way:
//
//	rdmavm session go test -exec "rdmavm exec" -tags integration ./...
//
// -cost-model boots the guest whose clock counts instructions (one vCPU,
// qemu's -icount; see testbed.Options.CostModel), for timings that repeat,
// and runs a copy of PROGRAM from the guest's memory, so that no page of it
// is fetched from the host inside a timed step:
//
//	go test -exec "rdmavm exec -cost-model" -tags integration -bench . ./rdmacm
//
// Environment: RDMAGO_TESTBED_CACHE (where assets are cached),
// RDMAGO_TESTBED_ACCEL (kvm or tcg, to skip the KVM probe).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rdmago/rdmago/test/testbed"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop) // a second signal ends rdmavm at once
	var opts testbed.Options
	var err error
	code := 0
	switch os.Args[1] {
	case "prepare":
		_, err = testbed.Prepare(ctx, opts)
	case "exec":
		args := guestFlags(&opts, os.Args[2:])
		if len(args) == 0 {
			usage()
		}
		code, err = execInGuest(ctx, opts, args)
	case "shell":
		if len(guestFlags(&opts, os.Args[2:])) > 0 {
			usage()
		}
		err = testbed.Shell(ctx, opts)
	case "session":
		if len(os.Args) < 3 {
			usage()
		}
		code, err = runSession(ctx, opts, os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rdmavm:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: rdmavm prepare | exec [-cost-model] PROGRAM [ARGS...] | shell [-cost-model] | session COMMAND [ARGS...]")
	os.Exit(2)
}

// guestFlags reads the flags that choose the guest, up to the program's
// name, and returns what follows them.
func guestFlags(opts *testbed.Options, args []string) []string {
	fs := flag.NewFlagSet("rdmavm", flag.ExitOnError)
	fs.BoolVar(&opts.CostModel, "cost-model", false, "count instructions as the guest's time (one vCPU)")
	fs.IntVar(&opts.CPUs, "cpus", 0, "vCPUs (default 2, or 1 with -cost-model)")
	fs.Usage = usage
	_ = fs.Parse(args) // ExitOnError
	return fs.Args()
}

func execInGuest(ctx context.Context, opts testbed.Options, argv []string) (int, error) {
	prog := argv[0]
	if strings.Contains(prog, "/") {
		abs, err := filepath.Abs(prog)
		if err != nil {
			return 0, err
		}
		prog = abs
		// go test writes the test log and coverage next to its *.test
		// binary: let the guest write there too.
		opts.Writable = append(opts.Writable, testbed.WorkDir())
		if dir := filepath.Dir(prog); strings.HasSuffix(prog, ".test") && !under(dir, opts.Writable[0]) {
			opts.Writable = append(opts.Writable, dir)
		}
	}
	argv = append([]string{prog}, argv[1:]...)
	if sock, ok := sessionFor(opts, prog); ok {
		return execInSession(ctx, sock, argv)
	}
	g, err := testbed.Boot(ctx, opts)
	if err != nil {
		return 0, err
	}
	defer g.Close()
	if opts.CostModel && strings.Contains(prog, "/") {
		if argv[0], err = copyIntoGuest(ctx, g, prog); err != nil {
			return 0, err
		}
	}
	err = run(ctx, g, argv, nil, "", os.Stdout, os.Stderr)
	logCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, _ := judge(err, argv[0], g.KernelLog(logCtx), os.Stderr)
	return code, nil
}

// run runs argv in g, with the host's environment and directory unless
// env and dir say otherwise.
func run(ctx context.Context, g *testbed.Guest, argv, env []string, dir string, stdout, stderr io.Writer) error {
	cmd := g.Command(ctx, argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = env, dir
	cmd.Stdout, cmd.Stderr = stdout, stderr
	return cmd.Run()
}

// judge turns how prog ended in the guest (run's error) into rdmavm's exit
// status, and tells whether the guest was lost under it. A failure is
// followed by the guest's kernel log; a success while the kernel reported
// a problem is a failure.
func judge(err error, prog, log string, stderr io.Writer) (code int, lost bool) {
	var exit *testbed.ExitError
	if errors.As(err, &exit) {
		fmt.Fprintf(stderr, "rdmavm: %v\n", err)
		switch {
		case exit.GuestLost: // the error ends with the console's tail
		case strings.TrimSpace(log) == "":
			fmt.Fprintln(stderr, "rdmavm: the guest's kernel logged nothing while it ran")
		default:
			fmt.Fprint(stderr, testbed.KernelLogTail(log, 40))
		}
		return max(exit.Code, 1), exit.GuestLost
	}
	if err != nil { // it did not start: the guest is gone
		fmt.Fprintf(stderr, "rdmavm: %v\n", err)
		return 1, true
	}
	if reports := testbed.KernelReports(log); len(reports) > 0 {
		fmt.Fprintf(stderr, "rdmavm: %s exited 0, but the guest's kernel reported %d problem(s) while it ran; "+
			"failing the run, since a pass beside a kernel bug or warning proves little:\n", filepath.Base(prog), len(reports))
		for _, r := range reports {
			fmt.Fprintf(stderr, "--- guest kernel report ---\n%s\n--- end of guest kernel report ---\n", r)
		}
		return 1, false
	}
	return 0, false
}

// copyIntoGuest copies prog into the guest's memory (its /tmp is on the
// tmpfs overlay) and returns the copy's path. Run from the host's 9p mount,
// a program's first touch of each page waits for the host, and under the
// cost model that wait lands, at random, inside whatever is being timed.
func copyIntoGuest(ctx context.Context, g *testbed.Guest, prog string) (string, error) {
	dst := filepath.Join("/tmp/rdmavm-exec", filepath.Base(prog))
	out, err := g.Command(ctx, "/bin/sh", "-c", `mkdir -p "$(dirname "$2")" && cp "$1" "$2"`, "sh", prog, dst).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("copying %s into the guest's memory: %v: %s", prog, err, out)
	}
	return dst, nil
}

func under(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && !strings.HasPrefix(rel, "..")
}
