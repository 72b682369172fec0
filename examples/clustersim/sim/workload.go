package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Workload is a list of jobs in arrival order and the cluster they share.
type Workload struct {
	Name  string
	Jobs  []*Job
	Nodes []NodeSpec
}

func newRand(seed uint64, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream))
}

// lognormal draws exp(N(ln median, sigma)) clipped to [lo, hi].
func lognormal(r *rand.Rand, median, sigma, lo, hi float64) float64 {
	return math.Min(hi, math.Max(lo, median*math.Exp(sigma*r.NormFloat64())))
}

// PSOptions shape the parameter-server workload built from the Philly and Alibaba traces.
type PSOptions struct {
	Jobs int // consecutive Philly submissions to take (default 160)
	// Load is the requested CPU-seconds of the workload that fall within its arrivals (each
	// job from its arrival to the earlier of its end at the request and the last arrival)
	// over the cluster's CPU-seconds in that time; the cluster's CPU node count follows from
	// it (default 1).
	Load float64
	// MaxDuration caps a Philly duration, seconds (default 2 days).
	MaxDuration float64
}

func (o *PSOptions) defaults() {
	if o.Jobs <= 0 {
		o.Jobs = 160
	}
	if o.Load <= 0 {
		o.Load = 1
	}
	if o.MaxDuration <= 0 {
		o.MaxDuration = 2 * 86400
	}
}

// ncfContention is the growth of a worker's step time per added worker, relative to one
// worker's, fitted to Pollux's measured ncf step times (scalability.csv) at every local batch
// size: the slope over the intercept of step time against replicas, the median over batch
// sizes.
func ncfContention(tr *Traces) (float64, error) {
	p := tr.PolluxProfiles["ncf"]
	if p == nil {
		return 0, fmt.Errorf("clustersim: no ncf profile under %s", PolluxProfilesDir)
	}
	byLocal := map[int][][2]float64{}
	for _, pt := range p.Points {
		if pt.Replicas >= 2 {
			byLocal[pt.LocalBatch] = append(byLocal[pt.LocalBatch], [2]float64{float64(pt.Replicas), pt.StepTime})
		}
	}
	var ratios []float64
	for _, xs := range byLocal {
		if len(xs) < 3 {
			continue
		}
		var sx, sy, sxx, sxy float64
		for _, p := range xs {
			sx += p[0]
			sy += p[1]
			sxx += p[0] * p[0]
			sxy += p[0] * p[1]
		}
		n := float64(len(xs))
		slope := (n*sxy - sx*sy) / (n*sxx - sx*sx)
		icept := (sy - slope*sx) / n
		if icept > 0 && slope > 0 {
			ratios = append(ratios, slope/icept)
		}
	}
	if len(ratios) == 0 {
		return 0, fmt.Errorf("clustersim: ncf scalability gives no step-time slope")
	}
	slices.Sort(ratios)
	return ratios[len(ratios)/2], nil
}

// machineOf returns the most common machine of a GPU type in the PAI machine spec.
func machineOf(tr *Traces, gpuType string) (Resources, error) {
	count := map[Resources]int{}
	for _, m := range tr.Machines {
		if m.GPUType == gpuType {
			count[m.Resources]++
		}
	}
	var best Resources
	n := 0
	for r, c := range count {
		if c > n || (c == n && r.CPU+r.Mem > best.CPU+best.Mem) {
			best, n = r, c
		}
	}
	if n == 0 {
		return Resources{}, fmt.Errorf("clustersim: no %s machine in %s", gpuType, MachineSpecPath)
	}
	return best, nil
}

