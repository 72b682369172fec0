package main_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/process"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMultiProcessKills runs a job of separate processes on loopback (the command built from
// this package, started and restarted by process.Scaler: a coordinator, three parameter
// servers and two workers) and kills a server, a worker and the coordinator with SIGKILL, one
// at a time, each once training has made progress since the previous kill (a newer commit).
// The scaler starts each again under its node id with the same flags (the coordinator finds
// its servers running the job and takes it over); the job must finish with every position trained exactly once, and no
// process may fail but the three killed.
func TestMultiProcessKills(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command and runs a job of six processes")
	}
	// A process that fails for good (beyond its restart) ends the test at once, rather than
	// leaving the job to wait for it until the deadline.
	tctx, cancelTimeout := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancelTimeout()
	ctx, cancel := context.WithCancelCause(tctx)
	defer cancel(nil)
	dir := t.TempDir()
	bin := filepath.Join(dir, "dlrm")
	build := exec.CommandContext(ctx, filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	const (
		servers, workers = 3, 2
		records, epochs  = 120_000, 2
	)
	secretFile := filepath.Join(dir, "secret")
	secret := make([]byte, 32)
	rand.Read(secret)
	require.NoError(t, os.WriteFile(secretFile, []byte(hex.EncodeToString(secret)), 0o600))
	ckDir, logDir, tmpDir := filepath.Join(dir, "checkpoints"), filepath.Join(dir, "logs"), filepath.Join(dir, "tmp")
	require.NoError(t, os.MkdirAll(logDir, 0o755))
	require.NoError(t, os.MkdirAll(tmpDir, 0o755))
	var psList []string
	psAddr := map[string]string{}
	for i := range servers {
		id := elastic.ServerID(i)
		psAddr[id] = freeAddr(t)
		psList = append(psList, id+"="+psAddr[id])
	}
	coordAddr := freeAddr(t)
	// Every process gossips (the coordinator hears of failures from it too), seeded with all.
	gossipAddr := map[string]string{elastic.CoordinatorID: freeAddr(t)}
	for i := range servers {
		gossipAddr[elastic.ServerID(i)] = freeAddr(t)
	}
	for i := range workers {
		gossipAddr[elastic.WorkerID(i)] = freeAddr(t)
	}
	var seeds []string
	for _, a := range gossipAddr {
		seeds = append(seeds, a)
	}
	slices.Sort(seeds)
	common := []string{"-seeds", strings.Join(seeds, ","), "-plain", "-v", "-seed", "3", "-train-records", strconv.Itoa(records), "-epochs", strconv.Itoa(epochs),
		"-test-records", "1000", "-vocab-cap", "2000", "-dim", "8", "-bottom", "16", "-top", "16", "-batch", "128",
		"-duration", "0", "-eval-every", "0", "-checkpoint-every", "40", "-checkpoint-dir", ckDir,
		"-ps", strconv.Itoa(servers), "-workers", strconv.Itoa(workers),
		"-secret-file", secretFile, "-servers", strings.Join(psList, ",")}

	// The servers' shared-memory directories (recorded in the checkpoint directory) go whatever
	// happens, after the scaler's Close; the test checks below that the job removed them.
	shmDirs := func() []string {
		var dirs []string
		for i := range servers {
			var rec struct {
				Dir string `json:"shm_dir"`
			}
			if b, err := os.ReadFile(filepath.Join(ckDir, "shm-dir."+elastic.ServerID(i))); err == nil && json.Unmarshal(b, &rec) == nil {
				dirs = append(dirs, rec.Dir)
			}
		}
		return dirs
	}
	defer func() {
		for _, d := range shmDirs() {
			os.RemoveAll(d)
		}
	}()

	coord := newCoordWatch()
	events := newEventLog(func(ev process.Event) {
		if ev.Final && ev.Err != nil && !errors.Is(ev.Err, process.ErrProcessStopped) {
			cancel(fmt.Errorf("%s failed for good: %w", ev.ID, ev.Err))
		}
	})
	var filesMu sync.Mutex // Output is called from every node id's goroutine
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	scaler, err := process.New(process.Config{
		Binary:      bin,
		Coordinator: true,
		MaxRestarts: 1, // each process is killed once at most; any other failure fails the test
		StopGrace:   10 * time.Second,
		Args: func(l process.Launch) []string {
			args := append(slices.Clone(common), "-gossip", gossipAddr[l.ID])
			switch l.Role {
			case elastic.RoleCoordinator:
				// Restarted with the same flags: it finds the servers running the job and
				// takes it over.
				args = append(args, "-role", "coordinator", "-listen", coordAddr)
			case elastic.RoleServer:
				args = append(args, "-role", "ps", "-id", l.ID, "-listen", psAddr[l.ID])
			case elastic.RoleWorker:
				args = append(args, "-role", "worker", "-id", l.ID, "-dispatcher", coordAddr)
			}
			return args
		},
		Env: func(process.Launch) []string { return []string{"TMPDIR=" + tmpDir} },
		Output: func(role elastic.Role, id string) (io.Writer, io.Writer) {
			f, err := os.Create(filepath.Join(logDir, id+".log"))
			if err != nil {
				t.Errorf("log of %s: %v", id, err)
				return nil, nil
			}
			filesMu.Lock()
			files = append(files, f)
			filesMu.Unlock()
			if role == elastic.RoleCoordinator {
				return io.MultiWriter(f, coord), f
			}
			return f, f
		},
		OnEvent: events.add,
	})
	require.NoError(t, err)
	defer scaler.Close()
	defer func() {
		if t.Failed() {
			dumpLogs(t, logDir)
		}
	}()

	start := time.Now()
	require.NoError(t, scaler.Scale(ctx, elastic.Plan{Servers: servers, Workers: workers}))

	// kill waits for a commit of a step after since, kills node id with SIGKILL and waits
	// for the scaler to start it again. It returns the newest step snapshotted at the kill:
	// a commit after it was snapshotted after the kill (a recovery or a takeover may take the
	// step back, never forward), which is the progress the next kill waits for.
	kill := func(id string, since uint64) uint64 {
		t.Helper()
		committed, err := coord.commitAfter(ctx, since)
		require.NoError(t, err, "no commit after step %d before killing %s (%v)", since, id, context.Cause(ctx))
		p := info(scaler, id)
		require.True(t, p.Running, "%s runs", id)
		require.NoError(t, syscall.Kill(p.Pid, syscall.SIGKILL))
		snap := coord.snapshotted()
		ev, err := events.started(ctx, id, 1)
		require.NoError(t, err, "%s was not started again (%v)", id, context.Cause(ctx))
		t.Logf("%6.1fs: killed %s (pid %d) after the commit of step %d; restarted as pid %d", time.Since(start).Seconds(), id, p.Pid, committed, ev.Pid)
		return snap
	}
	step := kill("ps-1", 0)
	step = kill("worker-0", step)
	step = kill(elastic.CoordinatorID, step)
	committed, err := coord.commitAfter(ctx, step)
	require.NoError(t, err, "the restarted coordinator commits (%v)", context.Cause(ctx))
	t.Logf("%6.1fs: the restarted coordinator committed step %d", time.Since(start).Seconds(), committed)

	require.NoError(t, scaler.Wait(ctx, elastic.CoordinatorID), "the coordinator exits with status 0 (%v)", context.Cause(ctx))
	t.Logf("%6.1fs: the job is done", time.Since(start).Seconds())
	for i := range workers {
		assert.NoError(t, scaler.Wait(ctx, elastic.WorkerID(i)), "worker %d exits with status 0", i)
	}
	for _, p := range scaler.Processes() {
		want := 0
		if p.ID == "ps-1" || p.ID == "worker-0" || p.ID == elastic.CoordinatorID {
			want = 1
		}
		assert.Equal(t, want, p.Restarts, "%s: restarts (only the kills)", p.ID)
	}

	// The coordinator's summary: every epoch done, every position trained exactly once.
	sum := coord.summary()
	require.NotEmpty(t, sum, "the coordinator printed its summary")
	assert.Contains(t, sum[0], "job: every epoch done;")
	assert.Contains(t, sum[0], fmt.Sprintf("%d samples counted by the dispatcher", records*epochs))
	assert.Contains(t, sum[0], "every position of every epoch covered exactly once;")
	assert.NotContains(t, sum[0], "FAILED")
	assert.NotContains(t, sum[0], "LOST")
	epochLine := regexp.MustCompile(`^epoch (\d+) \(complete\): (\d+) of (\d+) positions covered \(trained, or skipped as bad lines\), dispatcher counted (\d+), 0 twice$`)
	var seen int
	for _, l := range sum[1:] {
		m := epochLine.FindStringSubmatch(strings.TrimSpace(l))
		if !assert.NotNil(t, m, "epoch line %q: complete, no duplicates, no failed shards", l) {
			continue
		}
		seen++
		want := strconv.Itoa(records)
		assert.Equal(t, []string{want, want, want}, m[2:], "epoch %s: every position trained and counted once", m[1])
	}
	assert.Equal(t, epochs, seen, "one line per epoch")

	// The servers leave at SIGTERM, each removing its shared memory.
	dirs := shmDirs()
	require.NoError(t, scaler.Close())
	for _, p := range scaler.Processes() {
		if p.Role == elastic.RoleServer {
			assert.NoError(t, p.Exit, "%s exits with status 0 when stopped", p.ID)
		}
	}
	assert.Len(t, dirs, servers, "every server recorded its shared-memory directory")
	for _, d := range dirs {
		assert.NoDirExists(t, d, "shared memory left behind")
	}
	t.Logf("%6.1fs: done", time.Since(start).Seconds())
}

