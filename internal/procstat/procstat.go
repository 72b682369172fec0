// Package procstat reads what the running process uses: its CPU time and its resident memory.
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
	// ResidentBytes is the memory it holds in RAM now (zero where the system does not say).
	ResidentBytes int64
}

// Read returns the process's use now. A figure the system cannot give is left zero.
func Read() Sample {
	host, _ := os.Hostname()
	s := Sample{Pid: os.Getpid(), Host: host}
	s.CPU = cpuTime()
	s.ResidentBytes = residentBytes()
	return s
}
