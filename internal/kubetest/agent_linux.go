//go:build linux

package kubetest

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// podProcAttr puts a pod's process in a process group of its own, which the agent signals as a
// whole, and has the kernel kill it should the test binary die first.
func podProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalPid sends sig to process pid, which may have exited.
func signalPid(pid int, sig syscall.Signal) { _ = syscall.Kill(pid, sig) }

// signalGroup sends sig to every process of process group pgid, which may be empty.
func signalGroup(pgid int, sig syscall.Signal) { _ = syscall.Kill(-pgid, sig) }

// exitSignal returns the signal that ended a process, 0 if it exited.
func exitSignal(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return int(ws.Signal())
	}
	return 0
}

// writable reports whether this process may write in dir.
func writable(dir string) error { return syscall.Access(dir, 2 /* W_OK */) }

// mountTmpfs mounts an empty tmpfs of mode 0777 on dir, in this process's mount namespace, of
// size bytes (0: the kernel's default, half of the machine's memory).
func mountTmpfs(dir string, size int64) error {
	opts := "mode=777"
	if size > 0 {
		opts += ",size=" + strconv.FormatInt(size, 10)
	}
	if err := syscall.Mount("kubetest", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount a tmpfs on %s: %w", dir, err)
	}
	return nil
}

// unmount detaches the mount on dir, which goes once no process uses it.
func unmount(dir string) error {
	if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return nil
}

// agentSupported says why this process cannot run pods, or nil: it must be root, to make mount
// namespaces and write cgroups.
func agentSupported() error {
	if os.Geteuid() != 0 {
		return errors.New("the node agent must run as root, to make mount namespaces and cgroups")
	}
	for _, p := range []string{unshareBin, shellBin} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("the node agent needs %s: %w", p, err)
		}
	}
	return nil
}
