package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The kube suite OOM-kills a server by starting this program again as a memory hog inside the
// server pod's memory cgroup, with the server made the OOM killer's first choice (its
// oom_score_adj raised to 1000, which needs no privilege, where lowering the hog's would): the
// hog allocates until the kernel kills the server for the pod's memory limit. The server's end is
// then a real OOM kill (SIGKILL, the cgroup's oom_kill count up), which the node agent reports
// as OOMKilled and the scaler answers with a pod of more memory.
const (
	hogEnv    = "ELASTICPS_BENCH_MEMHOG" // set: this process is the hog
	hogCgroup = "ELASTICPS_BENCH_MEMHOG_CGROUP"
	hogPid    = "ELASTICPS_BENCH_MEMHOG_PID"
	hogMax    = "ELASTICPS_BENCH_MEMHOG_MAX"
	hogChunk  = 4 << 20
)

func init() {
	if os.Getenv(hogEnv) != "" {
		if err := runHog(); err != nil {
			fmt.Fprintln(os.Stderr, "memory hog:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// runHog joins the cgroup, allocates hogChunk at a time and prints "killed" once the server's
// process is gone or the cgroup counts an OOM kill; it gives up after hogMax bytes.
func runHog() error {
	dir := os.Getenv(hogCgroup)
	pid, err := strconv.Atoi(os.Getenv(hogPid))
	if err != nil {
		return fmt.Errorf("%s: %w", hogPid, err)
	}
	limit, err := strconv.ParseInt(os.Getenv(hogMax), 10, 64)
	if err != nil {
		return fmt.Errorf("%s: %w", hogMax, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return err
	}
	before := oomKillCount(dir)
	var held [][]byte
	for total := int64(0); total < limit; total += hogChunk {
		b := make([]byte, hogChunk)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		held = append(held, b)
		if syscall.Kill(pid, 0) == syscall.ESRCH || oomKillCount(dir) > before {
			fmt.Println("killed")
			return nil
		}
	}
	return fmt.Errorf("allocated %d MiB and the server (pid %d) still runs", len(held)*hogChunk>>20, pid)
}

// oomKillCount reads the oom_kill count of a memory cgroup (v1 memory.oom_control, v2
// memory.events); 0 where the kernel does not count.
func oomKillCount(dir string) int64 {
	for _, f := range []string{"memory.oom_control", "memory.events"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n
			}
		}
	}
	return 0
}

// oomKill runs the hog in the memory cgroup dir of the server process pid and returns when the
// hog saw the server killed. max bounds what the hog allocates.
func oomKill(ctx context.Context, dir string, pid int, max int64) (time.Time, error) {
	exe, err := os.Executable()
	if err != nil {
		return time.Time{}, err
	}
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte("1000"), 0); err != nil {
		return time.Time{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), hogEnv+"=1", hogCgroup+"="+dir, hogPid+"="+strconv.Itoa(pid), hogMax+"="+strconv.FormatInt(max, 10))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return time.Time{}, err
	}
	if err := cmd.Start(); err != nil {
		return time.Time{}, err
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	killed := time.Now()
	err = cmd.Wait()
	switch {
	case strings.TrimSpace(line) == "killed":
		return killed, nil
	case err != nil && syscall.Kill(pid, 0) == syscall.ESRCH:
		// The node agent kills what is left in a pod's cgroup once the pod's process ended:
		// the hog may go before it could say so.
		return killed, nil
	case err != nil:
		return time.Time{}, fmt.Errorf("memory hog: %w: %s", err, stderr.String())
	}
	return time.Time{}, errors.New("memory hog ended without the server's kill")
}
