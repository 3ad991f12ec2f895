// Command rdmavm runs commands against real Soft-RoCE (rxe) and Soft-iWARP
// (siw) devices in a qemu guest, on hosts whose kernel has no RDMA.
//
//	rdmavm prepare                 fetch and build the guest kernel, siw and initramfs
//	rdmavm exec PROGRAM [ARGS...]  run PROGRAM in a fresh guest; exit with its status
//	rdmavm shell                   a shell in a guest, for debugging
//
// exec is shaped for go test:
//
//	go test -exec "$(go env GOPATH)/bin/rdmavm exec" -tags integration ./...
//
// builds the test binaries on the host and runs each in its own guest. The
// guest's topology is in /run/rdmago/topology.json (package testbed reads it).
// When the program fails, the guest's kernel log is printed after its output.
//
// Environment: RDMAGO_TESTBED_CACHE (where assets are cached),
// RDMAGO_TESTBED_ACCEL (kvm or tcg, to skip the KVM probe).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/rdmago/rdmago/test/testbed"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var opts testbed.Options
	var err error
	code := 0
	switch os.Args[1] {
	case "prepare":
		_, err = testbed.Prepare(ctx, opts)
	case "exec":
		if len(os.Args) < 3 {
			usage()
		}
		code, err = execInGuest(ctx, opts, os.Args[2:])
	case "shell":
		err = testbed.Shell(ctx, opts)
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
	fmt.Fprintln(os.Stderr, "usage: rdmavm prepare | exec PROGRAM [ARGS...] | shell")
	os.Exit(2)
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
	g, err := testbed.Boot(ctx, opts)
	if err != nil {
		return 0, err
	}
	defer g.Close()
	cmd := g.Command(ctx, prog, argv[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err = cmd.Run()
	var exit *testbed.ExitError
	if errors.As(err, &exit) {
		fmt.Fprintf(os.Stderr, "rdmavm: %v\n--- guest kernel log (last 40 lines) ---\n%s--- end of guest kernel log ---\n",
			err, lastLines(g.KernelLog(context.Background()), 40))
		if exit.Code > 0 {
			return exit.Code, nil
		}
		return 1, nil
	}
	return 0, err
}

func under(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && !strings.HasPrefix(rel, "..")
}

func lastLines(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}
