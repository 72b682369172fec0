package procstat

import "os"

// cgroupMemory reads the charge and limit of the process's memory cgroup (memoryCgroup.read),
// found anew each time: a process may be moved to another cgroup.
func cgroupMemory() (charge, limit int64) {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0, 0
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, 0
	}
	cg, ok := findMemoryCgroup(string(mountinfo), string(own))
	if !ok {
		return 0, 0
	}
	charge, limit, ok = cg.read()
	if !ok {
		return 0, 0
	}
	return charge, limit
}
