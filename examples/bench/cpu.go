package main

import (
	"syscall"
	"time"
)

// procCPU is the user and system CPU time of a process.
type procCPU struct{ user, sys time.Duration }

func (c procCPU) sub(d procCPU) procCPU { return procCPU{c.user - d.user, c.sys - d.sys} }

// total is user plus system time.
func (c procCPU) total() time.Duration { return c.user + c.sys }

// selfCPU is this process's CPU time so far (getrusage).
func selfCPU() (procCPU, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return procCPU{}, err
	}
	return procCPU{time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())}, nil
}
