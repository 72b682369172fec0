package autoscale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/ps"
)

// Job is a running job as a Runner reads and changes it: *elastic.Coordinator in the
// coordinator's process, or *remote.Control (package elastic/remote) from another process.
// Every method may block and cross the network; an error means the call did not take effect,
// except that a Rebalance may have moved some slots before it failed.
type Job interface {
	// Usage returns the job's status with every server's counters (elastic.Coordinator.Usage).
	Usage(ctx context.Context) (elastic.Status, error)
	// SetPlan hands the job's scaler a new plan: counts and process sizes
	// (elastic.Coordinator.SetPlan).
	SetPlan(ctx context.Context, plan elastic.Plan) error
	// Rebalance moves the hottest slots off the servers whose share of the load, measured over
	// window, is above over times the average, at most maxMoves of them (0: no limit), and
	// returns the moves (elastic.Coordinator.Rebalance).
	Rebalance(ctx context.Context, over float64, window time.Duration, maxMoves int) ([]ps.Move, error)
}

var _ Job = (*elastic.Coordinator)(nil)

// A Job that can tell its status without reading every server's counters (as Usage does) is
// read that way where the plan alone is needed: the coordinator's own, or a remote one's.
type (
	statuser    interface{ Status() elastic.Status }
	ctxStatuser interface {
		Status(ctx context.Context) (elastic.Status, error)
	}
)

// status returns the job's status, with no server's counters read where the Job can.
func (r *Runner) status(ctx context.Context) (elastic.Status, error) {
	var st elastic.Status
	var err error
	switch j := r.cfg.Job.(type) {
	case statuser:
		st = j.Status()
	case ctxStatuser:
		st, err = j.Status(ctx)
	default:
		st, err = r.cfg.Job.Usage(ctx)
	}
	return r.withPlan(st), err
}

// withPlan is st with the plan of RunnerConfig.Signals while the coordinator has none.
func (r *Runner) withPlan(st elastic.Status) elastic.Status {
	if st.Plan == (elastic.Plan{}) && r.cfg.Signals != nil {
		st.Plan = r.cfg.Signals.Plan()
	}
	return st
}

// A Job that can fail a worker is the default of RunnerConfig.ReplaceWorker: the coordinator's
// own (no error: it fails a worker it knows of at once), or a remote one's.
type (
	workerFailer    interface{ Fail(worker, reason string) }
	ctxWorkerFailer interface {
		Fail(ctx context.Context, worker, reason string) error
	}
)

// RunnerConfig configures a Runner.
type RunnerConfig struct {
	// Job is the job's coordinator, in this process (*elastic.Coordinator) or reached through
	// the control protocol (*remote.Control). Its coordinator needs a scaler that changes the
	// server count (a ServerScaler) for Resize and AddServer decisions, and elastic.Config.Secret
	// set (Usage and Rebalance reach the servers). Required.
	Job Job
	// Planner makes the decisions. Required.
	Planner *Planner
	// Every is Run's period between observations; default 15 s.
	Every time.Duration
	// Now is the clock of the observations; nil: time.Now.
	Now func() time.Time
	// WorkerCPU and ServerCPU are the cores of a worker and a server when the coordinator's
	// plan sets none (elastic.Plan.Worker.CPUs, Server.CPUs); default 1. A server's CPU share
	// is its process's CPU time per second over ServerCPU, or its serving time per second when
	// it shares its process (elastic.ServerStatus.SharedProcess).
	WorkerCPU, ServerCPU float64
	// RestartServer restarts server id, whose new size the coordinator's plan already holds
	// (SetPlan), so that it restores its slots from the newest flash checkpoint: for an
	// in-process job, local.Job.RestartServerByID. Nil: Signals' RestartServer; without
	// Signals, RestartServer decisions fail with ErrNoRestarter.
	RestartServer func(ctx context.Context, id, reason string) error
	// ReplaceWorker stops worker id so that the scaler starts another in its place. Nil: the
	// Job's Fail, which *elastic.Coordinator and *remote.Control have (the worker is fenced and
	// its shards go to the others; a scaler that restarts failed workers starts it again); for
	// a Job without one, ReplaceWorker decisions fail with ErrNoReplacer.
	ReplaceWorker func(ctx context.Context, id, reason string) error
	// Pending lists the processes a cluster scheduler has not placed yet. Nil: Signals'
	// Pending, or none.
	Pending func() []Pending
	// Signals, if set, is what the platform that runs the processes tells of them (a
	// *kube.Scaler): the pending processes (the default of Pending), the servers killed for
	// lack of memory (each observation marks those killed since the previous one OOMKilled,
	// with the limit they went over, whether the job still counts them failed or serves from
	// their replacements already), the plan while the coordinator has none, and the default
	// of RestartServer. Nil: none of these.
	Signals Signals
	// RebalanceOver, RebalanceWindow and RebalanceMoves are the arguments of the
	// Job.Rebalance an AddServer or Rebalance decision calls: a server's share of
	// the load above RebalanceOver times the average is moved off (default 1.2), measured
	// over RebalanceWindow (default 1 s), at most RebalanceMoves slots (default 0: no limit).
	RebalanceOver   float64
	RebalanceWindow time.Duration
	RebalanceMoves  int
	// OnApplied, if set, is called with every decision Tick (and so Run) carries out, failed
	// ones included, in order: where a program counts them (metrics.Coordinator.ObserveDecision).
	OnApplied func(Applied)
	// Logger receives a line per decision carried out; nil discards.
	Logger *slog.Logger
}

