package kubetest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// process is one running binary, its output going to a log file.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string        // path of the file that holds its stdout and stderr
	done chan struct{} // closed once it has exited; err is set before
	err  error         // how it exited
}

// startProcess starts bin with args, its output to dir/name.log. The process is killed if the
// test binary dies before stopping it (on Linux), so that a timed-out test leaves nothing behind.
func startProcess(dir, name, bin string, args []string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.Dir = dir
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	return p, nil
}

// exited returns an error if the process has exited, and nil while it runs.
func (p *process) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited: %v", p.name, p.err)
	default:
		return nil
	}
}

// signal sends sig to the process by its pid, unless it has exited.
func (p *process) signal(sig os.Signal) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(sig) // it may exit in between: os.ErrProcessDone is fine
	}
}

// wait waits up to d for the process to exit, and reports whether it has.
func (p *process) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// stopProcesses sends SIGTERM to each process, waits up to grace for them all, kills those still
// running with SIGKILL, and waits for them to be gone.
func stopProcesses(grace time.Duration, ps ...*process) {
	for _, p := range ps {
		p.signal(syscall.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for _, p := range ps {
		if !p.wait(time.Until(deadline)) {
			p.signal(syscall.SIGKILL)
			<-p.done
		}
	}
}

// tail returns up to the last n bytes of the process's log, from the start of a line.
func (p *process) tail(n int64) string {
	f, err := os.Open(p.log)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	off := max(fi.Size()-n, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	if err != nil {
		return err.Error()
	}
	if off > 0 {
		for i, c := range b {
			if c == '\n' {
				b = b[i+1:]
				break
			}
		}
	}
	return string(b)
}

// freePorts returns n distinct loopback TCP ports that were free a moment ago. All listeners are
// held until the last is open, so the ports differ; another program may still take one before
// the control plane binds it, which makes the start fail with the port named in a log.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// errStopped is returned by a wait that the control plane's Stop cut short.
var errStopped = errors.New("kubetest: control plane stopped")
