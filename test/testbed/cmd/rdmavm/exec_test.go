//go:build testbed

package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A program that exits 0 while the guest's kernel reports a warning fails
// the run, and the report is printed whole: a pass beside a kernel defect
// is not a pass.
func TestExecFailsOnAKernelReport(t *testing.T) {
	dir := t.TempDir()
	rdmavm := filepath.Join(dir, "rdmavm")
	if out, err := exec.Command("go", "build", "-o", rdmavm, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	script := filepath.Join(dir, "warn.sh")
	body := "#!/bin/sh\n" +
		"echo '------------[ cut here ]------------' > /dev/kmsg\n" +
		"echo 'WARNING: CPU: 0 PID: 1 at injected.c:7 injected_by_a_test+0x0/0x0' > /dev/kmsg\n" +
		"echo '---[ end trace 0000000000000000 ]---' > /dev/kmsg\n" +
		"echo the program itself passed\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(rdmavm, "exec", script)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("rdmavm exec: %v, want exit status 1\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	if !strings.Contains(stdout.String(), "the program itself passed") {
		t.Errorf("the program's output is missing: %q", stdout.String())
	}
	for _, want := range []string{"warn.sh exited 0, but the guest's kernel reported 1 problem(s)",
		"--- guest kernel report ---", "WARNING: CPU: 0 PID: 1 at injected.c:7", "---[ end trace"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("want %q in rdmavm's report:\n%s", want, &stderr)
		}
	}
}