func info(s *process.Scaler, id string) process.Status {
	for _, p := range s.Processes() {
		if p.ID == id {
			return p
		}
	}
	return process.Status{}
}

// freeAddr returns a loopback address whose port is free now and was not handed out before in
// this test binary: the kernel may give a port just closed to the next listener, and two roles
// of one job given the same port (a server's and a worker's gossip, say) fail to start.
func freeAddr(t *testing.T) string {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		l.Close()
		if _, taken := handedOut.LoadOrStore(addr, true); !taken {
			return addr
		}
	}
}

// handedOut holds the addresses freeAddr returned.
var handedOut sync.Map

// dumpLogs logs the end of every process's output.
func dumpLogs(t *testing.T, dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		t.Logf("---- %s (last %d of %d lines)\n%s", e.Name(), min(len(lines), 60), len(lines), strings.Join(lines[max(0, len(lines)-60):], "\n"))
	}
}

// coordWatch reads the coordinator's stdout: the steps of its commits and its summary.
type coordWatch struct {
	mu      sync.Mutex
	buf     []byte
	newest  uint64        // the newest step committed
	snap    uint64        // the newest step snapshotted
	lines   []string      // from the summary's "job:" line on
	changed chan struct{} // closed and replaced at each commit
}

var (
	commitLine   = regexp.MustCompile(`checkpoint at step (\d+) committed`)
	snapshotLine = regexp.MustCompile(`checkpoint at step (\d+) \((full|delta),`)
)

