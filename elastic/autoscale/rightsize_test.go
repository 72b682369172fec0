package autoscale

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// usageJob feeds a planner observations of a job whose every worker uses workerUsed cores and
// every server serverUsed cores of theirs, at a throughput given by x, every minute.
type usageJob struct {
	p                      *Planner
	at                     time.Time
	workerUsed, serverUsed float64
	workerMem              int64
	x                      func(Shape) float64
}

func (u *usageJob) observe(s Shape) []Decision {
	u.at = u.at.Add(time.Minute)
	obs := Observation{At: u.at, Shape: s, Throughput: u.x(s)}
	for i := range s.Servers {
		obs.Servers = append(obs.Servers, ServerLoad{ID: "ps-" + string(rune('0'+i)), CPU: math.Min(1, u.serverUsed/s.Server.CPU)})
	}
	for i := range s.Workers {
		obs.Workers = append(obs.Workers, WorkerLoad{ID: "worker-" + string(rune('0'+i)), StepTime: 100 * time.Millisecond,
			CPU: math.Min(1, u.workerUsed/s.Worker.CPU), Memory: u.workerMem})
	}
	return u.p.Observe(obs)
}

// first observes s until the planner decides something, at most n times.
func (u *usageJob) first(t *testing.T, s Shape, n int) Decision {
	t.Helper()
	for range n {
		if ds := u.observe(s); len(ds) > 0 {
			require.Len(t, ds, 1)
			return ds[0]
		}
	}
	t.Fatalf("no decision in %d observations of %v", n, s)
	return Decision{}
}

func flat(x float64) func(Shape) float64 { return func(Shape) float64 { return x } }

// Each role's cores are cut to the most a process used times CPUHeadroom, rounded up to
// CPUStep; the worker's memory to its peak times MemoryHeadroom. Not before Settle
// observations at the sizes, and not when the right size is within RightsizeMargin.
func TestRightsizeCutsToMeasuredUse(t *testing.T) {
	p, err := NewPlanner(Config{Prior: &Model{WorkerCompute: 400e-6}, MaxWorkers: 8, MaxServers: 2})
	require.NoError(t, err)
	u := &usageJob{p: p, at: t0, workerUsed: 1.1, serverUsed: 0.6, workerMem: 3 << 30, x: flat(1000)}
	s := Shape{Workers: 8, Servers: 2, Worker: Resources{CPU: 8, Memory: 16 << 30}, Server: Resources{CPU: 4, Memory: 8 << 30}}
	for range 2 {
		assert.Empty(t, u.observe(s), "fewer than Settle observations")
	}
	d := u.first(t, s, 5)
	assert.Equal(t, Resize, d.Kind)
	assert.Contains(t, d.Reason, "right-size")
	// 1.1 x 1.5 = 1.65 -> 2 cores; 0.6 x 1.5 = 0.9 -> 1 core; 3 GiB x 1.25 = 3.75 GiB.
	assert.Equal(t, Resources{CPU: 2, Memory: 3840 << 20}, d.Shape.Worker)
	assert.Equal(t, Resources{CPU: 1, Memory: 8 << 30}, d.Shape.Server)
	assert.Equal(t, 8, d.Shape.Workers)
	assert.Equal(t, 2, d.Shape.Servers)
	assert.Equal(t, 18.0, d.Value)
	assert.Equal(t, 72.0, d.Limit)

	// Within the margin: 2.9 x 1.5 = 4.35 cores, 9% above 4; 3.3 GiB x 1.25 is 4.1 GiB of 4.
	p, err = NewPlanner(Config{Prior: &Model{WorkerCompute: 400e-6}, MinWorkers: 2, MaxWorkers: 2, MinServers: 2, MaxServers: 2})
	require.NoError(t, err)
	u = &usageJob{p: p, at: t0, workerUsed: 2.9, serverUsed: 2.9, workerMem: 33 << 30 / 10, x: flat(1000)}
	s = Shape{Workers: 2, Servers: 2, Worker: Resources{CPU: 4, Memory: 4 << 30}, Server: Resources{CPU: 4, Memory: 8 << 30}}
	for range 20 {
		for _, d := range u.observe(s) {
			t.Errorf("unexpected %v", d)
		}
	}
}

