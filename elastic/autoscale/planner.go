package autoscale

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"
)

// Observation is what a job looked like at one moment: the planner's only input after Begin.
type Observation struct {
	// At is when it was taken; observations come in time order.
	At time.Time
	// Shape is what the job runs now.
	Shape Shape
	// Throughput is the samples per second trained since the previous observation; 0: not
	// measured.
	Throughput float64
	// Changing says a change of the shape is under way (servers added or drained, a server
	// restarting): the throughput is not sampled into the model and no re-plan is made.
	Changing bool
	// Servers and Workers are the processes' own figures.
	Servers []ServerLoad
	Workers []WorkerLoad
	// Pending lists the processes asked for and not yet scheduled.
	Pending []Pending
}

// ServerLoad is one parameter server's figures.
type ServerLoad struct {
	ID string
	// CPU is the share of its cores it used since the previous observation, 0 to 1.
	CPU float64
	// Busy is the share of the time it spent serving since the previous observation, 0 to
	// 1; 0: not measured. With CPU it gives the cores it uses while it serves (CPU times its
	// cores over Busy), which do not depend on the load, and the servers' share of the
	// workers' step time, which fits the model's server term.
	Busy float64
	// Memory is the bytes it uses; MemoryLimit the bytes it may (0: Shape.Server.Memory). A
	// Runner gives a server's memory cgroup's charge and limit where it reports them
	// (elastic.ServerStatus.CgroupBytes), the figures the kernel kills a process by.
	Memory, MemoryLimit int64
	// OOMKilled says it was killed for lack of memory since the previous observation.
	OOMKilled bool
}

// WorkerLoad is one worker's figures.
type WorkerLoad struct {
	ID string
	// StepTime is its mean time per batch since the previous observation (0: none finished).
	StepTime time.Duration
	// CPU is the share of its cores it used since the previous observation, 0 to 1 (0: not
	// measured; the workers' cores are then not right-sized).
	CPU float64
	// Busy is the share of its step time it spent in its own computation (its forward and
	// backward pass, not waiting on the servers) since the previous observation, 0 to 1; 0:
	// not measured. With CPU it gives the cores it uses while it computes, and it fits the
	// model's compute term.
	Busy float64
	// Memory is the bytes it uses (0: not measured; the workers' memory is then not sized).
	Memory int64
}

// Pending is a process that waits to be scheduled.
type Pending struct {
	ID   string
	Role Role
	// Size is what it asks for; Waited how long it has waited since asked for at that size (a
	// ShrinkRequest carried out starts the wait again).
	Size   Resources
	Waited time.Duration
	// Reason is the scheduler's word on why it waits ("0/1 nodes are available: 1
	// Insufficient memory."), "" when it gave none.
	Reason string
}

// Planner decides a job's shape: a first plan from its profile and the history (Begin), then,
// from the observations fed to Observe, re-plans by the fitted model and answers to hot or
// short-of-memory servers, stragglers and requests that wait too long. It does no I/O and
// reads no clock: time is the observations'. Its methods are safe for concurrent use.
type Planner struct {
	cfg Config
	log *slog.Logger

	mu    sync.Mutex
	prior *Model
	shape Shape
	// profile is the job's (Begin); trained the samples trained so far, the throughputs
	// summed over time, last the time of the previous observation.
	profile JobProfile
	trained float64
	last    time.Time
	// awaiting is the shape of the latest Resize decided, until it is observed; moved says
	// whether the latest change moved rows (the Cooldown then applies).
	awaiting *Shape
	moved    bool
	// seen is what the observations said of the cores a worker and a server can use, where
	// they report Busy; rowBytes is the servers' memory last measured in all.
	seen     map[Role]*coresSeen
	rowBytes float64
	// peakRows is the most memory the servers used in all at one observation.
	peakRows int64
	// minCPU is the cores a pending request is not shrunk below (the history's median use of
	// a request, times this job's), by role; minWorkerMem the memory a worker is not shrunk
	// below before its use is measured (the history's estimate).
	minCPU       map[Role]float64
	minWorkerMem int64
	// shapes holds the measurements of the newest Window shapes measured, newest last.
	shapes []measured
	// atShape counts the samples taken at shape since it last changed.
	atShape int
	// changed is when the counts last changed or a change was decided; lastReplan when the
	// planner last re-planned.
	changed, lastReplan time.Time
	workerCounts        map[int]bool
	serverCounts        map[int]bool
	hotSince            map[string]time.Time
	slowSince           map[string]time.Time
	// asked is the memory a RestartServer asked for, by server, until it is seen; spreadTo
	// the server count an AddServer for memory asked for, until it is seen.
	asked    map[string]int64
	spreadTo int
	peakMem  int64
	// serverTotal is the bytes of memory the servers are given in all, which a change of
	// their count spreads anew; rowsNeed the least the model's rows need in all, with
	// MemoryHeadroom (the profile's estimate, or more as measured), below which no server's
	// share is cut. Both 0 until known.
	serverTotal, rowsNeed float64
	// Right-sizing: the most cores a worker and a server used in each observation at the
	// current sizes, newest last; the most memory a worker used; the cores a role is not cut
	// below again; the latest cut of cores, until its effect is measured.
	workerUsed, serverUsed []float64
	peakWorkerMem          int64
	floorCPU               map[Role]float64
	cut                    *coreCut
}

