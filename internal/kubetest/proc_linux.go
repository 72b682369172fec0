package kubetest

import "syscall"

// sysProcAttr makes a child process get SIGKILL when the test binary dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
