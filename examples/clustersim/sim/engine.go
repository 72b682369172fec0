package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
)

// Policy decides, at every tick, which jobs run and with what. It changes the cluster only
// through the State's Start, Resize and Preempt, so the shared machinery keeps the books.
type Policy interface {
	Name() string
	Schedule(s *State)
}

// OOMHandler is implemented by a policy that restarts a job whose server ran out of memory
// (from its last checkpoint) instead of letting it fail. OnOOM returns the configuration to
// restart with; false lets the job fail.
type OOMHandler interface {
	OnOOM(s *State, j *Job) (Config, bool)
}

// Stall is what a change costs a running job: Pause seconds without progress, then Slow
// seconds at Factor of its speed.
type Stall struct {
	Pause, Slow, Factor float64
}

// ScaleCost prices changes to running jobs.
type ScaleCost interface {
	// Resize is the stall of a running job changed from one configuration to another at a
	// progress (0..1).
	Resize(j *Job, progress float64, from, to Config) Stall
	// Restart is the stall of a job started again from its checkpoint (after a preemption or
	// a crash).
	Restart(j *Job, progress float64, c Config) Stall
}

// Options configure a run.
type Options struct {
	Tick float64 // seconds between scheduling decisions (default 60)
	// Tail is how long after the last arrival the run goes on (default 24 hours); jobs not
	// done by then count as not completed within the trace window.
	Tail float64
	Cost ScaleCost // nil: changes are free
	// CheckpointEvery is the seconds of training between checkpoints; a crash loses the
	// progress since the last (default 600).
	CheckpointEvery float64
	Seed            uint64 // seeds the noise of observations
}

func (o *Options) defaults() {
	if o.Tick <= 0 {
		o.Tick = 60
	}
	if o.Tail <= 0 {
		o.Tail = 86400
	}
	if o.CheckpointEvery <= 0 {
		o.CheckpointEvery = 600
	}
}

// jobState is the simulator's book on one job.
type jobState struct {
	*Job
	admitted, running, done, failed bool
	everRun                         bool
	seq                             int // order of the latest start
	cfg                             Config
	place                           placement
	firstStart, finish              float64
	progress, ckpt, sinceCkpt       float64
	stall                           Stall
	attained                        float64
	lastChange                      float64
	lastRate                        float64 // work/s over the last tick
	allocCPU, usedCPU               float64 // core-seconds
	allocMem, usedMem               float64 // GiB-seconds
	gpuSeconds                      float64
	restarts, resizes, ooms         int
	lastUsedWorker, lastUsedServer  Resources
	lastBusyWorker, lastBusyServer  float64
}

// State is what a policy sees and changes. It is valid only during Schedule.
type State struct {
	now      float64
	tick     float64
	opt      Options
	cl       *cluster
	jobs     []*jobState // by ID
	order    []*jobState // arrival order
	seq      int
	arrived  []*Job
	finished []*Job
	rng      *rand.Rand
	policy   Policy
}

// Now is the simulated time, seconds from the workload's start.
func (s *State) Now() float64 { return s.now }

// Tick is the seconds between decisions.
func (s *State) Tick() float64 { return s.tick }

// Arrived lists the jobs that arrived since the previous decision; Finished those that
// completed or failed.
func (s *State) Arrived() []*Job  { return s.arrived }
func (s *State) Finished() []*Job { return s.finished }

// Waiting lists the jobs that arrived and are not running or done, in arrival order.
func (s *State) Waiting() []*Job {
	var out []*Job
	for _, j := range s.order {
		if j.admitted && !j.running && !j.done {
			out = append(out, j.Job)
		}
	}
	return out
}

// Running lists the running jobs in the order they last started.
func (s *State) Running() []*Job {
	var rs []*jobState
	for _, j := range s.order {
		if j.running {
			rs = append(rs, j)
		}
	}
	sort.Slice(rs, func(a, b int) bool { return rs[a].seq < rs[b].seq })
	out := make([]*Job, len(rs))
	for i, j := range rs {
		out[i] = j.Job
	}
	return out
}

