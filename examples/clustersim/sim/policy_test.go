package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/elastic/autoscale"
)

// cpuJob is a parameter-server job of one worker and one server asking for cpu cores in all,
// with a model that fits its request, lasting about dur seconds at its request.
func cpuJob(id int, arrival, cpu, dur float64) *Job {
	req := Config{Workers: 1, Servers: 1, WorkerCPU: cpu / 2, ServerCPU: cpu / 2, WorkerMem: 4, ServerMem: 10}
	t := &PSTruth{Base: 1e-5, A: 1e-4 * cpu / 2, B: 1e-4 * cpu / 2, WorkerCores: cpu, ServerCores: cpu, ModelGiB: 4, ServerBaseGiB: 2, WorkerGiB: 2}
	return &Job{ID: id, Name: "j", Arrival: arrival, Kind: PS, Work: dur * t.Throughput(req), Request: req, Perf: t, PSTruth: t,
		Profile: Profile{ModelGiB: 4, Samples: dur * t.Throughput(req), Batch: 512, Application: "dlrm"}}
}

func oneNode(cpu float64) []NodeSpec {
	return []NodeSpec{{Count: 1, Resources: Resources{CPU: cpu, Mem: 1 << 20, GPU: 8}}}
}

// fifoChecker runs FIFO and checks, every tick, that no job started before an earlier job
// that fitted: an earlier job left waiting must not fit in what was free before the later
// jobs started (one node, so the totals are the placement).
type fifoChecker struct {
	t      *testing.T
	inner  Policy
	starts int
}

func (f *fifoChecker) Name() string { return f.inner.Name() }

func (f *fifoChecker) Schedule(s *State) {
	before := map[int]bool{}
	for _, j := range s.Waiting() {
		before[j.ID] = true
	}
	f.inner.Schedule(s)
	free := s.Free()
	waiting := s.Waiting()
	var started []*Job
	for _, j := range s.Running() {
		if before[j.ID] {
			started = append(started, j)
		}
	}
	f.starts += len(started)
	for _, e := range waiting {
		room := free
		for _, j := range started {
			if j.Arrival > e.Arrival || (j.Arrival == e.Arrival && j.ID > e.ID) {
				room = room.add(s.Config(j).Demand())
			}
		}
		if e.Request.Demand().fitsIn(room) {
			f.t.Errorf("t=%v: job %d started while earlier job %d (arrived %v) fitted", s.Now(), started[0].ID, e.ID, e.Arrival)
			return
		}
	}
}

func TestFIFONeverRunsAJobBeforeAnEarlierOneThatFits(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for trial := range 20 {
		w := &Workload{Name: "fifo", Nodes: oneNode(16)}
		for i := range 30 {
			w.Jobs = append(w.Jobs, cpuJob(i, float64(i/3)*120, float64(2+2*r.IntN(7)), 300+float64(r.IntN(3000))))
		}
		chk := &fifoChecker{t: t, inner: FIFO{}}
		res, err := Run(w, chk, Options{})
		require.NoError(t, err)
		require.Equal(t, 30, chk.starts, "trial %d", trial)
		assert.Equal(t, 30, res.Summary().Completed)
	}
	// A later small job does start ahead of an earlier one that does not fit.
	w := &Workload{Name: "skip", Nodes: oneNode(16), Jobs: []*Job{cpuJob(0, 0, 12, 3600), cpuJob(1, 60, 8, 600), cpuJob(2, 120, 4, 600)}}
	res, err := Run(w, FIFO{}, Options{})
	require.NoError(t, err)
	assert.Equal(t, 120.0, res.Jobs[2].Start)
	assert.Greater(t, res.Jobs[1].Start, res.Jobs[0].Finish-60)
}

