package process_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/elastictest"
	"github.com/elasticps/elasticps/elastic/process"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Scaler tests run this test binary itself as the child: TestMain sees childMode
// in its environment and acts the part instead of running the tests.
const (
	childMode    = "ELASTICPS_PROCSCALER_CHILD"
	childRestart = "ELASTICPS_PROCSCALER_RESTART"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childMode); mode != "" {
		os.Exit(runChild(mode))
	}
	os.Exit(m.Run())
}

// runChild is a child process of the Scaler tests: it prints "start N" (its restart)
// on stderr, then acts by its mode:
//
//	serve         print "ready", run until SIGTERM, exit 0
//	stubborn      print "ready", ignore SIGTERM, run until killed
//	exit0         exit with status 0
//	size          print its GOMAXPROCS and GOMEMLIMIT, exit 0
//	exit1         exit with status 1
//	crash         kill itself with SIGKILL
//	fail-until:N  exit 1 at starts 0..N-1, then 0
func runChild(mode string) int {
	restart, _ := strconv.Atoi(os.Getenv(childRestart))
	fmt.Fprintf(os.Stderr, "start %d\n", restart)
	switch {
	case mode == "serve":
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		fmt.Println("ready")
		<-c
		return 0
	case mode == "stubborn":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		select {}
	case mode == "exit0":
		return 0
	case mode == "size":
		fmt.Printf("GOMAXPROCS=%s GOMEMLIMIT=%s\n", os.Getenv("GOMAXPROCS"), os.Getenv("GOMEMLIMIT"))
		return 0
	case mode == "exit1":
		fmt.Fprintln(os.Stderr, "failing on purpose")
		return 1
	case mode == "crash":
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	case strings.HasPrefix(mode, "fail-until:"):
		n, _ := strconv.Atoi(strings.TrimPrefix(mode, "fail-until:"))
		if restart < n {
			return 1
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown child mode %q\n", mode)
	return 2
}

// childGORACE keeps a child built with -race from sleeping a second at its exit (the race
// runtime's default), which the grace periods here would count.
func childGORACE() string { return "GORACE=" + os.Getenv("GORACE") + " atexit_sleep_ms=0" }

// procHarness runs a Scaler over children of the modes mode gives, and records the
// events and the "ready" lines the children print.
type procHarness struct {
	t *testing.T
	s *process.Scaler

	mu      sync.Mutex
	events  map[string]chan process.Event // per node id
	ready   map[string]int                // "ready" lines per node id: one per start that got ready
	changed chan struct{}                 // closed and replaced at each "ready" line
	evented chan struct{}                 // closed and replaced at each event
}

func newProcHarness(t *testing.T, cfg process.Config, mode func(l process.Launch) string) *procHarness {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	h := &procHarness{t: t, events: map[string]chan process.Event{}, ready: map[string]int{}, changed: make(chan struct{}), evented: make(chan struct{})}
	cfg.Binary = exe
	cfg.Args = func(l process.Launch) []string {
		return []string{"-test.run=^$", "-role=" + l.Role.String(), "-id=" + l.ID}
	}
	cfg.Env = func(l process.Launch) []string {
		return []string{childMode + "=" + mode(l), childRestart + "=" + strconv.Itoa(l.Restart), childGORACE()}
	}
	cfg.OnEvent = func(ev process.Event) {
		h.eventsOf(ev.ID) <- ev
		h.mu.Lock()
		close(h.evented)
		h.evented = make(chan struct{})
		h.mu.Unlock()
	}
	cfg.Output = func(role elastic.Role, id string) (io.Writer, io.Writer) {
		return &lineWriter{line: func(s string) {
			if s == "ready" {
				h.mu.Lock()
				h.ready[id]++
				close(h.changed)
				h.changed = make(chan struct{})
				h.mu.Unlock()
			}
		}}, nil
	}
	h.s, err = process.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { h.s.Close() })
	return h
}

func (h *procHarness) eventsOf(id string) chan process.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.events[id]
	if c == nil {
		c = make(chan process.Event, 100)
		h.events[id] = c
	}
	return c
}

