package testbed

import "syscall"

// dieWithParent makes a child process get SIGKILL when we die.
func dieWithParent() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
