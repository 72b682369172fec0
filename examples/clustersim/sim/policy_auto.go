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
// from Planner.Begin with the job's profile and the records of the jobs finished so far in
// the run (the history); every tick the job's observation (throughput with noise, each
// server's CPU share and memory, each worker's step time) goes to Planner.Observe and its
// decisions are carried out: re-plans and added servers resize the job (priced by the run's
// ScaleCost), a server that ran out of memory or nears its limit restarts larger from the
// checkpoint, and the first job in the queue, once it has waited longer than PendingFor, asks
// for smaller processes. Jobs start in arrival order as soon as their plan fits, as under FIFO.
//
// The planner sizes server memory and both roles' cores; it does not size a worker's memory,
// which stays what the user asked for.
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
	// rowsGiB is the servers' memory in total the planner sized for the model (its first
	// plan, raised by every restart larger); the servers share it whatever their count.
	rowsGiB float64
}

// NewAuto returns the policy with planner configuration cfg (zero fields: the package
// defaults), which it checks, and the records of earlier jobs to plan from. Each job's planner gets cfg with MaxCPU set to the cores the
// user asked for: the auto configuration never takes more than the job's quota.
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
// a node.
func (a *Auto) configOf(j *Job, sh autoscale.Shape) Config {
	c := Config{Workers: sh.Workers, Servers: sh.Servers, WorkerCPU: sh.Worker.CPU, ServerCPU: sh.Server.CPU,
		WorkerMem: j.Request.WorkerMem, ServerMem: float64(sh.Server.Memory) / gib}
	if c.ServerMem <= 0 {
		c.ServerMem = j.Request.ServerMem
	}
	if a.maxNode.CPU > 0 {
		c.WorkerCPU, c.ServerCPU = math.Min(c.WorkerCPU, a.maxNode.CPU), math.Min(c.ServerCPU, a.maxNode.CPU)
		c.ServerMem = math.Min(c.ServerMem, a.maxNode.Mem)
	}
	return c
}

func (a *Auto) begin(s *State, j *Job) (*autoJob, error) {
	cfg := a.cfg
	cfg.MaxCPU = j.Request.Demand().CPU
	// Without a similar earlier job the plan starts from what the user asked for.
	cfg.Worker = autoscale.Resources{CPU: j.Request.WorkerCPU}
	cfg.Server = autoscale.Resources{CPU: j.Request.ServerCPU}
	cfg.InitialWorkers, cfg.InitialServers = j.Request.Workers, j.Request.Servers
	cfg.MaxServerMemory = min(cfg.MaxServerMemory, int64(a.maxNode.Mem*gib))
	if cfg.MaxServerMemory == 0 {
		cfg.MaxServerMemory = int64(a.maxNode.Mem * gib)
	}
	p, err := autoscale.NewPlanner(cfg)
	if err != nil {
		return nil, err
	}
	aj := &autoJob{planner: p, profile: autoscale.JobProfile{
		Kind: j.Profile.Application, ModelBytes: int64(j.Profile.ModelGiB * gib),
		DatasetSamples: int64(j.Profile.Samples), BatchSize: j.Profile.Batch,
	}}
	d, err := p.Begin(aj.profile, a.history, simTime(s.Now()))
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", j.Name, err)
	}
	a.decided++
	aj.rowsGiB = float64(d.Shape.Server.Memory) * float64(d.Shape.Servers) / gib
	aj.plan = withinQuota(j, a.spread(aj, a.configOf(j, d.Shape)))
	return aj, nil
}

// spread gives c's servers an equal share of the memory sized for the rows, with more servers
// when a share would not fit on a node. The planner's re-plans and pending rule size a
// server's cores and count but would shrink its memory below the rows' too, so the memory
// is kept here.
func (a *Auto) spread(aj *autoJob, c Config) Config {
	if aj.rowsGiB <= 0 || c.Servers <= 0 {
		return c
	}
	if a.maxNode.Mem > 0 {
		if n := int(math.Ceil(aj.rowsGiB / a.maxNode.Mem)); n > c.Servers {
			// More servers for the memory, sharing the cores the plan gave the servers.
			c.ServerCPU = math.Max(1, c.ServerCPU*float64(c.Servers)/float64(n))
			c.Servers = n
		}
	}
	c.ServerMem = aj.rowsGiB / float64(c.Servers)
	return c
}