// next returns the next event of node id.
func (h *procHarness) next(id string) process.Event {
	h.t.Helper()
	select {
	case ev := <-h.eventsOf(id):
		return ev
	case <-time.After(30 * time.Second):
		h.t.Fatalf("no event of %s", id)
		return process.Event{}
	}
}

// waitReady waits until node id has printed "ready" more than n times: its n-th process (0 is
// the first) has its signal handling set up.
func (h *procHarness) waitReady(id string, n int) {
	h.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		h.mu.Lock()
		got, changed := h.ready[id], h.changed
		h.mu.Unlock()
		if got > n {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			h.t.Fatalf("process %d of %s never got ready", n, id)
		}
	}
}

func (h *procHarness) info(id string) (process.Status, bool) {
	for _, p := range h.s.Processes() {
		if p.ID == id {
			return p, true
		}
	}
	return process.Status{}, false
}

// lineWriter calls line for every complete line written to it.
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	line func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		w.line(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}

func ids(infos []process.Status) []string {
	var out []string
	for _, p := range infos {
		out = append(out, p.ID)
	}
	return out
}

func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestProcessConfigValidate(t *testing.T) {
	err := process.Config{MaxRestarts: -1, StopGrace: -time.Second}.Validate()
	require.ErrorIs(t, err, elastic.ErrInvalidConfig)
	for _, want := range []string{"Binary", "Args", "MaxRestarts", "StopGrace"} {
		assert.ErrorContains(t, err, want)
	}
	_, err = process.New(process.Config{Binary: "x"})
	assert.ErrorIs(t, err, elastic.ErrInvalidConfig)
	s, err := process.New(process.Config{Binary: "x", Args: func(process.Launch) []string { return nil }})
	require.NoError(t, err)
	assert.ErrorIs(t, s.Scale(context.Background(), elastic.Plan{Servers: -1}), elastic.ErrInvalidConfig)
	require.NoError(t, s.Close())
}

func TestProcessScaleUpAndDown(t *testing.T) {
	h := newProcHarness(t, process.Config{Coordinator: true}, func(process.Launch) string { return "serve" })
	ctx := waitCtx(t)
	require.NoError(t, h.s.Scale(ctx, elastic.Plan{Servers: 2, Workers: 2}))
	assert.Equal(t, elastic.Plan{Servers: 2, Workers: 2}, h.s.Plan())
	procs := h.s.Processes()
	assert.Equal(t, []string{elastic.CoordinatorID, "ps-0", "ps-1", "worker-0", "worker-1"}, ids(procs))
	pids := map[int]bool{}
	for _, p := range procs {
		h.waitReady(p.ID, 0) // so that it exits 0 at SIGTERM
		assert.True(t, p.Running, p.ID)
		assert.NotZero(t, p.Pid, p.ID)
		pids[p.Pid] = true
	}
	assert.Len(t, pids, 5, "one process each")
	assert.Equal(t, elastic.RoleCoordinator, procs[0].Role)
	assert.Equal(t, elastic.RoleServer, procs[1].Role)
	assert.Equal(t, elastic.RoleWorker, procs[3].Role)

	// Down: the highest-numbered worker goes, and Scale returns once it has exited. The server
	// count is not Scale's to change.
	require.NoError(t, h.s.Scale(ctx, elastic.Plan{Servers: 2, Workers: 1}))
	assert.Equal(t, []string{elastic.CoordinatorID, "ps-0", "ps-1", "worker-0"}, ids(h.s.Processes()))
	assert.ErrorIs(t, h.s.Wait(ctx, "worker-1"), process.ErrProcessStopped)
	assert.ErrorIs(t, h.s.Scale(ctx, elastic.Plan{Servers: 1, Workers: 1}), elastic.ErrInvalidConfig)
	assert.ErrorIs(t, h.s.Scale(ctx, elastic.Plan{Servers: 3, Workers: 1}), elastic.ErrInvalidConfig)
	assert.Equal(t, elastic.Plan{Servers: 2, Workers: 1}, h.s.Plan())
	// Up again: a new process under the old name; the others are left alone.
	require.NoError(t, h.s.Scale(ctx, elastic.Plan{Servers: 2, Workers: 2}))
	procs = h.s.Processes()
	assert.Equal(t, []string{elastic.CoordinatorID, "ps-0", "ps-1", "worker-0", "worker-1"}, ids(procs))
	for _, p := range procs {
		if p.ID == "worker-1" {
			h.waitReady(p.ID, 1) // the second process of the name
			assert.False(t, pids[p.Pid], "%s is a new process", p.ID)
		} else {
			h.waitReady(p.ID, 0)
			assert.True(t, pids[p.Pid], "%s kept its process", p.ID)
		}
		assert.True(t, p.Running, p.ID)
		assert.Zero(t, p.Restarts, p.ID)
	}

	require.NoError(t, h.s.Close())
	for _, p := range h.s.Processes() {
		assert.False(t, p.Running, p.ID)
		assert.True(t, p.Done, p.ID)
		assert.NoError(t, p.Exit, "%s exited 0 at SIGTERM", p.ID)
		assert.ErrorIs(t, p.Err, process.ErrProcessStopped, p.ID)
		assert.ErrorIs(t, h.s.Wait(ctx, p.ID), process.ErrProcessStopped, p.ID)
	}
	require.NoError(t, h.s.Close(), "idempotent")
	assert.ErrorIs(t, h.s.Scale(ctx, elastic.Plan{Servers: 1}), elastic.ErrClosed)
	assert.ErrorIs(t, h.s.Wait(ctx, "worker-9"), process.ErrNoProcess)
}

