package autoscale

import (
	"bytes"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func cores(w, p int) Shape {
	return Shape{Workers: w, Servers: p, Worker: Resources{CPU: 4}, Server: Resources{CPU: 4, Memory: 8 << 30}}
}

// job is a simulated job whose throughput follows a hidden model, with seeded noise.
type job struct {
	truth Model
	rng   *rand.Rand
	noise float64
}

func (j *job) throughput(s Shape) float64 {
	return j.truth.Throughput(s) * math.Exp(j.noise*j.rng.NormFloat64())
}

// run feeds the planner an observation every 15 s for n ticks, carrying out every Resize, and
// returns the final shape and the decisions.
func run(t *testing.T, p *Planner, j *job, s Shape, n int) (Shape, []Decision) {
	t.Helper()
	var all []Decision
	for i := 1; i <= n; i++ {
		ds := p.Observe(Observation{At: t0.Add(time.Duration(i) * 15 * time.Second), Shape: s, Throughput: j.throughput(s)})
		for _, d := range ds {
			require.Equal(t, Resize, d.Kind, "%v", d)
			require.True(t, p.cfg.allows(d.Shape), "%v outside the quota", d.Shape)
			s = d.Shape
		}
		all = append(all, ds...)
	}
	return s, all
}

// best is the shape the greedy search reaches under the true model from s.
func best(c Config, m Model, s Shape, mv moves) Shape {
	c = c.withDefaults()
	for range 100 {
		d, ok := c.replan(m, s, mv)
		if !ok {
			break
		}
		s = d.Shape
	}
	return s
}

// TestReplanConverges: without a prior, the planner explores, fits the model to what it
// measures and settles where the true model says growing no longer pays: one more worker or
// server would be worth less than AddEfficiency (with a margin for the noise), one fewer would
// lose more than RemoveEfficiency. From below and from above.
func TestReplanConverges(t *testing.T) {
	truth := Model{Base: 20e-6, WorkerCompute: 400e-6, ServerCompute: 300e-6, PerWorker: 8e-6, PerServer: 20e-6}
	cfg := Config{MaxWorkers: 40, MaxServers: 12}
	c := cfg.withDefaults()
	for _, start := range []Shape{cores(2, 1), cores(40, 12)} {
		p, err := NewPlanner(cfg)
		require.NoError(t, err)
		j := &job{truth: truth, rng: rand.New(rand.NewPCG(3, 4)), noise: 0.02}
		got, ds := run(t, p, j, start, 400)
		require.NotEmpty(t, ds)
		assert.Contains(t, ds[0].Reason, "explore")
		for _, next := range []Shape{with(got, 1, 0), with(got, 0, 1)} {
			assert.Less(t, c.efficiency(truth, got, next), c.AddEfficiency+0.1, "from %v: at %v, to %v", start, got, next)
		}
		for _, prev := range []Shape{with(got, -1, 0), with(got, 0, -1)} {
			assert.Greater(t, c.efficiency(truth, got, prev), c.RemoveEfficiency, "from %v: at %v, to %v", start, got, prev)
		}
		// It has stopped moving: the last decision is long past.
		last := ds[len(ds)-1].At
		assert.Less(t, last.Sub(t0), 60*time.Minute, "still moving at %v: %v", last.Sub(t0), ds[len(ds)-1])
		m, samples, err := p.Model()
		require.NoError(t, err)
		// One sample per shape measured: the start and each decision's, some visited twice.
		assert.LessOrEqual(t, len(samples), len(ds)+1)
		assert.GreaterOrEqual(t, len(samples), 3)
		assert.InEpsilon(t, truth.Throughput(got), m.Throughput(got), 0.02)
		t.Logf("from %v: %d decisions, at %v (%.0f samples/s, %g cores); fit %v", start, len(ds), got, truth.Throughput(got), got.CPU(), m)
	}
}

// TestReplanQuota: the quota's bounds on counts and cores hold, and a shape outside them is
// brought back whatever the model says.
func TestReplanQuota(t *testing.T) {
	linear := Model{WorkerCompute: 400e-6} // every worker adds as much as the first
	c := Config{MaxWorkers: 10, MaxServers: 4, MaxCPU: 30, MaxStep: 100}.withDefaults()
	d, ok := c.replan(linear, cores(2, 1), moves{})
	require.True(t, ok)
	assert.Equal(t, cores(6, 1), d.Shape) // 6*4 + 1*4 = 28 cores, the most within 30
	// A worker adds half the throughput of 2 for 4 cores of a job that holds 12 cores and
	// 8 GiB, 2 cores' worth at CoreMemory 4 GiB: (x/2/4)/(x/14) = 1.75 (1 were the server's
	// cores and memory free).
	assert.InDelta(t, 1.75, d.Value, 1e-9)

	c = Config{MaxWorkers: 10, MaxServers: 4}.withDefaults()
	busy := Model{WorkerCompute: 400e-6, ServerCompute: 400e-6}
	d, ok = c.replan(busy, cores(12, 6), moves{})
	require.True(t, ok)
	assert.Equal(t, cores(10, 4), d.Shape, "%v", d)
	assert.Contains(t, d.Reason, "quota")

	// Servers that add nothing are removed, MaxStep at a time.
	c = Config{MaxStep: 2, MaxWorkers: 4}.withDefaults()
	d, ok = c.replan(linear, cores(4, 8), moves{})
	require.True(t, ok)
	assert.Equal(t, cores(4, 6), d.Shape)
	assert.Less(t, d.Value, c.RemoveEfficiency)
	assert.Contains(t, d.Reason, "< 0.20")
}

// TestReplanHysteresis: between the thresholds nothing moves.
func TestReplanHysteresis(t *testing.T) {
	c := Config{}.withDefaults()
	// The next worker's efficiency is 0.40, below AddEfficiency 0.5; removing one loses 0.47,
	// above RemoveEfficiency 0.2.
	m := Model{WorkerCompute: 400e-6, PerWorker: 20e-6}
	s := cores(8, 1)
	s.Server.Memory = 0 // cores alone
	up, down := c.efficiency(m, s, with(s, 1, 0)), c.efficiency(m, s, with(s, -1, 0))
	require.InDelta(t, 0.40, up, 0.01)
	require.InDelta(t, 0.47, down, 0.01)
	_, ok := c.replan(m, s, moves{})
	assert.False(t, ok, "up %.2f down %.2f", up, down)
}

func TestPlannerSettleAndCooldown(t *testing.T) {
	p, err := NewPlanner(Config{Prior: &Model{WorkerCompute: 400e-6}, MaxWorkers: 20})
	require.NoError(t, err)
	s := cores(2, 1)
	x := p.prior.Throughput(s)
	at := t0
	obs := func(d time.Duration, changing bool) []Decision {
		at = at.Add(d)
		return p.Observe(Observation{At: at, Shape: s, Throughput: x, Changing: changing})
	}
	// Two samples are fewer than Settle; samples while changing do not count.
	assert.Empty(t, obs(time.Minute, false))
	assert.Empty(t, obs(time.Minute, false))
	assert.Empty(t, obs(time.Minute, true))
	ds := obs(time.Minute, false)
	require.Len(t, ds, 1)
	assert.Equal(t, Resize, ds[0].Kind)
	// The decision is not carried out yet: within Cooldown it is not made again.
	assert.Empty(t, obs(time.Minute, false))
	assert.Len(t, obs(time.Minute+time.Second, false), 1)
}

func TestBeginFromHistory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "history.json")
	recs, err := LoadHistory(path)
	require.NoError(t, err)
	assert.Empty(t, recs)

	m := Model{Base: 20e-6, WorkerCompute: 400e-6, ServerCompute: 150e-6, PerWorker: 10e-6, PerServer: 40e-6}
	near := JobRecord{Job: "near", Profile: JobProfile{Kind: "dlrm", ModelBytes: 8 << 30, DatasetSamples: 1e9, BatchSize: 512},
		Shape: Shape{Workers: 8, Servers: 4, Worker: Resources{CPU: 2}, Server: Resources{CPU: 8}}, Model: &m, PeakServerMemory: 4 << 30}
	other := near
	other.Job, other.Profile.Kind, other.Model = "other-kind", "wdl", nil
	far := near
	far.Job, far.Profile.ModelBytes = "far", 1<<40
	for _, r := range []JobRecord{far, other, near} {
		require.NoError(t, AppendHistory(path, r, 2))
	}
	recs, err = LoadHistory(path)
	require.NoError(t, err)
	require.Len(t, recs, 2, "keep the newest 2")
	assert.Equal(t, "other-kind", recs[0].Job)
	assert.Equal(t, near, recs[1])

	profile := JobProfile{Kind: "dlrm", ModelBytes: 12 << 30, DatasetSamples: 2e9, BatchSize: 512}
	p, err := NewPlanner(Config{MaxWorkers: 64, MaxServers: 16, MaxServerMemory: 16 << 30})
	require.NoError(t, err)
	d, err := p.Begin(profile, append(recs, far), t0)
	require.NoError(t, err)
	assert.Equal(t, Plan, d.Kind)
	assert.Contains(t, d.Reason, "the model of near")
	// The near job used 4 GiB on each of 4 servers for 8 GiB of model: 2 bytes per byte (the
	// default is 3); 12 GiB of model need 24 GiB, 30 with the headroom: 2 servers of 16 GiB
	// at least.
	assert.InDelta(t, 30<<30, d.Value, 1)
	assert.GreaterOrEqual(t, d.Shape.Servers, 2)
	assert.InDelta(t, 30<<30, float64(d.Shape.Server.Memory*int64(d.Shape.Servers)), float64(d.Shape.Servers<<20))
	assert.Equal(t, near.Shape.Worker, d.Shape.Worker)
	assert.Equal(t, 8.0, d.Shape.Server.CPU)
	// The plan is where growing stops paying under the near job's model, and its prior is that model.
	c := p.Config()
	assert.Empty(t, c.grow(m, d.Shape, 1, moves{}), "%v", d.Shape)
	assert.Equal(t, &m, p.prior)
	assert.Greater(t, d.After, 0.0)

	// A job of another size does not use the history.
	p, err = NewPlanner(Config{})
	require.NoError(t, err)
	d, err = p.Begin(JobProfile{ModelBytes: 1 << 20, BatchSize: 64}, recs, t0)
	require.NoError(t, err)
	assert.Equal(t, cores(4, 2).Workers, d.Shape.Workers)
	assert.Equal(t, 2, d.Shape.Servers)
	assert.Contains(t, d.Reason, "no similar job")
	assert.Nil(t, p.prior)

	// A model larger than the quota's servers can hold.
	p, err = NewPlanner(Config{MaxServers: 2, MaxServerMemory: 1 << 30})
	require.NoError(t, err)
	_, err = p.Begin(JobProfile{ModelBytes: 1 << 30, BatchSize: 64}, nil, t0)
	assert.ErrorIs(t, err, ErrInvalidProfile)
	_, err = p.Begin(JobProfile{ModelBytes: 1 << 20}, nil, t0)
	assert.ErrorIs(t, err, ErrInvalidProfile)
}

