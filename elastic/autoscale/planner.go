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
	// Memory is the bytes it uses; MemoryLimit the bytes it may (0: Shape.Server.Memory).
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
	}, nil
}

// Config returns the planner's configuration, defaults filled in.
func (p *Planner) Config() Config { return p.cfg }

// Begin returns a job's first plan, from its profile and the records of earlier jobs
// (LoadHistory): the nearest record of a job within Config.HistoryMaxDistance gives its
// model (the prior of later fits, unless Config.Prior is set), its process sizes (right-sized
// while it ran) and its memory per model byte; the servers are as many as the model's memory
// needs (MaxServerMemory each) and the model suggests, the workers as many as the model finds
// worth their cores within the quota's cores and memory. Without such a record it is
// InitialWorkers and InitialServers of Config.Worker and Config.Server, and the memory per
// model byte is the median measured by the earlier jobs of the profile's kind (of any kind
// when none), MemoryPerModelByte without any: what a byte of model costs in memory is the
// platform's, not the job's. It returns ErrInvalidProfile for a profile with a non-positive
// size or a model too large for MaxServers servers.
func (p *Planner) Begin(profile JobProfile, history []JobRecord, at time.Time) (Decision, error) {
	if err := profile.validate(); err != nil {
		return Decision{}, err
	}
	c := &p.cfg
	rec, dist, found := nearest(profile, history, c.HistoryMaxDistance)
	perByte, why := c.MemoryPerModelByte, "default"
	if v, ok := rec.memoryPerModelByte(); found && ok {
		perByte, why = v, "measured by "+rec.Job
	} else if v, n := platformMemoryPerModelByte(profile.Kind, history); n > 0 {
		perByte, why = v, fmt.Sprintf("the median measured by %d earlier jobs", n)
	}
	need := float64(profile.ModelBytes) * perByte * c.MemoryHeadroom
	minServers := max(int(math.Ceil(need/float64(c.MaxServerMemory))), c.MinServers)
	if minServers > c.MaxServers {
		return Decision{}, fmt.Errorf("%w: the model needs %.1f GiB of server memory (%.2f bytes per model byte, %s), more than %d servers of %.1f GiB",
			ErrInvalidProfile, need/(1<<30), perByte, why, c.MaxServers, float64(c.MaxServerMemory)/(1<<30))
	}

	d := Decision{Kind: Plan, At: at, Value: need, Limit: float64(c.MaxServerMemory)}
	var s Shape
	var model *Model
	switch {
	case found && rec.Model != nil:
		model = rec.Model
		s = Shape{Workers: c.MinWorkers, Servers: minServers, Worker: rec.Shape.Worker, Server: rec.Shape.Server}
		if !s.valid() {
			s.Worker, s.Server = c.Worker, c.Server
		}
		for _, st := range c.grow(*model, spread(s, need), c.MaxWorkers+c.MaxServers, need) {
			s = st.to
		}
		d.Reason = fmt.Sprintf("the model of %s (profile distance %.2f) predicts %.0f samples/s", rec.Job, dist, model.Throughput(s))
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
	s = c.withinQuota(s)
	d.Shape = s
	d.Reason += fmt.Sprintf("; servers need %.2f GiB for a %.2f GiB model (%.2f bytes per model byte, %s, x%.2f headroom): %.2f GiB each",
		need/(1<<30), float64(profile.ModelBytes)/(1<<30), perByte, why, c.MemoryHeadroom, float64(s.Server.Memory)/(1<<30))
	if model != nil {
		d.After = model.Throughput(s)
		if profile.DatasetSamples > 0 && d.After > 0 {
			d.Reason += fmt.Sprintf("; an epoch in about %v", (time.Duration(float64(profile.DatasetSamples)/d.After) * time.Second).Round(time.Second))
		}
	}

	p.mu.Lock()
	if p.cfg.Prior == nil && model != nil {
		m := *model
		p.prior = &m
	}
	p.shape = s
	p.changed = at
	p.serverTotal, p.rowsNeed = float64(s.Server.Memory)*float64(s.Servers), need
	p.mu.Unlock()
	p.logDecision(d)
	return d, nil
}

func roundMiB(b float64) int64 {
	const mib = 1 << 20
	return int64(math.Ceil(b/mib)) * mib
}

// Observe takes one observation and returns what to do about it, possibly nothing. A
// decision that changes the counts (Resize, AddServer) or restarts a server is made at most
// once per Cooldown, and the hot, straggler and memory rules act again on a process only
// after it shows the condition anew; so feeding observations while a decision is carried out
// does not repeat it.
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
	if p.cut != nil && !sameSize(obs.Shape, p.cut.to) && !sameSize(obs.Shape, p.cut.from) {
		p.cut = nil // something else changed the job: the cut cannot be judged alone
	}
	p.shape = obs.Shape
	if p.serverTotal == 0 && obs.Shape.Server.Memory > 0 {
		p.serverTotal = float64(obs.Shape.Server.Memory) * float64(obs.Shape.Servers)
	}
	p.useLocked(obs)
	if !obs.Changing && obs.Throughput > 0 && obs.Shape.valid() && !math.IsInf(obs.Throughput, 0) {
		p.addLocked(obs.Shape, obs.Throughput)
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
		p.changed = obs.At
		return ds
	}
	if d, ok := p.replanLocked(obs); ok {
		p.changed = obs.At
		ds = append(ds, d)
	}
	return ds
}