// PSWorkload builds the parameter-server (DLRM) workload: Jobs consecutive submissions of the
// Philly trace from a seeded starting point give arrivals, sizes and durations; each job takes
// the requests of a seeded Alibaba DLRM application (CN instance: a server's CPU and memory;
// HN: a worker's; the application's CN:HN ratio: servers per worker); the modelled truths of
// PSTruth decide how much of those requests it uses. The cluster is of the PAI CPU machines.
func PSWorkload(tr *Traces, seed uint64, opt PSOptions) (*Workload, error) {
	opt.defaults()
	if len(tr.Philly) < opt.Jobs {
		return nil, fmt.Errorf("clustersim: %d Philly jobs, want %d", len(tr.Philly), opt.Jobs)
	}
	rho, err := ncfContention(tr)
	if err != nil {
		return nil, err
	}
	node, err := machineOf(tr, "CPU")
	if err != nil {
		return nil, err
	}
	type app struct{ cn, hn []Instance }
	apps := map[string]*app{}
	for _, in := range tr.Alibaba {
		a := apps[in.App]
		if a == nil {
			a = &app{}
			apps[in.App] = a
		}
		if in.Role == "CN" {
			a.cn = append(a.cn, in)
		} else {
			a.hn = append(a.hn, in)
		}
	}
	var names []string
	for n, a := range apps {
		if len(a.cn) > 0 && len(a.hn) > 0 {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("clustersim: no Alibaba application with both CN and HN instances")
	}
	sort.Slice(names, func(i, j int) bool { return appLess(names[i], names[j]) })

	r := newRand(seed, 1)
	start := r.IntN(len(tr.Philly) - opt.Jobs + 1)
	window := tr.Philly[start : start+opt.Jobs]
	t0 := window[0].Submit
	w := &Workload{Name: "philly-dlrm"}
	var reqCPUSeconds float64
	for i, pj := range window {
		a := apps[names[r.IntN(len(names))]]
		cn, hn := a.cn[r.IntN(len(a.cn))], a.hn[r.IntN(len(a.hn))]
		ratio := math.Min(1, math.Max(0.25, float64(len(a.cn))/float64(len(a.hn))))
		workers := min(32, 2*pj.GPUs)
		servers := min(8, max(1, int(math.Round(float64(workers)*ratio))))
		req := Config{Workers: workers, Servers: servers, WorkerCPU: hn.CPU, WorkerMem: hn.MemGiB, ServerCPU: math.Min(cn.CPU, node.CPU), ServerMem: math.Min(cn.MemGiB, node.Mem)}
		dur := math.Min(opt.MaxDuration, math.Max(60, pj.Duration))

		// The truths: the cores a process can use, as a fraction of its request (users ask for
		// about twice what they use, some for less than they need); the sparse model's final
		// size, as a fraction of the servers' requested memory (about half, and above the
		// request for about one job in sixteen: those run out of memory as requested); the
		// share of a step spent waiting on the servers at the request.
		t := &PSTruth{
			WorkerCores:   req.WorkerCPU * lognormal(r, 0.45, 0.5, 0.1, 1.5),
			ServerCores:   req.ServerCPU * lognormal(r, 0.35, 0.5, 0.05, 1.5),
			ServerBaseGiB: 2,
			WorkerGiB:     req.WorkerMem * lognormal(r, 0.5, 0.3, 0.1, 0.95),
		}
		t.ModelGiB = float64(servers) * math.Max(1, req.ServerMem-t.ServerBaseGiB) * lognormal(r, 0.5, 0.45, 0.05, 1.6)
		serverShare := 0.25 + 0.35*r.Float64()
		// Per-sample seconds at the request, in units of the worker's compute term (A' = 1).
		wf, pf := float64(workers), float64(servers)
		cwEff, csEff := math.Min(req.WorkerCPU, t.WorkerCores), math.Min(req.ServerCPU, t.ServerCores)
		// A worker's compute term at the request is 100 us per sample (10,000 samples/s).
		const unit = 1e-4
		t.A = unit * cwEff
		t.B = unit * serverShare / (1 - serverShare) * pf * csEff / wf
		t.C = unit * rho
		t.Base = unit * 0.05
		t.D = unit * 0.02
		x := t.Throughput(req)
		j := &Job{
			ID: i, Name: fmt.Sprintf("dlrm-%d", i), Arrival: pj.Submit.Sub(t0).Seconds(), Kind: PS,
			Model: "dlrm", Work: dur * x, Request: req, TraceDuration: dur, Perf: t, PSTruth: t,
			Profile: Profile{ModelGiB: t.ModelGiB * lognormal(r, 1, 0.2, 0.5, 2), Samples: dur * x, Batch: 512, Application: "dlrm"},
		}
		w.Jobs = append(w.Jobs, j)
	}
	span := math.Max(3600, w.Jobs[len(w.Jobs)-1].Arrival)
	for _, j := range w.Jobs {
		reqCPUSeconds += j.Request.Demand().CPU * math.Min(j.TraceDuration, math.Max(0, span-j.Arrival))
	}
	nodes := max(2, int(math.Ceil(reqCPUSeconds/(span*node.CPU)/opt.Load)))
	w.Nodes = []NodeSpec{{Count: nodes, Resources: node}}
	return w, nil
}

// appLess orders "app_2" before "app_10".
func appLess(a, b string) bool {
	na, ea := strconv.Atoi(strings.TrimPrefix(a, "app_"))
	nb, eb := strconv.Atoi(strings.TrimPrefix(b, "app_"))
	if ea == nil && eb == nil {
		return na < nb
	}
	return a < b
}

// GavelOptions shape the GPU workload built from a Gavel trace.
type GavelOptions struct {
	Cluster string // the virtual cluster's trace (default: the one with the most jobs)
	Jobs    int    // consecutive jobs from a seeded start (default 160)
	GPUs    int    // GPUs in the cluster, on V100 machines of the PAI spec (default 32)
	MaxGPUs int    // cap on a job's GPUs, the largest scale factor Gavel measured (8)
}

// GavelWorkload builds a GPU workload from a Gavel trace: arrival, total steps, job type and
// GPU count from the trace, speed by GPU count from Gavel's measured V100 throughputs (linear
// between measured counts, never slower with more GPUs, flat past the largest measured).
func GavelWorkload(tr *Traces, seed uint64, opt GavelOptions) (*Workload, error) {
	if opt.Jobs <= 0 {
		opt.Jobs = 160
	}
	if opt.GPUs <= 0 {
		opt.GPUs = 32
	}
	if opt.MaxGPUs <= 0 {
		opt.MaxGPUs = 8
	}
	if opt.Cluster == "" {
		var names []string
		for n := range tr.Gavel {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			if opt.Cluster == "" || len(tr.Gavel[n]) > len(tr.Gavel[opt.Cluster]) {
				opt.Cluster = n
			}
		}
	}
	jobs := slices.Clone(tr.Gavel[opt.Cluster])
	if len(jobs) < opt.Jobs {
		return nil, fmt.Errorf("clustersim: Gavel cluster %q has %d jobs, want %d", opt.Cluster, len(jobs), opt.Jobs)
	}
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].Arrival < jobs[j].Arrival })
	node, err := machineOf(tr, "V100")
	if err != nil {
		return nil, err
	}
	r := newRand(seed, 2)
	start := r.IntN(len(jobs) - opt.Jobs + 1)
	window := jobs[start : start+opt.Jobs]
	w := &Workload{Name: "gavel-" + opt.Cluster}
	curves := map[string]*CurvePerf{}
	for i, gj := range window {
		perf := curves[gj.JobType]
		if perf == nil {
			m := tr.GavelThroughput["v100"][gj.JobType]
			if len(m) == 0 {
				return nil, fmt.Errorf("clustersim: no v100 throughput for Gavel job type %q (%s line %d)", gj.JobType, opt.Cluster, gj.Line)
			}
			perf = &CurvePerf{}
			for k := range m {
				perf.GPUs = append(perf.GPUs, k)
			}
			slices.Sort(perf.GPUs)
			for _, k := range perf.GPUs {
				v := m[k]
				if n := len(perf.Rate); n > 0 {
					v = math.Max(v, perf.Rate[n-1])
				}
				perf.Rate = append(perf.Rate, v)
			}
			curves[gj.JobType] = perf
		}
		g := min(gj.ScaleFactor, opt.MaxGPUs)
		req := gpuConfig(g, 0)
		model, _, _ := strings.Cut(gj.JobType, " (")
		j := &Job{ID: i, Name: fmt.Sprintf("%s-%d", strings.ToLower(model), i), Arrival: gj.Arrival - window[0].Arrival,
			Kind: GPU, Model: model, Work: float64(gj.Steps), Request: req, Perf: perf}
		j.TraceDuration = j.Work / perf.Throughput(req)
		w.Jobs = append(w.Jobs, j)
	}
	w.Nodes = []NodeSpec{{Count: max(1, opt.GPUs/int(node.GPU)), Resources: node}}
	return w, nil
}

