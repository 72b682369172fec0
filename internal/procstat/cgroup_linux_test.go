package procstat

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// childEnv names the shared-memory file a child process of TestReadInMemoryCgroup maps; its
// being set makes the test binary that child.
const childEnv = "PROCSTAT_CGROUP_CHILD_SHM"

const (
	testLimit  = 192 << 20 // the child's cgroup's memory limit
	sharedSize = 256 << 20 // the shared memory it maps, brought in by the parent: more than the limit
	ownSize    = 16 << 20  // the memory it touches itself, charged to its cgroup
)

// TestReadInMemoryCgroup runs a process in a memory cgroup with a limit, made for the test, and
// checks its reading: the cgroup's limit, and a charge that counts what the process touched but
// not the shared memory it maps that another cgroup was charged for, which its resident memory
// counts (as a server's counts the flash checkpoint's shared memory from /dev/shm).
func TestReadInMemoryCgroup(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("making a cgroup takes root")
	}
	cg := testCgroup(t)
	shm, err := os.CreateTemp("/dev/shm", "procstat-test-")
	if err != nil {
		t.Skipf("no shared memory file system: %v", err)
	}
	t.Cleanup(func() { os.Remove(shm.Name()) })
	_, err = shm.Write(make([]byte, sharedSize)) // its pages are charged to this process's cgroup
	require.NoError(t, err)
	require.NoError(t, shm.Close())

	cmd := exec.Command(os.Args[0], "-test.run=^TestCgroupChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+shm.Name())
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Wait() })
	defer stdin.Close()
	// The child waits for a line on stdin, sent once it is in the cgroup: what it touches from
	// then on is charged there.
	require.NoError(t, os.WriteFile(filepath.Join(cg.dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0))
	_, err = stdin.Write([]byte("go\n"))
	require.NoError(t, err)

	var s Sample
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	require.NoError(t, err, "the child's reading")
	require.NoError(t, json.Unmarshal(line, &s), "%s", line)
	t.Logf("child in %s: resident %.1f MiB, cgroup charge %.1f MiB of a %.1f MiB limit", cg.dir,
		float64(s.ResidentBytes)/(1<<20), float64(s.CgroupBytes)/(1<<20), float64(s.CgroupLimitBytes)/(1<<20))
	assert.Equal(t, int64(testLimit), s.CgroupLimitBytes, "the limit set")
	assert.GreaterOrEqual(t, s.CgroupBytes, int64(ownSize), "what it touched in the cgroup is charged")
	assert.Less(t, s.CgroupBytes, int64(testLimit), "the shared memory charged elsewhere is not")
	assert.Greater(t, s.ResidentBytes, int64(sharedSize), "its resident memory counts the shared memory too")
}

// TestCgroupChild is the child process of TestReadInMemoryCgroup: it maps and reads the shared
// memory file, touches memory of its own once told it is in the cgroup, and prints its reading.
func TestCgroupChild(t *testing.T) {
	name := os.Getenv(childEnv)
	if name == "" {
		t.Skip("run by TestReadInMemoryCgroup")
	}
	_, err := bufio.NewReader(os.Stdin).ReadString('\n')
	require.NoError(t, err)
	f, err := os.Open(name)
	require.NoError(t, err)
	shared, err := syscall.Mmap(int(f.Fd()), 0, sharedSize, syscall.PROT_READ, syscall.MAP_SHARED)
	require.NoError(t, err)
	defer syscall.Munmap(shared)
	sum := 0
	for i := 0; i < len(shared); i += os.Getpagesize() {
		sum += int(shared[i])
	}
	own := make([]byte, ownSize)
	for i := range own {
		own[i] = byte(i)
	}
	b, err := json.Marshal(Read())
	require.NoError(t, err)
	fmt.Printf("%s\n", b)
	t.Logf("read %d bytes of shared memory (sum %d), touched %d", len(shared), sum, len(own))
	runtime.KeepAlive(own)
}

// testCgroup makes a memory cgroup with a limit of testLimit under this process's own, and
// removes it when the test ends; it skips the test where none can be made.
func testCgroup(t *testing.T) memoryCgroup {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	own, err := os.ReadFile("/proc/self/cgroup")
	require.NoError(t, err)
	parent, ok := findMemoryCgroup(string(mountinfo), string(own))
	if !ok {
		t.Skip("no memory cgroup hierarchy")
	}
	if parent.v2 {
		b, err := os.ReadFile(filepath.Join(parent.dir, "cgroup.subtree_control"))
		if err != nil || !slices.Contains(strings.Fields(string(b)), "memory") {
			// The kernel lets a cgroup holding processes give its children no controller.
			if err := os.WriteFile(filepath.Join(parent.dir, "cgroup.subtree_control"), []byte("+memory"), 0); err != nil {
				t.Skipf("cgroup v2: cannot enable the memory controller below %s: %v", parent.dir, err)
			}
		}
	}
	cg := memoryCgroup{dir: filepath.Join(parent.dir, fmt.Sprintf("procstat-test-%d", os.Getpid())), v2: parent.v2}
	if err := os.Mkdir(cg.dir, 0o755); err != nil {
		t.Skipf("cannot make a cgroup: %v", err)
	}
	t.Cleanup(func() {
		for range 100 { // the kernel lets the cgroup go once its process is reaped
			if err := os.Remove(cg.dir); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Errorf("cgroup %s left behind", cg.dir)
	})
	limitFile := "memory.limit_in_bytes"
	if cg.v2 {
		limitFile = "memory.max"
	}
	require.NoError(t, os.WriteFile(filepath.Join(cg.dir, limitFile), []byte(strconv.Itoa(testLimit)), 0))
	return cg
}
