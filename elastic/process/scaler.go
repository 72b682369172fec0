package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/elasticps/elasticps/elastic"
)

var (
	// ErrRestartLimit is returned by Scaler.Wait for a process that exited abnormally
	// once more than Config.MaxRestarts allows; the error wraps the last exit's too (an
	// *exec.ExitError).
	ErrRestartLimit = errors.New("process: the process exited abnormally more often than the restart limit allows")
	// ErrProcessStopped is returned by Scaler.Wait for a process that Scale or Close
	// stopped.
	ErrProcessStopped = errors.New("process: the process was stopped by its scaler")
	// ErrNoProcess is returned by Scaler.Wait for a node id the scaler never ran.
	ErrNoProcess = errors.New("process: no such process")
)

// Launch is one start of a process of a Scaler.
type Launch struct {
	// Role is the process's role.
	Role elastic.Role
	// ID is its node id: elastic.CoordinatorID, elastic.ServerID(i) or elastic.WorkerID(i).
	ID string
	// Restart is 0 at the first start of the node id and n at its n-th restart after an
	// abnormal exit.
	Restart int
	// Size is the size the plan gives processes of its role when it was started. The scaler
	// passes it to the Go runtime (GOMAXPROCS, the CPUs rounded up; GOMEMLIMIT, the memory);
	// Args may also make flags of it.
	Size elastic.Resources
}