// gpuConfig is k GPU workers, each with the CPU and memory a GPU of a V100 machine comes with.
func gpuConfig(k, batch int) Config {
	return Config{Workers: k, WorkerCPU: 4, WorkerMem: 32, WorkerGPU: 1, Batch: batch}
}

// PolluxPerf is the measured speed of a Pollux application in samples per second at a GPU
// count and global batch size: the step time at the local batch size (log-linear between
// measured sizes; past the largest, steps of gradient accumulation) and the GPU count (linear
// between measured counts, the best placement of each).
type PolluxPerf struct {
	counts []int                // ascending GPU counts measured
	steps  map[int][]ScalePoint // by count, ascending local batch, best step time per local batch
}

func newPolluxPerf(p *PolluxProfile) *PolluxPerf {
	pp := &PolluxPerf{steps: map[int][]ScalePoint{}}
	best := map[[2]int]ScalePoint{}
	for _, pt := range p.Points {
		k := [2]int{pt.Replicas, pt.LocalBatch}
		if b, ok := best[k]; !ok || pt.StepTime < b.StepTime {
			best[k] = pt
		}
	}
	for k, pt := range best {
		pp.steps[k[0]] = append(pp.steps[k[0]], pt)
	}
	for n, pts := range pp.steps {
		sort.Slice(pts, func(i, j int) bool { return pts[i].LocalBatch < pts[j].LocalBatch })
		pp.counts = append(pp.counts, n)
	}
	slices.Sort(pp.counts)
	return pp
}