// TestRecordRoundTrip: a finished job's record plans the next job like it.
func TestRecordRoundTrip(t *testing.T) {
	truth := Model{Base: 20e-6, WorkerCompute: 400e-6, ServerCompute: 300e-6, PerWorker: 8e-6, PerServer: 20e-6}
	cfg := Config{MaxWorkers: 40, MaxServers: 12}
	p, err := NewPlanner(cfg)
	require.NoError(t, err)
	j := &job{truth: truth, rng: rand.New(rand.NewPCG(5, 6)), noise: 0.02}
	s, _ := run(t, p, j, cores(2, 1), 300)
	p.Observe(Observation{At: t0.Add(300 * 15 * time.Second), Shape: s, Changing: true,
		Servers: []ServerLoad{{ID: "ps-0", Memory: 3 << 30}, {ID: "ps-1", Memory: 5 << 30}}})
	profile := JobProfile{ModelBytes: 10 << 30, BatchSize: 256}
	rec := p.Record("first", profile, t0)
	assert.Equal(t, s, rec.Shape)
	assert.Equal(t, int64(5<<30), rec.PeakServerMemory)
	assert.InEpsilon(t, truth.Throughput(s), rec.Throughput, 0.02)
	require.NotNil(t, rec.Model)

	path := filepath.Join(t.TempDir(), "h.json")
	require.NoError(t, AppendHistory(path, rec, 0))
	recs, err := LoadHistory(path)
	require.NoError(t, err)
	p2, err := NewPlanner(cfg)
	require.NoError(t, err)
	d, err := p2.Begin(profile, recs, t0)
	require.NoError(t, err)
	// The plan is where, under the true model, growing no longer pays and shrinking costs
	// too much (with a margin for the fit), the servers' memory spread as a first plan
	// spreads it.
	c := p2.Config()
	mv := moves{total: float64(d.Shape.Servers) * float64(d.Shape.Server.Memory)}
	for _, next := range []Shape{with(d.Shape, 1, 0), mv.addServer(d.Shape)} {
		assert.Less(t, c.efficiency(truth, d.Shape, next), c.AddEfficiency+0.15, "plan %v, to %v", d.Shape, next)
	}
	for _, prev := range []Shape{with(d.Shape, -1, 0), mv.removeServer(d.Shape)} {
		assert.Greater(t, c.efficiency(truth, d.Shape, prev), c.RemoveEfficiency, "plan %v, to %v", d.Shape, prev)
	}
	want := best(cfg, truth, spread(cores(1, 1), mv.total), mv)
	assert.InEpsilon(t, truth.Throughput(want), truth.Throughput(d.Shape), 0.1, "plan %v, want about %v", d.Shape, want)
}