// Config is what j runs with now (zero when it is not running).
func (s *State) Config(j *Job) Config { return s.jobs[j.ID].cfg }

// Failed reports whether j ended without completing (its server ran out of memory).
func (s *State) Failed(j *Job) bool { return s.jobs[j.ID].failed }

// Stalled reports whether a change of j is still under way (its stall not over).
func (s *State) Stalled(j *Job) bool {
	st := s.jobs[j.ID].stall
	return st.Pause > 0 || st.Slow > 0
}

// IsRunning reports whether j runs now.
func (s *State) IsRunning(j *Job) bool { return s.jobs[j.ID].running }

// HasRun reports whether j ever ran.
func (s *State) HasRun(j *Job) bool { return s.jobs[j.ID].everRun }

// Progress is the fraction of j's work done.
func (s *State) Progress(j *Job) float64 { return s.jobs[j.ID].progress / j.Work }

// Remaining is j's work left, in its work units.
func (s *State) Remaining(j *Job) float64 { return j.Work - s.jobs[j.ID].progress }

// Attained is the service j received: GPU-seconds for a GPU job, core-seconds otherwise.
func (s *State) Attained(j *Job) float64 { return s.jobs[j.ID].attained }

// LastChange is when j was last started or resized.
func (s *State) LastChange(j *Job) float64 { return s.jobs[j.ID].lastChange }

// Capacity is the cluster's total; Free what no job holds now.
func (s *State) Capacity() Resources { return s.cl.total }
func (s *State) Free() Resources     { return s.cl.freeTotal() }

// Fits reports whether c could be placed now beside what runs.
func (s *State) Fits(c Config) bool { return s.cl.fits(c.tasks()) }

// FitsResized reports whether running j could change to c now.
func (s *State) FitsResized(j *Job, c Config) bool {
	js := s.jobs[j.ID]
	if !js.running {
		return s.Fits(c)
	}
	s.cl.release(js.place)
	ok := s.cl.fits(c.tasks())
	s.cl.restore(js.place)
	return ok
}

// Start runs waiting job j with c if it fits, and reports whether it did. A job that ran
// before restarts from its checkpoint and pays the restart stall.
func (s *State) Start(j *Job, c Config) bool {
	js := s.jobs[j.ID]
	if js.running || js.done || !js.admitted || c.Zero() {
		return false
	}
	p, ok := s.cl.place(c.tasks())
	if !ok {
		return false
	}
	js.place, js.cfg, js.running = p, c, true
	s.seq++
	js.seq = s.seq
	js.lastChange = s.now
	if js.everRun {
		js.restarts++
		if s.opt.Cost != nil {
			js.stall = addStall(js.stall, s.opt.Cost.Restart(j, js.progress/j.Work, c))
		}
	} else {
		js.everRun = true
		js.firstStart = s.now
	}
	return true
}

// Resize changes running job j to c if c fits in place of what j holds, and reports whether
// it did; the change costs the ScaleCost's stall.
func (s *State) Resize(j *Job, c Config) bool {
	js := s.jobs[j.ID]
	if !js.running || c.Zero() {
		return false
	}
	if c == js.cfg {
		return true
	}
	s.cl.release(js.place)
	p, ok := s.cl.place(c.tasks())
	if !ok {
		s.cl.restore(js.place)
		return false
	}
	if s.opt.Cost != nil {
		js.stall = addStall(js.stall, s.opt.Cost.Resize(j, js.progress/j.Work, js.cfg, c))
	}
	js.place, js.cfg = p, c
	js.lastChange = s.now
	js.resizes++
	return true
}