// stepTime at count n (measured) and local batch b.
func (pp *PolluxPerf) stepTimeAt(n int, b float64) float64 {
	pts := pp.steps[n]
	if b <= float64(pts[0].LocalBatch) {
		return pts[0].StepTime
	}
	last := pts[len(pts)-1]
	if b >= float64(last.LocalBatch) {
		return last.StepTime * b / float64(last.LocalBatch)
	}
	i := sort.Search(len(pts), func(i int) bool { return float64(pts[i].LocalBatch) >= b })
	lo, hi := pts[i-1], pts[i]
	f := (math.Log(b) - math.Log(float64(lo.LocalBatch))) / (math.Log(float64(hi.LocalBatch)) - math.Log(float64(lo.LocalBatch)))
	return lo.StepTime + f*(hi.StepTime-lo.StepTime)
}

// Throughput implements Perf: samples per second.
func (pp *PolluxPerf) Throughput(c Config) float64 {
	k, b := c.Workers, c.Batch
	if k <= 0 || b <= 0 || len(pp.counts) == 0 {
		return 0
	}
	local := float64(b) / float64(k)
	var st float64
	i := sort.SearchInts(pp.counts, k)
	switch {
	case i < len(pp.counts) && pp.counts[i] == k:
		st = pp.stepTimeAt(k, local)
	case i == 0:
		st = pp.stepTimeAt(pp.counts[0], local)
	case i == len(pp.counts):
		n := pp.counts[len(pp.counts)-1]
		st = pp.stepTimeAt(n, local)
	default:
		lo, hi := pp.counts[i-1], pp.counts[i]
		f := float64(k-lo) / float64(hi-lo)
		st = pp.stepTimeAt(lo, local)*(1-f) + pp.stepTimeAt(hi, local)*f
	}
	return float64(b) / st
}

