// Package procstat reads what the running process uses: its CPU time, its resident memory, and
// what its memory cgroup charges against its limit.
package procstat

import (
	"os"
	"time"
)

// Sample is the process's use at one moment.
type Sample struct {
	Pid  int
	Host string
	// CPU is the user and system time the process has used since it started.
	CPU time.Duration
	// ResidentBytes is the memory it holds in RAM now (zero where the system does not say). It
	// counts every page mapped, shared ones too (a file or shared memory that another process,
	// maybe in another cgroup, brought in), so it may be more than its memory cgroup charges.
	ResidentBytes int64
	// CgroupBytes is the memory its memory cgroup is charged now, less the inactive file
	// pages (the kernel reclaims those first): the working set a kubelet reports, which the
	// kernel's OOM killer holds against CgroupLimitBytes. CgroupLimitBytes is the cgroup's memory
	// limit. Both are zero where the process is in no memory cgroup with a limit (the root
	// cgroup, an unlimited one, a system without cgroups) or the files cannot be read.
	CgroupBytes, CgroupLimitBytes int64
}

// Read returns the process's use now. A figure the system cannot give is left zero.
func Read() Sample {
	host, _ := os.Hostname()
	s := Sample{Pid: os.Getpid(), Host: host}
	s.CPU = cpuTime()
	s.ResidentBytes = residentBytes()
	s.CgroupBytes, s.CgroupLimitBytes = cgroupMemory()
	return s
}
