package procstat

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// memoryCgroup is the directory of a process's memory cgroup, under cgroup v1 or v2.
type memoryCgroup struct {
	dir string
	v2  bool
}

// findMemoryCgroup locates the memory cgroup of a process from the text of its
// /proc/<pid>/mountinfo and /proc/<pid>/cgroup: the v1 hierarchy of the memory controller where
// one is mounted and the process is in it, else the unified (v2) hierarchy. A cgroup's path in
// /proc/<pid>/cgroup is from its hierarchy's root, and a mount may show only a subtree (field 4
// of its mountinfo line, the mount's root: a container's own cgroup mounted at /sys/fs/cgroup),
// so the directory is the path relative to the root of a mount that holds it.
func findMemoryCgroup(mountinfo, procCgroup string) (memoryCgroup, bool) {
	v1, unified, haveV1, haveUnified := "", "", false, false
	for line := range strings.SplitSeq(procCgroup, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			unified, haveUnified = parts[2], true
			continue
		}
		if slices.Contains(strings.Split(parts[1], ","), "memory") {
			v1, haveV1 = parts[2], true
		}
	}
	var v2dir string
	for line := range strings.SplitSeq(mountinfo, "\n") {
		m, ok := ParseMountinfoLine(line)
		if !ok {
			continue
		}
		switch {
		case haveV1 && m.FSType == "cgroup" && slices.Contains(strings.Split(m.SuperOptions, ","), "memory"):
			if dir, ok := m.Locate(v1); ok {
				return memoryCgroup{dir: dir}, true
			}
		case haveUnified && !haveV1 && m.FSType == "cgroup2" && v2dir == "":
			if dir, ok := m.Locate(unified); ok {
				v2dir = dir
			}
		}
	}
	if v2dir == "" {
		return memoryCgroup{}, false
	}
	return memoryCgroup{dir: v2dir, v2: true}, true
}

// Mount is what a search for a cgroup hierarchy needs of a line of /proc/<pid>/mountinfo: the
// mount's root in its file system, where it is mounted, the file system type and the super
// block's options (for cgroup v1, the controllers).
type Mount struct {
	Root, MountPoint, FSType, SuperOptions string
}

// ParseMountinfoLine parses "36 35 98:0 /root /mnt rw,noatime master:1 - ext3 /dev/root rw":
// the mount's root (field 4) and mount point (field 5), and after the " - " separator the file
// system type and the super block's options.
func ParseMountinfoLine(line string) (Mount, bool) {
	pre, post, ok := strings.Cut(line, " - ")
	if !ok {
		return Mount{}, false
	}
	f, g := strings.Fields(pre), strings.Fields(post)
	if len(f) < 5 || len(g) < 3 {
		return Mount{}, false
	}
	return Mount{Root: unescapeMountinfo(f[3]), MountPoint: unescapeMountinfo(f[4]), FSType: g[0], SuperOptions: g[2]}, true
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of a mountinfo path.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Locate returns the directory of cgroup path (from its hierarchy's root) under this mount,
// and false when the mount does not show it: the path is not under the mount's root.
func (m Mount) Locate(path string) (string, bool) {
	if !strings.HasPrefix(path, "/") {
		return "", false
	}
	rel, ok := strings.CutPrefix(path, m.Root)
	if !ok || m.Root != "/" && rel != "" && !strings.HasPrefix(rel, "/") {
		return "", false
	}
	return filepath.Join(m.MountPoint, rel), true
}

// noLimit is the least cgroup v1 limit taken for none: an unlimited v1 cgroup reads the largest
// page-aligned int64 (9223372036854771712), and no machine has 4 EiB.
const noLimit = 1 << 62

// read returns the memory the cgroup is charged, less its inactive file pages, and its limit;
// ok is false when the cgroup has no limit or a file cannot be read. Under v2 it reads
// memory.current, memory.max and memory.stat's inactive_file (the root cgroup has neither
// memory.current nor memory.max); under v1 memory.usage_in_bytes, memory.limit_in_bytes and
// memory.stat's total_inactive_file (the cgroup's and its descendants'). Where memory.stat
// lacks the inactive file pages the charge is the whole usage.
func (cg memoryCgroup) read() (charge, limit int64, ok bool) {
	usageFile, limitFile, inactiveKey := "memory.usage_in_bytes", "memory.limit_in_bytes", "total_inactive_file"
	if cg.v2 {
		usageFile, limitFile, inactiveKey = "memory.current", "memory.max", "inactive_file"
	}
	b, err := os.ReadFile(filepath.Join(cg.dir, limitFile))
	if err != nil {
		return 0, 0, false
	}
	limit, ok = parseLimit(string(b))
	if !ok {
		return 0, 0, false
	}
	b, err = os.ReadFile(filepath.Join(cg.dir, usageFile))
	if err != nil {
		return 0, 0, false
	}
	usage, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || usage < 0 {
		return 0, 0, false
	}
	if b, err := os.ReadFile(filepath.Join(cg.dir, "memory.stat")); err == nil {
		if inactive, ok := statValue(string(b), inactiveKey); ok {
			usage = max(usage-inactive, 0)
		}
	}
	return usage, limit, true
}

// parseLimit parses a memory limit file: a byte count, or "max" (v2) or a value of at least
// noLimit (v1) for none.
func parseLimit(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= noLimit {
		return 0, false
	}
	return n, true
}

// statValue returns the value of key in the text of a memory.stat file ("key value" lines).
func statValue(stat, key string) (int64, bool) {
	for line := range strings.SplitSeq(stat, "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok || k != key {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		return n, err == nil && n >= 0
	}
	return 0, false
}