// Preempt stops running job j; it waits again and keeps its progress (it checkpoints as it
// stops), and its next Start pays the restart stall.
func (s *State) Preempt(j *Job) {
	js := s.jobs[j.ID]
	if !js.running {
		return
	}
	s.stop(js)
	js.ckpt = js.progress
	js.lastChange = s.now
}

func (s *State) stop(js *jobState) {
	s.cl.release(js.place)
	js.place, js.cfg, js.running = placement{}, Config{}, false
	js.stall = Stall{}
}

// Throughput is j's profiled speed at c, in work units per second: what the Pollux and Gavel
// measurements give a policy that profiles jobs.
func (s *State) Throughput(j *Job, c Config) float64 { return j.Perf.Throughput(c) }

// Observation is what a job's monitoring reports about its last tick: the configuration, the
// measured throughput (with noise) and the resources each worker and server used.
type Observation struct {
	Config     Config
	Throughput float64 // work units per second, 0 while stalled
	Worker     Resources
	Server     Resources
	// WorkerBusy and ServerBusy are the shares of its time a worker computed and a server
	// served (PSTruth.Busy; 0 for a GPU job).
	WorkerBusy, ServerBusy float64
	Progress               float64 // 0..1
}

// Observe returns j's latest observation; ok is false when it is not running or has not
// trained for a whole tick since it last changed.
func (s *State) Observe(j *Job) (Observation, bool) {
	js := s.jobs[j.ID]
	if !js.running || js.lastRate <= 0 {
		return Observation{}, false
	}
	noise := math.Max(0.5, 1+0.03*s.rng.NormFloat64())
	return Observation{Config: js.cfg, Throughput: js.lastRate * noise, Worker: js.lastUsedWorker, Server: js.lastUsedServer,
		WorkerBusy: js.lastBusyWorker, ServerBusy: js.lastBusyServer, Progress: js.progress / j.Work}, true
}

func addStall(a, b Stall) Stall {
	out := Stall{Pause: a.Pause + b.Pause, Slow: a.Slow + b.Slow, Factor: b.Factor}
	if a.Slow > 0 && b.Slow == 0 {
		out.Factor = a.Factor
	}
	return out
}

// Sample is the cluster's state over one tick.
type Sample struct {
	T                 float64
	CPUAlloc, CPUUsed float64 // cores
	MemAlloc, MemUsed float64 // GiB
	GPUAlloc          float64
	Running, Waiting  int
}

// JobResult is one job's outcome.
type JobResult struct {
	ID                      int
	Name                    string
	Arrival, Start, Finish  float64 // Start and Finish are NaN when it never started or finished
	Completed, Failed       bool
	AllocCPU, UsedCPU       float64 // core-seconds
	AllocMem, UsedMem       float64 // GiB-seconds
	GPUSeconds              float64
	Restarts, Resizes, OOMs int
}

// JCT is the job's completion time (NaN when it did not complete).
func (r JobResult) JCT() float64 {
	if !r.Completed {
		return math.NaN()
	}
	return r.Finish - r.Arrival
}

// Result is one run of a policy on a workload.
type Result struct {
	Policy, Workload string
	Capacity         Resources
	End              float64 // when the trace window closed
	Jobs             []JobResult
	Series           []Sample
}

// ErrNothingSimulated is returned by Run for a workload with no job.
var ErrNothingSimulated = errors.New("clustersim: nothing to simulate")