// PolluxOptions shape the batch-elastic GPU workload of a Pollux 160-job workload.
type PolluxOptions struct {
	Workload int // 1..8 (default 6, the one of Pollux's testbed experiments)
	GPUs     int // default 64: 16 nodes of 4, Pollux's simulated cluster
	// MinDuration and MaxDuration clip the Philly duration drawn for each job, seconds
	// (default 5 minutes and 8 hours).
	MinDuration, MaxDuration float64
}

// PolluxWorkload builds a GPU workload from a Pollux workload: arrival, application, GPUs and
// batch size from it; speed from the application's measured step times; a duration drawn
// from the Philly jobs of the same GPU count (the workloads give none), which at the
// requested GPUs and batch size sets the samples to train. The batch size may range from a
// quarter to four times the requested one, within the sizes Pollux validated.
func PolluxWorkload(tr *Traces, seed uint64, opt PolluxOptions) (*Workload, error) {
	if opt.Workload == 0 {
		opt.Workload = 6
	}
	if opt.GPUs <= 0 {
		opt.GPUs = 64
	}
	if opt.MinDuration <= 0 {
		opt.MinDuration = 300
	}
	if opt.MaxDuration <= 0 {
		opt.MaxDuration = 8 * 3600
	}
	src := tr.PolluxWorkloads[opt.Workload]
	if len(src) == 0 {
		return nil, fmt.Errorf("clustersim: no Pollux workload-%d", opt.Workload)
	}
	byGPUs := map[int][]float64{}
	for _, p := range tr.Philly {
		byGPUs[p.GPUs] = append(byGPUs[p.GPUs], p.Duration)
	}
	var gpuCounts []int
	for g := range byGPUs {
		gpuCounts = append(gpuCounts, g)
	}
	slices.Sort(gpuCounts)
	r := newRand(seed, 3)
	perfs := map[string]*PolluxPerf{}
	w := &Workload{Name: fmt.Sprintf("pollux-workload-%d", opt.Workload)}
	for i, pj := range src {
		prof := tr.PolluxProfiles[pj.Application]
		if prof == nil || len(prof.Points) == 0 {
			return nil, fmt.Errorf("clustersim: no profile for application %q (workload-%d.csv line %d)", pj.Application, opt.Workload, pj.Line)
		}
		perf := perfs[pj.Application]
		if perf == nil {
			perf = newPolluxPerf(prof)
			perfs[pj.Application] = perf
		}
		g := gpuCounts[0]
		for _, c := range gpuCounts {
			if c <= pj.Replicas {
				g = c
			}
		}
		ds := byGPUs[g]
		dur := math.Min(opt.MaxDuration, math.Max(opt.MinDuration, ds[r.IntN(len(ds))]))
		req := gpuConfig(min(pj.Replicas, opt.GPUs), pj.BatchSize)
		j := &Job{ID: i, Name: pj.Name, Arrival: pj.Time, Kind: GPU, Model: pj.Application, Request: req, Perf: perf, TraceDuration: dur}
		j.Work = dur * perf.Throughput(req)
		j.MinBatch, j.MaxBatch = pj.BatchSize/4, pj.BatchSize*4
		if len(prof.Validated) > 0 {
			j.MinBatch = max(j.MinBatch, prof.Validated[0])
			j.MaxBatch = min(j.MaxBatch, prof.Validated[len(prof.Validated)-1])
		}
		j.MinBatch, j.MaxBatch = min(j.MinBatch, pj.BatchSize), max(j.MaxBatch, pj.BatchSize)
		w.Jobs = append(w.Jobs, j)
	}
	sort.SliceStable(w.Jobs, func(a, b int) bool { return w.Jobs[a].Arrival < w.Jobs[b].Arrival })
	node := Resources{CPU: 64, Mem: 256, GPU: 4}
	w.Nodes = []NodeSpec{{Count: max(1, opt.GPUs/4), Resources: node}}
	return w, nil
}