// NewPlanner returns a Planner for cfg (zero fields take their defaults).
func NewPlanner(cfg Config) (*Planner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Planner{
		cfg: cfg, log: log, prior: cfg.Prior,
		workerCounts: map[int]bool{}, serverCounts: map[int]bool{},
		hotSince: map[string]time.Time{}, slowSince: map[string]time.Time{},
		asked: map[string]int64{}, floorCPU: map[Role]float64{},
		seen: map[Role]*coresSeen{Worker: {}, Server: {}}, minCPU: map[Role]float64{},
		// The job's start loads its rows: the Cooldown applies from Begin, as after a move.
		moved: true,
	}, nil
}

// Config returns the planner's configuration, defaults filled in.
func (p *Planner) Config() Config { return p.cfg }

// Begin returns a job's first plan, from its profile and the records of earlier jobs
// (LoadHistory). Nothing runs yet, so any size and count costs nothing to choose; later, a
// change of the servers moves rows and must pay (Config.Payback).
//
// The sizes, when the profile gives the user's request (JobProfile.Request) and at least
// HistoryMinNeighbours earlier jobs of its kind kept theirs: what users ask for against what
// their processes use is the platform's users' habit, so the plan starts from the user's
// counts and sizes each process from what the HistoryNeighbours nearest earlier jobs'
// processes used of their requests.
//
//   - Cores: with a model from the history (below), each role's cores are added, from the
//     least the records could use (their cores used while working over their request, times
//     this job's request), the role whose next step gains most first, while the expected
//     marginal efficiency is at least AddEfficiency: a process given c cores that could use
//     k takes max(1, k/c) times as long over its term of the step, and the expectation is
//     over the records' k. Without a model, each role gets the CoreQuantile of that spread.
//     No role gets more than was asked.
//   - A worker's memory: the MemoryQuantile of the records' peak over request, times this
//     job's request.
//   - The servers' memory: the profile's model bytes times a memory per model byte that
//     every earlier job of the kind measured: the one of least expected memory-time over the
//     job's expected run (its samples at the model's throughput) and, with the chance the
//     rows need more, the restore of its rows at RestoreBytesPerSecond after running out; at
//     least the MemoryQuantile of them. A job that runs for a minute holds little by asking
//     more, and its restore could take an hour.
//
// Otherwise the nearest record within Config.HistoryMaxDistance gives the process sizes
// (right-sized while it ran) and its memory per model byte; without one the sizes are
// Config.Worker and Config.Server and the memory per model byte the median the earlier jobs
// of the profile's kind measured (of any kind when none), MemoryPerModelByte without any;
// these times MemoryHeadroom.
//
// The counts: a model from the history (the median coefficients of the records within
// HistoryMaxDistance, the nearest's when it alone has one) is the prior of later fits, unless
// Config.Prior is set; from the user's counts (the fewest, when the nearest record plans),
// the plan adds and removes workers and servers while that model finds it worth their cost
// (efficiency, AddEfficiency, RemoveEfficiency), the servers' memory spread over their count,
// within the quota. The servers are never fewer than the memory needs at MaxServerMemory
// each, and what the rows need beyond the memory the user asked for the servers is added to
// MaxMemory, so that the workers keep theirs. Without a record it is InitialWorkers and
// InitialServers. It returns ErrInvalidProfile for a profile with a non-positive size or a
// model too large for MaxServers servers.
func (p *Planner) Begin(profile JobProfile, history []JobRecord, at time.Time) (Decision, error) {
	if err := profile.validate(); err != nil {
		return Decision{}, err
	}
	c := &p.cfg
	rec, dist, found := nearest(profile, history, c.HistoryMaxDistance)
	sz, sized := c.sizesFrom(profile, neighbours(profile, history, c.HistoryNeighbours), history)
	model, models := medianModel(profile, history, c.HistoryMaxDistance)
	perByte, why := c.MemoryPerModelByte, "default"
	headroom := c.MemoryHeadroom
	if v, ok := rec.memoryPerModelByte(); found && ok {
		perByte, why = v, "measured by "+rec.Job
	} else if v, n := platformMemoryPerModelByte(profile.Kind, history); n > 0 {
		perByte, why = v, fmt.Sprintf("the median measured by %d earlier jobs", n)
	}
	if n := len(sz.perBytes); sized && n >= c.HistoryMinNeighbours {
		// The chance of running out against the memory held: a job that runs briefly holds
		// little by asking more, and a restore of its rows can take many times its run.
		var T, R float64
		if s0 := sz.shape; model != nil && profile.samples() > 0 {
			if x := model.Throughput(s0); x > 0 {
				T = profile.samples() / x
			}
		}
		R = float64(profile.ModelBytes) * sz.perBytes[n/2] / c.RestoreBytesPerSecond
		var risk float64
		perByte, risk = memoryPerByte(sz.perBytes, c.MemoryQuantile, T, R)
		headroom = 1
		if T > 0 {
			why = fmt.Sprintf("of the %d earlier jobs' measures, the least expected memory-time over an expected run of %v against a restore of %v, at least their %.0f%% quantile: %.1f%% of them needed more",
				n, dur(T), dur(R), 100*c.MemoryQuantile, 100*risk)
		} else {
			why = fmt.Sprintf("the %.0f%% quantile of the %d earlier jobs' measures (no model to say how long the job runs): %.1f%% of them needed more",
				100*c.MemoryQuantile, n, 100*risk)
		}
	}
	need := float64(profile.ModelBytes) * perByte * headroom
	minServers := max(int(math.Ceil(need/float64(c.MaxServerMemory))), c.MinServers)
	if minServers > c.MaxServers {
		return Decision{}, fmt.Errorf("%w: the model needs %.1f GiB of server memory (%.2f bytes per model byte, %s), more than %d servers of %.1f GiB",
			ErrInvalidProfile, need/(1<<30), perByte, why, c.MaxServers, float64(c.MaxServerMemory)/(1<<30))
	}

	d := Decision{Kind: Plan, At: at, Value: need, Limit: float64(c.MaxServerMemory)}
	var s Shape
	switch {
	case sized:
		s = sz.shape
		s.Servers = max(s.Servers, minServers)
		d.Reason = sz.why
		if model != nil {
			if sc, why, ok := c.sizeCores(*model, s, sz); ok {
				s = sc
				d.Reason += "; by " + models + ", " + why
			}
		}
	case found && rec.Model != nil:
		s = Shape{Workers: c.MinWorkers, Servers: minServers, Worker: rec.Shape.Worker, Server: rec.Shape.Server}
		if !s.valid() {
			s.Worker, s.Server = c.Worker, c.Server
		}
		d.Reason = fmt.Sprintf("the sizes of %s (profile distance %.2f)", rec.Job, dist)
	case found:
		s = rec.Shape
		s.Servers = max(s.Servers, minServers)
		d.Reason = fmt.Sprintf("the shape of %s (profile distance %.2f), which left no model", rec.Job, dist)
	default:
		s = Shape{Workers: c.InitialWorkers, Servers: max(c.InitialServers, minServers), Worker: c.Worker, Server: c.Server}
		d.Reason = "no similar job in the history: the configured initial shape"
	}
	s = c.clamp(s)
	s.Server.Memory = roundMiB(need / float64(s.Servers))
	// The rows' memory is never refused: what they need beyond what the user gave the
	// servers is added to the memory quota, so that the workers keep theirs.
	cq := *c
	c = &cq
	if asked := profile.Request.Memory() - int64(profile.Request.Workers)*profile.Request.Worker.Memory; c.MaxMemory > 0 && profile.requested() && int64(need) > asked {
		c.MaxMemory += int64(need) - asked
		d.Reason += fmt.Sprintf("; the memory quota grows by the %.1f GiB the rows need beyond the servers' %.1f GiB asked", gib(int64(need)-asked), gib(asked))
	}
	if model != nil && (sized || found) {
		// Nothing runs yet: any count is free to choose, the servers' memory spread over it.
		if rd, ok := c.replan(*model, s, moves{total: need}); ok {
			s = rd.Shape
			for range c.MaxWorkers + c.MaxServers {
				next, ok := c.replan(*model, s, moves{total: need})
				if !ok {
					break
				}
				s = next.Shape
			}
		}
		d.Reason += fmt.Sprintf("; %s predicts %.0f samples/s at %d workers and %d servers",
			models, model.Throughput(s), s.Workers, s.Servers)
	}
	s = c.withinQuota(s)
	d.Shape = s
	d.Reason += fmt.Sprintf("; servers need %.2f GiB for a %.2f GiB model (%.2f bytes per model byte, %s, x%.2f headroom): %.2f GiB each",
		need/(1<<30), float64(profile.ModelBytes)/(1<<30), perByte, why, headroom, float64(s.Server.Memory)/(1<<30))
	if model != nil {
		d.After = model.Throughput(s)
		if n := profile.samples(); n > 0 && d.After > 0 {
			d.Reason += fmt.Sprintf("; the job in about %v", (time.Duration(n/d.After) * time.Second).Round(time.Second))
		}
	}

	p.mu.Lock()
	if p.cfg.Prior == nil && model != nil {
		m := *model
		p.prior = &m
	}
	p.profile = profile
	p.shape = s
	p.changed = at
	p.serverTotal, p.rowsNeed = float64(s.Server.Memory)*float64(s.Servers), need
	if sized {
		p.minCPU[Worker], p.minCPU[Server] = sz.minWorker, sz.minServer
		if s.Worker.Memory != profile.Request.Worker.Memory {
			p.minWorkerMem = s.Worker.Memory
		}
	}
	p.cfg.MaxMemory = c.MaxMemory
	p.mu.Unlock()
	p.logDecision(d)
	return d, nil
}

