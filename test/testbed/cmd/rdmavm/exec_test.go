//go:build testbed

package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A program that exits 0 while the guest's kernel reports a warning fails
// the run, and the report is printed whole: a pass beside a kernel defect
// is not a pass.
func TestExecFailsOnAKernelReport(t *testing.T) {
	dir := t.TempDir()
	rdmavm := buildRdmavm(t, dir)
	script := writeScript(t, dir, "warn.sh", warnScript)
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

// warnScript makes the guest's kernel log a warning, and exits 0.
const warnScript = "echo '------------[ cut here ]------------' > /dev/kmsg\n" +
	"echo 'WARNING: CPU: 0 PID: 1 at injected.c:7 injected_by_a_test+0x0/0x0' > /dev/kmsg\n" +
	"echo '---[ end trace 0000000000000000 ]---' > /dev/kmsg\n" +
	"echo the program itself passed\n"

// A session boots one guest for the execs under it. Each still gets its own
// exit status and its own kernel reports; one that leaves the guest changed
// fails, after a failure the next exec gets a new guest, and a guest that
// dies after an exec passed fails the next, or the session after its last.
func TestSessionSharesOneGuest(t *testing.T) {
	dir := t.TempDir()
	rdmavm := buildRdmavm(t, dir)
	writeScript(t, dir, "id.sh", "echo boot $(cat /proc/sys/kernel/random/boot_id)\nexit $1\n")
	// Passes, and crashes the guest's kernel a moment later: after the
	// session has judged the guest (its state check takes about a second
	// when the host is busy), before the next exec.
	writeScript(t, dir, "crash.sh", "setsid sh -c 'sleep 2; echo c > /proc/sysrq-trigger' >/dev/null 2>&1 &\n")
	// Both at once, which the session reports both of: one guest fewer to boot.
	writeScript(t, dir, "warnchange.sh", "ip addr add 10.99.0.1/24 dev lo && ip -n siw-a route add 10.98.0.0/24 dev veth-siwa\n"+warnScript)
	var stdout, stderr bytes.Buffer
	// The programs go where the session's guest sees the host's files as
	// they are (GOTMPDIR, which the session sets): from elsewhere, exec
	// boots a guest of its own.
	cmd := exec.Command(rdmavm, "session", "sh", "-c",
		`cp "$1"/*.sh "$GOTMPDIR" && cd "$GOTMPDIR" || exit 8; `+
			`"$0" exec ./id.sh 0 || exit 9; "$0" exec ./id.sh 0 || exit 9; "$0" exec ./crash.sh || exit 9; sleep 6; `+
			`"$0" exec ./id.sh 3; echo id=$?; "$0" exec ./warnchange.sh; echo warnchange=$?; `+
			`"$0" exec "$1"/id.sh 0; exit 4`,
		rdmavm, dir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 4 {
		t.Fatalf("rdmavm session: %v, want the command's exit status 4\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	var boots []string
	for _, line := range strings.Split(stdout.String(), "\n") {
		if strings.HasPrefix(line, "boot ") {
			boots = append(boots, line)
		}
	}
	// One guest for the first three, which crash.sh crashed; id.sh 3 has
	// another. The last id.sh, outside the session's directories, has a
	// guest of its own.
	if len(boots) != 4 || boots[0] != boots[1] || boots[1] == boots[2] || boots[3] == boots[2] {
		t.Errorf("want one guest's boot id twice, then two others, got %q", boots)
	}
	// A (id, id, crash), B (id 3), C (warnchange), D (the last).
	if n := strings.Count(stderr.String(), "booting guest"); n != 4 {
		t.Errorf("%d boots, want 4:\n%s", n, &stderr)
	}
	for _, want := range []string{
		"a new guest for id.sh (the last: died after its last command",
		"failing id.sh: the session's guest died after the command before it had passed",
		"a new guest for warnchange.sh (the last: id.sh failed in it)",
		"warnchange.sh exited 0, but the guest's kernel reported 1 problem(s)",
		"warnchange.sh left the session's guest changed",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("want %q in:\n%s", want, &stderr)
		}
	}
	for _, want := range []string{"id=3", "warnchange=1"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("want %q (each exec's own exit status) in:\n%s", want, &stdout)
		}
	}
	if n := strings.Count(stderr.String(), "injected.c:7"); n != 1 {
		t.Errorf("the injected warning shows %d times, want once (in warnchange.sh's report):\n%s", n, &stderr)
	}
	if !regexp.MustCompile(`(?m)^\+ lo .*10\.99\.0\.1/24`).MatchString(stderr.String()) {
		t.Errorf("want warnchange.sh's address in its report:\n%s", &stderr)
	}
	if !regexp.MustCompile(`(?m)^\+ siw-a: 10\.98\.0\.0/24 dev veth-siwa`).MatchString(stderr.String()) {
		t.Errorf("want warnchange.sh's route, in namespace siw-a, in its report:\n%s", &stderr)
	}

	// A guest that dies after the last exec passed fails the session.
	stdout.Reset()
	stderr.Reset()
	cmd = exec.Command(rdmavm, "session", "sh", "-c",
		`cp "$1"/crash.sh "$GOTMPDIR" && cd "$GOTMPDIR" || exit 8; "$0" exec ./crash.sh || exit 9; sleep 6`,
		rdmavm, dir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if !errors.As(err, &exit) || exit.ExitCode() != 1 ||
		!strings.Contains(stderr.String(), "the guest died after its last command had passed") {
		t.Errorf("rdmavm session with a crash after its last exec: %v, want exit status 1 saying why\nstderr:\n%s",
			err, &stderr)
	}
}

func buildRdmavm(t *testing.T, dir string) string {
	t.Helper()
	rdmavm := filepath.Join(dir, "rdmavm")
	if out, err := exec.Command("go", "build", "-o", rdmavm, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return rdmavm
}

func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}
