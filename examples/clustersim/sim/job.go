package sim

import (
	"fmt"
	"math"
)

// Config is what a job runs with: its workers and parameter servers and the size of each.
// A GPU job has no servers and one GPU per worker.
type Config struct {
	Workers, Servers     int
	WorkerCPU, ServerCPU float64 // cores per process
	WorkerMem, ServerMem float64 // GiB per process
	WorkerGPU            float64 // GPUs per worker
	Batch                int     // global batch size (GPU jobs; 0 for parameter-server jobs)
}

// Zero reports whether c runs nothing.
func (c Config) Zero() bool { return c.Workers == 0 }

// Demand is what c takes from the cluster in total.
func (c Config) Demand() Resources {
	w, p := float64(c.Workers), float64(c.Servers)
	return Resources{
		CPU: w*c.WorkerCPU + p*c.ServerCPU,
		Mem: w*c.WorkerMem + p*c.ServerMem,
		GPU: w * c.WorkerGPU,
	}
}

// tasks lists the processes of c, servers first.
func (c Config) tasks() []Resources {
	t := make([]Resources, 0, c.Workers+c.Servers)
	for range c.Servers {
		t = append(t, Resources{CPU: c.ServerCPU, Mem: c.ServerMem})
	}
	for range c.Workers {
		t = append(t, Resources{CPU: c.WorkerCPU, Mem: c.WorkerMem, GPU: c.WorkerGPU})
	}
	return t
}

func (c Config) String() string {
	if c.Servers == 0 {
		return fmt.Sprintf("%d GPU batch %d", c.Workers, c.Batch)
	}
	return fmt.Sprintf("%dw x %.3g CPU %.3g GiB, %dps x %.3g CPU %.3g GiB", c.Workers, c.WorkerCPU, c.WorkerMem, c.Servers, c.ServerCPU, c.ServerMem)
}

// Kind says how a job trains.
type Kind int

const (
	// PS is a parameter-server recommendation job on CPU workers and servers.
	PS Kind = iota
	// GPU is a data-parallel job with one GPU per worker.
	GPU
)

// Perf is a job's true speed: the work units (samples, or steps for a fixed-batch GPU job)
// per second it trains at a configuration, running alone on its resources.
type Perf interface {
	Throughput(c Config) float64
}

// Job is one training job of a workload: what the trace says, what the user asked for, and
// the truths of the model that the simulator knows and a policy may only observe.
type Job struct {
	ID      int
	Name    string
	Arrival float64 // seconds from the workload's start
	Kind    Kind
	Model   string  // model or application name
	Work    float64 // work units to train (samples; steps for fixed-batch GPU jobs)
	Request Config  // what the user asked for
	// MinBatch and MaxBatch bound the global batch size a batch-elastic policy may choose
	// (GPU jobs from the Pollux workloads); both 0 for a job whose batch is fixed.
	MinBatch, MaxBatch int
	// TraceDuration is the seconds the job ran in its source trace (0 if unknown).
	TraceDuration float64
	Perf          Perf
	// PSTruth holds the modelled resource use of a parameter-server job (nil for GPU jobs).
	PSTruth *PSTruth
	Profile Profile
}

// Profile is what a job tells the scheduler before it runs: DLRover-RM's job profile.
type Profile struct {
	ModelGiB    float64 // expected size of the sparse model (embedding rows and optimizer state)
	Samples     float64 // records to train
	Batch       int     // records per worker step
	Application string
}

// PSTruth is the modelled truth of a parameter-server job. A worker spends, per sample,
//
//	t = Base + A/min(cw, WorkerCores) + B*w/(p*min(cs, ServerCores)) + C*w + D*p
//
// seconds (the form of the Optimus / DLRover-RM model, with the cores a process can use
// capped: more cores than the job's threads use do not help), and the job trains w/t
// samples per second. A is the CPU-seconds a worker spends per sample and B the servers'
// CPU-seconds per sample, so the cores used follow from the throughput.
type PSTruth struct {
	Base, A, B, C, D         float64
	WorkerCores, ServerCores float64 // cores a worker and a server can use at most
	ModelGiB                 float64 // the sparse model's final size (rows and optimizer state)
	ServerBaseGiB            float64 // each server's memory beside its rows
	WorkerGiB                float64 // each worker's memory
}

