//go:build unix && !linux

package testcluster

import "syscall"

// sysProcAttr puts the child in its own process group so Stop can signal it.
// Outside Linux there is no parent-death signal: a test binary killed without
// running its cleanups leaves etcd and kube-apiserver running.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