func TestLASRunsTheLeastServedFirst(t *testing.T) {
	// A long job holds the whole cluster; a second arrives. FIFO makes it wait for the first
	// to end; LAS preempts the first once its attained service puts it in a lower queue.
	w := &Workload{Name: "las", Nodes: oneNode(16), Jobs: []*Job{cpuJob(0, 0, 16, 10*3600), cpuJob(1, 600, 16, 200)}}
	fifo, err := Run(w, FIFO{}, Options{})
	require.NoError(t, err)
	las, err := Run(w, &LAS{Queues: []float64{300}}, Options{})
	require.NoError(t, err)
	require.True(t, las.Jobs[1].Completed)
	assert.Less(t, las.Jobs[1].Finish, las.Jobs[0].Finish, "the short job finishes first under LAS")
	assert.Greater(t, fifo.Jobs[1].Start, fifo.Jobs[0].Finish-60, "FIFO waits")
	assert.Greater(t, las.Jobs[0].Restarts, 0)
}

func TestElasticLASShrinksInsteadOfWaiting(t *testing.T) {
	big := cpuJob(0, 0, 16, 10*3600)
	big.Request.Workers, big.Request.Servers = 4, 4
	big.Request.WorkerCPU, big.Request.ServerCPU = 2, 2
	w := &Workload{Name: "elastic", Nodes: oneNode(16), Jobs: []*Job{big, cpuJob(1, 600, 8, 1200)}}
	fig := RepartitionFigures{LiveBytesPerSec: 1e8, DuringFactor: 0.5, RestartBytesPerSec: 5e7}
	res, err := Run(w, &LAS{Elastic: true}, Options{Cost: PSScaleCost{Figures: fig, Live: true}})
	require.NoError(t, err)
	assert.Equal(t, 600.0, res.Jobs[1].Start, "the second job starts at once, the first shrunk for it")
	assert.Greater(t, res.Jobs[0].Resizes, 0)
	assert.Zero(t, res.Jobs[0].Restarts)
}

func TestScaleCosts(t *testing.T) {
	j := cpuJob(0, 0, 8, 100)
	fig := RepartitionFigures{LiveBytesPerSec: 1 << 30, DuringFactor: 0.5, RestartBytesPerSec: 1 << 29}
	live := PSScaleCost{Figures: fig, Live: true}
	stop := PSScaleCost{Figures: fig}
	from := j.Request
	to := from
	to.Servers = 2
	bytes := j.PSTruth.ModelBytesAt(1)
	assert.Equal(t, Stall{Slow: bytes / 2 / (1 << 30), Factor: 0.5}, live.Resize(j, 1, from, to), "half the slots move, training goes on")
	assert.Equal(t, Stall{Pause: bytes / (1 << 29)}, stop.Resize(j, 1, from, to), "the whole model is checkpointed and restored")
	more := from
	more.Workers = 3
	assert.Equal(t, Stall{}, live.Resize(j, 1, from, more), "workers join between steps")
	assert.Equal(t, stop.Restart(j, 1, more), stop.Resize(j, 1, from, more))
}

// gpuJob is a GPU job whose speed grows linearly to 8 GPUs.
func gpuJob(id int, arrival float64, gpus int, dur float64) *Job {
	p := &CurvePerf{GPUs: []int{1, 2, 4, 8}, Rate: []float64{1, 1.9, 3.6, 6.8}}
	req := gpuConfig(gpus, 0)
	return &Job{ID: id, Name: "g", Arrival: arrival, Kind: GPU, Work: dur * p.Throughput(req), Request: req, Perf: p}
}

func TestProgressAwareUsesIdleGPUsAndTerminationNeverShrinks(t *testing.T) {
	w := &Workload{Name: "gpus", Nodes: oneNode(64), Jobs: []*Job{gpuJob(0, 0, 1, 3600), gpuJob(1, 0, 1, 7200), gpuJob(2, 1800, 2, 600)}}
	opt := Options{Cost: FixedRestartCost{Seconds: 30}}
	def, err := Run(w, FIFO{}, opt)
	require.NoError(t, err)
	pa, err := Run(w, &ProgressAware{}, opt)
	require.NoError(t, err)
	assert.Less(t, pa.Summary().MeanJCT, def.Summary().MeanJCT)
	assert.Less(t, pa.Summary().Makespan, def.Summary().Makespan)

	// Termination-based: nothing grows until a job ends, and no running job ever shrinks.
	sh := &shrinkWatch{t: t, inner: TerminationRealloc{}, last: map[int]int{}}
	tr, err := Run(w, sh, opt)
	require.NoError(t, err)
	assert.Equal(t, 3, tr.Summary().Completed)
	assert.True(t, sh.grew, "freed GPUs went to a running job")
}

