// Package command is the main function the examples share: run with the
// arguments and standard output, interrupted by SIGINT or SIGTERM through
// the context, and exit 1 with the error on standard error.
package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Main runs run and exits the process if it fails. The first SIGINT or
// SIGTERM ends ctx; a second one ends the process, as without a handler.
// -h prints the usage and exits 0.
func Main(name string, run func(ctx context.Context, args []string, out io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}