func roundMiB(b float64) int64 {
	const mib = 1 << 20
	return int64(math.Ceil(b/mib)) * mib
}

// Observe takes one observation and returns what to do about it, possibly nothing. A
// Resize is not made again until the shape it asked for is observed or Cooldown has passed;
// after a change that moves rows (servers added, removed or resized, a server restarted) the
// counts are not changed again for Cooldown; and the hot, straggler and memory rules act
// again on a process only after it shows the condition anew; so feeding observations while a
// decision is carried out does not repeat it.
func (p *Planner) Observe(obs Observation) []Decision {
	p.mu.Lock()
	ds := p.observeLocked(obs)
	p.mu.Unlock()
	for _, d := range ds {
		p.logDecision(d)
	}
	return ds
}

func (p *Planner) observeLocked(obs Observation) []Decision {
	if obs.Shape.Workers != p.shape.Workers || obs.Shape.Servers != p.shape.Servers ||
		obs.Shape.Worker.CPU != p.shape.Worker.CPU || obs.Shape.Server.CPU != p.shape.Server.CPU {
		p.atShape = 0
		p.changed = obs.At
		clear(p.hotSince)
	}
	if !sameSize(obs.Shape, p.shape) {
		// What a process uses depends on the counts as well as its cores.
		p.workerUsed, p.serverUsed = nil, nil
	}
	if p.awaiting != nil && sameSize(obs.Shape, *p.awaiting) {
		p.awaiting = nil
	}
	if p.cut != nil && !sameSize(obs.Shape, p.cut.to) && !sameSize(obs.Shape, p.cut.from) {
		p.cut = nil // something else changed the job: the cut cannot be judged alone
	}
	p.shape = obs.Shape
	if p.serverTotal == 0 && obs.Shape.Server.Memory > 0 {
		p.serverTotal = float64(obs.Shape.Server.Memory) * float64(obs.Shape.Servers)
	}
	if !p.last.IsZero() && obs.At.After(p.last) && obs.Throughput > 0 && !math.IsInf(obs.Throughput, 0) {
		p.trained += obs.Throughput * obs.At.Sub(p.last).Seconds()
	}
	if obs.At.After(p.last) {
		p.last = obs.At
	}
	p.useLocked(obs)
	if !obs.Changing && obs.Throughput > 0 && obs.Shape.valid() && !math.IsInf(obs.Throughput, 0) {
		compute, serve := shares(obs)
		p.addLocked(obs.Shape, point{obs.Throughput, compute, serve})
		p.atShape++
		p.workerCounts[obs.Shape.Workers] = true
		p.serverCounts[obs.Shape.Servers] = true
	}

	var ds []Decision
	resized := false
	for _, sv := range obs.Servers {
		p.peakMem = max(p.peakMem, sv.Memory)
		if resized && ds[len(ds)-1].Kind == AddServer {
			continue // the rows are spread over more servers: one decision for all of them
		}
		if d, ok := p.memoryLocked(obs, sv); ok {
			ds = append(ds, d)
			resized = true // AddServer or RestartServer: the shape changes
		}
	}
	if d, ok := p.hotLocked(obs); ok && !resized {
		ds = append(ds, d)
		resized = resized || d.Kind == AddServer
	}
	ds = append(ds, p.stragglersLocked(obs)...)
	ds = append(ds, p.pendingLocked(obs)...)
	if resized {
		p.changed, p.moved = obs.At, true
		return ds
	}
	if d, ok := p.replanLocked(obs); ok {
		p.changed = obs.At
		p.moved = movedFraction(obs.Shape, d.Shape) > 0
		sh := d.Shape
		p.awaiting = &sh
		ds = append(ds, d)
	}
	return ds
}

