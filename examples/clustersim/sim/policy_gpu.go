package sim

import "math"

// maxGPUs is the most GPUs an elastic GPU policy gives a job: the largest count past which its
// profiled speed stops growing, and no more than the cluster.
func maxGPUs(s *State, j *Job) int {
	limit := int(s.Capacity().GPU)
	if cp, ok := j.Perf.(*CurvePerf); ok {
		return min(limit, max(1, cp.MaxUseful()))
	}
	return limit
}

// withGPUs is j's request on k GPUs, with batch b (0 keeps the request's).
func withGPUs(j *Job, k, b int) Config {
	c := j.Request
	c.Workers = k
	if b > 0 {
		c.Batch = b
	}
	return c
}

// TerminationRealloc is elastic only when a job ends: the GPUs it frees go first to waiting
// jobs in arrival order (at their request), then one at a time to the running job whose
// profiled speed grows the most from one more. Running jobs never shrink.
type TerminationRealloc struct{}

// Name implements Policy.
func (TerminationRealloc) Name() string { return "termination-based" }

// Schedule implements Policy.
func (TerminationRealloc) Schedule(s *State) {
	for _, j := range s.Waiting() {
		s.Start(j, j.Request)
	}
	if len(s.Finished()) == 0 {
		return
	}
	want := map[int]int{}
	for _, j := range s.Running() {
		want[j.ID] = s.Config(j).Workers
	}
	free := int(s.Free().GPU)
	for ; free > 0; free-- {
		var best *Job
		bestGain := 0.05 // at least 5% faster for one more GPU
		for _, j := range s.Running() {
			k := want[j.ID]
			if k+1 > maxGPUs(s, j) {
				continue
			}
			x0, x1 := s.Throughput(j, withGPUs(j, k, 0)), s.Throughput(j, withGPUs(j, k+1, 0))
			if g := x1/x0 - 1; x0 > 0 && g > bestGain {
				best, bestGain = j, g
			}
		}
		if best == nil {
			break
		}
		want[best.ID]++
	}
	for _, j := range s.Running() {
		if want[j.ID] > s.Config(j).Workers {
			s.Resize(j, withGPUs(j, want[j.ID], 0))
		}
	}
}

// ProgressAware is SC20's adaptive allocation (Wang et al., "An Efficient and Non-Intrusive
// GPU Scheduling Framework for Deep Learning Training Systems"): at every arrival, end, and
// Period, it uses each job's progress (its remaining work) and profiled speed to re-plan every
// job's GPUs: each running job, then each waiting one in arrival order, gets one GPU while
// any is left; the rest go one at a time to the job whose completion rate (speed over remaining
// work) grows most. A running job is changed only when the plan saves it more than Gain times
// the restart it costs.
type ProgressAware struct {
	Period  float64 // seconds between re-plans without events (default 600)
	Gain    float64 // default 2
	Restart float64 // the restart cost it plans with, seconds (default 30)
	last    float64
}

// Name implements Policy.
func (*ProgressAware) Name() string { return "progress-aware" }

// Schedule implements Policy.
func (p *ProgressAware) Schedule(s *State) {
	period, gain, restart := p.Period, p.Gain, p.Restart
	if period <= 0 {
		period = 600
	}
	if gain <= 0 {
		gain = 2
	}
	if restart <= 0 {
		restart = 30
	}
	if len(s.Arrived()) == 0 && len(s.Finished()) == 0 && s.Now()-p.last < period {
		return
	}
	p.last = s.Now()
	jobs := append(s.Running(), s.Waiting()...)
	free := int(s.Capacity().GPU)
	plan := map[int]int{}
	for _, j := range jobs {
		if free == 0 {
			break
		}
		plan[j.ID] = 1
		free--
	}
	for ; free > 0; free-- {
		var best *Job
		bestScore := 0.0
		for _, j := range jobs {
			k, ok := plan[j.ID]
			if !ok || k+1 > maxGPUs(s, j) {
				continue
			}
			rem := math.Max(s.Remaining(j), 1e-9)
			x0, x1 := s.Throughput(j, withGPUs(j, k, 0)), s.Throughput(j, withGPUs(j, k+1, 0))
			if sc := (x1 - x0) / rem; sc > bestScore*(1+1e-12) {
				best, bestScore = j, sc
			}
		}
		if best == nil {
			break
		}
		plan[best.ID]++
	}
	worth := func(j *Job, k int) bool {
		cur := s.Config(j).Workers
		rem := s.Remaining(j)
		t0, t1 := rem/s.Throughput(j, withGPUs(j, cur, 0)), rem/s.Throughput(j, withGPUs(j, k, 0))
		return t0-t1 > gain*restart
	}
	// Shrink first (a shrink that frees GPUs for a waiting job is always made), then start,
	// then grow.
	waiting := len(s.Waiting()) > 0
	for _, j := range s.Running() {
		if k := plan[j.ID]; k < s.Config(j).Workers && (waiting || worth(j, k)) {
			s.Resize(j, withGPUs(j, k, 0))
		}
	}
	for _, j := range s.Waiting() {
		if k := plan[j.ID]; k > 0 {
			for ; k > 0 && !s.Start(j, withGPUs(j, k, 0)); k-- {
			}
		}
	}
	for _, j := range s.Running() {
		if k := plan[j.ID]; k > s.Config(j).Workers && worth(j, k) {
			s.Resize(j, withGPUs(j, k, 0))
		}
	}
}