type shrinkWatch struct {
	t     *testing.T
	inner Policy
	last  map[int]int
	grew  bool
}

func (w *shrinkWatch) Name() string { return w.inner.Name() }
func (w *shrinkWatch) Schedule(s *State) {
	ended := len(s.Finished()) > 0
	w.inner.Schedule(s)
	for _, j := range s.Running() {
		if _, seen := w.last[j.ID]; !seen && !ended && s.Config(j).Workers != j.Request.Workers {
			w.t.Errorf("t=%v: job %d started with %d GPUs, not its request, with no job ended", s.Now(), j.ID, s.Config(j).Workers)
		}
		k := s.Config(j).Workers
		if prev, ok := w.last[j.ID]; ok {
			if k < prev {
				w.t.Errorf("t=%v: job %d shrank from %d to %d GPUs", s.Now(), j.ID, prev, k)
			}
			if k > prev {
				if !ended {
					w.t.Errorf("t=%v: job %d grew with no job ended", s.Now(), j.ID)
				}
				w.grew = true
			}
		}
		w.last[j.ID] = k
	}
}

// batchPerf is a job whose steps take as long at any batch size up to 1024 per GPU: a larger
// batch trains more samples per second.
type batchPerf struct{}

func (batchPerf) Throughput(c Config) float64 {
	if c.Workers <= 0 || c.Batch <= 0 {
		return 0
	}
	local := float64(c.Batch) / float64(c.Workers)
	step := 0.1 * math.Max(1, local/1024) * (1 + 0.05*float64(c.Workers))
	return float64(c.Batch) / step
}

func TestDPBatchElasticTrainsFasterThanFixedBatch(t *testing.T) {
	var jobs []*Job
	for i := range 6 {
		req := gpuConfig(2, 256)
		jobs = append(jobs, &Job{ID: i, Name: "b", Arrival: float64(i * 60), Kind: GPU, Work: 3600 * batchPerf{}.Throughput(req),
			Request: req, Perf: batchPerf{}, MinBatch: 128, MaxBatch: 4096})
	}
	w := &Workload{Name: "dp", Nodes: oneNode(64), Jobs: jobs}
	opt := Options{Cost: FixedRestartCost{Seconds: 30}}
	fixed, err := Run(w, &DPScaler{}, opt)
	require.NoError(t, err)
	dp, err := Run(w, &DPScaler{BatchElastic: true}, opt)
	require.NoError(t, err)
	require.Equal(t, 6, dp.Summary().Completed)
	assert.Less(t, dp.Summary().MeanJCT, 0.5*fixed.Summary().MeanJCT)
}

func TestAutoKeepsAJobThatOutgrowsItsMemory(t *testing.T) {
	j := cpuJob(0, 0, 8, 3600)
	j.PSTruth.ModelGiB = 30 // the servers' request (10 GiB) holds a third of it
	j.Profile.ModelGiB = 4  // and the profile underestimates it
	w := &Workload{Name: "oom", Nodes: oneNode(64), Jobs: []*Job{j}}
	fig := RepartitionFigures{LiveBytesPerSec: 1e9, DuringFactor: 0.5, RestartBytesPerSec: 1e9}
	opt := Options{Cost: PSScaleCost{Figures: fig, Live: true}}
	man, err := Run(w, FIFO{}, opt)
	require.NoError(t, err)
	assert.True(t, man.Jobs[0].Failed, "as requested, it runs out of memory and fails")
	a, err := NewAuto(autoscale.Config{}, "auto", nil)
	require.NoError(t, err)
	auto, err := Run(w, a, opt)
	require.NoError(t, err)
	assert.True(t, auto.Jobs[0].Completed, "restarted larger (near its limit or killed), it completes")
	assert.Greater(t, a.Decisions(), 1)
}

