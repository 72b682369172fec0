package procstat

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A host under cgroup v1 (with the v2 hierarchy mounted beside it, as systemd's hybrid mode
// does): the memory controller's own hierarchy holds the process's memory cgroup.
const v1Mountinfo = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`

const v1Cgroup = `9:name=systemd:/
4:memory:/kubepods/pod1/c1
2:cpu,cpuacct:/kubepods/pod1/c1
0::/
`

func TestFindMemoryCgroup(t *testing.T) {
	for _, tc := range []struct {
		name, mountinfo, cgroup string
		want                    memoryCgroup
		ok                      bool
	}{
		{"v1", v1Mountinfo, v1Cgroup, memoryCgroup{dir: "/sys/fs/cgroup/memory/kubepods/pod1/c1"}, true},
		{"v1 root", v1Mountinfo, "4:memory:/\n0::/\n", memoryCgroup{dir: "/sys/fs/cgroup/memory"}, true},
		// A private mount namespace that mounts the pod's own cgroup as the hierarchy: the mount's
		// root is the cgroup's path, so the cgroup is the mount point itself.
		{"v1 mounted at the cgroup", "50 40 0:31 /kubepods/pod1/c1 /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n",
			v1Cgroup, memoryCgroup{dir: "/sys/fs/cgroup/memory"}, true},
		{"v1 mounted above the cgroup", "50 40 0:31 /kubepods /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
			v1Cgroup, memoryCgroup{dir: "/sys/fs/cgroup/memory/pod1/c1"}, true},
		// A mount of another subtree does not show the cgroup: the next mount that does is taken.
		{"v1 other subtree first", "50 40 0:31 /kubepods/pod2 /mnt/other rw - cgroup cgroup rw,memory\n" +
			"51 40 0:31 /kubepods/pod1 /mnt/pod1 rw - cgroup cgroup rw,memory\n",
			v1Cgroup, memoryCgroup{dir: "/mnt/pod1/c1"}, true},
		{"v1 sibling prefix", "50 40 0:31 /kubepods/pod1/c /mnt/c rw - cgroup cgroup rw,memory\n", v1Cgroup, memoryCgroup{}, false},
		{"v1 memory not mounted", "31 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", v1Cgroup, memoryCgroup{}, false},
		{"v2", "35 24 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n",
			"0::/kubepods.slice/pod1.slice/cri-c1.scope\n",
			memoryCgroup{dir: "/sys/fs/cgroup/kubepods.slice/pod1.slice/cri-c1.scope", v2: true}, true},
		{"v2 namespaced", "60 50 0:30 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n", "0::/\n",
			memoryCgroup{dir: "/sys/fs/cgroup", v2: true}, true},
		{"v2 mounted at the cgroup", "60 50 0:30 /kubepods/pod1/c1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n", "0::/kubepods/pod1/c1\n",
			memoryCgroup{dir: "/sys/fs/cgroup", v2: true}, true},
		{"v2 escaped mount point", `35 24 0:30 / /mnt/cgroup\040two rw - cgroup2 cgroup2 rw` + "\n", "0::/a\n",
			memoryCgroup{dir: "/mnt/cgroup two/a", v2: true}, true},
		{"v2 not mounted", "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n", "0::/a\n", memoryCgroup{}, false},
		{"nothing", "", "", memoryCgroup{}, false},
		{"garbage", "no separator here\n1 2 - x\n", "x\n::\n", memoryCgroup{}, false},
	} {
		got, ok := findMemoryCgroup(tc.mountinfo, tc.cgroup)
		assert.Equal(t, tc.ok, ok, tc.name)
		assert.Equal(t, tc.want, got, tc.name)
	}
}

func TestParseLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"117440512\n", 117440512, true},
		{"max\n", 0, false},                 // v2 without a limit
		{"9223372036854771712\n", 0, false}, // v1 without a limit
		{"0\n", 0, false},
		{"-1\n", 0, false},
		{"", 0, false},
		{"12k", 0, false},
	} {
		got, ok := parseLimit(tc.in)
		assert.Equal(t, tc.ok, ok, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
}

// memory.stat of a v1 cgroup: the cgroup's own counters, then its subtree's (total_).
const v1Stat = `cache 1167360
rss 1769472
inactive_file 327680
active_file 839680
hierarchical_memory_limit 117440512
total_cache 2167360
total_inactive_file 1327104
total_active_file 839680
`

// memory.stat of a v2 cgroup.
const v2Stat = `anon 52428800
file 20971520
shmem 8388608
file_mapped 4194304
inactive_anon 0
active_anon 52428800
inactive_file 12582912
active_file 8388608
`

func TestStatValue(t *testing.T) {
	v, ok := statValue(v1Stat, "total_inactive_file")
	assert.True(t, ok)
	assert.Equal(t, int64(1327104), v)
	v, ok = statValue(v1Stat, "inactive_file")
	assert.True(t, ok)
	assert.Equal(t, int64(327680), v, "the key in full, not a suffix of another")
	v, ok = statValue(v2Stat, "inactive_file")
	assert.True(t, ok)
	assert.Equal(t, int64(12582912), v)
	_, ok = statValue(v2Stat, "total_inactive_file")
	assert.False(t, ok)
	_, ok = statValue("inactive_file x\n", "inactive_file")
	assert.False(t, ok)
}

// writeFiles makes dir hold files, by name.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
}

// TestReadCgroup reads a cgroup's charge and limit from directories holding the files' literal
// contents.
func TestReadCgroup(t *testing.T) {
	v1 := t.TempDir()
	writeFiles(t, v1, map[string]string{"memory.usage_in_bytes": "71303168\n", "memory.limit_in_bytes": "117440512\n", "memory.stat": v1Stat})
	charge, limit, ok := memoryCgroup{dir: v1}.read()
	require.True(t, ok)
	assert.Equal(t, int64(71303168-1327104), charge, "usage less the subtree's inactive file pages")
	assert.Equal(t, int64(117440512), limit)

	v2 := t.TempDir()
	writeFiles(t, v2, map[string]string{"memory.current": "73400320\n", "memory.max": "117440512\n", "memory.stat": v2Stat})
	charge, limit, ok = memoryCgroup{dir: v2, v2: true}.read()
	require.True(t, ok)
	assert.Equal(t, int64(73400320-12582912), charge)
	assert.Equal(t, int64(117440512), limit)

	// No memory.stat: the whole usage. More inactive pages than usage (the counters are read
	// one after the other): zero.
	require.NoError(t, os.Remove(filepath.Join(v2, "memory.stat")))
	charge, _, ok = memoryCgroup{dir: v2, v2: true}.read()
	require.True(t, ok)
	assert.Equal(t, int64(73400320), charge)
	writeFiles(t, v2, map[string]string{"memory.current": "4096\n", "memory.stat": v2Stat})
	charge, _, ok = memoryCgroup{dir: v2, v2: true}.read()
	require.True(t, ok)
	assert.Zero(t, charge)

	// No limit, or no files (the root cgroup under v2): nothing.
	writeFiles(t, v2, map[string]string{"memory.max": "max\n"})
	_, _, ok = memoryCgroup{dir: v2, v2: true}.read()
	assert.False(t, ok)
	writeFiles(t, v1, map[string]string{"memory.limit_in_bytes": "9223372036854771712\n"})
	_, _, ok = memoryCgroup{dir: v1}.read()
	assert.False(t, ok)
	_, _, ok = memoryCgroup{dir: t.TempDir(), v2: true}.read()
	assert.False(t, ok)
	writeFiles(t, v1, map[string]string{"memory.limit_in_bytes": "117440512\n", "memory.usage_in_bytes": strings.Repeat("9", 30)})
	_, _, ok = memoryCgroup{dir: v1}.read()
	assert.False(t, ok)
}
