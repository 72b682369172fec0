package kubetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/elasticps/elasticps/internal/procstat"
	"github.com/elasticps/elasticps/internal/wait"
)

// cgroups is where a node makes its pods' cgroups: under the test process's own cgroup of each
// controller it uses.
type cgroups struct {
	// v2 is set when the memory and cpu controllers are those of the unified hierarchy.
	v2 bool
	// memory and cpu are the process's own cgroup directories of the two controllers; under v2
	// both are the one unified directory.
	memory, cpu string
}

// detectCgroups finds the test process's cgroups from /proc/self: cgroup v1 when the memory
// and cpu controllers are mounted as v1 hierarchies, else cgroup v2 when its unified hierarchy
// is mounted and offers both. Under v2 it enables the two controllers for the children of the
// process's cgroup, which the kernel refuses if the cgroup holds processes and is not a
// namespace's root (the "no internal processes" rule): run the tests in a leaf cgroup then.
func detectCgroups() (cgroups, error) {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return cgroups{}, err
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return cgroups{}, err
	}
	cg, err := findCgroups(string(mountinfo), string(own))
	if err != nil {
		return cgroups{}, err
	}
	if cg.v2 {
		if err := enableV2Controllers(cg.memory); err != nil {
			return cgroups{}, err
		}
	}
	for _, dir := range []string{cg.memory, cg.cpu} {
		if err := writable(dir); err != nil {
			return cgroups{}, fmt.Errorf("cgroup %s is not writable: %w", dir, err)
		}
	}
	return cg, nil
}

// findCgroups locates the process's cgroup directories from the text of /proc/self/mountinfo
// and /proc/self/cgroup.
func findCgroups(mountinfo, procCgroup string) (cgroups, error) {
	// Paths of the process's cgroups: by v1 controller, and the unified one ("0::/path").
	v1 := make(map[string]string)
	unified, haveUnified := "", false
	for _, line := range strings.Split(procCgroup, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			unified, haveUnified = parts[2], true
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			v1[c] = parts[2]
		}
	}

	var memory, cpu, v2dir string
	for _, line := range strings.Split(mountinfo, "\n") {
		m, ok := procstat.ParseMountinfoLine(line)
		if !ok {
			continue
		}
		switch m.FSType {
		case "cgroup":
			opts := strings.Split(m.SuperOptions, ",")
			if slices.Contains(opts, "memory") && memory == "" {
				memory, _ = m.Locate(v1["memory"])
			}
			if slices.Contains(opts, "cpu") && cpu == "" {
				cpu, _ = m.Locate(v1["cpu"])
			}
		case "cgroup2":
			if haveUnified && v2dir == "" {
				v2dir, _ = m.Locate(unified)
			}
		}
	}
	switch {
	case memory != "" && cpu != "":
		return cgroups{memory: memory, cpu: cpu}, nil
	case memory == "" && cpu == "" && v2dir != "":
		controllers, err := os.ReadFile(filepath.Join(v2dir, "cgroup.controllers"))
		if err != nil {
			return cgroups{}, fmt.Errorf("cgroup v2: %w", err)
		}
		have := strings.Fields(string(controllers))
		if !slices.Contains(have, "memory") || !slices.Contains(have, "cpu") {
			return cgroups{}, fmt.Errorf("cgroup v2 at %s offers controllers %q, not both memory and cpu", v2dir, have)
		}
		return cgroups{v2: true, memory: v2dir, cpu: v2dir}, nil
	default:
		return cgroups{}, errors.New("no cgroup v1 hierarchies of both memory and cpu, nor a cgroup v2 hierarchy, found in /proc/self/mountinfo")
	}
}

// enableV2Controllers lets the children of cgroup dir use the memory and cpu controllers.
func enableV2Controllers(dir string) error {
	have, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return err
	}
	fields := strings.Fields(string(have))
	if slices.Contains(fields, "memory") && slices.Contains(fields, "cpu") {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory +cpu"), 0); err != nil {
		return fmt.Errorf("cgroup v2: enable memory and cpu for the children of %s (a cgroup that holds processes cannot, unless it is a root): %w", dir, err)
	}
	return nil
}

// cfsPeriod is the CPU bandwidth period of a pod's cgroup under v2, the kernel's default.
const cfsPeriod = 100000 // µs

// minCFSQuota is the smallest quota a limit gives, as a kubelet's.
const minCFSQuota = 1000 // µs

// podCgroup is the cgroup of one pod: one directory per controller under v1, one under v2.
type podCgroup struct {
	v2          bool
	memory, cpu string
}