// A worker that uses its cores (mean share at least HotCPU) gets CPUHeadroom times them when
// the quota has room, and nothing when it has not.
func TestRightsizeGrowsBusyWorkers(t *testing.T) {
	p, err := NewPlanner(Config{Prior: &Model{WorkerCompute: 400e-6}, MinWorkers: 4, MaxWorkers: 4, MaxServers: 1, MaxCPU: 40})
	require.NoError(t, err)
	u := &usageJob{p: p, at: t0, workerUsed: 2, serverUsed: 1.5, x: flat(1000)}
	s := Shape{Workers: 4, Servers: 1, Worker: Resources{CPU: 2}, Server: Resources{CPU: 2}}
	d := u.first(t, s, 6)
	assert.Equal(t, 3.0, d.Shape.Worker.CPU, "%v", d)
	assert.Equal(t, 4, d.Shape.Workers)
	assert.Contains(t, d.Reason, "on average")

	p, err = NewPlanner(Config{Prior: &Model{WorkerCompute: 400e-6}, MinWorkers: 4, MaxWorkers: 4, MaxServers: 1, MaxCPU: 10})
	require.NoError(t, err)
	u = &usageJob{p: p, at: t0, workerUsed: 2, serverUsed: 1.5, x: flat(1000)}
	for range 20 {
		for _, d := range u.observe(s) {
			assert.NotEqual(t, 3.0, d.Shape.Worker.CPU, "no room in 10 cores: %v", d)
		}
	}
}

// A cut that costs more throughput than its cores are worth is undone and the role is not cut
// below that size again; a cut that costs little stays.
func TestRightsizeUndoesACostlyCut(t *testing.T) {
	s := Shape{Workers: 4, Servers: 1, Worker: Resources{CPU: 8}, Server: Resources{CPU: 2}}
	for _, tc := range []struct {
		name   string
		after  float64 // throughput at 4 cores a worker, against 1000 at 8
		undone bool
	}{
		{"costly", 700, true}, // 30% of the throughput for 16 of 34 cores: efficiency 0.64
		{"cheap", 950, false}, // 5%: efficiency 0.11
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPlanner(Config{Prior: &Model{WorkerCompute: 400e-6}, MinWorkers: 4, MaxWorkers: 4, MaxServers: 1})
			require.NoError(t, err)
			x := func(sh Shape) float64 {
				if sh.Worker.CPU < 8 {
					return tc.after
				}
				return 1000
			}
			u := &usageJob{p: p, at: t0, workerUsed: 2.5, serverUsed: 1.2, x: x}
			d := u.first(t, s, 6)
			require.Equal(t, 4.0, d.Shape.Worker.CPU, "%v", d)
			require.Equal(t, 2.0, d.Shape.Server.CPU, "the server is within the margin")
			cut := d.Shape
			// At the cut size the workers are busier: they use all 4 cores' worth of 2.5 x 8/4.
			var back *Decision
			for range 20 {
				for _, d := range u.observe(cut) {
					if d.Shape.Worker.CPU > cut.Worker.CPU {
						back = &d
					}
				}
				if back != nil {
					break
				}
			}
			if !tc.undone {
				assert.Nil(t, back)
				return
			}
			require.NotNil(t, back)
			assert.Equal(t, 8.0, back.Shape.Worker.CPU)
			assert.Contains(t, back.Reason, "go back")
			assert.InDelta(t, 0.64, back.Value, 0.01)
			// And it stays: the same use would cut it again, the floor does not let it.
			for range 20 {
				for _, d := range u.observe(back.Shape) {
					assert.GreaterOrEqual(t, d.Shape.Worker.CPU, 8.0, "%v", d)
				}
			}
		})
	}
}

// A worker near its memory limit gets MemoryGrowth times it.
func TestRightsizeGrowsWorkerMemory(t *testing.T) {
	p, err := NewPlanner(Config{Prior: &Model{WorkerCompute: 400e-6}, MinWorkers: 2, MaxWorkers: 2, MaxServers: 1})
	require.NoError(t, err)
	u := &usageJob{p: p, at: t0, workerUsed: 1.5, serverUsed: 1.5, workerMem: 39 << 28, x: flat(1000)} // 9.75 GiB
	s := Shape{Workers: 2, Servers: 1, Worker: Resources{CPU: 2, Memory: 10 << 30}, Server: Resources{CPU: 2, Memory: 4 << 30}}
	d := u.first(t, s, 6)
	assert.Equal(t, int64(15<<30), d.Shape.Worker.Memory, "%v", d)
	assert.Contains(t, d.Reason, "near")
}