// Throughput implements Perf.
func (t *PSTruth) Throughput(c Config) float64 {
	if c.Workers <= 0 || c.Servers <= 0 || c.WorkerCPU <= 0 || c.ServerCPU <= 0 {
		return 0
	}
	return float64(c.Workers) / t.secondsPerSample(c)
}

func (t *PSTruth) secondsPerSample(c Config) float64 {
	w, p := float64(c.Workers), float64(c.Servers)
	return t.Base + t.A/math.Min(c.WorkerCPU, t.WorkerCores) +
		t.B*w/(p*math.Min(c.ServerCPU, t.ServerCores)) + t.C*w + t.D*p
}

// Used returns the cores and memory a worker and a server use at c, training at x samples/s
// with progress (0..1) of its work done: a worker's share of the per-sample CPU, a server's
// share of the servers' CPU, and a server's share of the rows created so far.
func (t *PSTruth) Used(c Config, x, progress float64) (worker, server Resources) {
	w, p := float64(c.Workers), float64(c.Servers)
	worker = Resources{CPU: math.Min(c.WorkerCPU, 0.1+t.A*x/w), Mem: math.Min(c.WorkerMem, t.WorkerGiB)}
	server = Resources{CPU: math.Min(c.ServerCPU, 0.1+t.B*x/p), Mem: t.ServerMemNeed(c.Servers, progress)}
	return worker, server
}

// Busy returns the share of its time a worker spends in its own computation (rather than
// waiting on the servers, the other workers or the fixed costs) and the share of its time a
// server spends serving, at c training at x samples/s: a worker's compute seconds per sample
// over its seconds per sample, a server's CPU-seconds per second over the cores it can use.
// Monitoring measures both (a worker times its forward and backward pass against its step, a
// server its serving against the clock); with the cores used they give how many cores a
// process uses while it works.
func (t *PSTruth) Busy(c Config, x float64) (worker, server float64) {
	if c.Workers <= 0 || c.Servers <= 0 || !(x > 0) {
		return 0, 0
	}
	w, p := float64(c.Workers), float64(c.Servers)
	worker = t.A / math.Min(c.WorkerCPU, t.WorkerCores) * x / w
	server = t.B * x / p / math.Min(c.ServerCPU, t.ServerCores)
	return math.Min(1, worker), math.Min(1, server)
}

// modelFill is the fraction of its final rows a sparse model holds at a progress: new ids
// keep arriving over the first half of training, from 40% of the rows at the start.
func modelFill(progress float64) float64 {
	return 0.4 + 0.6*math.Min(1, math.Max(0, progress)/0.5)
}

// ServerMemNeed is the GiB each of p servers needs at a progress (0..1).
func (t *PSTruth) ServerMemNeed(p int, progress float64) float64 {
	return t.ServerBaseGiB + t.ModelGiB*modelFill(progress)/float64(max(p, 1))
}

// ModelBytesAt is the bytes of sparse model a job holds at a progress, which a change of its
// servers moves or a restart restores.
func (t *PSTruth) ModelBytesAt(progress float64) float64 {
	return t.ModelGiB * modelFill(progress) * (1 << 30)
}

// CurvePerf is a GPU job's measured speed: steps (or samples) per second by GPU count, from
// measurements at some counts, linear in between, and flat past the largest measured.
type CurvePerf struct {
	GPUs []int     // ascending
	Rate []float64 // work units per second at GPUs[i]
}

// Throughput implements Perf.
func (p *CurvePerf) Throughput(c Config) float64 {
	k := c.Workers
	if k <= 0 || len(p.GPUs) == 0 {
		return 0
	}
	if k <= p.GPUs[0] {
		return p.Rate[0] * float64(k) / float64(p.GPUs[0])
	}
	for i := 1; i < len(p.GPUs); i++ {
		if k <= p.GPUs[i] {
			f := float64(k-p.GPUs[i-1]) / float64(p.GPUs[i]-p.GPUs[i-1])
			return p.Rate[i-1] + f*(p.Rate[i]-p.Rate[i-1])
		}
	}
	return p.Rate[len(p.Rate)-1]
}

// MaxUseful is the largest GPU count that is faster than every smaller one.
func (p *CurvePerf) MaxUseful() int {
	if len(p.GPUs) == 0 {
		return 0
	}
	best, bestRate := p.GPUs[0], p.Rate[0]
	for i := range p.GPUs {
		if p.Rate[i] > bestRate {
			best, bestRate = p.GPUs[i], p.Rate[i]
		}
	}
	return best
}