func TestProcessRestartAfterKill(t *testing.T) {
	h := newProcHarness(t, process.Config{MaxRestarts: 2}, func(process.Launch) string { return "serve" })
	ctx := waitCtx(t)
	require.NoError(t, h.s.Scale(ctx, elastic.Plan{Servers: 1, Workers: 1}))
	ev := h.next("ps-0")
	require.False(t, ev.Exited)
	for restart := range 2 {
		require.Equal(t, restart, ev.Restart)
		h.waitReady("ps-0", restart)
		require.NoError(t, syscall.Kill(ev.Pid, syscall.SIGKILL))
		exit := h.next("ps-0")
		require.True(t, exit.Exited)
		assert.Equal(t, ev.Pid, exit.Pid)
		assert.False(t, exit.Final, "restarted")
		var ee *exec.ExitError
		require.ErrorAs(t, exit.Err, &ee)
		assert.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal())
		again := h.next("ps-0")
		require.False(t, again.Exited)
		assert.Equal(t, restart+1, again.Restart)
		assert.NotEqual(t, ev.Pid, again.Pid, "a new process")
		p, _ := h.info("ps-0")
		assert.Equal(t, restart+1, p.Restarts)
		assert.Equal(t, again.Pid, p.Pid)
		assert.True(t, p.Running)
		assert.Error(t, p.Exit, "the kill")
		ev = again
	}
	// Two restarts used: the third kill is final.
	h.waitReady("ps-0", 2)
	require.NoError(t, syscall.Kill(ev.Pid, syscall.SIGKILL))
	err := h.s.Wait(ctx, "ps-0")
	require.ErrorIs(t, err, process.ErrRestartLimit)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "the last exit is wrapped")
	p, ok := h.info("ps-0")
	require.True(t, ok)
	assert.True(t, p.Done)
	assert.False(t, p.Running)
	assert.Equal(t, 2, p.Restarts)
	w, _ := h.info("worker-0")
	assert.True(t, w.Running, "the worker is not touched")
	assert.Zero(t, w.Restarts)
}