// The memory quota bounds the first plan and every re-plan: workers go first, never the
// servers' memory for the rows.
func TestMemoryQuota(t *testing.T) {
	p, err := NewPlanner(Config{MaxMemory: 40 << 30, Worker: Resources{CPU: 4, Memory: 8 << 30}, InitialWorkers: 6,
		MemoryPerModelByte: 2, MemoryHeadroom: 1})
	require.NoError(t, err)
	// 8 GiB of model: 16 GiB of servers, 24 GiB left: 3 workers of 8 GiB.
	d, err := p.Begin(JobProfile{ModelBytes: 8 << 30, BatchSize: 64}, nil, t0)
	require.NoError(t, err)
	assert.Equal(t, 3, d.Shape.Workers, "%v", d.Shape)
	assert.Equal(t, int64(16<<30), int64(d.Shape.Servers)*d.Shape.Server.Memory)
	assert.LessOrEqual(t, d.Shape.Memory(), int64(40<<30))

	// A re-plan does not grow past the memory, however well the workers scale.
	c := Config{MaxMemory: 40 << 30, MaxWorkers: 20}.withDefaults()
	s := Shape{Workers: 2, Servers: 1, Worker: Resources{CPU: 4, Memory: 8 << 30}, Server: Resources{CPU: 4, Memory: 16 << 30}}
	rd, ok := c.replan(Model{WorkerCompute: 400e-6}, s, moves{total: 16 << 30})
	require.True(t, ok)
	assert.Equal(t, 3, rd.Shape.Workers)
	// Rows over the quota alone: the fewest workers, the servers' memory whole.
	s.Server.Memory = 48 << 30
	q := c.withinQuota(s)
	assert.Equal(t, 1, q.Workers)
	assert.Equal(t, int64(48<<30), q.Server.Memory)
	// Such a shape is allowed (its cores may be right-sized), with no more workers.
	assert.True(t, c.allows(q))
	assert.False(t, c.allows(with(q, 1, 0)))
}

// A change of the server count spreads the servers' memory anew: fewer servers each get a
// larger share, so the rows still fit.
func TestReplanSpreadsServerMemory(t *testing.T) {
	c := Config{MaxWorkers: 4, MaxStep: 1}.withDefaults()
	s := Shape{Workers: 4, Servers: 4, Worker: Resources{CPU: 4}, Server: Resources{CPU: 4, Memory: 8 << 30}}
	d, ok := c.replan(Model{WorkerCompute: 400e-6}, s, moves{total: 32 << 30})
	require.True(t, ok)
	require.Equal(t, 3, d.Shape.Servers)
	assert.Equal(t, roundMiB(32<<30/3.0), d.Shape.Server.Memory)
	// Servers that would need more than MaxServerMemory each are not removed.
	c = Config{MaxWorkers: 4, MaxStep: 1, MaxServerMemory: 10 << 30}.withDefaults()
	_, ok = c.replan(Model{WorkerCompute: 400e-6}, s, moves{total: 32 << 30})
	assert.False(t, ok)
}

// A server killed for lack of memory at MaxServerMemory gets its rows spread over more
// servers at once, even within Cooldown of the last change; once, until the servers come.
func TestOutOfMemoryAtTheCapInCooldown(t *testing.T) {
	p, err := NewPlanner(Config{MaxServerMemory: 16 << 30, MaxServers: 8})
	require.NoError(t, err)
	s := Shape{Workers: 4, Servers: 2, Worker: Resources{CPU: 4}, Server: Resources{CPU: 4, Memory: 16 << 30}}
	obs := func(sec int, sh Shape, sv ...ServerLoad) []Decision {
		return p.Observe(Observation{At: t0.Add(time.Duration(sec) * time.Second), Shape: sh, Servers: sv})
	}
	assert.Empty(t, obs(0, s))
	// Near the cap within Cooldown: not yet.
	assert.Empty(t, obs(10, s, ServerLoad{ID: "ps-0", Memory: 155 << 26}))
	ds := obs(20, s, ServerLoad{ID: "ps-0", Memory: 16 << 30, OOMKilled: true})
	require.Len(t, ds, 1)
	d := ds[0]
	assert.Equal(t, AddServer, d.Kind)
	// 2 x 16 GiB x 1.5 = 48 GiB: 3 servers of 16 GiB.
	assert.Equal(t, 3, d.Shape.Servers)
	assert.Equal(t, int64(16<<30), d.Shape.Server.Memory)
	assert.Contains(t, d.Reason, "spread over 3 servers")
	// Not again while the third server is not there, for a server near the cap ...
	assert.Empty(t, obs(30, s, ServerLoad{ID: "ps-0", Memory: 155 << 26}, ServerLoad{ID: "ps-1", Memory: 155 << 26}))
	// ... but a server killed again meanwhile gets the same spread again, once for all of them.
	ds = obs(40, s, ServerLoad{ID: "ps-0", Memory: 16 << 30, OOMKilled: true}, ServerLoad{ID: "ps-1", Memory: 16 << 30, OOMKilled: true})
	require.Len(t, ds, 1)
	assert.Equal(t, 3, ds[0].Shape.Servers)
	// Once there, a server near the cap waits for the Cooldown.
	s3 := ds[0].Shape
	assert.Empty(t, obs(50, s3, ServerLoad{ID: "ps-0", Memory: 155 << 26}))
	// At MaxServers there is nothing to do.
	p, err = NewPlanner(Config{MaxServerMemory: 16 << 30, MaxServers: 2})
	require.NoError(t, err)
	assert.Empty(t, obs(40, s, ServerLoad{ID: "ps-0", Memory: 16 << 30, OOMKilled: true}))
}