func newCoordWatch() *coordWatch { return &coordWatch{changed: make(chan struct{})} }

func (w *coordWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		if m := commitLine.FindStringSubmatch(line); m != nil {
			step, _ := strconv.ParseUint(m[1], 10, 64)
			w.newest = max(w.newest, step)
			close(w.changed)
			w.changed = make(chan struct{})
		}
		if m := snapshotLine.FindStringSubmatch(line); m != nil {
			step, _ := strconv.ParseUint(m[1], 10, 64)
			w.snap = max(w.snap, step)
		}
		if strings.HasPrefix(line, "job: ") || len(w.lines) > 0 && line != "" {
			w.lines = append(w.lines, line)
		}
	}
}

// commitAfter waits for a commit of a step after since and returns the newest step committed.
func (w *coordWatch) commitAfter(ctx context.Context, since uint64) (uint64, error) {
	for {
		w.mu.Lock()
		newest, changed := w.newest, w.changed
		w.mu.Unlock()
		if newest > since {
			return newest, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// snapshotted returns the newest step snapshotted.
func (w *coordWatch) snapshotted() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.snap
}

func (w *coordWatch) summary() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.lines...)
}

// eventLog keeps the scaler's events, and hands each to onExit at an exit.
type eventLog struct {
	onExit  func(process.Event)
	mu      sync.Mutex
	events  []process.Event
	changed chan struct{}
}

func newEventLog(onExit func(process.Event)) *eventLog {
	return &eventLog{onExit: onExit, changed: make(chan struct{})}
}

func (l *eventLog) add(ev process.Event) {
	l.mu.Lock()
	l.events = append(l.events, ev)
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
	if ev.Exited {
		l.onExit(ev)
	}
}

// started waits for start restart of node id.
func (l *eventLog) started(ctx context.Context, id string, restart int) (process.Event, error) {
	for {
		l.mu.Lock()
		changed := l.changed
		for _, ev := range l.events {
			if ev.ID == id && !ev.Exited && ev.Restart == restart {
				l.mu.Unlock()
				return ev, nil
			}
		}
		l.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return process.Event{}, ctx.Err()
		}
	}
}