func TestProcessRestartLimit(t *testing.T) {
	h := newProcHarness(t, process.Config{MaxRestarts: 2}, func(l process.Launch) string {
		if l.Role == elastic.RoleServer {
			return "crash"
		}
		return "exit1"
	})
	ctx := waitCtx(t)
	require.NoError(t, h.s.Scale(ctx, elastic.Plan{Servers: 1, Workers: 1}))
	err := h.s.Wait(ctx, "worker-0")
	require.ErrorIs(t, err, process.ErrRestartLimit)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 1, ee.ExitCode())
	err = h.s.Wait(ctx, "ps-0")
	require.ErrorIs(t, err, process.ErrRestartLimit)
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal())
	for _, p := range h.s.Processes() {
		assert.Equal(t, 2, p.Restarts, p.ID)
		assert.True(t, p.Done, p.ID)
		assert.ErrorIs(t, p.Err, process.ErrRestartLimit, p.ID)
	}
	// Three starts and three exits each, the last one final.
	for _, id := range []string{"ps-0", "worker-0"} {
		for i := range 3 {
			assert.False(t, h.next(id).Exited)
			exit := h.next(id)
			assert.True(t, exit.Exited)
			assert.Equal(t, i == 2, exit.Final)
		}
	}

	// The default: never restarted.
	h = newProcHarness(t, process.Config{}, func(process.Launch) string { return "exit1" })
	require.NoError(t, h.s.Scale(ctx, elastic.Plan{Workers: 1}))
	require.ErrorIs(t, h.s.Wait(ctx, "worker-0"), process.ErrRestartLimit)
	p, _ := h.info("worker-0")
	assert.Zero(t, p.Restarts)
}

func TestProcessCleanExitIsNotRestarted(t *testing.T) {
	h := newProcHarness(t, process.Config{Coordinator: true, MaxRestarts: 3}, func(l process.Launch) string {
		switch l.ID {
		case elastic.CoordinatorID:
			return "exit0"
		case "worker-1":
			return "fail-until:2"
		}
		return "serve"
	})
	ctx := waitCtx(t)
	require.NoError(t, h.s.Scale(ctx, elastic.Plan{Servers: 1, Workers: 2}))
	require.NoError(t, h.s.Wait(ctx, elastic.CoordinatorID), "the job is done")
	require.NoError(t, h.s.Wait(ctx, "worker-1"), "succeeded at its second restart")
	c, _ := h.info(elastic.CoordinatorID)
	assert.Zero(t, c.Restarts)
	assert.True(t, c.Done)
	assert.NoError(t, c.Exit)
	w, _ := h.info("worker-1")
	assert.Equal(t, 2, w.Restarts)
	assert.True(t, w.Done)
	// The coordinator started once and exited once.
	assert.False(t, h.next(elastic.CoordinatorID).Exited)
	exit := h.next(elastic.CoordinatorID)
	assert.True(t, exit.Exited)
	assert.True(t, exit.Final)

	// The same plan again starts nothing: the done ones stay done.
	require.NoError(t, h.s.Scale(ctx, elastic.Plan{Servers: 1, Workers: 2}))
	c, _ = h.info(elastic.CoordinatorID)
	assert.True(t, c.Done)
	assert.False(t, c.Running)
	for _, id := range []string{"ps-0", "worker-0"} {
		p, _ := h.info(id)
		assert.True(t, p.Running, id)
	}
}

