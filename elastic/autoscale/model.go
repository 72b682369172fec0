package autoscale

import (
	"errors"
	"fmt"
	"math"
)

// Shape is what a job runs: how many workers and parameter servers, and the size of each.
type Shape struct {
	// Workers and Servers count the processes of each role.
	Workers int `json:"workers"`
	Servers int `json:"servers"`
	// Worker and Server are the size of each worker and each server.
	Worker Resources `json:"worker"`
	Server Resources `json:"server"`
}

// Resources is the size of a process.
type Resources struct {
	// CPU is the cores it may use.
	CPU float64 `json:"cpu"`
	// Memory is the bytes of memory it may use (0: not set).
	Memory int64 `json:"memory,omitempty"`
}

// CPU returns the cores the whole shape uses.
func (s Shape) CPU() float64 {
	return float64(s.Workers)*s.Worker.CPU + float64(s.Servers)*s.Server.CPU
}

// Memory returns the bytes of memory the whole shape asks for (a size of 0 counts 0).
func (s Shape) Memory() int64 {
	return int64(s.Workers)*s.Worker.Memory + int64(s.Servers)*s.Server.Memory
}

// String returns "4 workers x 2 CPU, 2 servers x 4 CPU 3.0 GiB".
func (s Shape) String() string {
	return fmt.Sprintf("%d workers x %s, %d servers x %s", s.Workers, s.Worker, s.Servers, s.Server)
}

// String returns "4 CPU" or "4 CPU 3.0 GiB".
func (r Resources) String() string {
	if r.Memory == 0 {
		return fmt.Sprintf("%g CPU", r.CPU)
	}
	return fmt.Sprintf("%g CPU %.1f GiB", r.CPU, float64(r.Memory)/(1<<30))
}

// valid reports whether the model can be evaluated at s.
func (s Shape) valid() bool {
	return s.Workers > 0 && s.Servers > 0 && s.Worker.CPU > 0 && s.Server.CPU > 0 &&
		!math.IsInf(s.Worker.CPU, 0) && !math.IsInf(s.Server.CPU, 0)
}

// Sample is a measurement of a running job: its shape and the samples (records) per second
// it trained over the measurement's interval, or the mean of Weight such measurements.
type Sample struct {
	Shape      Shape   `json:"shape"`
	Throughput float64 `json:"throughput"`
	// Weight is how many measurements the sample stands for; 0 counts as 1.
	Weight float64 `json:"weight,omitempty"`
	// Compute is the share of a worker's seconds per sample it spent in its own computation
	// (its forward and backward pass), Serve the share the servers spent serving it (a
	// server's busy share), 0 to 1; 0: not measured. Where measured they fit WorkerCompute
	// and ServerCompute at the sample's shape directly, so that a job measured at one shape
	// already says how it scales.
	Compute float64 `json:"compute,omitempty"`
	Serve   float64 `json:"serve,omitempty"`
}

// Model is the resource-performance model: the training throughput of a job as a function of
// its shape. It is the asynchronous parameter-server model of Optimus (Peng et al., EuroSys
// 2018), which DLRover-RM also fits, with the compute terms divided by the cores that do the
// work. A worker spends, per training sample,
//
//	t = Base + WorkerCompute/cw + ServerCompute*w/(p*cs) + PerWorker*w + PerServer*p
//
// seconds, for w workers of cw cores and p servers of cs cores: a fixed cost; its own
// forward and backward pass; its share of the servers' work, which grows with the workers
// sending to each server and shrinks with the servers' cores; contention that grows with the
// workers; and the fan-out to every server. The job trains w/t samples per second, concave
// and saturating in w (towards 1/(ServerCompute/(p*cs) + PerWorker)) and greatest at
// p = sqrt(ServerCompute*w/(cs*PerServer)) servers. Every coefficient is a non-negative
// number of seconds per sample, so the fit is a non-negative least-squares problem (NNLS) in
// them.
//
// WorkerCores and ServerCores bound the cores a worker and a server can use: a process runs
// so many threads, and cores beyond them add nothing, so cw and cs above are min(cores,
// bound). They are not fitted but measured (the cores a process uses while it works: see
// WorkerLoad.Busy); 0 is no bound.
type Model struct {
	Base          float64 `json:"base"`
	WorkerCompute float64 `json:"worker_compute"`
	ServerCompute float64 `json:"server_compute"`
	PerWorker     float64 `json:"per_worker"`
	PerServer     float64 `json:"per_server"`
	WorkerCores   float64 `json:"worker_cores,omitempty"`
	ServerCores   float64 `json:"server_cores,omitempty"`
}

// nterms is the number of coefficients of a Model.
const nterms = 5

func (m Model) coef() [nterms]float64 {
	return [nterms]float64{m.Base, m.WorkerCompute, m.ServerCompute, m.PerWorker, m.PerServer}
}

func modelOf(c []float64) Model {
	return Model{Base: c[0], WorkerCompute: c[1], ServerCompute: c[2], PerWorker: c[3], PerServer: c[4]}
}

// bounded returns s with each role's cores cut to the bound (0: none).
func bounded(s Shape, worker, server float64) Shape {
	if worker > 0 {
		s.Worker.CPU = min(s.Worker.CPU, worker)
	}
	if server > 0 {
		s.Server.CPU = min(s.Server.CPU, server)
	}
	return s
}

// features returns the terms of t at s, the coefficients' multipliers.
func features(s Shape) [nterms]float64 {
	w, p := float64(s.Workers), float64(s.Servers)
	return [nterms]float64{1, 1 / s.Worker.CPU, w / (p * s.Server.CPU), w, p}
}