// shares returns the mean share of their time the workers computed and the servers served;
// 0 where not measured.
func shares(obs Observation) (compute, serve float64) {
	mean := func(n int, v func(int) float64) float64 {
		var sum float64
		k := 0
		for i := range n {
			if x := v(i); x > 0 && x <= 1 {
				sum += x
				k++
			}
		}
		if k == 0 {
			return 0
		}
		return sum / float64(k)
	}
	return mean(len(obs.Workers), func(i int) float64 { return obs.Workers[i].Busy }),
		mean(len(obs.Servers), func(i int) float64 { return obs.Servers[i].Busy })
}

// replanLocked is stage 2: every ReplanEvery, once the shape has settled (Settle samples;
// Cooldown after a change that moved rows, or while a Resize is not yet seen), the model's
// recommendation.
func (p *Planner) replanLocked(obs Observation) (Decision, bool) {
	c := &p.cfg
	wait := time.Duration(0)
	if p.moved || p.awaiting != nil {
		wait = c.Cooldown
	}
	if obs.Changing || obs.At.Sub(p.lastReplan) < c.ReplanEvery || obs.At.Sub(p.changed) < wait ||
		p.atShape < c.Settle || !obs.Shape.valid() {
		return Decision{}, false
	}
	p.lastReplan = obs.At
	p.checkPriorLocked(obs)
	if p.seen[Worker].n > 0 || p.seen[Server].n > 0 {
		return p.replanBusyLocked(obs)
	}
	// A cut of cores is judged first, at the shape it made; then the counts; the processes
	// are right-sized only at counts the model keeps, since what a process uses depends on
	// how many share the work.
	if d, ok := p.judgeCutLocked(obs); ok {
		return d, true
	}
	if d, ok := p.countsLocked(obs); ok {
		return d, true
	}
	return p.rightsizeLocked(obs)
}