// dirs returns the pod's cgroup directories, each once.
func (p *podCgroup) dirs() []string {
	if p.memory == p.cpu {
		return []string{p.memory}
	}
	return []string{p.memory, p.cpu}
}

// create makes a pod's cgroup named name and sets its limits: memory from limits.memory (none
// when unset), CPU bandwidth from limits.cpu (none when unset). Under v1 the memory+swap limit
// is set equal to the memory limit where the kernel has it, so that swap cannot hide an overrun;
// under v2 memory.swap.max is 0.
func (c cgroups) create(name string, limits corev1.ResourceList) (*podCgroup, error) {
	p := &podCgroup{v2: c.v2, memory: filepath.Join(c.memory, name), cpu: filepath.Join(c.cpu, name)}
	for _, d := range p.dirs() {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
	}
	if err := p.setLimits(limits); err != nil {
		_ = p.remove(context.Background())
		return nil, err
	}
	return p, nil
}

func (p *podCgroup) setLimits(limits corev1.ResourceList) error {
	mem, hasMem := limits[corev1.ResourceMemory]
	cpu, hasCPU := limits[corev1.ResourceCPU]
	hasMem = hasMem && !mem.IsZero()
	hasCPU = hasCPU && !cpu.IsZero()
	if p.v2 {
		if hasMem {
			if err := writeCgroup(p.memory, "memory.max", strconv.FormatInt(mem.Value(), 10)); err != nil {
				return err
			}
			if exists(filepath.Join(p.memory, "memory.swap.max")) {
				if err := writeCgroup(p.memory, "memory.swap.max", "0"); err != nil {
					return err
				}
			}
		}
		if hasCPU {
			quota := max(cpu.MilliValue()*cfsPeriod/1000, minCFSQuota)
			if err := writeCgroup(p.cpu, "cpu.max", fmt.Sprintf("%d %d", quota, cfsPeriod)); err != nil {
				return err
			}
		}
		return nil
	}
	if hasMem {
		v := strconv.FormatInt(mem.Value(), 10)
		if err := writeCgroup(p.memory, "memory.limit_in_bytes", v); err != nil {
			return err
		}
		if exists(filepath.Join(p.memory, "memory.memsw.limit_in_bytes")) {
			if err := writeCgroup(p.memory, "memory.memsw.limit_in_bytes", v); err != nil {
				return err
			}
		}
	}
	if hasCPU {
		b, err := os.ReadFile(filepath.Join(p.cpu, "cpu.cfs_period_us"))
		if err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
		period, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return fmt.Errorf("cgroup: cpu.cfs_period_us: %w", err)
		}
		quota := max(cpu.MilliValue()*period/1000, minCFSQuota)
		if err := writeCgroup(p.cpu, "cpu.cfs_quota_us", strconv.FormatInt(quota, 10)); err != nil {
			return err
		}
	}
	return nil
}

func writeCgroup(dir, file, value string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("cgroup: set %s to %s: %w", file, value, err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// oomKills returns how many processes the kernel's OOM killer has killed in the pod's memory
// cgroup: the oom_kill count of memory.oom_control (v1) or memory.events (v2). It is 0 where the
// kernel does not count (before Linux 4.13).
func (p *podCgroup) oomKills() int64 {
	file := "memory.oom_control"
	if p.v2 {
		file = "memory.events"
	}
	f, err := os.Open(filepath.Join(p.memory, file))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// removeAttempts and removeEvery bound how long remove waits for the kernel to let a cgroup go.
const (
	removeAttempts = 100
	removeEvery    = 10 * time.Millisecond
)

// remove kills any process left in the pod's cgroup and removes its directories. The kernel
// refuses to remove a cgroup (EBUSY) until its last process is reaped and its memory accounted
// for, which takes a moment after a kill: remove retries for about a second, or until ctx ends.
func (p *podCgroup) remove(ctx context.Context) error {
	var err error
	for range removeAttempts {
		err = nil
		for _, d := range p.dirs() {
			if e := removeCgroupDir(d); e != nil {
				err = e
			}
		}
		if err == nil {
			return nil
		}
		if wait.Sleep(ctx, removeEvery) != nil {
			break
		}
	}
	return fmt.Errorf("remove cgroup: %w", err)
}

// removeCgroupDir kills the processes in cgroup dir and removes it; a missing dir is removed.
func removeCgroupDir(dir string) error {
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
				signalPid(pid, syscall.SIGKILL)
			}
		}
	}
	err := os.Remove(dir)
	if err == nil || errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
