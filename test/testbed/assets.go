package testbed

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The guest's scripts travel inside every binary that imports this package,
// so the test bed works from the module cache in other projects too.
//
//go:embed vm/prepare.sh vm/init vm/stage2
var scripts embed.FS

// Assets are the prepared guest files.
type Assets struct {
	Dir     string // kernel-specific directory: vmlinux, initramfs.cpio.gz, modules/
	Scripts string // stage-two script and friends, readable by the guest
	Kernel  string // guest kernel release, e.g. 6.1.0-56-amd64
	Accel   string // "kvm" or "tcg"
}

// Prepare makes sure the guest kernel, the siw module and the initramfs are
// in the cache, building what is missing (the first run downloads about
// 220 MB of Debian packages and takes about a minute), and decides between
// KVM and emulation. It reports progress to opts.Progress.
func Prepare(ctx context.Context, opts Options) (*Assets, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Cache, 0o755); err != nil {
		return nil, fmt.Errorf("testbed: cache: %w", err)
	}
	scriptDir := filepath.Join(o.Cache, "scripts")
	if err := writeScripts(scriptDir); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(scriptDir, "prepare.sh"), o.Cache)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = o.progress()
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("testbed: preparing guest assets in %s failed: %w (see the messages above)", o.Cache, err)
	}
	dir := strings.TrimSpace(out.String())
	kver, err := os.ReadFile(filepath.Join(dir, "kver"))
	if err != nil {
		return nil, fmt.Errorf("testbed: prepared assets in %q are incomplete: %w", dir, err)
	}
	a := &Assets{Dir: dir, Scripts: scriptDir, Kernel: strings.TrimSpace(string(kver))}
	a.Accel, err = chooseAccel(ctx, o, a)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// writeScripts copies the embedded scripts out, rewriting only what changed so
// that file times tell prepare.sh when the initramfs must be rebuilt.
func writeScripts(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	return fs.WalkDir(scripts, "vm", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := scripts.ReadFile(path)
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.Base(path))
		if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
			return nil
		}
		// Write and rename: a concurrent guest may be reading the old copy.
		tmp := dst + ".tmp" + fmt.Sprint(os.Getpid())
		if err := os.WriteFile(tmp, data, 0o755); err != nil {
			return fmt.Errorf("testbed: %w", err)
		}
		return os.Rename(tmp, dst)
	})
}

// chooseAccel uses KVM where it can run our guest kernel and emulation
// elsewhere. $RDMAGO_TESTBED_ACCEL (kvm or tcg) overrides; otherwise the
// verdict of a short probe boot is remembered in the cache.
func chooseAccel(ctx context.Context, o Options, a *Assets) (string, error) {
	switch v := os.Getenv("RDMAGO_TESTBED_ACCEL"); v {
	case "kvm", "tcg":
		return v, nil
	case "":
	default:
		return "", fmt.Errorf("testbed: RDMAGO_TESTBED_ACCEL=%q: want kvm or tcg", v)
	}
	verdict := filepath.Join(o.Cache, "accel")
	if b, err := os.ReadFile(verdict); err == nil {
		if v := strings.TrimSpace(string(b)); v == "kvm" || v == "tcg" {
			return v, nil
		}
	}
	accel := "tcg"
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
		f.Close()
		if probeKVM(ctx, o, a) {
			accel = "kvm"
		}
	}
	o.logf("using %s (verdict kept in %s)", map[string]string{"kvm": "KVM", "tcg": "software emulation (TCG)"}[accel], verdict)
	_ = os.WriteFile(verdict, []byte(accel+"\n"), 0o644)
	return accel, nil
}

// probeKVM boots the guest kernel under KVM without a stage two: a working KVM
// reaches the initramfs, which complains and powers off, within seconds. Some
// hosts expose /dev/kvm and yet stop the guest kernel early (a KVM "emulation
// failure", after which qemu waits, as if hung); they get emulation. One
// such is kvm-pvm in native mode, which emulates a non-PVM guest kernel's
// privileged code: far slower than TCG even before it fails.
func probeKVM(ctx context.Context, o Options, a *Assets) bool {
	o.logf("probing whether KVM runs the guest kernel here (once per cache)")
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	o.Writable = nil
	args := qemuArgs(o, a, "kvm", "console=ttyS0 panic=-1 loglevel=1")
	args = append(args, "-serial", "stdio")
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run()
	return strings.Contains(out.String(), "testbed-init: error")
}