// SecondsPerSample returns t at s, the seconds a worker spends per sample.
func (m Model) SecondsPerSample(s Shape) float64 {
	f, c := features(bounded(s, m.WorkerCores, m.ServerCores)), m.coef()
	var t float64
	for i := range f {
		t += f[i] * c[i]
	}
	return t
}

// Throughput returns the samples per second the model predicts for s; 0 for a shape with no
// worker, server or cores, or for the zero Model.
func (m Model) Throughput(s Shape) float64 {
	if !s.valid() {
		return 0
	}
	t := m.SecondsPerSample(s)
	if !(t > 0) {
		return 0
	}
	return float64(s.Workers) / t
}

// String returns the coefficients in microseconds per sample, and the bounds on cores.
func (m Model) String() string {
	s := fmt.Sprintf("t = %.3g + %.3g/cw + %.3g*w/(p*cs) + %.3g*w + %.3g*p us/sample",
		m.Base*1e6, m.WorkerCompute*1e6, m.ServerCompute*1e6, m.PerWorker*1e6, m.PerServer*1e6)
	if m.WorkerCores > 0 || m.ServerCores > 0 {
		s += fmt.Sprintf(" (cw <= %g, cs <= %g cores)", m.WorkerCores, m.ServerCores)
	}
	return s
}

// Terms returns the seconds per sample of each part of t at s: the worker's computation
// (WorkerCompute/cw), the servers' work (ServerCompute*w/(p*cs)) and the rest.
func (m Model) Terms(s Shape) (compute, serve, rest float64) {
	f := features(bounded(s, m.WorkerCores, m.ServerCores))
	compute, serve = m.WorkerCompute*f[1], m.ServerCompute*f[2]
	return compute, serve, m.Base + m.PerWorker*f[3] + m.PerServer*f[4]
}

// Prior is a model the fit is drawn towards where the samples do not determine it: a job
// that has run at one shape only says nothing of how it scales, and the model of an earlier,
// similar job (Planner.Begin takes it from the history) fills the gap.
type Prior struct {
	Model Model
	// Weight is how many samples the prior counts as, per coefficient: each coefficient's
	// term is drawn towards the prior's as much as Weight samples would pull it.
	Weight float64
}

// Fit returns the Model that best explains the samples: the non-negative coefficients that
// minimise the squared relative error of the predicted seconds per sample (workers over
// throughput), each sample counted Weight times, plus, where a sample measured them, the
// squared error of the compute and serve terms against its Compute and Serve shares of t,
// plus, with a prior, prior.Weight times the squared difference between each term and the
// prior's, relative to the samples' t and averaged over them. The prior's WorkerCores and
// ServerCores bound the cores of the samples' shapes and are the fitted model's (a prior of
// Weight 0 gives only them). It returns ErrInvalidSample for a sample with a non-positive
// count, size or throughput, or a share outside [0, 1], and ErrNoModel when nothing fits (no
// samples and no prior, or every coefficient zero).
func Fit(samples []Sample, prior *Prior) (Model, error) {
	var capW, capS float64
	if prior != nil {
		capW, capS = prior.Model.WorkerCores, prior.Model.ServerCores
	}
	var errs []error
	var rows [][]float64
	var ys []float64
	var mean [nterms]float64
	var total float64
	for i, s := range samples {
		if !s.Shape.valid() || !(s.Throughput > 0) || math.IsInf(s.Throughput, 0) || s.Weight < 0 || math.IsInf(s.Weight, 0) ||
			!(s.Compute >= 0 && s.Compute <= 1) || !(s.Serve >= 0 && s.Serve <= 1) {
			errs = append(errs, fmt.Errorf("sample %d: %v at %.3g samples/s, weight %g, shares %g and %g", i, s.Shape, s.Throughput, s.Weight, s.Compute, s.Serve))
			continue
		}
		wt := s.Weight
		if wt == 0 {
			wt = 1
		}
		// Measurement noise is relative (a throughput off by some percent), so each row is
		// divided by its target: the fit minimises the relative error of t.
		f := features(bounded(s.Shape, capW, capS))
		y := float64(s.Shape.Workers) / s.Throughput
		r := math.Sqrt(wt)
		row := make([]float64, nterms)
		for k := range f {
			row[k] = r * f[k] / y
			mean[k] += wt * f[k] / y
		}
		total += wt
		rows = append(rows, row)
		ys = append(ys, r)
		// A measured share of t is a term's value: WorkerCompute*f1 = Compute*y.
		for _, sh := range []struct {
			k     int
			share float64
		}{{1, s.Compute}, {2, s.Serve}} {
			if sh.share > 0 {
				row := make([]float64, nterms)
				row[sh.k] = r * f[sh.k] / y
				rows = append(rows, row)
				ys = append(ys, r*sh.share)
			}
		}
	}
	for k := range mean {
		mean[k] /= max(total, 1)
	}
	if len(errs) > 0 {
		return Model{}, fmt.Errorf("%w: %w", ErrInvalidSample, errors.Join(errs...))
	}
	if prior != nil && prior.Weight > 0 {
		if len(rows) == 0 {
			mean = [nterms]float64{1, 1, 1, 1, 1}
		}
		pc := prior.Model.coef()
		r := math.Sqrt(prior.Weight)
		for k := range nterms {
			row := make([]float64, nterms)
			row[k] = r * mean[k]
			rows = append(rows, row)
			ys = append(ys, r*mean[k]*pc[k])
		}
	}
	if len(rows) == 0 {
		return Model{}, fmt.Errorf("%w: no samples", ErrNoModel)
	}
	c, err := NNLS(rows, ys)
	if err != nil {
		return Model{}, err
	}
	m := modelOf(c)
	if m == (Model{}) {
		return Model{}, fmt.Errorf("%w: every coefficient is zero", ErrNoModel)
	}
	m.WorkerCores, m.ServerCores = capW, capS
	return m, nil
}