// ShrinkRequest never asks a server for less than its share of what the rows need, nor gives
// a server up when the others cannot hold its rows.
func TestShrinkRequestKeepsTheRows(t *testing.T) {
	p, err := NewPlanner(Config{MemoryPerModelByte: 1, MemoryHeadroom: 1.25, MaxServerMemory: 12 << 30})
	require.NoError(t, err)
	// 16 GiB of model: 20 GiB with the headroom, 10 GiB a server on 2.
	d, err := p.Begin(JobProfile{ModelBytes: 16 << 30, BatchSize: 64}, nil, t0)
	require.NoError(t, err)
	require.Equal(t, 2, d.Shape.Servers)
	require.Equal(t, int64(10<<30), d.Shape.Server.Memory)
	s := d.Shape
	pending := func(size Resources) []Decision {
		return p.Observe(Observation{At: t0, Shape: s, Pending: []Pending{{ID: "ps-1", Role: Server, Size: size, Waited: time.Hour}}})
	}
	ds := pending(Resources{CPU: 4, Memory: 12 << 30})
	require.Len(t, ds, 1)
	// 0.75 x 12 = 9 GiB is below the 10 GiB the rows need.
	assert.Equal(t, Resources{CPU: 3, Memory: 10 << 30}, ds[0].Size)
	assert.Contains(t, ds[0].Reason, "least it needs")
	ds = pending(Resources{CPU: 4, Memory: 10 << 30})
	require.Len(t, ds, 1)
	assert.Equal(t, Resources{CPU: 3, Memory: 10 << 30}, ds[0].Size, "cores only")
	// At the smallest cores with the rows' memory: one server cannot hold 20 GiB in 12.
	assert.Empty(t, pending(Resources{CPU: 1, Memory: 10 << 30}))
}

// Without a similar job, the memory per model byte is what the earlier jobs measured (their
// median), not the default.
func TestBeginMemoryFromEveryRecord(t *testing.T) {
	rec := func(name string, model, peak int64) JobRecord {
		return JobRecord{Job: name, Profile: JobProfile{Kind: "dlrm", ModelBytes: model, BatchSize: 64},
			Shape: Shape{Workers: 2, Servers: 2, Worker: Resources{CPU: 2}, Server: Resources{CPU: 2}}, PeakServerMemory: peak}
	}
	// 1.2, 1.5 and 2 bytes per model byte, all far from the new job's 1 TiB.
	hist := []JobRecord{rec("a", 1<<30, 6<<27), rec("b", 1<<30, 3<<28), rec("c", 1<<30, 1<<30)}
	p, err := NewPlanner(Config{MaxServerMemory: 1 << 40, MemoryHeadroom: 1})
	require.NoError(t, err)
	d, err := p.Begin(JobProfile{Kind: "dlrm", ModelBytes: 1 << 40, BatchSize: 64}, hist, t0)
	require.NoError(t, err)
	assert.Contains(t, d.Reason, "no similar job")
	assert.Contains(t, d.Reason, "median measured by 3 earlier jobs")
	assert.InDelta(t, 1.5*(1<<40), d.Value, 1)
}

// A re-plan that gives each server more load gives it the cores its measured use, scaled by
// that load, needs with CPUHeadroom; one that gives it less leaves the cores to the right-size.
func TestReplanScalesCoresWithTheLoad(t *testing.T) {
	p, err := NewPlanner(Config{})
	require.NoError(t, err)
	p.serverUsed = []float64{1.5, 2}
	p.workerUsed = []float64{3}
	from := Shape{Workers: 4, Servers: 2, Worker: Resources{CPU: 4}, Server: Resources{CPU: 4}}
	to := with(from, 4, 0)
	// Twice the throughput over as many servers: 2 x 2 x 1.5 = 6 cores a server; the workers'
	// load each is as before.
	got, why := p.scaleCoresLocked(from, to, 1000, 2000)
	assert.Equal(t, 6.0, got.Server.CPU)
	assert.Equal(t, 4.0, got.Worker.CPU)
	assert.Contains(t, why, "servers 4 -> 6 cores")
	// Twice the servers for 10% more: half the load each, the servers' cores kept; the
	// workers' 10% more load each needs 3 x 1.1 x 1.5 = 4.95 -> 5 cores.
	got, why = p.scaleCoresLocked(from, with(from, 0, 2), 1000, 1100)
	assert.Equal(t, 4.0, got.Server.CPU)
	assert.Equal(t, 5.0, got.Worker.CPU)
	assert.NotContains(t, why, "servers")
}