// Config configures a Scaler. The zero value of every field but Binary and Args
// means its default. Args, Env, Output and OnEvent are called from the goroutine that watches
// the node id they are about: different node ids' calls may come concurrently.
type Config struct {
	// Binary is the program every process runs (a path, or a name looked up in PATH). Required.
	Binary string
	// Args returns the arguments (without the program name) of a start: the role, node id,
	// addresses and whatever else the program needs. Called once per start. Required.
	Args func(l Launch) []string
	// Env, if set, returns environment entries ("KEY=value") a start gets on top of this
	// process's environment. Called once per start.
	Env func(l Launch) []string
	// Dir is the processes' working directory. Default: this process's.
	Dir string
	// Coordinator makes the scaler run the job's coordinator too, as node id elastic.CoordinatorID,
	// from the first Scale until Close. Default false: the coordinator runs elsewhere (in the
	// caller's process, say).
	Coordinator bool
	// MaxRestarts is how many times a node id whose process exits abnormally (killed by a
	// signal, or a nonzero status) is started again, over the node id's life. A process that
	// exits with status 0 is done, and one that Scale or Close stopped is never restarted.
	// Default 0: never.
	MaxRestarts int
	// StopGrace is how long a process told to stop (SIGTERM) may take before it is killed
	// (SIGKILL); it also bounds the wait for a process's output once it has exited. Default 10s.
	StopGrace time.Duration
	// Output, if set, returns the writers of a node id's stdout and stderr (either may be nil:
	// discarded), called once per node id: its restarts write to the same writers. Each writer
	// is written by one goroutine at a time (the same writer for both streams too, if it is
	// comparable); the scaler never closes them. Nil: discarded.
	Output func(role elastic.Role, id string) (stdout, stderr io.Writer)
	// OnEvent, if set, is called when a process starts and when it exits: one node id's events
	// come in order. It must not block for long.
	OnEvent func(Event)
	// Server, if set, returns how the coordinator reaches the parameter server process of a
	// node id (say remote.NewServer at the address Args gives it), which makes the scaler start
	// and stop servers for a change of the server count (ServerScaler). Nil: the server count
	// stays as the first Scale made it (StartServers fails with errors.ErrUnsupported).
	Server func(id string) (elastic.ParameterServer, error)
	// Logger receives the scaler's events (starts, abnormal exits, restarts). Nil discards.
	Logger *slog.Logger
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if c.Binary == "" {
		errs = append(errs, errors.New("Binary is required"))
	}
	if c.Args == nil {
		errs = append(errs, errors.New("Args is required"))
	}
	if c.MaxRestarts < 0 {
		errs = append(errs, fmt.Errorf("MaxRestarts %d is negative", c.MaxRestarts))
	}
	if c.StopGrace < 0 {
		errs = append(errs, fmt.Errorf("StopGrace %v is negative", c.StopGrace))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", elastic.ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.StopGrace == 0 {
		c.StopGrace = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Event is a start or an exit of a process of a Scaler (Config.OnEvent).
type Event struct {
	// Launch is the start the event is about.
	Launch
	// Pid is the process's id; 0 when it could not be started.
	Pid int
	// Exited is false at a start and true at an exit (or a failure to start).
	Exited bool
	// Err is an exit's error: an *exec.ExitError for a signal or a nonzero status, nil for
	// status 0; or the failure to start.
	Err error
	// Final says the node id will not be started again: it exited with status 0, was stopped,
	// failed to start or reached the restart limit. Scaler.Wait returns.
	Final bool
}

// Status is a process of a Scaler (Scaler.Processes).
type Status struct {
	// Role is the process's role.
	Role elastic.Role
	// ID is its node id.
	ID string
	// Pid is the newest start's process id; 0 before the first start.
	Pid int
	// Restarts counts the starts after an abnormal exit.
	Restarts int
	// Running says the process runs now.
	Running bool
	// Done says the node id will not be started again.
	Done bool
	// Exit is the newest exit's error (nil: not exited yet, or status 0).
	Exit error
	// Err is why the node id is done, as Wait returns it; nil while not Done.
	Err error
}

// Scaler is a Scaler that runs a job's processes on this host with os/exec: one process
// per node id, with the arguments Config.Args gives, started again under its node id
// after an abnormal exit (a signal or a nonzero status) up to MaxRestarts; an exit with status 0
// is final. Processes that Scale or Close stop get SIGTERM, then SIGKILL after StopGrace, and are
// never restarted. A restarted process is a new incarnation of its node (Launch.Restart says
// which start it is). It is safe for concurrent use; Close stops every process.
type Scaler struct {
	cfg Config
	log *slog.Logger
	wg  sync.WaitGroup // one per node id's goroutine

	mu      sync.Mutex
	plan    elastic.Plan
	servers bool             // the server count is set: by the first Scale, or StartServers
	procs   map[string]*proc // the node ids of the plan (and the coordinator)
	last    map[string]*proc // the newest proc of every node id ever run
	closed  bool
}

var _ elastic.ServerScaler = (*Scaler)(nil)

// StartServers implements elastic.ServerScaler: it starts server processes ps-k .. ps-(k+n-1)
// after the plan's k and returns them as Config.Server gives them, once each start was tried
// (a process may take a moment to listen: the coordinator waits for it to answer). Without
// Config.Server it fails with errors.ErrUnsupported and starts none.
func (s *Scaler) StartServers(ctx context.Context, n int) ([]elastic.ParameterServer, error) {
	if s.cfg.Server == nil {
		return nil, fmt.Errorf("process: the process scaler cannot reach the servers it starts (Config.Server): %w", errors.ErrUnsupported)
	}
	if n < 0 {
		return nil, fmt.Errorf("%w: start %d servers", elastic.ErrInvalidConfig, n)
	}
	var k int
	err := s.scale(ctx, func(cur elastic.Plan) (elastic.Plan, error) {
		k = cur.Servers
		cur.Servers += n
		return cur, nil
	})
	if err != nil {
		return nil, err
	}
	var out []elastic.ParameterServer
	for i := k; i < k+n; i++ {
		srv, err := s.cfg.Server(elastic.ServerID(i))
		if err != nil {
			return out, fmt.Errorf("process: server %s: %w", elastic.ServerID(i), err)
		}
		out = append(out, srv)
	}
	return out, nil
}

// StopServers implements elastic.ServerScaler: it stops the server processes of ids, which must
// be the plan's highest-numbered, and waits for them to exit.
func (s *Scaler) StopServers(ctx context.Context, ids []string) error {
	return s.scale(ctx, func(cur elastic.Plan) (elastic.Plan, error) {
		k := cur.Servers - len(ids)
		for n, id := range ids {
			ok := k >= 0 && !slices.Contains(ids[:n], id)
			if ok {
				ok = false
				for j := k; j < cur.Servers; j++ {
					ok = ok || elastic.ServerID(j) == id
				}
			}
			if !ok {
				return cur, fmt.Errorf("%w: server %q is not among the plan's highest-numbered %d (or named twice)", elastic.ErrInvalidConfig, id, len(ids))
			}
		}
		cur.Servers = k
		return cur, nil
	})
}

// proc is one node id's life, from its first start to its end; restarts keep the proc.
type proc struct {
	role  elastic.Role
	id    string
	index int   // i of ServerID(i) or WorkerID(i); -1 for the coordinator
	prev  *proc // the node id's earlier proc, maybe still stopping: this one starts after it
	size  elastic.Resources

	stop     chan struct{} // closed to stop the process
	stopOnce sync.Once
	launched chan struct{} // closed once the first start was tried
	startErr error         // the first start's failure; set before launched is closed
	done     chan struct{} // closed when the node id will not be started again

	// Guarded by Scaler.mu.
	pid      int
	restarts int
	running  bool
	exit     error
	result   error // Wait's outcome; set before done is closed
	finished bool
}

func (p *proc) signalStop() { p.stopOnce.Do(func() { close(p.stop) }) }

// New returns a scaler that runs no process until Scale.
func New(cfg Config) (*Scaler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Scaler{cfg: cfg, log: cfg.Logger, procs: map[string]*proc{}, last: map[string]*proc{}}, nil
}

// Scale implements elastic.Scaler: it starts the workers plan has and the scaler does not run
// (and, at the first call, the plan's servers and, with Config.Coordinator, the coordinator),
// stops the workers it runs and plan does not have (the highest-numbered), and returns once
// every start was tried and every stopped process has exited, or ctx ends (the stops go on). A
// node id done for good (exited with status 0, or at its restart limit) is not started again
// while plan keeps it. After the first call, plan.Servers must be Plan().Servers: the server
// count changes through StartServers and StopServers (an error wrapping
// elastic.ErrInvalidConfig otherwise, and nothing changes). The error joins the failures to
// start; ErrClosed after Close.
func (s *Scaler) Scale(ctx context.Context, plan elastic.Plan) error {
	if err := plan.Validate(); err != nil {
		return err
	}
	return s.scale(ctx, func(cur elastic.Plan) (elastic.Plan, error) {
		if s.servers && plan.Servers != cur.Servers {
			return cur, fmt.Errorf("%w: %d parameter servers asked for, the scaler runs %d: change the number through the coordinator (SetParallelism), which moves the slots and calls StartServers or StopServers",
				elastic.ErrInvalidConfig, plan.Servers, cur.Servers)
		}
		return plan, nil
	})
}

// scale runs the plan change returns for the current one, as Scale says; change is called
// with s.mu held, and its error changes nothing.
func (s *Scaler) scale(ctx context.Context, change func(cur elastic.Plan) (elastic.Plan, error)) error {
	type want struct {
		role  elastic.Role
		index int
		size  elastic.Resources
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return elastic.ErrClosed
	}
	plan, err := change(s.plan)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	wanted := map[string]want{}
	var order []string
	add := func(id string, w want) { wanted[id] = w; order = append(order, id) }
	if s.cfg.Coordinator {
		add(elastic.CoordinatorID, want{elastic.RoleCoordinator, -1, elastic.Resources{}})
	}
	for i := range plan.Servers {
		add(elastic.ServerID(i), want{elastic.RoleServer, i, plan.Server})
	}
	for i := range plan.Workers {
		add(elastic.WorkerID(i), want{elastic.RoleWorker, i, plan.Worker})
	}
	var started, stopped []*proc
	for id, p := range s.procs {
		if _, ok := wanted[id]; !ok {
			delete(s.procs, id)
			p.signalStop()
			stopped = append(stopped, p)
		}
	}
	for _, id := range order {
		if s.procs[id] != nil {
			continue
		}
		w := wanted[id]
		p := &proc{role: w.role, id: id, index: w.index, size: w.size, prev: s.last[id],
			stop: make(chan struct{}), launched: make(chan struct{}), done: make(chan struct{})}
		s.procs[id], s.last[id] = p, p
		s.wg.Add(1)
		go s.supervise(p)
		started = append(started, p)
	}
	s.plan, s.servers = plan, true
	s.mu.Unlock()

	var errs []error
	for _, p := range started {
		select {
		case <-p.launched:
			if p.startErr != nil {
				errs = append(errs, p.startErr)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, p := range stopped {
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.Join(errs...)
}

// Plan implements Scaler.
func (s *Scaler) Plan() elastic.Plan {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.plan
}

// Processes returns the processes of the plan (and the coordinator): the coordinator first,
// then the servers and the workers in index order. After Close, the ones it stopped.
func (s *Scaler) Processes() []Status {
	s.mu.Lock()
	ps := make([]*proc, 0, len(s.procs))
	for _, p := range s.procs {
		ps = append(ps, p)
	}
	out := make([]Status, 0, len(ps))
	slices.SortFunc(ps, func(a, b *proc) int {
		if ra, rb := roleRank(a.role), roleRank(b.role); ra != rb {
			return ra - rb
		}
		return a.index - b.index
	})
	for _, p := range ps {
		out = append(out, Status{Role: p.role, ID: p.id, Pid: p.pid, Restarts: p.restarts,
			Running: p.running, Done: p.finished, Exit: p.exit, Err: p.result})
	}
	s.mu.Unlock()
	return out
}

func roleRank(r elastic.Role) int {
	switch r {
	case elastic.RoleCoordinator:
		return 0
	case elastic.RoleServer:
		return 1
	}
	return 2
}

// Wait waits until node id will not be started again, or ctx ends, and returns why: nil when
// its process exited with status 0, ErrProcessStopped when Scale or Close stopped it,
// ErrRestartLimit (with the last exit) when it failed once more than MaxRestarts allows, the
// failure to start, or ErrNoProcess for a node id the scaler never ran. Wait(ctx,
// elastic.CoordinatorID) waits for the job to end.
func (s *Scaler) Wait(ctx context.Context, id string) error {
	s.mu.Lock()
	p := s.last[id]
	s.mu.Unlock()
	if p == nil {
		return fmt.Errorf("%w: %q", ErrNoProcess, id)
	}
	select {
	case <-p.done:
		return p.result
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close implements Scaler: it stops every process (the workers and the coordinator first, so
// that a coordinator's final checkpoint finds its servers up, then the servers), each with
// SIGTERM and, after StopGrace, SIGKILL, and waits for every one. Idempotent.
func (s *Scaler) Close() error {
	s.mu.Lock()
	var first, servers []*proc
	if !s.closed {
		s.closed = true
		for _, p := range s.procs {
			if p.role == elastic.RoleServer {
				servers = append(servers, p)
			} else {
				first = append(first, p)
			}
		}
	}
	s.mu.Unlock()
	for _, group := range [][]*proc{first, servers} {
		for _, p := range group {
			p.signalStop()
		}
		for _, p := range group {
			<-p.done
		}
	}
	s.wg.Wait()
	return nil
}

// supervise runs node id p until it is done for good.
func (s *Scaler) supervise(p *proc) {
	defer s.wg.Done()
	result := s.run(p)
	s.mu.Lock()
	p.running, p.result, p.finished = false, result, true
	s.mu.Unlock()
	close(p.done)
}

// run starts p's process, and again after each abnormal exit up to the limit, and returns
// Wait's outcome.
func (s *Scaler) run(p *proc) error {
	launched := sync.OnceFunc(func() { close(p.launched) })
	defer launched()
	if p.prev != nil {
		// The node id's earlier process may still be stopping (it holds the node's port).
		select {
		case <-p.prev.done:
		case <-p.stop:
			return ErrProcessStopped
		}
		p.prev = nil // no chain of ended procs
	}
	var stdout, stderr io.Writer
	if s.cfg.Output != nil {
		stdout, stderr = s.cfg.Output(p.role, p.id)
	}
	log := s.log.With("role", p.role.String(), "id", p.id)
	for restart := 0; ; restart++ {
		l := Launch{Role: p.role, ID: p.id, Restart: restart, Size: p.size}
		select {
		case <-p.stop:
			return ErrProcessStopped
		default:
		}
		cmd := exec.Command(s.cfg.Binary, s.cfg.Args(l)...)
		cmd.Dir = s.cfg.Dir
		if s.cfg.Env != nil || p.size != (elastic.Resources{}) {
			cmd.Env = append(os.Environ(), sizeEnv(p.size)...)
			if s.cfg.Env != nil {
				cmd.Env = append(cmd.Env, s.cfg.Env(l)...)
			}
		}
		cmd.Stdout, cmd.Stderr = stdout, stderr
		cmd.WaitDelay = s.cfg.StopGrace
		if err := cmd.Start(); err != nil {
			err = fmt.Errorf("start %s %s: %w", p.role, p.id, err)
			if restart == 0 {
				p.startErr = err
			}
			log.Error("process could not be started", "restart", restart, "err", err)
			s.emit(Event{Launch: l, Exited: true, Err: err, Final: true})
			return err
		}
		pid := cmd.Process.Pid
		s.mu.Lock()
		p.pid, p.restarts, p.running = pid, restart, true
		s.mu.Unlock()
		log.Info("process started", "pid", pid, "restart", restart)
		s.emit(Event{Launch: l, Pid: pid})
		launched()

		err, stopped := s.wait(p, cmd)
		if errors.Is(err, exec.ErrWaitDelay) {
			err = nil // it exited with status 0; something it started holds its output open
		}
		s.mu.Lock()
		p.running, p.exit = false, err
		s.mu.Unlock()
		ev := Event{Launch: l, Pid: pid, Exited: true, Err: err, Final: true}
		switch {
		case stopped:
			log.Info("process stopped", "pid", pid, "exit", exitString(err))
			s.emit(ev)
			return ErrProcessStopped
		case err == nil:
			log.Info("process done", "pid", pid)
			s.emit(ev)
			return nil
		case restart >= s.cfg.MaxRestarts:
			log.Error("process failed; restart limit reached", "pid", pid, "exit", exitString(err), "restarts", restart)
			s.emit(ev)
			return fmt.Errorf("%s %s: %w (%d restarts): %w", p.role, p.id, ErrRestartLimit, restart, err)
		}
		log.Warn("process failed; starting it again", "pid", pid, "exit", exitString(err), "restart", restart+1)
		ev.Final = false
		s.emit(ev)
	}
}

// wait waits for cmd to exit, stopping it if p is told to stop meanwhile (or was already).
func (s *Scaler) wait(p *proc, cmd *exec.Cmd) (err error, stopped bool) {
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		select {
		case <-p.stop:
			return err, true // stopped as it exited: not restarted either way
		default:
			return err, false
		}
	case <-p.stop:
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		cmd.Process.Kill() // no SIGTERM here (or it just exited): kill, which is harmless after an exit
	}
	t := time.NewTimer(s.cfg.StopGrace)
	defer t.Stop()
	select {
	case err := <-exited:
		return err, true
	case <-t.C:
	}
	cmd.Process.Kill()
	return <-exited, true
}

func (s *Scaler) emit(ev Event) {
	if s.cfg.OnEvent != nil {
		s.cfg.OnEvent(ev)
	}
}

// exitString describes an exit for a log line.
func exitString(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// sizeEnv is the Go runtime's environment for a process of size r: GOMAXPROCS (the CPUs,
// rounded up) and GOMEMLIMIT (the memory), those that are set.
func sizeEnv(r elastic.Resources) []string {
	var env []string
	if r.CPUs > 0 {
		env = append(env, fmt.Sprintf("GOMAXPROCS=%d", int(math.Ceil(r.CPUs))))
	}
	if r.Memory > 0 {
		env = append(env, fmt.Sprintf("GOMEMLIMIT=%d", r.Memory))
	}
	return env
}