// withinQuota trims workers until j's memory is within what its user asked for: the planner's
// quota bounds the job's cores (MaxCPU), not its memory, and a worker keeps the memory its
// user asked for.
func withinQuota(j *Job, c Config) Config {
	quota := j.Request.Demand().Mem
	for c.Workers > 1 && c.Demand().Mem > quota {
		c.Workers--
	}
	return c
}

// observation builds what the job's monitoring would report.
func (a *Auto) observation(s *State, j *Job, o Observation, oom bool) autoscale.Observation {
	c := o.Config
	obs := autoscale.Observation{At: simTime(s.Now()), Shape: a.shapeOf(c), Throughput: o.Throughput, Changing: s.Stalled(j)}
	for i := range c.Servers {
		obs.Servers = append(obs.Servers, autoscale.ServerLoad{
			ID: fmt.Sprintf("ps-%d", i), CPU: math.Min(1, o.Server.CPU/c.ServerCPU),
			Memory: int64(o.Server.Mem * gib), MemoryLimit: int64(c.ServerMem * gib), OOMKilled: oom,
		})
	}
	if o.Throughput > 0 && j.Profile.Batch > 0 {
		step := time.Duration(float64(j.Profile.Batch) * float64(c.Workers) / o.Throughput * float64(time.Second))
		for i := range c.Workers {
			obs.Workers = append(obs.Workers, autoscale.WorkerLoad{ID: fmt.Sprintf("worker-%d", i), StepTime: step})
		}
	}
	return obs
}

// apply carries out decisions on j's configuration and returns the new one.
func (a *Auto) apply(aj *autoJob, j *Job, c Config, ds []autoscale.Decision) Config {
	for _, d := range ds {
		a.decided++
		switch d.Kind {
		case autoscale.Resize, autoscale.AddServer:
			c = a.configOf(j, d.Shape)
		case autoscale.RestartServer:
			// The servers are alike here: what one runs short of, all do.
			aj.rowsGiB = math.Max(aj.rowsGiB, float64(d.Size.Memory)*float64(c.Servers)/gib)
		case autoscale.ShrinkRequest:
			if d.Size.CPU > 0 {
				if d.Role == autoscale.Server {
					c.ServerCPU = d.Size.CPU
				} else {
					c.WorkerCPU = d.Size.CPU
				}
			}
			if d.Shape.Workers > 0 && (d.Shape.Workers != c.Workers || d.Shape.Servers != c.Servers) {
				c.Workers, c.Servers = d.Shape.Workers, d.Shape.Servers
			}
		}
	}
	return withinQuota(j, a.spread(aj, c))
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
		if n := a.apply(aj, j, s.Config(j), ds); n != s.Config(j) && s.Resize(j, n) {
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
		obs := autoscale.Observation{At: simTime(s.Now()), Shape: a.shapeOf(c), Pending: []autoscale.Pending{
			{ID: "servers", Role: autoscale.Server, Size: a.shapeOf(c).Server, Waited: time.Duration(aj.waited * float64(time.Second))},
			{ID: "workers", Role: autoscale.Worker, Size: a.shapeOf(c).Worker, Waited: time.Duration(aj.waited * float64(time.Second))},
		}}
		if ds := aj.planner.Observe(obs); len(ds) > 0 {
			if n := a.apply(aj, j, c, ds); n != c {
				aj.plan, aj.waited = n, 0
			}
		}
	}
}

// OnOOM implements OOMHandler: the planner sees the server killed and says how large to
// restart it; the job restarts from its checkpoint with that.
func (a *Auto) OnOOM(s *State, j *Job) (Config, bool) {
	aj := a.jobs[j.ID]
	if aj == nil || aj.planner == nil {
		return Config{}, false
	}
	c := aj.plan
	o := Observation{Config: c, Server: Resources{Mem: c.ServerMem}}
	n := a.apply(aj, j, c, aj.planner.Observe(a.observation(s, j, o, true)))
	if n.ServerMem*float64(n.Servers) <= c.ServerMem*float64(c.Servers) {
		// No larger restart decided (the planner's cooldown, or a node's memory already):
		// half as much again, over more servers if need be.
		aj.rowsGiB = 1.5 * c.ServerMem * float64(c.Servers)
		n = a.spread(aj, n)
	}
	aj.plan = n
	return n, true
}

var _ OOMHandler = (*Auto)(nil)
