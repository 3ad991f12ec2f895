package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func writeConsole(t *testing.T, lines []string) *Guest {
	t.Helper()
	g := &Guest{tmp: t.TempDir()}
	require.NoError(t, os.WriteFile(filepath.Join(g.tmp, "console.log"), []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	return g
}

func numbered(prefix string, n int) []string {
	var l []string
	for i := range n {
		l = append(l, fmt.Sprintf("%s %d", prefix, i))
	}
	return l
}

// A panic whose call trace is longer than the tail keeps its headline.
func TestConsoleTailKeepsThePanicHeadline(t *testing.T) {
	lines := append(numbered("boot", 100), "Kernel panic - not syncing: sysrq triggered crash")
	lines = append(lines, numbered("trace", 45)...)
	tail := writeConsole(t, lines).consoleTail(40)
	assert.Contains(t, tail, "(last 46 lines)")
	assert.Contains(t, tail, "---\nKernel panic - not syncing")
	assert.NotContains(t, tail, "boot 99")
	assert.Contains(t, tail, "trace 44\n--- end")
}

// Without a panic, or with one too far back, the tail is n lines.
func TestConsoleTailIsNLines(t *testing.T) {
	tail := writeConsole(t, numbered("line", 100)).consoleTail(40)
	assert.Contains(t, tail, "(last 40 lines)")
	assert.Contains(t, tail, "---\nline 60\n")

	old := append([]string{"BUG: an old one"}, numbered("later", maxPanicLines+10)...)
	tail = writeConsole(t, old).consoleTail(40)
	assert.Contains(t, tail, "(last 40 lines)")
	assert.NotContains(t, tail, "BUG:")

	short := writeConsole(t, numbered("line", 5)).consoleTail(40)
	assert.Contains(t, short, "(last 5 lines)")
}

// An oops (a list corruption's report, here) opens rdmavm's kernel log
// tail, from its "cut here" line, though its trace is longer than the tail.
func TestKernelLogTailKeepsTheOops(t *testing.T) {
	lines := append(numbered("boot", 100), "------------[ cut here ]------------",
		"list_del corruption. prev->next should be ffff888006fe3400, but was dead000000000100", "kernel BUG at lib/list_debug.c:53!")
	lines = append(lines, numbered("trace", 60)...)
	tail := KernelLogTail(strings.Join(lines, "\n")+"\n", 40)
	assert.Contains(t, tail, "(last 63 lines) ---\n------------[ cut here ]")
	assert.Contains(t, tail, "list_del corruption")
	assert.NotContains(t, tail, "boot 99")
	assert.Contains(t, tail, "trace 59\n--- end of guest kernel log ---\n")

	plain := KernelLogTail(strings.Join(numbered("line", 100), "\n"), 40)
	assert.Contains(t, plain, "(last 40 lines) ---\nline 60\n")
}

// A command that a crashed guest was running fails with the console's
// tail, once, and says the guest was lost (rdmavm then adds no kernel log).
// dmesg cannot run in such a guest: its kernel log is the console.
func TestACrashedGuestsConsoleIsReportedOnce(t *testing.T) {
	g := writeConsole(t, append(numbered("boot", 100), "Kernel panic - not syncing: Fatal exception"))
	g.Topology, g.cmds = &Topology{Role: "single"}, map[uint64]*Cmd{}
	cmd := g.Command(context.Background(), "sleep", "60")
	cmd.id = 1
	g.cmds[1] = cmd
	g.lost(errors.New("EOF"))
	err := cmd.Wait()
	var exit *ExitError
	require.ErrorAs(t, err, &exit)
	assert.True(t, exit.GuestLost)
	assert.Equal(t, 1, strings.Count(err.Error(), "Kernel panic - not syncing"), err.Error())

	report := KernelLogTail(g.KernelLog(context.Background()), 40)
	assert.Equal(t, 1, strings.Count(report, "--- guest kernel log"), report)
	assert.NotContains(t, report, "--- guest console")
	assert.Contains(t, report, "Kernel panic - not syncing: Fatal exception\n--- end of guest kernel log ---\n")
}

// A passing run's kernel log is searched for the kernel's reports: each is
// returned whole, from its headline to its end-trace line, and a clean log
// gives none.
func TestKernelReportsFindsEachReport(t *testing.T) {
	assert.Empty(t, KernelReports(strings.Join(numbered("[    1.000000] siw: line", 50), "\n")))

	warn := []string{"[   12.1] ------------[ cut here ]------------",
		"[   12.1] WARNING: CPU: 0 PID: 311 at drivers/infiniband/sw/siw/siw_qp.c:1234 siw_qp_modify+0x10/0x20 [siw]",
		"[   12.1] Call Trace:", "[   12.1]  <TASK>", "[   12.1]  </TASK>", "[   12.1] ---[ end trace 0000000000000000 ]---"}
	hung := "[  250.0] INFO: task soak:412 blocked for more than 120 seconds."
	lines := append(numbered("before", 10), warn...)
	lines = append(lines, "after the warning")
	lines = append(lines, hung)
	lines = append(lines, numbered("trace", maxReportLines+5)...)
	reports := KernelReports(strings.Join(lines, "\n"))
	require.Len(t, reports, 2)
	assert.Equal(t, strings.Join(warn, "\n"), reports[0], "one report from cut here to end trace, WARNING inside it")
	assert.True(t, strings.HasPrefix(reports[1], hung), reports[1])
	assert.Len(t, strings.Split(reports[1], "\n"), maxReportLines, "a report without an end trace is bounded")
}
