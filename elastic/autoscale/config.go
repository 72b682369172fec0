package autoscale

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"
)

// Config sets a Planner's quota and thresholds. The zero value of every field means its
// default; DefaultConfig returns the defaults filled in.
type Config struct {
	// MinWorkers and MaxWorkers bound the workers of a plan; defaults 1 and 64.
	MinWorkers, MaxWorkers int
	// MinServers and MaxServers bound the parameter servers; defaults 1 and 32.
	MinServers, MaxServers int
	// MaxCPU bounds the cores of the whole job, workers and servers; default 0, no bound
	// beyond the counts.
	MaxCPU float64
	// MaxMemory bounds the bytes of memory of the whole job, workers and servers; default 0,
	// no bound. A plan over it loses workers first; the memory the servers need for the
	// model's rows is never cut for it (a job whose rows alone exceed it runs MinWorkers
	// workers, over the quota, rather than being killed for lack of memory).
	MaxMemory int64

	// Worker and Server are the sizes a plan gives each worker and server when the history has
	// no similar job; defaults 4 cores each (the server's memory is sized from the model; a
	// worker's memory, 0 by default, is not set until it is measured).
	Worker, Server Resources
	// InitialWorkers and InitialServers are the counts of a first plan without a similar job in
	// the history (InitialServers is raised when the model does not fit in that many servers'
	// MaxServerMemory); defaults 4 and 2.
	InitialWorkers, InitialServers int

	// MemoryPerModelByte is the server memory a byte of model takes (rows, optimizer state,
	// the shared-memory checkpoint copy, the runtime) when the history has no similar job to
	// measure it from; default 3.
	MemoryPerModelByte float64
	// MemoryHeadroom multiplies the memory the model needs into the request, the memory
	// seen in use into the request after an out-of-memory kill, and the most memory a worker
	// was seen to use into its right size; default 1.25.
	MemoryHeadroom float64
	// MaxServerMemory is the largest memory a server may get, in bytes; default 64 GiB. A model
	// that needs more is spread over more servers.
	MaxServerMemory int64
	// MemoryGrowth multiplies a server's memory when it was killed for lack of memory or runs
	// near its limit; default 1.5.
	MemoryGrowth float64
	// NearMemory is the fraction of its memory limit in use at which a server counts as near
	// the limit and is restarted larger before it is killed; default 0.95. Where the server's
	// process is in a memory cgroup with a limit (a pod with a memory limit), its memory in use
	// is what the cgroup is charged, held against the cgroup's limit: the figures the kernel
	// kills it by. Elsewhere it is the process's resident memory against the plan's server
	// memory; the resident memory counts shared pages (the flash checkpoint's shared memory), so
	// it may read more than the process is charged. A NearMemory above 1 turns the rule off
	// for the servers measured by their cgroup (the kernel keeps a charge within its limit),
	// and a large one (100) for all: a server is then restarted larger only once it was killed
	// (ServerLoad.OOMKilled).
	NearMemory float64

	// CPUHeadroom multiplies the most cores a process of a role was seen to use (over the
	// Settle or more newest observations at its size) into that role's right size: the
	// re-plan sizes each role's processes from what they use, like a vertical autoscaler.
	// Default 1.5: room for bursts the observation period averages away, and a floor on how
	// busy a process is kept (at most 1/1.5 of its cores on average), which bounds what a
	// process whose speed grows with its cores loses. A cut whose measured throughput loss is
	// worth the cores (marginal efficiency at least AddEfficiency) is undone, and that role is
	// not cut below the size again.
	CPUHeadroom float64
	// BusyHeadroom multiplies the cores a process of a role uses while it works (its CPU
	// share times its cores over its Busy share, where the observations report Busy) into
	// that role's right size, in place of CPUHeadroom. Default 1.15: those cores are already
	// the process's peak (how many threads it keeps running), so the margin only covers
	// noise in the measurement; a process that uses all of its cores while it works may be
	// held back by them and is given CPUHeadroom times as many when the model says they pay.
	BusyHeadroom float64
	// CPUStep is the granularity of a right-sized process's cores; default 0.5.
	CPUStep float64
	// RightsizeMargin is how far a role's right size must be from its size, as a fraction of
	// the size, before the re-plan changes it (so that noise does not resize the job every
	// period); default 0.2.
	RightsizeMargin float64

	// AddEfficiency is the least marginal efficiency worth adding a process or cores for:
	// the throughput gained per added resource, over the job's throughput per resource (1
	// for linear scaling); a resource is a core, or CoreMemory bytes of memory. Default 0.5.
	// Higher uses fewer resources and finishes later.
	AddEfficiency float64
	// RemoveEfficiency is the marginal efficiency below which a process is removed: the
	// throughput lost per removed resource, over the throughput per resource. Default 0.2; it
	// must be below AddEfficiency, the gap keeping plans from flapping.
	RemoveEfficiency float64
	// CoreMemory is the bytes of memory that cost as much as a core, so that a plan weighs
	// memory against cores: a job that runs slower holds its memory longer, and a process's
	// memory counts in what it costs. Default 4 GiB (the memory per vCPU of general-purpose
	// cloud machines); set it to the platform's nodes' memory over their cores.
	CoreMemory int64
	// ReplanEvery is how often the planner reconsiders the counts; default 1 minute.
	ReplanEvery time.Duration
	// Settle is how many throughput samples must be observed at a shape before it is judged
	// (the first after a change include its cost); default 3.
	Settle int
	// Cooldown is how long after a change that moves rows (servers added, removed or
	// resized) the planner proposes no other change of the counts, so each is measured
	// before the next; default 2 minutes. A change of the workers alone moves nothing (they
	// join and leave between steps) and needs only Settle samples before the next.
	Cooldown time.Duration
	// MaxStep is the most processes one re-plan adds or removes; default 4.
	MaxStep int
	// Window is how many of the shapes measured most recently the model is fitted to, each
	// by the mean of its newest 20 measurements; default 50.
	Window int
	// Prior is the model the fit is drawn towards where the samples leave it open; Begin sets
	// it from a similar job in the history. Nil: none, and the planner explores instead (it
	// adds a worker, then a server, to see how the job scales).
	Prior *Model
	// PriorWeight is how many samples the prior counts as; default 2.
	PriorWeight float64
	// PriorTolerance is how many times off (either way) the throughput measured at a shape
	// may be from what the model of the history's similar job predicts there before that
	// model is dropped and the planner explores as without one; default 1.5. A Prior set in
	// the Config is never dropped.
	PriorTolerance float64

	// MoveBytesPerSecond is the rate a live change moves a job's rows between servers, in
	// bytes per second: a change of the server count moves the slots that change owner,
	// servers of a new size replace the old ones and take all the rows. Default 100e6
	// (the repartition benchmark measures it: go run ./examples/bench repartition).
	MoveBytesPerSecond float64
	// RestoreBytesPerSecond is the rate a server restarted after running out of memory
	// restores its rows from the newest checkpoint, in bytes per second; default 100e6.
	// With the job's expected length it sets how much memory a first plan gives the servers
	// beyond MemoryQuantile: a restore that would take many times the job's run is worth
	// more memory to avoid.
	RestoreBytesPerSecond float64
	// MoveSpeed is the job's throughput while rows move, as a fraction of its throughput
	// before; default 0.5 (the repartition benchmark's throughput_during_vs_before).
	MoveSpeed float64
	// Payback is how many times its cost a change that moves rows must be predicted to pay
	// back before the planner makes it: the training time it saves over the job's remaining
	// samples (JobProfile.DatasetSamples times Epochs, less those trained) against the
	// training time lost while the rows move; for a cut of the servers' size, which frees
	// resources rather than saving time, the core-seconds freed over the remaining time
	// against the job's core-seconds lost. Default 2, for the error in both predictions. A
	// job of unknown length is not priced: every change pays. Changes of the workers move
	// no rows and are not priced. Out-of-memory kills are answered whatever the cost.
	Payback float64
	// ExploreShare is the most of the job's predicted remaining time a step taken only to
	// learn how the job scales (a server more without a model to say so) may cost; default
	// 0.05.
	ExploreShare float64

	// HotCPU is the share of its cores a server must use, over HotFor, to count as hot;
	// default 0.85.
	HotCPU float64
	// HotFor is how long a server must stay hot before a server is added; default 30 s.
	HotFor time.Duration
	// StragglerFactor is how many times the workers' median step time a worker's must be to
	// count as a straggler; default 2.
	StragglerFactor float64
	// StragglerFor is how long a worker must straggle before it is replaced; default 1 minute.
	StragglerFor time.Duration
	// StragglerMinWorkers is the fewest workers whose median says what a normal step time is;
	// default 3.
	StragglerMinWorkers int
	// PendingFor is how long a process may wait to be scheduled before its request is
	// made smaller; default 5 minutes. A platform that gives up a pending process by itself
	// must wait longer (kube.Config.PendingTimeout well above PendingFor plus the Runner's
	// period), or the autoscaler never sees the wait.
	PendingFor time.Duration
	// ShrinkFactor multiplies a pending request's cores and memory; default 0.75. A server's
	// memory never goes below its share of what the model's rows need (the profile's size or
	// the most measured, times MemoryHeadroom), nor a worker's below the most a worker was
	// seen to use times MemoryHeadroom.
	ShrinkFactor float64
	// MinProcess is the smallest request a shrink goes down to; default 1 core and 1 GiB.
	MinProcess Resources

	// HistoryMaxDistance is how far apart two jobs' profiles may be for one's record to plan
	// the other: the Euclidean distance of the natural logarithms of model bytes, dataset
	// samples and batch size. Default 1.5 (about a factor 4.5 in one of them).
	HistoryMaxDistance float64
	// HistoryNeighbours is how many earlier jobs of the profile's kind, nearest first, a
	// first plan draws its sizes from when the profile gives the user's request
	// (JobProfile.Request): what their processes used against what their users asked for.
	// Default 20. What users over- or under-ask is a habit of the platform's users more than
	// a property of one model, so these need not be within HistoryMaxDistance; the model
	// prior still comes from the records that are.
	HistoryNeighbours int
	// HistoryMinNeighbours is the fewest such records the sizes are drawn from; with fewer,
	// the plan keeps the user's sizes. Default 5.
	HistoryMinNeighbours int
	// CoreQuantile is the quantile, over those records, of the cores a process used while it
	// worked over the cores its user asked for, that a first plan gives each process of the
	// role (times the job's own request) when no model comes from the history; default 0.8.
	// With a model, the cores are those whose expected marginal efficiency over that spread
	// is at least AddEfficiency (Planner.Begin). Records of processes that used all the
	// cores they had count as lower bounds (Kaplan-Meier).
	CoreQuantile float64
	// MemoryQuantile is the quantile, over those records, of the server memory per model
	// byte and of a worker's memory over its request, that a first plan gives; default 0.95:
	// a server that runs out of memory is restarted or has its rows moved, which costs far
	// more than the memory. It takes the place of MemoryHeadroom in a plan drawn from the
	// history: the spread of the records is the headroom.
	MemoryQuantile float64

	// Logger receives a line per decision; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns the Config whose every field holds its default.
func DefaultConfig() Config { return Config{}.withDefaults() }

func (c Config) withDefaults() Config {
	setInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	setF := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	setD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	setInt(&c.MinWorkers, 1)
	setInt(&c.MaxWorkers, 64)
	setInt(&c.MinServers, 1)
	setInt(&c.MaxServers, 32)
	setF(&c.Worker.CPU, 4)
	setF(&c.Server.CPU, 4)
	setInt(&c.InitialWorkers, 4)
	setInt(&c.InitialServers, 2)
	setF(&c.MemoryPerModelByte, 3)
	setF(&c.MemoryHeadroom, 1.25)
	if c.MaxServerMemory == 0 {
		c.MaxServerMemory = 64 << 30
	}
	setF(&c.MemoryGrowth, 1.5)
	setF(&c.NearMemory, 0.95)
	setF(&c.CPUHeadroom, 1.5)
	setF(&c.BusyHeadroom, 1.15)
	setF(&c.CPUStep, 0.5)
	setF(&c.RightsizeMargin, 0.2)
	setF(&c.AddEfficiency, 0.5)
	if c.CoreMemory == 0 {
		c.CoreMemory = 4 << 30
	}
	setF(&c.RemoveEfficiency, 0.2)
	setD(&c.ReplanEvery, time.Minute)
	setInt(&c.Settle, 3)
	setD(&c.Cooldown, 2*time.Minute)
	setInt(&c.MaxStep, 4)
	setInt(&c.Window, 50)
	setF(&c.PriorWeight, 2)
	setF(&c.PriorTolerance, 1.5)
	setF(&c.MoveBytesPerSecond, 100e6)
	setF(&c.MoveSpeed, 0.5)
	setF(&c.RestoreBytesPerSecond, 100e6)
	setF(&c.Payback, 2)
	setF(&c.ExploreShare, 0.05)
	setF(&c.HotCPU, 0.85)
	setD(&c.HotFor, 30*time.Second)
	setF(&c.StragglerFactor, 2)
	setD(&c.StragglerFor, time.Minute)
	setInt(&c.StragglerMinWorkers, 3)
	setD(&c.PendingFor, 5*time.Minute)
	setF(&c.ShrinkFactor, 0.75)
	setF(&c.MinProcess.CPU, 1)
	if c.MinProcess.Memory == 0 {
		c.MinProcess.Memory = 1 << 30
	}
	setF(&c.HistoryMaxDistance, 1.5)
	setInt(&c.HistoryNeighbours, 20)
	setInt(&c.HistoryMinNeighbours, 5)
	setF(&c.CoreQuantile, 0.8)
	setF(&c.MemoryQuantile, 0.95)
	return c
}

// Validate reports every invalid field at once (wrapping ErrInvalidConfig); zero fields are
// valid (they take their defaults).
func (c Config) Validate() error {
	d := c.withDefaults()
	var errs []error
	bad := func(cond bool, format string, args ...any) {
		if cond {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	bad(d.MinWorkers < 0 || d.MaxWorkers < d.MinWorkers, "workers between %d and %d", c.MinWorkers, c.MaxWorkers)
	bad(d.MinServers < 0 || d.MaxServers < d.MinServers, "servers between %d and %d", c.MinServers, c.MaxServers)
	bad(d.MaxCPU < 0 || !finite(d.MaxCPU), "MaxCPU %g", c.MaxCPU)
	bad(d.MaxMemory < 0, "MaxMemory %d", c.MaxMemory)
	bad(!(d.Worker.CPU > 0) || !finite(d.Worker.CPU) || d.Worker.Memory < 0, "Worker %+v", c.Worker)
	bad(!(d.Server.CPU > 0) || !finite(d.Server.CPU) || d.Server.Memory < 0, "Server %+v", c.Server)
	bad(d.InitialWorkers < 0 || d.InitialServers < 0, "initial counts %d workers, %d servers", c.InitialWorkers, c.InitialServers)
	bad(!(d.MemoryPerModelByte > 0) || !finite(d.MemoryPerModelByte), "MemoryPerModelByte %g", c.MemoryPerModelByte)
	bad(!(d.MemoryHeadroom >= 1) || !finite(d.MemoryHeadroom), "MemoryHeadroom %g (at least 1)", c.MemoryHeadroom)
	bad(d.MaxServerMemory < 0, "MaxServerMemory %d", c.MaxServerMemory)
	bad(!(d.MemoryGrowth > 1) || !finite(d.MemoryGrowth), "MemoryGrowth %g (above 1)", c.MemoryGrowth)
	bad(!(d.NearMemory > 0) || !finite(d.NearMemory), "NearMemory %g", c.NearMemory)
	bad(!(d.CPUHeadroom >= 1) || !finite(d.CPUHeadroom), "CPUHeadroom %g (at least 1)", c.CPUHeadroom)
	bad(!(d.BusyHeadroom >= 1) || !finite(d.BusyHeadroom), "BusyHeadroom %g (at least 1)", c.BusyHeadroom)
	bad(!(d.CPUStep > 0) || !finite(d.CPUStep), "CPUStep %g", c.CPUStep)
	bad(!(d.RightsizeMargin > 0 && d.RightsizeMargin < 1), "RightsizeMargin %g (in (0, 1))", c.RightsizeMargin)
	bad(!(d.AddEfficiency > 0) || !finite(d.AddEfficiency), "AddEfficiency %g", c.AddEfficiency)
	bad(!(d.RemoveEfficiency > 0 && d.RemoveEfficiency < d.AddEfficiency), "RemoveEfficiency %g (in (0, AddEfficiency %g))", d.RemoveEfficiency, d.AddEfficiency)
	bad(d.CoreMemory < 0, "CoreMemory %d", c.CoreMemory)
	bad(d.ReplanEvery < 0 || d.Cooldown < 0 || d.HotFor < 0 || d.StragglerFor < 0 || d.PendingFor < 0, "negative duration")
	bad(d.Settle < 0 || d.MaxStep < 0 || d.Window < 0 || d.StragglerMinWorkers < 0, "negative count")
	bad(!(d.PriorWeight > 0) || !finite(d.PriorWeight), "PriorWeight %g", c.PriorWeight)
	bad(!(d.PriorTolerance > 1) || !finite(d.PriorTolerance), "PriorTolerance %g (above 1)", c.PriorTolerance)
	bad(!(d.MoveBytesPerSecond > 0) || !finite(d.MoveBytesPerSecond), "MoveBytesPerSecond %g", c.MoveBytesPerSecond)
	bad(!(d.MoveSpeed > 0 && d.MoveSpeed <= 1), "MoveSpeed %g (in (0, 1])", c.MoveSpeed)
	bad(!(d.RestoreBytesPerSecond > 0) || !finite(d.RestoreBytesPerSecond), "RestoreBytesPerSecond %g", c.RestoreBytesPerSecond)
	bad(!(d.Payback > 0) || !finite(d.Payback), "Payback %g", c.Payback)
	bad(!(d.ExploreShare > 0 && d.ExploreShare <= 1), "ExploreShare %g (in (0, 1])", c.ExploreShare)
	bad(!(d.HotCPU > 0 && d.HotCPU <= 1), "HotCPU %g (in (0, 1])", c.HotCPU)
	bad(!(d.StragglerFactor > 1) || !finite(d.StragglerFactor), "StragglerFactor %g (above 1)", c.StragglerFactor)
	bad(!(d.ShrinkFactor > 0 && d.ShrinkFactor < 1), "ShrinkFactor %g (in (0, 1))", c.ShrinkFactor)
	bad(!(d.MinProcess.CPU > 0) || d.MinProcess.Memory < 0, "MinProcess %+v", c.MinProcess)
	bad(!(d.HistoryMaxDistance > 0), "HistoryMaxDistance %g", c.HistoryMaxDistance)
	bad(d.HistoryNeighbours < 0 || d.HistoryMinNeighbours < 0, "negative history neighbours")
	bad(!(d.CoreQuantile > 0 && d.CoreQuantile < 1), "CoreQuantile %g (in (0, 1))", c.CoreQuantile)
	bad(!(d.MemoryQuantile > 0 && d.MemoryQuantile < 1), "MemoryQuantile %g (in (0, 1))", c.MemoryQuantile)
	if c.Prior != nil {
		for k, v := range c.Prior.coef() {
			bad(!(v >= 0) || !finite(v), "Prior coefficient %d: %g", k, v)
		}
		bad(!(c.Prior.WorkerCores >= 0) || !(c.Prior.ServerCores >= 0) || !finite(c.Prior.WorkerCores) || !finite(c.Prior.ServerCores),
			"Prior cores %g and %g", c.Prior.WorkerCores, c.Prior.ServerCores)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}