// replanLocked is stage 2: every ReplanEvery, once the shape has settled, the model's
// recommendation.
func (p *Planner) replanLocked(obs Observation) (Decision, bool) {
	c := &p.cfg
	if obs.Changing || obs.At.Sub(p.lastReplan) < c.ReplanEvery || obs.At.Sub(p.changed) < c.Cooldown ||
		p.atShape < c.Settle || !obs.Shape.valid() {
		return Decision{}, false
	}
	p.lastReplan = obs.At
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

// countsLocked is the re-plan of the counts: exploration without a prior, else the model's
// recommendation, the cores of a process raised where its measured use, scaled by the load
// per process the model predicts, needs more with CPUHeadroom.
func (p *Planner) countsLocked(obs Observation) (Decision, bool) {
	c := &p.cfg
	if p.prior != nil && p.cfg.Prior == nil {
		// A prior from the history that the job's own measurements contradict (off by more
		// than PriorTolerance) plans nothing: without it the planner explores.
		pred, got := p.prior.Throughput(obs.Shape), p.meanAtLocked(obs.Shape)
		if pred > 0 && got > 0 && math.Abs(math.Log(got/pred)) > math.Log(c.PriorTolerance) {
			p.log.Info("autoscale: prior dropped", "predicted", pred, "measured", got, "shape", obs.Shape.String())
			p.prior = nil
		}
	}
	if p.prior == nil && (len(p.workerCounts) < 2 || len(p.serverCounts) < 2) {
		return p.exploreLocked(obs)
	}
	m, err := p.fitLocked()
	if err != nil {
		p.log.Warn("autoscale: no model", "err", err)
		return Decision{}, false
	}
	d, ok := c.replan(m, obs.Shape, p.serverTotal)
	if !ok {
		p.log.Debug("autoscale: shape kept", "shape", obs.Shape.String(), "model", m.String())
		return Decision{}, false
	}
	if s, why := p.scaleCoresLocked(obs.Shape, d.Shape, m.Throughput(obs.Shape), d.After); why != "" {
		d.Shape = s
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
// learns how the job scales; it needs no prior.
func (p *Planner) exploreLocked(obs Observation) (Decision, bool) {
	c := &p.cfg
	var moves []Shape
	var what string
	if len(p.workerCounts) < 2 {
		moves, what = []Shape{with(obs.Shape, 1, 0), with(obs.Shape, -1, 0)}, "workers"
	} else {
		moves, what = []Shape{spread(with(obs.Shape, 0, 1), p.serverTotal), spread(with(obs.Shape, 0, -1), p.serverTotal)}, "servers"
	}
	for _, s := range moves {
		if c.allows(s) {
			return Decision{
				Kind: Resize, At: obs.At, Shape: s, Before: obs.Throughput,
				Reason: fmt.Sprintf("explore: one count of %s measured, no prior model; %s", what, obs.Shape.String()),
			}, true
		}
	}
	// The quota allows no other count: mark the dimension as known so the fit goes ahead.
	if what == "workers" {
		p.workerCounts[-1] = true
	} else {
		p.serverCounts[-1] = true
	}
	return Decision{}, false
}

// measured is the newest throughputs measured at one shape.
type measured struct {
	shape Shape
	xs    []float64
}

// perShape is how many of the newest measurements at a shape its sample averages.
const perShape = 20

// addLocked records a measurement: the shape's entry moves to the end, the oldest shape
// beyond Window is forgotten. Keeping every shape's measurements, not just the newest ones
// overall, keeps the shapes explored early in the fit after hours at one shape.
func (p *Planner) addLocked(s Shape, x float64) {
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

// samplesLocked returns the mean throughput of each shape, weighted by its measurements.
func (p *Planner) samplesLocked() []Sample {
	out := make([]Sample, len(p.shapes))
	for i, m := range p.shapes {
		var sum float64
		for _, x := range m.xs {
			sum += x
		}
		out[i] = Sample{Shape: m.shape, Throughput: sum / float64(len(m.xs)), Weight: float64(len(m.xs))}
	}
	return out
}

func (p *Planner) fitLocked() (Model, error) {
	var prior *Prior
	if p.prior != nil {
		prior = &Prior{Model: *p.prior, Weight: p.cfg.PriorWeight}
	}
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
// its samples, its mean throughput at that shape and its peak server memory.
func (p *Planner) Record(job string, profile JobProfile, finished time.Time) JobRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := JobRecord{Job: job, Profile: profile, Shape: p.shape, PeakServerMemory: p.peakMem, PeakWorkerMemory: p.peakWorkerMem, Finished: finished}
	if m, err := p.fitLocked(); err == nil {
		r.Model = &m
	}
	for _, s := range p.samplesLocked() {
		if s.Shape == p.shape {
			r.Throughput = s.Throughput
		}
	}
	return r
}

func (p *Planner) logDecision(d Decision) {
	p.log.LogAttrs(context.Background(), slog.LevelInfo, "autoscale: "+d.Kind.String(), slog.Any("decision", d))
}
