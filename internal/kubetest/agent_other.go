//go:build !linux

package kubetest

import (
	"errors"
	"os"
	"syscall"
)

func podProcAttr() *syscall.SysProcAttr { return nil }

func signalPid(pid int, sig syscall.Signal) {
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Signal(sig)
	}
}

func signalGroup(pgid int, sig syscall.Signal) { signalPid(pgid, sig) }

func exitSignal(*os.ProcessState) int { return 0 }

func writable(string) error { return errors.ErrUnsupported }

func mountTmpfs(string, int64) error { return errors.ErrUnsupported }

func unmount(string) error { return errors.ErrUnsupported }

func agentSupported() error { return errors.New("the node agent runs on Linux only") }