// Run simulates policy p on workload w.
func Run(w *Workload, p Policy, opt Options) (*Result, error) {
	opt.defaults()
	if len(w.Jobs) == 0 {
		return nil, ErrNothingSimulated
	}
	s := &State{opt: opt, tick: opt.Tick, cl: newCluster(w.Nodes), rng: newRand(opt.Seed, 99), policy: p}
	if s.cl.total.CPU <= 0 {
		return nil, fmt.Errorf("clustersim: workload %s has no nodes", w.Name)
	}
	s.jobs = make([]*jobState, len(w.Jobs))
	for _, j := range w.Jobs {
		if j.ID < 0 || j.ID >= len(w.Jobs) || s.jobs[j.ID] != nil {
			return nil, fmt.Errorf("clustersim: job %s: ids must be 0..%d, each once", j.Name, len(w.Jobs)-1)
		}
		if !(j.Work > 0) || j.Perf == nil || j.Arrival < 0 {
			return nil, fmt.Errorf("clustersim: job %s: needs positive work, a Perf and an arrival >= 0", j.Name)
		}
		s.jobs[j.ID] = &jobState{Job: j, finish: math.NaN(), firstStart: math.NaN()}
	}
	s.order = slices.Clone(s.jobs)
	sort.SliceStable(s.order, func(a, b int) bool { return s.order[a].Arrival < s.order[b].Arrival })
	end := s.order[len(s.order)-1].Arrival + opt.Tail
	res := &Result{Policy: p.Name(), Workload: w.Name, Capacity: s.cl.total, End: end}

	next := 0
	for s.now = 0; s.now < end; s.now += s.tick {
		for next < len(s.order) && s.order[next].Arrival <= s.now {
			s.order[next].admitted = true
			s.arrived = append(s.arrived, s.order[next].Job)
			next++
		}
		if !s.anyActive() {
			if next == len(s.order) {
				break
			}
			// Nothing to do until the next arrival.
			s.now = math.Ceil(s.order[next].Arrival/s.tick)*s.tick - s.tick
			continue
		}
		p.Schedule(s)
		s.arrived, s.finished = s.arrived[:0], s.finished[:0]
		res.Series = append(res.Series, s.advance())
	}
	for _, js := range s.jobs {
		res.Jobs = append(res.Jobs, JobResult{
			ID: js.ID, Name: js.Name, Arrival: js.Arrival, Start: js.firstStart, Finish: js.finish,
			Completed: js.done && !js.failed, Failed: js.failed,
			AllocCPU: js.allocCPU, UsedCPU: js.usedCPU, AllocMem: js.allocMem, UsedMem: js.usedMem, GPUSeconds: js.gpuSeconds,
			Restarts: js.restarts, Resizes: js.resizes, OOMs: js.ooms,
		})
	}
	return res, nil
}

// anyActive reports whether a job has arrived and is not done.
func (s *State) anyActive() bool {
	for _, js := range s.order {
		if js.admitted && !js.done {
			return true
		}
	}
	return false
}