// DPScaler is the autoscaler of Saxena et al. ("Effective Elastic Scaling of Deep Learning
// Workloads", MASCOTS 2020): at every arrival and end, waiting jobs are admitted in arrival
// order while every admitted job can have one GPU, and a dynamic program over (job, GPUs)
// gives the cluster's GPUs to the admitted jobs to maximise the sum of their speed-ups over
// one GPU. With BatchElastic each job runs, at each GPU count, the batch size in its allowed
// range that is fastest there; without, its batch size stays the requested one and only the
// GPUs change (the paper's baseline).
type DPScaler struct {
	BatchElastic bool
}

// Name implements Policy.
func (d *DPScaler) Name() string {
	if d.BatchElastic {
		return "DP batch+GPUs"
	}
	return "GPUs at fixed batch"
}

// best returns j's fastest configuration on k GPUs.
func (d *DPScaler) best(s *State, j *Job, k int) (Config, float64) {
	if !d.BatchElastic || j.MaxBatch == 0 {
		c := withGPUs(j, k, 0)
		if c.Batch > 0 && c.Batch < k {
			return c, 0
		}
		return c, s.Throughput(j, c)
	}
	var bc Config
	bx := 0.0
	for b := j.MinBatch; b <= j.MaxBatch; b *= 2 {
		for _, bb := range []int{b, j.Request.Batch} {
			if bb < j.MinBatch || bb > j.MaxBatch || bb < k {
				continue
			}
			c := withGPUs(j, k, bb)
			if x := s.Throughput(j, c); x > bx {
				bc, bx = c, x
			}
		}
	}
	return bc, bx
}

// Schedule implements Policy.
func (d *DPScaler) Schedule(s *State) {
	if len(s.Arrived()) == 0 && len(s.Finished()) == 0 {
		return
	}
	g := int(s.Capacity().GPU)
	jobs := s.Running()
	for _, j := range s.Waiting() {
		if len(jobs) < g {
			jobs = append(jobs, j)
		}
	}
	n := len(jobs)
	if n == 0 {
		return
	}
	// value[i][k]: speed-up of job i on k GPUs over its one-GPU speed (k >= 1).
	kmax := make([]int, n)
	value := make([][]float64, n)
	cfgs := make([][]Config, n)
	for i, j := range jobs {
		kmax[i] = min(g-(n-1), maxGPUs(s, j), 64)
		value[i] = make([]float64, kmax[i]+1)
		cfgs[i] = make([]Config, kmax[i]+1)
		_, x1 := d.best(s, j, 1)
		for k := 1; k <= kmax[i]; k++ {
			c, x := d.best(s, j, k)
			cfgs[i][k] = c
			if x1 > 0 {
				value[i][k] = x / x1
			}
		}
	}
	// best[i][u]: the most total speed-up of jobs i.. with u GPUs, each job at least one.
	neg := math.Inf(-1)
	best := make([][]float64, n+1)
	pick := make([][]int, n+1)
	for i := range best {
		best[i] = make([]float64, g+1)
		pick[i] = make([]int, g+1)
		for u := range best[i] {
			best[i][u] = neg
		}
	}
	for u := 0; u <= g; u++ {
		best[n][u] = 0
	}
	for i := n - 1; i >= 0; i-- {
		for u := 0; u <= g; u++ {
			for k := 1; k <= kmax[i] && k <= u; k++ {
				if v := best[i+1][u-k]; v > neg {
					if t := v + value[i][k]; t > best[i][u]+1e-12 {
						best[i][u], pick[i][u] = t, k
					}
				}
			}
		}
	}
	if best[0][g] == neg {
		return
	}
	plan := make([]Config, n)
	for i, u := 0, g; i < n; i++ {
		k := pick[i][u]
		plan[i] = cfgs[i][k]
		u -= k
	}
	idx := map[int]int{}
	for i, j := range jobs {
		idx[j.ID] = i
	}
	for _, j := range s.Running() {
		if c := plan[idx[j.ID]]; c.Workers < s.Config(j).Workers {
			s.Resize(j, c)
		}
	}
	for _, j := range jobs {
		if c := plan[idx[j.ID]]; !s.IsRunning(j) {
			for ; c.Workers > 0 && !s.Start(j, c); c, _ = d.best(s, j, c.Workers-1) {
			}
		}
	}
	for _, j := range s.Running() {
		if c := plan[idx[j.ID]]; c != s.Config(j) {
			s.Resize(j, c)
		}
	}
}