// capJob is a parameter-server job that asks for 2 workers of 8 cores and 2 servers of 32 but
// whose processes can use only 3 and 12: users ask for more than their processes use.
func capJob(id int, arrival, dur float64) *Job {
	req := Config{Workers: 2, Servers: 2, WorkerCPU: 8, ServerCPU: 32, WorkerMem: 8, ServerMem: 20}
	t := &PSTruth{Base: 5e-6, A: 1e-4 * 3, B: 1e-4 * 12, C: 3e-6, D: 2e-6, WorkerCores: 3, ServerCores: 12, ModelGiB: 16, ServerBaseGiB: 2, WorkerGiB: 3}
	return &Job{ID: id, Name: fmt.Sprintf("cap-%d", id), Arrival: arrival, Kind: PS, Work: dur * t.Throughput(req), Request: req, Perf: t, PSTruth: t,
		Profile: Profile{ModelGiB: 16, Samples: dur * t.Throughput(req), Batch: 512, Application: "dlrm"}}
}

// firstWatch records the configuration each job first ran with.
type firstWatch struct {
	Policy
	first map[int]Config
}

func (f *firstWatch) Schedule(s *State) {
	f.Policy.Schedule(s)
	for _, j := range s.Running() {
		if _, ok := f.first[j.ID]; !ok {
			f.first[j.ID] = s.Config(j)
		}
	}
}

// Auto configuration plans a job from what earlier jobs used of their requests: with a
// history of jobs whose processes used less than asked, later jobs start smaller than asked,
// every one completes, and none is slower than as asked by more than the cores it was not
// given can explain.
func TestAutoSizesFromHistory(t *testing.T) {
	workload := func(first int) *Workload {
		w := &Workload{Name: "caps", Nodes: []NodeSpec{{Count: 4, Resources: Resources{CPU: 96, Mem: 512}}}}
		for i := range 20 {
			w.Jobs = append(w.Jobs, capJob(i, float64(first+i)*600, 1800))
		}
		return w
	}
	fig := RepartitionFigures{LiveBytesPerSec: 1e8, DuringFactor: 0.5, RestartBytesPerSec: 5e7}
	opt := Options{Cost: PSScaleCost{Figures: fig, Live: true}}
	warm, err := NewAuto(autoscale.Config{}, "warm", nil)
	require.NoError(t, err)
	_, err = Run(workload(0), warm, opt)
	require.NoError(t, err)
	// (The last job to finish leaves no record: the run ends before the policy sees it.)
	require.GreaterOrEqual(t, len(warm.History()), 19)
	for _, r := range warm.History() {
		assert.Equal(t, 8.0, r.Profile.Request.Worker.CPU, "the record keeps the request")
		assert.InDelta(t, 3, r.WorkerCores, 0.5, "and what a worker used while it worked")
		assert.InDelta(t, 12, r.ServerCores, 1.5)
	}
	auto, err := NewAuto(autoscale.Config{}, "auto", warm.History())
	require.NoError(t, err)
	fw := &firstWatch{Policy: auto, first: map[int]Config{}}
	w := workload(100)
	res, err := Run(w, fw, opt)
	require.NoError(t, err)
	assert.Equal(t, 20, res.Summary().Completed)
	for _, j := range w.Jobs {
		c := fw.first[j.ID]
		assert.Less(t, c.WorkerCPU, j.Request.WorkerCPU, "job %d: %v", j.ID, c)
		assert.Less(t, c.ServerCPU, j.Request.ServerCPU, "job %d: %v", j.ID, c)
		assert.GreaterOrEqual(t, c.ServerCPU, 12.0, "job %d: the servers can use 12 cores: %v", j.ID, c)
		assert.Less(t, c.ServerMem, j.Request.ServerMem, "job %d: %v", j.ID, c)
	}
}