func TestProcessCloseKillsAfterGrace(t *testing.T) {
	h := newProcHarness(t, process.Config{StopGrace: 500 * time.Millisecond}, func(l process.Launch) string {
		if l.Role == elastic.RoleWorker {
			return "stubborn"
		}
		return "serve"
	})
	ctx := waitCtx(t)
	require.NoError(t, h.s.Scale(ctx, elastic.Plan{Servers: 1, Workers: 2}))
	for _, id := range []string{"ps-0", "worker-0", "worker-1"} {
		h.waitReady(id, 0)
	}
	// A stubborn worker stopped by Scale is killed after the grace, and not restarted even
	// though a signal ended it.
	require.NoError(t, h.s.Scale(ctx, elastic.Plan{Servers: 1, Workers: 1}))
	require.ErrorIs(t, h.s.Wait(ctx, "worker-1"), process.ErrProcessStopped)
	var stops []process.Event
	for ev := h.next("worker-1"); ; ev = h.next("worker-1") {
		stops = append(stops, ev)
		if ev.Final {
			break
		}
	}
	require.Len(t, stops, 2, "one start, one exit")
	var ee *exec.ExitError
	require.ErrorAs(t, stops[1].Err, &ee)
	assert.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal())

	require.NoError(t, h.s.Close())
	for _, p := range h.s.Processes() {
		assert.False(t, p.Running, p.ID)
		assert.ErrorIs(t, h.s.Wait(ctx, p.ID), process.ErrProcessStopped)
		// The server left at SIGTERM, the stubborn worker was killed.
		if p.Role == elastic.RoleServer {
			assert.NoError(t, p.Exit)
		} else {
			assert.Error(t, p.Exit)
		}
	}
}

func TestProcessStartFailure(t *testing.T) {
	s, err := process.New(process.Config{Binary: "/nonexistent/elasticps-binary",
		Args: func(process.Launch) []string { return nil }})
	require.NoError(t, err)
	defer s.Close()
	ctx := waitCtx(t)
	err = s.Scale(ctx, elastic.Plan{Servers: 1})
	require.Error(t, err)
	assert.True(t, errors.Is(err, os.ErrNotExist), err)
	assert.ErrorIs(t, s.Wait(ctx, "ps-0"), os.ErrNotExist)
}

// TestProcessOutput checks that a node id's restarts write to the writers Output gave once.
func TestProcessOutput(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	var mu sync.Mutex
	calls := map[string]int{}
	outs := map[string]*strings.Builder{}
	s, err := process.New(process.Config{Binary: exe, MaxRestarts: 1,
		Args: func(process.Launch) []string { return []string{"-test.run=^$"} },
		Env: func(l process.Launch) []string {
			return []string{childMode + "=fail-until:1", childRestart + "=" + strconv.Itoa(l.Restart), childGORACE()}
		},
		Output: func(role elastic.Role, id string) (io.Writer, io.Writer) {
			mu.Lock()
			defer mu.Unlock()
			calls[id]++
			b := &strings.Builder{}
			outs[id] = b
			return io.Discard, b
		}})
	require.NoError(t, err)
	defer s.Close()
	ctx := waitCtx(t)
	require.NoError(t, s.Scale(ctx, elastic.Plan{Workers: 1}))
	require.NoError(t, s.Wait(ctx, "worker-0"))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]int{"worker-0": 1}, calls)
	assert.Equal(t, "start 0\nstart 1\n", outs["worker-0"].String(), "both starts wrote to the one writer")
}

// A plan's process sizes reach the Go runtime of the processes started under it.
func TestProcessScalerGivesThePlansSizes(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	var mu sync.Mutex
	var lines []string
	s, err := process.New(process.Config{
		Binary: exe,
		Args:   func(process.Launch) []string { return []string{"-test.run=^$"} },
		Env:    func(process.Launch) []string { return []string{childMode + "=size", childGORACE()} },
		Output: func(elastic.Role, string) (io.Writer, io.Writer) {
			return &lineWriter{line: func(l string) {
				mu.Lock()
				defer mu.Unlock()
				lines = append(lines, l)
			}}, nil
		},
	})
	require.NoError(t, err)
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, s.Scale(ctx, elastic.Plan{Workers: 1, Worker: elastic.Resources{CPUs: 1.5, Memory: 1 << 30}}))
	require.NoError(t, s.Wait(ctx, elastic.WorkerID(0)))
	require.NoError(t, s.Close()) // the output is flushed once the process is waited for
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"GOMAXPROCS=2 GOMEMLIMIT=1073741824"}, lines)
	assert.ErrorIs(t, s.Scale(ctx, elastic.Plan{Workers: 1, Worker: elastic.Resources{Memory: -1}}), elastic.ErrInvalidConfig)
}

