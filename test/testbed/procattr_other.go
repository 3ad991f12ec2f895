//go:build !linux

package testbed

import "syscall"

// dieWithParent has no equivalent off Linux: the guest is killed by the
// test's cleanup only.
func dieWithParent() *syscall.SysProcAttr { return nil }
