package kubetest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The programs a pod's start goes through before its own binary.
const (
	unshareBin = "/usr/bin/unshare"
	shellBin   = "/bin/sh"
)

// containerRun is what one start of a pod's container needs.
type containerRun struct {
	binary  string
	args    []string // after the binary
	env     []string // NAME=value
	mounts  []bindMount
	workDir string
}

// startScript is the shell script that prepares a pod's process in its new mount and UTS
// namespaces and then execs the pod's binary, so that the pid the agent started is the pod's.
// It reports on file descriptor 3, which it closes at the exec: "s" once it runs, then the
// step that failed, if one does.
type startScript struct {
	cgroupProcs []string // cgroup.procs files to join
	hostname    string
	tmpfs       []string // directories covered with an empty tmpfs
	mounts      []bindMount
	workDir     string
	mount       string // the mount and mkdir binaries
	mkdir       string
}

// shellQuote quotes s for sh as one word.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (s startScript) String() string {
	var b strings.Builder
	q := shellQuote
	b.WriteString("fail() { printf '%s' \"$*\" >&3; exit 1; }\n")
	b.WriteString("printf s >&3\n")
	for _, p := range s.cgroupProcs {
		fmt.Fprintf(&b, "echo $$ >%s || fail join cgroup %s\n", q(p), q(filepath.Dir(p)))
	}
	fmt.Fprintf(&b, "echo %s >/proc/sys/kernel/hostname || fail set the host name\n", q(s.hostname))
	for _, d := range s.tmpfs {
		fmt.Fprintf(&b, "%s -t tmpfs -o mode=755 kubetest %s || fail mount a tmpfs on %s\n", s.mount, q(d), q(d))
	}
	for _, m := range s.mounts {
		if m.create {
			if m.file {
				fmt.Fprintf(&b, "%s -p %s && : >>%s || fail make %s\n", s.mkdir, q(filepath.Dir(m.dst)), q(m.dst), q(m.dst))
			} else {
				fmt.Fprintf(&b, "%s -p %s || fail make %s\n", s.mkdir, q(m.dst), q(m.dst))
			}
		}
		fmt.Fprintf(&b, "%s --bind %s %s || fail bind %s on %s\n", s.mount, q(m.src), q(m.dst), q(m.src), q(m.dst))
		if m.readOnly {
			fmt.Fprintf(&b, "%s -o remount,bind,ro %s || fail make %s read-only\n", s.mount, q(m.dst), q(m.dst))
		}
	}
	fmt.Fprintf(&b, "cd %s || fail working directory %s\n", q(s.workDir), q(s.workDir))
	b.WriteString("unset OLDPWD PWD\n") // the shell's, not the pod's
	b.WriteString("exec \"$@\" 3>&-\n")
	return b.String()
}

// podProcess is one start of a pod's container.
type podProcess struct {
	pid       int
	started   metav1.Time
	oomBefore int64         // the cgroup's OOM kills before the start
	startErr  string        // why the start failed before the pod's binary ran; "" if it ran
	done      chan struct{} // closed once the process has been reaped
	state     *os.ProcessState
	finished  metav1.Time
}

func (p *podProcess) containerID() string {
	if p.pid == 0 {
		return ""
	}
	return "kubetest://" + strconv.Itoa(p.pid)
}

// signal sends sig to the process's group unless it has been reaped.
func (p *podProcess) signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		signalGroup(p.pid, sig)
	}
}

// startPodProcess starts run in a new mount and UTS namespace, its output appended to logPath, and
// returns once the pod's binary runs or the start failed (startErr set, done closed).
func startPodProcess(ctx context.Context, run *containerRun, script startScript, logPath, dir string, cg *podCgroup) *podProcess {
	p := &podProcess{done: make(chan struct{}), started: metav1.Now()}
	failed := func(err error) *podProcess {
		p.startErr = err.Error()
		p.finished = metav1.Now()
		close(p.done)
		return p
	}
	out, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return failed(err)
	}
	defer out.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return failed(err)
	}
	defer r.Close()
	args := append([]string{"--mount", "--uts", "--propagation", "private", "--", shellBin, "-c", script.String(), "sh", run.binary}, run.args...)
	cmd := exec.Command(unshareBin, args...)
	cmd.Env = run.env
	cmd.Dir = dir
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = podProcAttr()
	p.oomBefore = cg.oomKills()
	err = cmd.Start()
	w.Close()
	if err != nil {
		return failed(err)
	}
	p.pid = cmd.Process.Pid
	p.started = metav1.Now()
	go func() {
		_ = cmd.Wait() // the state says how it ended
		p.state = cmd.ProcessState
		p.finished = metav1.Now()
		close(p.done)
	}()
	// Read until the exec closes the pipe, or the process ends; the agent's stop cuts it short.
	stop := context.AfterFunc(ctx, func() { p.signal(syscall.SIGKILL) })
	msg, _ := io.ReadAll(r)
	stop()
	switch {
	case string(msg) == "s":
		return p
	case len(msg) == 0:
		p.startErr = "the pod's namespaces could not be made (" + unshareBin + " failed; see the pod's log)"
	default:
		p.startErr = "start script: " + string(msg[1:])
	}
	<-p.done
	return p
}

// gracePeriod returns how long a deleted pod's process has between SIGTERM and SIGKILL: the
// deletion's grace period, else the pod's terminationGracePeriodSeconds, else 30 s.
func gracePeriod(podGrace, specGrace *int64) time.Duration {
	switch {
	case podGrace != nil:
		return time.Duration(*podGrace) * time.Second
	case specGrace != nil:
		return time.Duration(*specGrace) * time.Second
	default:
		return 30 * time.Second
	}
}