// Applied is a decision carried out, or not.
type Applied struct {
	Decision Decision
	// Took is how long carrying it out took: for AddServer, from the decision to the last slot
	// moved by the rebalance.
	Took time.Duration
	// Moves counts the slots the rebalance moved (AddServer, Rebalance).
	Moves int
	// Err is why it failed.
	Err error
}

// Runner drives a Planner from a live job: each Tick reads the job's Usage, turns the
// differences since the previous tick into an Observation (throughput, each server's CPU
// share and memory against the plan's server memory, each worker's mean step time), and
// carries out the planner's decisions through the Job: SetPlan with the counts and any new
// process sizes for Plan and Resize, SetPlan and Rebalance for AddServer, Rebalance for
// Rebalance, SetPlan with the new size and RestartServer for RestartServer, ReplaceWorker, and
// SetPlan for ShrinkRequest. Tick and Run are called from one goroutine at a time.
type Runner struct {
	cfg RunnerConfig
	log *slog.Logger

	mu   sync.Mutex
	prev *reading
	// kills are the OOM kills of the latest observation (Signals), and unanswered the kills
	// whose answer failed: they are handed to the next observation again.
	kills, unanswered []OOMKill
}

// reading is one tick's counters.
type reading struct {
	at      time.Time
	records int64
	servers map[string]elastic.ServerStatus
	workers map[string]elastic.WorkerStatus
}

