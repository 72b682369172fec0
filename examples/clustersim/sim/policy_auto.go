package sim

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/elasticps/elasticps/elastic/autoscale"
)

// Auto is DLRover-RM-style auto configuration of parameter-server jobs on the policy code the
// coordinator runs (package elastic/autoscale): each job gets a Planner; its first shape comes
// from Planner.Begin with the job's profile (the user's request among it) and the records of
// the jobs finished so far in the run (the history); every tick the job's observation
// (throughput with noise; each server's CPU share, busy share and memory; each worker's CPU
// share, busy share, memory and step time) goes to Planner.Observe and its decisions are
// carried out: re-plans resize the job or right-size its processes, added servers resize it
// (each change priced by the run's ScaleCost, and by the planner from the same figures), a
// server that ran out of memory or nears its limit restarts larger from the checkpoint (or its
// rows are spread over more servers), and the first job in the queue, once it has waited
// longer than PendingFor, gives up workers and then asks for smaller processes. Jobs start in
// arrival order as soon as their plan fits, as under FIFO. The planner's quota is the cores and
// memory the user asked for; a core weighs as much as the largest node's memory per core.
type Auto struct {
	cfg     autoscale.Config
	label   string
	jobs    map[int]*autoJob
	history []autoscale.JobRecord
	maxNode Resources
	decided int
}

type autoJob struct {
	planner *autoscale.Planner
	profile autoscale.JobProfile
	plan    Config // the configuration to start or run with
	waited  float64
}

// NewAuto returns the policy with planner configuration cfg (zero fields: the package
// defaults), which it checks, and the records of earlier jobs to plan from. Each job's planner
// gets cfg with MaxCPU and MaxMemory set to the cores and memory the user asked for: the auto
// configuration takes no more than the job's quota (but for the memory its model's rows turn
// out to need).
func NewAuto(cfg autoscale.Config, label string, history []autoscale.JobRecord) (*Auto, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if label == "" {
		label = "auto"
	}
	return &Auto{cfg: cfg, label: label, jobs: map[int]*autoJob{}, history: slices.Clone(history)}, nil
}

// Name implements Policy.
func (a *Auto) Name() string { return a.label }

// Decisions is how many decisions the planners made.
func (a *Auto) Decisions() int { return a.decided }

// History is the records the finished jobs left, oldest first.
func (a *Auto) History() []autoscale.JobRecord { return a.history }

const gib = 1 << 30

func simTime(t float64) time.Time {
	return time.Unix(0, 0).UTC().Add(time.Duration(t * float64(time.Second)))
}

func (a *Auto) shapeOf(c Config) autoscale.Shape {
	return autoscale.Shape{
		Workers: c.Workers, Servers: c.Servers,
		Worker: autoscale.Resources{CPU: c.WorkerCPU, Memory: int64(c.WorkerMem * gib)},
		Server: autoscale.Resources{CPU: c.ServerCPU, Memory: int64(c.ServerMem * gib)},
	}
}

// configOf turns a planned shape into a configuration for job j, each process no larger than
// a node; a worker's memory is the user's until the planner sizes it.
func (a *Auto) configOf(j *Job, sh autoscale.Shape) Config {
	c := Config{Workers: sh.Workers, Servers: sh.Servers, WorkerCPU: sh.Worker.CPU, ServerCPU: sh.Server.CPU,
		WorkerMem: float64(sh.Worker.Memory) / gib, ServerMem: float64(sh.Server.Memory) / gib}
	if c.WorkerMem <= 0 {
		c.WorkerMem = j.Request.WorkerMem
	}
	if c.ServerMem <= 0 {
		c.ServerMem = j.Request.ServerMem
	}
	if a.maxNode.CPU > 0 {
		c.WorkerCPU, c.ServerCPU = math.Min(c.WorkerCPU, a.maxNode.CPU), math.Min(c.ServerCPU, a.maxNode.CPU)
		c.WorkerMem, c.ServerMem = math.Min(c.WorkerMem, a.maxNode.Mem), math.Min(c.ServerMem, a.maxNode.Mem)
	}
	return c
}

func (a *Auto) begin(s *State, j *Job) (*autoJob, error) {
	cfg := a.cfg
	req := j.Request.Demand()
	cfg.MaxCPU = req.CPU
	cfg.MaxMemory = int64(req.Mem * gib)
	// Without a similar earlier job the plan starts from what the user asked for.
	cfg.Worker = autoscale.Resources{CPU: j.Request.WorkerCPU, Memory: int64(j.Request.WorkerMem * gib)}
	cfg.Server = autoscale.Resources{CPU: j.Request.ServerCPU}
	cfg.InitialWorkers, cfg.InitialServers = j.Request.Workers, j.Request.Servers
	if cfg.CoreMemory == 0 && a.maxNode.CPU > 0 {
		// A core of the cluster's nodes comes with their memory over their cores.
		cfg.CoreMemory = int64(a.maxNode.Mem / a.maxNode.CPU * gib)
	}
	cfg.MaxServerMemory = min(cfg.MaxServerMemory, int64(a.maxNode.Mem*gib))
	if cfg.MaxServerMemory == 0 {
		cfg.MaxServerMemory = int64(a.maxNode.Mem * gib)
	}
	if cfg.Logger != nil {
		cfg.Logger = cfg.Logger.With("job", j.Name)
	}
	p, err := autoscale.NewPlanner(cfg)
	if err != nil {
		return nil, err
	}
	aj := &autoJob{planner: p, profile: autoscale.JobProfile{
		Kind: j.Profile.Application, ModelBytes: int64(j.Profile.ModelGiB * gib),
		DatasetSamples: int64(j.Profile.Samples), BatchSize: j.Profile.Batch,
		Request: a.shapeOf(j.Request),
	}}
	d, err := p.Begin(aj.profile, a.history, simTime(s.Now()))
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", j.Name, err)
	}
	a.decided++
	aj.plan = a.configOf(j, d.Shape)
	return aj, nil
}