// checkPriorLocked drops a prior from the history that the job's own measurements contradict
// (off by more than PriorTolerance): it plans nothing then, and without it the planner
// explores.
func (p *Planner) checkPriorLocked(obs Observation) {
	if p.prior == nil || p.cfg.Prior != nil {
		return
	}
	pred, got := p.prior.Throughput(obs.Shape), p.meanAtLocked(obs.Shape)
	if pred > 0 && got > 0 && math.Abs(math.Log(got/pred)) > math.Log(p.cfg.PriorTolerance) {
		p.log.Info("autoscale: prior dropped", "predicted", pred, "measured", got, "shape", obs.Shape.String())
		p.prior = nil
	}
}

// countsLocked is the re-plan of the counts: exploration without a prior, else the model's
// recommendation, the cores of a process raised where its measured use, scaled by the load
// per process the model predicts, needs more with CPUHeadroom.
func (p *Planner) countsLocked(obs Observation) (Decision, bool) {
	c := &p.cfg
	if p.prior == nil && (len(p.workerCounts) < 2 || len(p.serverCounts) < 2) {
		return p.exploreLocked(obs)
	}
	m, err := p.fitLocked()
	if err != nil {
		p.log.Warn("autoscale: no model", "err", err)
		return Decision{}, false
	}
	x0 := p.meanAtLocked(obs.Shape)
	d, ok := c.replan(m, obs.Shape, p.movesLocked(m, obs.Shape, x0))
	if !ok {
		p.log.Debug("autoscale: shape kept", "shape", obs.Shape.String(), "model", m.String())
		return Decision{}, false
	}
	if s, why := p.scaleCoresLocked(obs.Shape, d.Shape, m.Throughput(obs.Shape), d.After); why != "" {
		d.Shape = s
		d.Reason += "; " + why
	}
	if _, why := p.paysLocked(obs.Shape, d.Shape, x0, x0*m.Throughput(d.Shape)/m.Throughput(obs.Shape)); why != "" {
		d.Reason += "; " + why
	}
	d.At = obs.At
	d.Before = obs.Throughput
	if d.Before == 0 {
		d.Before = m.Throughput(obs.Shape)
	}
	d.Reason += "; " + m.String()
	return d, true
}