// advance trains every running job over one tick and returns the cluster's sample.
func (s *State) advance() Sample {
	smp := Sample{T: s.now}
	for _, js := range s.order {
		if js.admitted && !js.running && !js.done {
			smp.Waiting++
		}
	}
	var crashed []*jobState
	for _, js := range s.order {
		if !js.running {
			continue
		}
		smp.Running++
		c := js.cfg
		x := js.Perf.Throughput(c)
		limit := js.Work // progress at which the job ends this tick (done or crashed)
		oomAt := math.Inf(1)
		if js.PSTruth != nil {
			oomAt = js.oomProgress(c) * js.Work
			limit = math.Min(limit, oomAt)
		}
		// Walk the tick: the stall's pause, its slow part, then full speed.
		segs := [3][2]float64{{0, 0}, {0, 0}, {0, x}}
		budget := s.tick
		pz := math.Min(js.stall.Pause, budget)
		js.stall.Pause -= pz
		budget -= pz
		segs[0] = [2]float64{pz, 0}
		sl := math.Min(js.stall.Slow, budget)
		js.stall.Slow -= sl
		budget -= sl
		segs[1] = [2]float64{sl, x * js.stall.Factor}
		segs[2] = [2]float64{budget, x}
		elapsed, work, ended := 0.0, 0.0, false
		for _, sg := range segs {
			if sg[0] <= 0 {
				continue
			}
			if need := limit - js.progress - work; sg[1] > 0 && sg[1]*sg[0] >= need {
				dt := math.Max(0, need/sg[1])
				elapsed += dt
				work += math.Max(0, need)
				ended = true
				break
			}
			elapsed += sg[0]
			work += sg[1] * sg[0]
		}
		if js.progress >= limit {
			ended = true
		}
		js.progress += work
		js.sinceCkpt += elapsed
		if js.sinceCkpt >= s.opt.CheckpointEvery {
			js.ckpt, js.sinceCkpt = js.progress, 0
		}
		js.lastRate = 0
		if elapsed > 0 && pz == 0 {
			js.lastRate = work / elapsed
		}
		// The books: allocation and use over the time it held its resources.
		d := c.Demand()
		rate := 0.0
		if elapsed > 0 {
			rate = work / elapsed
		}
		// A GPU job's use of its cores and memory is not modelled (the traces say nothing of
		// it): only its GPUs' busy share is.
		var uw, us Resources
		js.lastBusyWorker, js.lastBusyServer = 0, 0
		if js.PSTruth != nil {
			uw, us = js.PSTruth.Used(c, rate, js.progress/js.Work)
			js.lastBusyWorker, js.lastBusyServer = js.PSTruth.Busy(c, rate)
		} else if x > 0 {
			uw = Resources{GPU: rate / x}
		}
		js.lastUsedWorker, js.lastUsedServer = uw, us
		used := uw.scale(float64(c.Workers)).add(us.scale(float64(c.Servers)))
		js.allocCPU += d.CPU * elapsed
		js.allocMem += d.Mem * elapsed
		js.usedCPU += used.CPU * elapsed
		js.usedMem += math.Min(used.Mem, d.Mem) * elapsed
		js.gpuSeconds += d.GPU * elapsed
		if js.Kind == GPU {
			js.attained += d.GPU * elapsed
		} else {
			js.attained += d.CPU * elapsed
		}
		frac := elapsed / s.tick
		smp.CPUAlloc += d.CPU * frac
		smp.MemAlloc += d.Mem * frac
		smp.GPUAlloc += d.GPU * frac
		smp.CPUUsed += used.CPU * frac
		smp.MemUsed += math.Min(used.Mem, d.Mem) * frac
		if !ended {
			continue
		}
		if js.progress >= js.Work-1e-9*js.Work {
			js.progress = js.Work
			s.stop(js)
			js.done, js.finish = true, s.now+elapsed
			s.finished = append(s.finished, js.Job)
			continue
		}
		crashed = append(crashed, js)
	}
	for _, js := range crashed {
		s.oom(js)
	}
	return smp
}

// oomProgress is the progress (0..1) at which a server of j at c runs out of memory (+Inf if
// never).
func (js *jobState) oomProgress(c Config) float64 {
	t := js.PSTruth
	if t.ServerMemNeed(c.Servers, 1) <= c.ServerMem {
		return math.Inf(1)
	}
	if t.ServerMemNeed(c.Servers, 0) > c.ServerMem {
		return 0
	}
	// fill(f) = 0.4 + 1.2 f below f = 0.5.
	fill := (c.ServerMem - t.ServerBaseGiB) * float64(c.Servers) / t.ModelGiB
	return math.Max(0, (fill-0.4)/1.2)
}

// oom kills js as its server runs out of memory: it loses the progress since its checkpoint
// and fails, unless the policy restarts it.
func (s *State) oom(js *jobState) {
	js.ooms++
	s.stop(js)
	js.progress, js.sinceCkpt = js.ckpt, 0
	if h, ok := s.policy.(OOMHandler); ok {
		if c, again := h.OnOOM(s, js.Job); again && !c.Zero() {
			if !s.Start(js.Job, c) {
				js.stall = Stall{}
			}
			return
		}
	}
	js.done, js.failed, js.finish = true, true, math.NaN()
	s.finished = append(s.finished, js.Job)
}