// observation builds what the job's monitoring would report.
func (a *Auto) observation(s *State, j *Job, o Observation, oom bool) autoscale.Observation {
	c := o.Config
	obs := autoscale.Observation{At: simTime(s.Now()), Shape: a.shapeOf(c), Throughput: o.Throughput, Changing: s.Stalled(j)}
	for i := range c.Servers {
		obs.Servers = append(obs.Servers, autoscale.ServerLoad{
			ID: fmt.Sprintf("ps-%d", i), CPU: math.Min(1, o.Server.CPU/c.ServerCPU), Busy: o.ServerBusy,
			Memory: int64(o.Server.Mem * gib), MemoryLimit: int64(c.ServerMem * gib), OOMKilled: oom,
		})
	}
	var step time.Duration
	if o.Throughput > 0 && j.Profile.Batch > 0 {
		step = time.Duration(float64(j.Profile.Batch) * float64(c.Workers) / o.Throughput * float64(time.Second))
	}
	for i := range c.Workers {
		obs.Workers = append(obs.Workers, autoscale.WorkerLoad{ID: fmt.Sprintf("worker-%d", i), StepTime: step,
			CPU: math.Min(1, o.Worker.CPU/c.WorkerCPU), Busy: o.WorkerBusy, Memory: int64(o.Worker.Mem * gib)})
	}
	return obs
}

// apply carries out decisions on j's configuration and returns the new one. The planner's
// shapes carry the counts and sizes; a restart larger gives every server the new size (the
// servers are alike here: what one runs short of, all do).
func (a *Auto) apply(j *Job, c Config, ds []autoscale.Decision) Config {
	for _, d := range ds {
		a.decided++
		switch d.Kind {
		case autoscale.Resize, autoscale.AddServer, autoscale.RestartServer, autoscale.ShrinkRequest:
			if d.Shape.Workers > 0 {
				c = a.configOf(j, d.Shape)
			}
		}
	}
	return c
}

// Schedule implements Policy.
func (a *Auto) Schedule(s *State) {
	if a.maxNode.CPU == 0 {
		a.maxNode = s.cl.largest()
	}
	for _, j := range s.Finished() {
		if aj := a.jobs[j.ID]; aj != nil && !s.Failed(j) {
			a.history = append(a.history, aj.planner.Record(j.Name, aj.profile, simTime(s.Now())))
		}
		delete(a.jobs, j.ID)
	}
	for _, j := range s.Running() {
		aj := a.jobs[j.ID]
		o, ok := s.Observe(j)
		if aj == nil || !ok {
			continue
		}
		ds := aj.planner.Observe(a.observation(s, j, o, false))
		if len(ds) == 0 {
			continue
		}
		if n := a.apply(j, s.Config(j), ds); n != s.Config(j) && s.Resize(j, n) {
			aj.plan = n
		}
	}
	head := true // the pending rule applies to the first job that waits: the others wait their turn
	for _, j := range s.Waiting() {
		aj := a.jobs[j.ID]
		if aj == nil {
			var err error
			if aj, err = a.begin(s, j); err != nil {
				// A profile the planner refuses runs as the user asked.
				aj = &autoJob{plan: j.Request}
			}
			a.jobs[j.ID] = aj
		}
		if s.Start(j, aj.plan) {
			aj.waited = 0
			continue
		}
		if !head || aj.planner == nil {
			continue
		}
		head = false
		aj.waited += s.Tick()
		c := aj.plan
		sh := a.shapeOf(c)
		waited := time.Duration(aj.waited * float64(time.Second))
		obs := autoscale.Observation{At: simTime(s.Now()), Shape: sh}
		for i := range c.Servers {
			obs.Pending = append(obs.Pending, autoscale.Pending{ID: fmt.Sprintf("ps-%d", i), Role: autoscale.Server, Size: sh.Server, Waited: waited})
		}
		for i := range c.Workers {
			obs.Pending = append(obs.Pending, autoscale.Pending{ID: fmt.Sprintf("worker-%d", i), Role: autoscale.Worker, Size: sh.Worker, Waited: waited})
		}
		if ds := aj.planner.Observe(obs); len(ds) > 0 {
			if n := a.apply(j, c, ds); n != c {
				aj.plan, aj.waited = n, 0
			}
		}
	}
}

// OnOOM implements OOMHandler: the planner sees the servers killed and says how large to
// restart them, or over how many servers to spread the rows; the job restarts from its
// checkpoint with that. A planner that decides nothing (a restart it asked for that has not
// been carried out, or MaxServers at MaxServerMemory) lets the job fail, as it would without
// one.
func (a *Auto) OnOOM(s *State, j *Job) (Config, bool) {
	aj := a.jobs[j.ID]
	if aj == nil || aj.planner == nil {
		return Config{}, false
	}
	c := aj.plan
	o := Observation{Config: c, Server: Resources{Mem: c.ServerMem}}
	n := a.apply(j, c, aj.planner.Observe(a.observation(s, j, o, true)))
	if n.ServerMem*float64(n.Servers) <= c.ServerMem*float64(c.Servers) {
		return Config{}, false
	}
	aj.plan = n
	return n, true
}

var _ OOMHandler = (*Auto)(nil)