func TestHotServer(t *testing.T) {
	var logs bytes.Buffer
	p, err := NewPlanner(Config{MaxServers: 3, HotFor: 30 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	s := cores(4, 2)
	load := func(sec int, cpu0, cpu1 float64) []Decision {
		return p.Observe(Observation{At: t0.Add(time.Duration(sec) * time.Second), Shape: s, Throughput: 1000,
			Servers: []ServerLoad{{ID: "ps-0", CPU: cpu0}, {ID: "ps-1", CPU: cpu1}}})
	}
	assert.Empty(t, load(0, 0.5, 0.9))
	assert.Empty(t, load(20, 0.5, 0.9))
	assert.Empty(t, load(25, 0.5, 0.8), "a dip below HotCPU restarts the clock")
	assert.Empty(t, load(30, 0.5, 0.9))
	assert.Empty(t, load(59, 0.5, 0.9))
	ds := load(60, 0.5, 0.95)
	require.Len(t, ds, 1)
	d := ds[0]
	assert.Equal(t, AddServer, d.Kind)
	assert.Equal(t, "ps-1", d.Target)
	assert.Equal(t, 3, d.Shape.Servers)
	assert.Equal(t, 0.95, d.Value)
	assert.Equal(t, 0.85, d.Limit)
	assert.Contains(t, d.Reason, "CPU share 0.95 >= 0.85 for 30s")
	assert.Contains(t, logs.String(), "kind=add-server")
	assert.Contains(t, logs.String(), "target=ps-1")
	// Not again at once; at the quota's 3 servers a hot server gets a rebalance.
	assert.Empty(t, load(75, 0.5, 0.95))
	s = cores(4, 3)
	assert.Empty(t, load(80, 0.95, 0.5))
	ds = load(110, 0.95, 0.5)
	require.Len(t, ds, 1)
	assert.Equal(t, Rebalance, ds[0].Kind)
	assert.Equal(t, "ps-0", ds[0].Target)
	// Observations while a change is under way do not count towards HotFor.
	assert.Empty(t, p.Observe(Observation{At: t0.Add(120 * time.Second), Shape: s, Changing: true, Servers: []ServerLoad{{ID: "ps-0", CPU: 0.99}}}))
	assert.Empty(t, load(140, 0.95, 0.5))
	assert.Empty(t, load(169, 0.95, 0.5))
	assert.Len(t, load(170, 0.95, 0.5), 1)
}

func TestOutOfMemory(t *testing.T) {
	p, err := NewPlanner(Config{MaxServerMemory: 16 << 30, MaxServers: 3})
	require.NoError(t, err)
	s := cores(4, 2) // 8 GiB servers
	obs := func(sec int, sv ...ServerLoad) []Decision {
		return p.Observe(Observation{At: t0.Add(time.Duration(sec) * time.Second), Shape: s, Servers: sv})
	}
	assert.Empty(t, obs(0, ServerLoad{ID: "ps-0", Memory: 7 << 30}))
	ds := obs(10, ServerLoad{ID: "ps-0", Memory: 77 << 30 / 10}) // above 95% of 8 GiB
	require.Len(t, ds, 1)
	d := ds[0]
	assert.Equal(t, RestartServer, d.Kind)
	assert.Equal(t, "ps-0", d.Target)
	assert.Equal(t, int64(12<<30), d.Size.Memory, "1.5 x 8 GiB")
	assert.Equal(t, 4.0, d.Size.CPU)
	assert.Equal(t, int64(12<<30), d.Shape.Server.Memory)
	assert.Contains(t, d.Reason, "flash checkpoint")
	// While the restart is under way (the limit still 8 GiB) it is not asked again.
	assert.Empty(t, obs(20, ServerLoad{ID: "ps-0", Memory: 79 << 30 / 10}))
	// Killed before the restart came: it is asked for again.
	ds = obs(25, ServerLoad{ID: "ps-0", Memory: 8 << 30, OOMKilled: true})
	require.Len(t, ds, 1)
	assert.Equal(t, RestartServer, ds[0].Kind)
	assert.Equal(t, int64(12<<30), ds[0].Size.Memory)
	// Restarted at 12 GiB and killed there: 1.5 x 12 = 18 GiB, capped at 16.
	ds = obs(30, ServerLoad{ID: "ps-0", Memory: 11 << 30, MemoryLimit: 12 << 30, OOMKilled: true})
	require.Len(t, ds, 1)
	assert.Equal(t, int64(16<<30), ds[0].Size.Memory)
	assert.Contains(t, ds[0].Reason, "killed")
	// Killed at the cap: the model is spread over one more server (after Cooldown).
	ds = obs(200, ServerLoad{ID: "ps-0", Memory: 15 << 30, MemoryLimit: 16 << 30, OOMKilled: true})
	require.Len(t, ds, 1)
	assert.Equal(t, AddServer, ds[0].Kind)
	assert.Equal(t, 3, ds[0].Shape.Servers)
}

func TestStraggler(t *testing.T) {
	p, err := NewPlanner(Config{StragglerFor: 20 * time.Second})
	require.NoError(t, err)
	s := cores(4, 2)
	obs := func(sec int, times ...time.Duration) []Decision {
		var ws []WorkerLoad
		for i, st := range times {
			ws = append(ws, WorkerLoad{ID: "worker-" + string(rune('0'+i)), StepTime: st})
		}
		return p.Observe(Observation{At: t0.Add(time.Duration(sec) * time.Second), Shape: s, Workers: ws})
	}
	ms := time.Millisecond
	// Median of 100, 110, 120, 250 is 115: 250 is above 2x.
	assert.Empty(t, obs(0, 100*ms, 110*ms, 120*ms, 250*ms))
	assert.Empty(t, obs(10, 100*ms, 110*ms, 120*ms, 250*ms))
	ds := obs(20, 100*ms, 110*ms, 120*ms, 250*ms)
	require.Len(t, ds, 1)
	assert.Equal(t, ReplaceWorker, ds[0].Kind)
	assert.Equal(t, "worker-3", ds[0].Target)
	assert.InDelta(t, 0.25, ds[0].Value, 1e-9)
	assert.InDelta(t, 0.23, ds[0].Limit, 1e-9)
	// 220 ms is below 2 x 115: not a straggler.
	assert.Empty(t, obs(30, 100*ms, 110*ms, 120*ms, 220*ms))
	assert.Empty(t, obs(60, 100*ms, 110*ms, 120*ms, 220*ms))
	// Two workers say nothing of a median.
	assert.Empty(t, obs(70, 100*ms, 500*ms))
	assert.Empty(t, obs(100, 100*ms, 500*ms))
}

func TestPendingShrinks(t *testing.T) {
	p, err := NewPlanner(Config{MinWorkers: 2})
	require.NoError(t, err)
	s := cores(4, 2)
	s.Worker = Resources{CPU: 8, Memory: 16 << 30}
	worker := func(id string) Pending {
		return Pending{ID: id, Role: Worker, Size: Resources{CPU: 8, Memory: 16 << 30}, Waited: 5 * time.Minute}
	}
	obs := func(pd ...Pending) []Decision {
		return p.Observe(Observation{At: t0, Shape: s, Pending: pd})
	}
	early := worker("worker-3")
	early.Waited = 4 * time.Minute
	assert.Empty(t, obs(early))
	// Pending workers are given up first, down to MinWorkers, one decision each, each
	// Shape the job's once those before it are carried out; no request shrinks meanwhile.
	ds := obs(worker("worker-1"), worker("worker-2"), worker("worker-3"),
		Pending{ID: "ps-1", Role: Server, Size: Resources{CPU: 4, Memory: 8 << 30}, Waited: time.Hour})
	require.Len(t, ds, 2)
	for i, d := range ds {
		assert.Equal(t, ShrinkRequest, d.Kind)
		assert.Equal(t, 3-i, d.Shape.Workers)
		assert.Equal(t, s.Worker, d.Shape.Worker)
		assert.Contains(t, d.Reason, "give it up")
	}
	// At MinWorkers a pending worker's request is made smaller instead.
	s.Workers = 2
	ds = obs(worker("worker-1"))
	require.Len(t, ds, 1)
	assert.Equal(t, ShrinkRequest, ds[0].Kind)
	assert.Equal(t, Resources{CPU: 6, Memory: 12 << 30}, ds[0].Size)
	want := s
	want.Worker = ds[0].Size
	assert.Equal(t, want, ds[0].Shape, "the shape once the smaller worker is asked for")
	// At the smallest size already, a server is given up.
	ds = obs(Pending{ID: "ps-2", Role: Server, Size: Resources{CPU: 1, Memory: 1 << 30}, Waited: time.Hour})
	require.Len(t, ds, 1)
	assert.Equal(t, 1, ds[0].Shape.Servers)
	assert.True(t, strings.Contains(ds[0].Reason, "give it up"), ds[0].Reason)
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, Config{}.Validate())
	d := DefaultConfig()
	require.NoError(t, d.Validate())
	assert.Equal(t, 0.5, d.AddEfficiency)
	err := Config{MaxWorkers: -1, AddEfficiency: 0.1, RemoveEfficiency: 0.3, HotCPU: 2, ShrinkFactor: 1.5, Prior: &Model{Base: -1}}.Validate()
	require.ErrorIs(t, err, ErrInvalidConfig)
	for _, want := range []string{"workers", "RemoveEfficiency", "HotCPU", "ShrinkFactor", "Prior"} {
		assert.Contains(t, err.Error(), want)
	}
	_, err = NewPlanner(Config{NearMemory: -0.5})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewPlanner(Config{NearMemory: 1.5})
	assert.NoError(t, err, "above 1: only kills")
}