// A process scaler that can reach its servers (Config.Server) starts and stops server
// processes for a change of the server count, the highest-numbered first.
func TestProcessScalerStartsAndStopsServers(t *testing.T) {
	reach := func(id string) (elastic.ParameterServer, error) {
		return remote.NewServer(ps.Node{ID: id, Addr: "127.0.0.1:1"}, remote.Config{Secret: []byte("a secret of the process tests...")})
	}
	h := newProcHarness(t, process.Config{Server: reach}, func(process.Launch) string { return "serve" })
	ctx := waitCtx(t)
	require.NoError(t, h.s.Scale(ctx, elastic.Plan{Servers: 1, Workers: 1}))
	added, err := h.s.StartServers(ctx, 2)
	require.NoError(t, err)
	require.Len(t, added, 2)
	assert.Equal(t, "ps-1", added[0].Node().ID)
	assert.Equal(t, "ps-2", added[1].Node().ID)
	assert.Equal(t, elastic.Plan{Servers: 3, Workers: 1}, h.s.Plan())
	assert.Equal(t, []string{"ps-0", "ps-1", "ps-2", "worker-0"}, ids(h.s.Processes()))
	for _, id := range []string{"ps-1", "ps-2"} {
		h.waitReady(id, 0) // so that it exits 0 at SIGTERM
	}
	assert.ErrorIs(t, h.s.StopServers(ctx, []string{"ps-0"}), elastic.ErrInvalidConfig, "not the highest-numbered")
	assert.ErrorIs(t, h.s.Scale(ctx, elastic.Plan{Servers: 2, Workers: 1}), elastic.ErrInvalidConfig, "Scale keeps the servers")
	assert.Equal(t, elastic.Plan{Servers: 3, Workers: 1}, h.s.Plan())
	require.NoError(t, h.s.StopServers(ctx, []string{"ps-2"}))
	assert.Equal(t, []string{"ps-0", "ps-1", "worker-0"}, ids(h.s.Processes()))
	assert.Equal(t, 2, h.s.Plan().Servers)

	plain := newProcHarness(t, process.Config{}, func(process.Launch) string { return "serve" })
	_, err = plain.s.StartServers(ctx, 1)
	assert.ErrorIs(t, err, errors.ErrUnsupported, "a scaler that cannot reach its servers does not start them")
}

// procs is what runs: the node ids of the scaler's running processes, with their pids.
func (h *procHarness) procs() elastictest.Procs {
	out := elastictest.Procs{}
	for _, p := range h.s.Processes() {
		if p.Running {
			out[p.ID] = strconv.Itoa(p.Pid)
		}
	}
	return out
}

// await waits for cond, looking again at every start and exit of a process.
func (h *procHarness) await(ctx context.Context, cond func(elastictest.Procs) bool) (elastictest.Procs, error) {
	changed := func() <-chan struct{} {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.evented
	}
	return elastictest.AwaitChanges(ctx, changed, h.procs, cond)
}

// crash kills the process of node id with SIGKILL, behind the scaler's back.
func (h *procHarness) crash(ctx context.Context, id string) error {
	p, ok := h.info(id)
	if !ok || !p.Running {
		return fmt.Errorf("%s does not run", id)
	}
	return syscall.Kill(p.Pid, syscall.SIGKILL)
}

// The process scaler, reaching its servers (Config.Server), meets the Scaler contract; its
// children serve until stopped.
func TestProcessScalerContract(t *testing.T) {
	elastictest.TestScaler(t, func(t *testing.T, servers int) elastictest.ScalerUnderTest {
		reach := func(id string) (elastic.ParameterServer, error) {
			return remote.NewServer(ps.Node{ID: id, Addr: "127.0.0.1:1"}, remote.Config{Secret: []byte("a secret of the process tests...")})
		}
		h := newProcHarness(t, process.Config{Server: reach, MaxRestarts: 2, StopGrace: 5 * time.Second},
			func(process.Launch) string { return "serve" })
		return elastictest.ScalerUnderTest{Scaler: h.s, Await: h.await, Crash: h.crash}
	})
}
