package testcluster

import "syscall"

// sysProcAttr puts the child in its own process group (so Stop can signal it
// and anything it spawned) and has the kernel SIGKILL it when the test binary
// dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