// exploreLocked takes a step in a direction the samples have not covered, so that the model
// learns how the job scales; it needs no prior. A step of the servers moves rows: it is taken
// only when that costs at most ExploreShare of the job's remaining time.
func (p *Planner) exploreLocked(obs Observation) (Decision, bool) {
	c := &p.cfg
	var steps []Shape
	var what string
	if len(p.workerCounts) < 2 {
		steps, what = []Shape{with(obs.Shape, 1, 0), with(obs.Shape, -1, 0)}, "workers"
	} else {
		mv := moves{rows: p.rowsNeed}
		steps, what = []Shape{mv.addServer(obs.Shape), mv.removeServer(obs.Shape)}, "servers"
	}
	for _, s := range steps {
		if !c.allows(s) {
			continue
		}
		lost, _ := p.moveCostLocked(obs.Shape, s)
		if rem, known := p.remainingLocked(); known && lost > 0 && obs.Throughput > 0 && lost > c.ExploreShare*rem/obs.Throughput {
			p.log.Info("autoscale: no exploration", "what", what, "lost", dur(lost), "left", dur(rem/obs.Throughput))
			continue
		}
		return Decision{
			Kind: Resize, At: obs.At, Shape: s, Before: obs.Throughput,
			Reason: fmt.Sprintf("explore: one count of %s measured, no prior model; %s", what, obs.Shape.String()),
		}, true
	}
	// The quota or the cost allows no other count: mark the dimension as known so the fit
	// goes ahead.
	if what == "workers" {
		p.workerCounts[-1] = true
	} else {
		p.serverCounts[-1] = true
	}
	return Decision{}, false
}

// point is one measurement: the throughput and, where measured, the workers' compute share
// and the servers' busy share of the step.
type point struct{ x, compute, serve float64 }