// NewRunner returns a Runner for cfg.
func NewRunner(cfg RunnerConfig) (*Runner, error) {
	var errs []error
	if cfg.Job == nil {
		errs = append(errs, errors.New("Job is required"))
	}
	if cfg.Planner == nil {
		errs = append(errs, errors.New("Planner is required"))
	}
	if cfg.Every < 0 || cfg.WorkerCPU < 0 || cfg.ServerCPU < 0 || cfg.RebalanceWindow < 0 || cfg.RebalanceMoves < 0 {
		errs = append(errs, errors.New("negative period, cores, window or moves"))
	}
	if cfg.RebalanceOver != 0 && cfg.RebalanceOver <= 1 {
		errs = append(errs, fmt.Errorf("RebalanceOver %g (above 1)", cfg.RebalanceOver))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	if cfg.Every == 0 {
		cfg.Every = 15 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.WorkerCPU == 0 {
		cfg.WorkerCPU = 1
	}
	if cfg.ServerCPU == 0 {
		cfg.ServerCPU = 1
	}
	if cfg.RebalanceOver == 0 {
		cfg.RebalanceOver = 1.2
	}
	if cfg.RebalanceWindow == 0 {
		cfg.RebalanceWindow = time.Second
	}
	if cfg.ReplaceWorker == nil {
		switch j := cfg.Job.(type) {
		case ctxWorkerFailer:
			cfg.ReplaceWorker = func(ctx context.Context, id, reason string) error {
				return j.Fail(ctx, id, "autoscale: "+reason)
			}
		case workerFailer:
			cfg.ReplaceWorker = func(_ context.Context, id, reason string) error {
				j.Fail(id, "autoscale: "+reason)
				return nil
			}
		}
	}
	if sig := cfg.Signals; sig != nil {
		if cfg.Pending == nil {
			cfg.Pending = sig.Pending
		}
		if cfg.RestartServer == nil {
			cfg.RestartServer = sig.RestartServer
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Runner{cfg: cfg, log: log}, nil
}

// Run ticks every RunnerConfig.Every until ctx ends, and returns ctx's error. A failed
// reading or decision is logged and the next tick tries again.
func (r *Runner) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		applied, err := r.Tick(ctx)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("autoscale: no observation", "err", err)
		}
		for _, a := range applied {
			if a.Err != nil {
				r.log.Warn("autoscale: decision failed", "decision", a.Decision, "err", a.Err)
			}
		}
	}
}

// Tick takes one observation, hands it to the planner and carries out its decisions, in
// order; it returns them with their outcomes. It fails only when the job cannot be read.
func (r *Runner) Tick(ctx context.Context) ([]Applied, error) {
	obs, err := r.Observe(ctx)
	if err != nil {
		return nil, err
	}
	var out []Applied
	for _, d := range r.cfg.Planner.Observe(obs) {
		a := r.Apply(ctx, d)
		r.log.Info("autoscale: applied", "decision", d, "took", a.Took, "moves", a.Moves, "err", a.Err)
		if r.cfg.OnApplied != nil {
			r.cfg.OnApplied(a)
		}
		if a.Err != nil {
			r.keepUnanswered(d.Target)
		}
		out = append(out, a)
	}
	return out, nil
}

// keepUnanswered hands the OOM kills of server id in the latest observation to the next one
// again: the decision that answered them failed (the coordinator's SetPlan or the platform's
// restart did not take effect), and a kill is answered, not forgotten.
func (r *Runner) keepUnanswered(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range r.kills {
		if k.ID == id {
			r.unanswered = append(r.unanswered, k)
		}
	}
}

// Observe reads the job and returns its Observation: the differences since the previous
// call (the first has no throughput, CPU shares or step times).
func (r *Runner) Observe(ctx context.Context) (Observation, error) {
	st, err := r.cfg.Job.Usage(ctx)
	if err != nil {
		return Observation{}, fmt.Errorf("autoscale: usage: %w", err)
	}
	st = r.withPlan(st)
	now := r.cfg.Now()
	cur := &reading{
		at:      now,
		records: int64(st.Epoch)*st.EpochRecords + st.EpochDone,
		servers: map[string]elastic.ServerStatus{}, workers: map[string]elastic.WorkerStatus{},
	}
	obs := Observation{At: now, Shape: r.shape(st)}
	failed := false
	for _, s := range st.Servers {
		failed = failed || s.Failed
	}
	obs.Changing = failed || st.Phase == "recovering" || (st.Repartition != nil && st.Repartition.Running)

	r.mu.Lock()
	prev := r.prev
	r.prev = cur
	r.mu.Unlock()
	if prev != nil && now.After(prev.at) && cur.records >= prev.records {
		obs.Throughput = float64(cur.records-prev.records) / now.Sub(prev.at).Seconds()
	}
	for _, s := range st.Servers {
		if s.Failed || s.UsageError != "" {
			continue
		}
		cur.servers[s.ID] = s
		obs.Servers = append(obs.Servers, serverLoad(s, prev, obs.Shape.Server))
	}
	for _, w := range st.Workers {
		cur.workers[w.ID] = w
		wl := WorkerLoad{ID: w.ID}
		if p, ok := prev.worker(w.ID); ok && w.Steps > p.Steps {
			wl.StepTime = (w.Busy - p.Busy) / time.Duration(w.Steps-p.Steps)
		}
		obs.Workers = append(obs.Workers, wl)
	}
	if r.cfg.Pending != nil {
		obs.Pending = r.cfg.Pending()
	}
	if r.cfg.Signals != nil {
		r.mu.Lock()
		kills := append(r.unanswered, r.cfg.Signals.OOMKills()...)
		r.kills, r.unanswered = kills, nil
		r.mu.Unlock()
		obs.Servers = killed(obs.Servers, kills, prev)
		for _, sv := range obs.Servers {
			obs.Changing = obs.Changing || sv.OOMKilled
		}
	}
	return obs, nil
}

// killed marks the servers of kills OOMKilled in loads, with the limit they went over; a
// server the job does not serve from now (failed, not yet recovered) is added, with the
// memory it used at the previous reading. Its memory, that reading or its replacement's when
// the job serves from that already, is capped at the limit: the kernel
// killed the server there, and a reading above it is the process's resident memory (a server
// that reports no cgroup charge) counting pages its memory cgroup does not charge it (the flash
// checkpoint's shared memory, say), which must not make the planner ask for more than
// MemoryGrowth times the limit.
func killed(loads []ServerLoad, kills []OOMKill, prev *reading) []ServerLoad {
	for _, k := range kills {
		i := slices.IndexFunc(loads, func(l ServerLoad) bool { return l.ID == k.ID })
		if i < 0 {
			l := ServerLoad{ID: k.ID}
			if p, ok := prev.server(k.ID); ok {
				l.Memory, _ = p.Use()
			}
			loads = append(loads, l)
			i = len(loads) - 1
		}
		loads[i].OOMKilled = true
		if k.MemoryLimit > 0 {
			loads[i].MemoryLimit = k.MemoryLimit
			loads[i].Memory = min(loads[i].Memory, k.MemoryLimit)
		}
	}
	return loads
}

// serverLoad is a server's figures from two readings of it. A server alone in its process
// reports what the process really uses: its CPU time, and its memory (elastic.ServerStatus.Use),
// with Busy the share of the time it served. Its memory limit is the plan's server memory
// (size), or, where the process reports a memory cgroup with a limit, that limit, with the
// cgroup's charge as its memory: what the kernel kills it for, which the resident memory is not
// (it counts shared pages, the flash checkpoint's, that the cgroup may not be charged for). A
// server sharing its process (an in-process job) counts its serving time as its CPU, and its
// tables' memory as its memory.
func serverLoad(s elastic.ServerStatus, prev *reading, size Resources) ServerLoad {
	sl := ServerLoad{ID: s.ID, MemoryLimit: size.Memory}
	var own bool
	sl.Memory, own = s.Use()
	if own && s.CgroupLimitBytes > 0 {
		sl.MemoryLimit = s.CgroupLimitBytes
	}
	p, ok := prev.server(s.ID)
	if !ok || s.Uptime <= p.Uptime || s.Busy < p.Busy {
		return sl
	}
	up := float64(s.Uptime - p.Uptime)
	used, own := s.UsedSince(p)
	sl.CPU = float64(used) / up / size.CPU
	if own {
		sl.Busy = min(float64(s.Busy-p.Busy)/up, 1)
	}
	return sl
}

func (p *reading) server(id string) (elastic.ServerStatus, bool) {
	if p == nil {
		return elastic.ServerStatus{}, false
	}
	s, ok := p.servers[id]
	return s, ok
}

func (p *reading) worker(id string) (elastic.WorkerStatus, bool) {
	if p == nil {
		return elastic.WorkerStatus{}, false
	}
	w, ok := p.workers[id]
	return w, ok
}

// shape is the job's shape from its status: the servers of the owner table, the plan's
// workers (or those the coordinator knows, before any plan) and the plan's sizes.
func (r *Runner) shape(st elastic.Status) Shape {
	s := Shape{
		Workers: st.Plan.Workers, Servers: len(st.Servers),
		Worker: Resources{CPU: st.Plan.Worker.CPUs, Memory: st.Plan.Worker.Memory},
		Server: Resources{CPU: st.Plan.Server.CPUs, Memory: st.Plan.Server.Memory},
	}
	if s.Workers == 0 {
		s.Workers = len(st.Workers)
	}
	if s.Worker.CPU == 0 {
		s.Worker.CPU = r.cfg.WorkerCPU
	}
	if s.Server.CPU == 0 {
		s.Server.CPU = r.cfg.ServerCPU
	}
	return s
}

// plan is st's plan with the counts of s and the sizes of st's plan.
func plan(st elastic.Status, s Shape) elastic.Plan {
	p := st.Plan
	p.Workers, p.Servers = s.Workers, s.Servers
	return p
}

// sized is st's plan with d's counts, and d's process sizes where they differ from the job's
// (a right-size, or servers' memory spread anew), or all of them.
func (r *Runner) sized(st elastic.Status, d Decision, all bool) elastic.Plan {
	p := plan(st, d.Shape)
	cur := r.shape(st)
	if all || d.Shape.Worker != cur.Worker {
		p.Worker = elastic.Resources{CPUs: d.Shape.Worker.CPU, Memory: d.Shape.Worker.Memory}
	}
	if all || d.Shape.Server != cur.Server {
		p.Server = elastic.Resources{CPUs: d.Shape.Server.CPU, Memory: d.Shape.Server.Memory}
	}
	return p
}

// Apply carries out one decision through the job. A decision that changes the plan reads the
// job's plan first (its Status where the Job has one, else Usage), so that it keeps what the
// decision does not change.
func (r *Runner) Apply(ctx context.Context, d Decision) Applied {
	c := r.cfg.Job
	start := time.Now()
	a := Applied{Decision: d}
	var st elastic.Status
	switch d.Kind {
	case Plan, Resize, AddServer, RestartServer, ShrinkRequest:
		if st, a.Err = r.status(ctx); a.Err != nil {
			a.Err = fmt.Errorf("autoscale: read the plan: %w", a.Err)
			a.Took = time.Since(start)
			return a
		}
	}
	switch d.Kind {
	case Plan, Resize:
		a.Err = c.SetPlan(ctx, r.sized(st, d, d.Kind == Plan))
	case AddServer, Rebalance:
		if d.Kind == AddServer {
			a.Err = c.SetPlan(ctx, r.sized(st, d, false))
		}
		if a.Err == nil {
			var moves int
			moves, a.Err = r.rebalance(ctx)
			a.Moves = moves
		}
	case RestartServer:
		// Only the memory: the cores of a plan that sets none stay the platform's default.
		p := plan(st, d.Shape)
		p.Server.Memory = d.Size.Memory
		if r.cfg.RestartServer == nil {
			a.Err = ErrNoRestarter
		} else if a.Err = c.SetPlan(ctx, p); a.Err == nil {
			a.Err = r.cfg.RestartServer(ctx, d.Target, d.Reason)
		}
	case ReplaceWorker:
		if r.cfg.ReplaceWorker == nil {
			a.Err = ErrNoReplacer
		} else {
			a.Err = r.cfg.ReplaceWorker(ctx, d.Target, d.Reason)
		}
	case ShrinkRequest:
		p := plan(st, d.Shape)
		if d.Role == Server {
			p.Server = elastic.Resources{CPUs: d.Size.CPU, Memory: d.Size.Memory}
		} else {
			p.Worker = elastic.Resources{CPUs: d.Size.CPU, Memory: d.Size.Memory}
		}
		a.Err = c.SetPlan(ctx, p)
	default:
		a.Err = fmt.Errorf("autoscale: unknown decision %v", d.Kind)
	}
	a.Took = time.Since(start)
	return a
}

// rebalance moves load off the servers above RebalanceOver times the average.
func (r *Runner) rebalance(ctx context.Context) (int, error) {
	moves, err := r.cfg.Job.Rebalance(ctx, r.cfg.RebalanceOver, r.cfg.RebalanceWindow, r.cfg.RebalanceMoves)
	return len(moves), err
}