// measured is the newest measurements at one shape.
type measured struct {
	shape Shape
	xs    []point
}

// perShape is how many of the newest measurements at a shape its sample averages.
const perShape = 20

// addLocked records a measurement: the shape's entry moves to the end, the oldest shape
// beyond Window is forgotten. Keeping every shape's measurements, not just the newest ones
// overall, keeps the shapes explored early in the fit after hours at one shape.
func (p *Planner) addLocked(s Shape, x point) {
	i := slices.IndexFunc(p.shapes, func(m measured) bool { return m.shape == s })
	var m measured
	if i >= 0 {
		m = p.shapes[i]
		p.shapes = slices.Delete(p.shapes, i, i+1)
	} else {
		m.shape = s
	}
	m.xs = append(m.xs, x)
	if len(m.xs) > perShape {
		m.xs = slices.Delete(m.xs, 0, len(m.xs)-perShape)
	}
	p.shapes = append(p.shapes, m)
	if len(p.shapes) > p.cfg.Window {
		p.shapes = slices.Delete(p.shapes, 0, len(p.shapes)-p.cfg.Window)
	}
}

// samplesLocked returns the mean throughput and shares of each shape, weighted by its
// measurements.
func (p *Planner) samplesLocked() []Sample {
	out := make([]Sample, len(p.shapes))
	for i, m := range p.shapes {
		var sum, cs, ss float64
		var nc, ns int
		for _, x := range m.xs {
			sum += x.x
			if x.compute > 0 {
				cs += x.compute
				nc++
			}
			if x.serve > 0 {
				ss += x.serve
				ns++
			}
		}
		out[i] = Sample{Shape: m.shape, Throughput: sum / float64(len(m.xs)), Weight: float64(len(m.xs))}
		if nc > 0 {
			out[i].Compute = cs / float64(nc)
		}
		if ns > 0 {
			out[i].Serve = ss / float64(ns)
		}
	}
	return out
}

// fitLocked fits the model to the measurements, with the prior, the cores bounded where the
// observations showed how many a process uses.
func (p *Planner) fitLocked() (Model, error) {
	prior := &Prior{}
	if p.prior != nil {
		prior = &Prior{Model: *p.prior, Weight: p.cfg.PriorWeight}
	}
	prior.Model.WorkerCores, prior.Model.ServerCores = p.boundLocked(Worker), p.boundLocked(Server)
	return Fit(p.samplesLocked(), prior)
}

// Model returns the model fitted to the measurements so far (with the prior) and the
// samples it was fitted to: one per shape, the mean of its newest measurements.
func (p *Planner) Model() (Model, []Sample, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, err := p.fitLocked()
	return m, p.samplesLocked(), err
}

// Record returns the job's record for the history: the current shape, the model fitted to
// its samples, its mean throughput at that shape, its peak server and worker memory and the
// most cores its processes used while they worked. profile's Request, when zero, is the
// one Begin was given.
func (p *Planner) Record(job string, profile JobProfile, finished time.Time) JobRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	if profile.Request == (Shape{}) {
		profile.Request = p.profile.Request
	}
	r := JobRecord{Job: job, Profile: profile, Shape: p.shape, PeakServerMemory: p.peakMem, PeakWorkerMemory: p.peakWorkerMem, Finished: finished}
	if m, err := p.fitLocked(); err == nil {
		r.Model = &m
	}
	for _, s := range p.samplesLocked() {
		if s.Shape == p.shape {
			r.Throughput = s.Throughput
		}
	}
	r.WorkerCores, r.WorkerCoresAtLeast = p.seen[Worker].record(p.cfg.BusyHeadroom, p.cfg.CPUStep)
	r.ServerCores, r.ServerCoresAtLeast = p.seen[Server].record(p.cfg.BusyHeadroom, p.cfg.CPUStep)
	r.PeakRowMemory = p.peakRows
	return r
}

func (p *Planner) logDecision(d Decision) {
	p.log.LogAttrs(context.Background(), slog.LevelInfo, "autoscale: "+d.Kind.String(), slog.Any("decision", d))
}
