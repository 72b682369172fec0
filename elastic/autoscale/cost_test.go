package autoscale

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMovedFraction(t *testing.T) {
	s := Shape{Workers: 4, Servers: 2, Worker: Resources{CPU: 4}, Server: Resources{CPU: 8, Memory: 16 << 30}}
	assert.Zero(t, movedFraction(s, with(s, 6, 0)), "workers move no rows")
	bigger := s
	bigger.Worker.CPU = 8
	assert.Zero(t, movedFraction(s, bigger), "nor do larger workers")
	assert.InDelta(t, 1.0/3, movedFraction(s, with(s, 0, 1)), 1e-12, "a third server takes a third of the slots")
	assert.InDelta(t, 0.5, movedFraction(s, with(s, 0, -1)), 1e-12, "one of two servers leaves its half")
	resized := s
	resized.Server.CPU = 4
	assert.Equal(t, 1.0, movedFraction(s, resized), "servers of a new size take all the rows")
	resized = s
	resized.Server.Memory = 12 << 30
	assert.Equal(t, 1.0, movedFraction(s, resized))
}

// pricedPlanner is a planner that began a job of samples samples with rows bytes of model,
// moving rows at 100 MB/s with training at half speed meanwhile.
func pricedPlanner(t *testing.T, samples int64, rows int64, cfg Config) *Planner {
	t.Helper()
	cfg.MoveBytesPerSecond, cfg.MoveSpeed = 100e6, 0.5
	if cfg.MaxServerMemory == 0 {
		cfg.MaxServerMemory = 1 << 40
	}
	p, err := NewPlanner(cfg)
	require.NoError(t, err)
	_, err = p.Begin(JobProfile{ModelBytes: rows, DatasetSamples: samples, BatchSize: 512}, nil, t0)
	require.NoError(t, err)
	return p
}

// TestPays: a change that moves rows pays when the time it saves over the job's remaining
// samples is Payback times the training it loses while they move; a cut of the servers'
// size, when the core-seconds it frees are Payback times the job's core-seconds lost; a
// change that moves nothing, or of a job of unknown length, always.
func TestPays(t *testing.T) {
	s := Shape{Workers: 4, Servers: 2, Worker: Resources{CPU: 4}, Server: Resources{CPU: 8, Memory: 16 << 30}}
	const rows = 10e9 // 100 s to move at 100 MB/s
	// A third server moves a third of 10 GB: 33 s at half speed, 17 s lost. 10% faster saves
	// a tenth of the remaining time: it pays (2 x 17 s) when more than about 6 minutes remain.
	for _, tc := range []struct {
		samples int64
		pays    bool
	}{{1000 * 60 * 60, true}, {1000 * 60 * 3, false}} {
		p := pricedPlanner(t, tc.samples, rows, Config{})
		p.rowBytes = rows
		ok, why := p.paysLocked(s, with(s, 0, 1), 1000, 1100)
		assert.Equal(t, tc.pays, ok, "%d samples: %s", tc.samples, why)
		assert.Contains(t, why, "moving 33% of 9.3 GiB of rows takes 33s at 100 MB/s and loses 17s of training")
		ok, why = p.paysLocked(s, with(s, 8, 0), 1000, 1100)
		assert.True(t, ok, "workers move nothing")
		assert.Empty(t, why)
	}
	// A cut of the servers to 4 cores frees 8 of 32 cores over the time left, against 50 s
	// lost (all the rows move) times 32 cores.
	cut := s
	cut.Server.CPU = 4
	long := pricedPlanner(t, 1000*3600, rows, Config{})
	long.rowBytes = rows
	ok, why := long.paysLocked(s, cut, 1000, 1000)
	assert.True(t, ok, why)
	assert.Contains(t, why, "frees 28800 core-seconds")
	short := pricedPlanner(t, 1000*300, rows, Config{})
	short.rowBytes = rows
	ok, why = short.paysLocked(s, cut, 1000, 1000)
	assert.False(t, ok, why)
	// Unknown length: every change pays.
	p, err := NewPlanner(Config{})
	require.NoError(t, err)
	p.rowBytes = rows
	ok, why = p.paysLocked(s, with(s, 0, 1), 1000, 1001)
	assert.True(t, ok)
	assert.Contains(t, why, "not priced")
}

// A hot server gets a server more only when that pays; otherwise its slots are moved.
func TestHotServerPriced(t *testing.T) {
	s := Shape{Workers: 4, Servers: 2, Worker: Resources{CPU: 4}, Server: Resources{CPU: 8, Memory: 16 << 30}}
	for _, tc := range []struct {
		samples int64
		want    Kind
	}{{1000 * 3600 * 10, AddServer}, {1000 * 120, Rebalance}} {
		p := pricedPlanner(t, tc.samples, 30e9, Config{})
		var ds []Decision
		for sec := 0; sec <= 60 && len(ds) == 0; sec += 15 {
			ds = p.Observe(Observation{At: t0.Add(time.Duration(sec) * time.Second), Shape: s, Throughput: 1000,
				Servers: []ServerLoad{{ID: "ps-0", CPU: 0.95, Memory: 15e9}, {ID: "ps-1", CPU: 0.9, Memory: 15e9}}})
		}
		require.Len(t, ds, 1)
		assert.Equal(t, tc.want, ds[0].Kind, "%s", ds[0].Reason)
		if tc.want == AddServer {
			assert.Equal(t, s.Server, ds[0].Shape.Server, "a server like the others: theirs are not resized")
			assert.Equal(t, 3, ds[0].Shape.Servers)
		} else {
			assert.Contains(t, ds[0].Reason, "would not pay")
		}
	}
}

// busyJob is a job whose workers can use 3 cores and servers 6, whatever they are given, and
// whose throughput follows m with those bounds; its observations report the cores used and
// the share of the time each process works, every minute.
type busyJob struct {
	p  *Planner
	m  Model
	at time.Time
}

func (j *busyJob) observe(s Shape) []Decision {
	j.at = j.at.Add(time.Minute)
	x := j.m.Throughput(s)
	compute, serve, _ := j.m.Terms(s)
	step := j.m.SecondsPerSample(s)
	obs := Observation{At: j.at, Shape: s, Throughput: x}
	// A process uses its usable cores while it works: its CPU share is its busy share times
	// those cores over its own.
	for i := range s.Workers {
		obs.Workers = append(obs.Workers, WorkerLoad{ID: "w" + string(rune('0'+i)), Busy: compute / step,
			CPU: compute / step * math.Min(s.Worker.CPU, j.m.WorkerCores) / s.Worker.CPU, StepTime: time.Second})
	}
	for i := range s.Servers {
		obs.Servers = append(obs.Servers, ServerLoad{ID: "ps" + string(rune('0'+i)), Busy: serve / step,
			CPU: serve / step * math.Min(s.Server.CPU, j.m.ServerCores) / s.Server.CPU, Memory: 15e9})
	}
	return j.p.Observe(obs)
}

// With Busy reported, one decision right-sizes the workers to the cores they use while they
// work (free: workers join and leave between steps) and adds the workers the model, fitted
// from one shape's shares, finds worth it; the servers keep their size on a short job (all
// the rows would move) and are cut on a long one.
func TestBusyRightsize(t *testing.T) {
	m := Model{Base: 10e-6, WorkerCompute: 600e-6, ServerCompute: 600e-6, PerWorker: 2e-6, PerServer: 2e-6, WorkerCores: 3, ServerCores: 6}
	s := Shape{Workers: 2, Servers: 2, Worker: Resources{CPU: 8, Memory: 8 << 30}, Server: Resources{CPU: 16, Memory: 16 << 30}}
	x := m.Throughput(s)
	for _, tc := range []struct {
		name    string
		seconds float64 // the job's length at x
		cut     bool
	}{{"short", 600, false}, {"long", 100 * 3600, true}} {
		t.Run(tc.name, func(t *testing.T) {
			p := pricedPlanner(t, int64(tc.seconds*x), 30e9, Config{MaxWorkers: 32, Prior: &Model{Base: 10e-6, PerWorker: 2e-6, PerServer: 2e-6}})
			j := &busyJob{p: p, m: m, at: t0}
			var d Decision
			for range 10 {
				if ds := j.observe(s); len(ds) > 0 {
					require.Len(t, ds, 1)
					d = ds[0]
					break
				}
			}
			require.Equal(t, Resize, d.Kind, "no decision")
			assert.Equal(t, 3.5, d.Shape.Worker.CPU, "3 cores used while working, x1.15, rounded up to 0.5: %s", d.Reason)
			assert.Contains(t, d.Reason, "workers use 3.00 cores while they work")
			assert.Greater(t, d.Shape.Workers, s.Workers, "more workers in the same decision: %s", d.Reason)
			if tc.cut {
				assert.Equal(t, 7.0, d.Shape.Server.CPU, "%s", d.Reason)
				assert.Contains(t, d.Reason, "frees")
			} else {
				assert.Equal(t, s.Server.CPU, d.Shape.Server.CPU, "%s", d.Reason)
			}
			// The workers' right size holds: the cores they use while they work do not depend
			// on the load.
			s2 := d.Shape
			for range 10 {
				for _, d := range j.observe(s2) {
					assert.Equal(t, 3.5, d.Shape.Worker.CPU, "%s", d.Reason)
					s2 = d.Shape
				}
			}
		})
	}
}

// A change of the workers alone moves nothing: the next re-plan waits only for Settle
// samples at the new shape. After a change of the servers the Cooldown applies.
func TestCooldownOnlyAfterMoves(t *testing.T) {
	p, err := NewPlanner(Config{Prior: &Model{WorkerCompute: 400e-6}, MaxWorkers: 64, MaxStep: 2, Cooldown: 10 * time.Minute})
	require.NoError(t, err)
	s := cores(2, 1)
	at := t0
	next := func() (Decision, time.Duration) {
		start := at
		for range 30 {
			at = at.Add(time.Minute)
			if ds := p.Observe(Observation{At: at, Shape: s, Throughput: p.prior.Throughput(s)}); len(ds) > 0 {
				return ds[0], at.Sub(start)
			}
		}
		t.Fatal("no decision")
		return Decision{}, 0
	}
	// The start counts as a move: the Cooldown applies from the first observation, a minute
	// in.
	d, took := next()
	assert.Equal(t, 11*time.Minute, took)
	s = d.Shape
	d, took = next()
	require.Equal(t, Resize, d.Kind)
	assert.Equal(t, 3*time.Minute, took, "Settle samples after a change of the workers")
	// A change of the servers: the Cooldown again.
	s = with(d.Shape, 0, 1)
	_, took = next()
	assert.Equal(t, 11*time.Minute, took)
}

// When every server nears its memory limit, the rows are spread over more servers of the
// same size (a share of the rows moves) rather than every server restarted larger (all of
// them move); one server near its limit is restarted larger.
func TestNearMemorySpreads(t *testing.T) {
	s := Shape{Workers: 4, Servers: 2, Worker: Resources{CPU: 4}, Server: Resources{CPU: 4, Memory: 10 << 30}}
	near := ServerLoad{Memory: 98 << 30 / 10}
	far := ServerLoad{Memory: 5 << 30}
	obs := func(p *Planner, sv ...ServerLoad) []Decision {
		for i := range sv {
			sv[i].ID = "ps-" + string(rune('0'+i))
		}
		return p.Observe(Observation{At: t0.Add(time.Hour), Shape: s, Servers: sv})
	}
	p, err := NewPlanner(Config{MaxServers: 8, MaxServerMemory: 64 << 30})
	require.NoError(t, err)
	ds := obs(p, near, near)
	require.Len(t, ds, 1)
	assert.Equal(t, AddServer, ds[0].Kind)
	assert.Equal(t, 3, ds[0].Shape.Servers, "1.5 times the memory in all")
	assert.Equal(t, s.Server, ds[0].Shape.Server)
	assert.Contains(t, ds[0].Reason, "moves 33% of the rows")
	p, err = NewPlanner(Config{MaxServers: 8, MaxServerMemory: 64 << 30})
	require.NoError(t, err)
	ds = obs(p, near, far)
	require.Len(t, ds, 1)
	assert.Equal(t, RestartServer, ds[0].Kind)
	assert.Equal(t, int64(15<<30), ds[0].Size.Memory)
	// When the servers a spread needs would take workers from the quota's cores, the servers
	// are restarted larger.
	p, err = NewPlanner(Config{MaxServers: 8, MaxServerMemory: 64 << 30, MaxCPU: s.CPU() + 3})
	require.NoError(t, err)
	ds = obs(p, near, near)
	require.Len(t, ds, 2)
	assert.Equal(t, RestartServer, ds[0].Kind)
	assert.Equal(t, 4, ds[0].Shape.Workers)
	// At MaxServers the servers are restarted larger.
	p, err = NewPlanner(Config{MaxServers: 2, MaxServerMemory: 64 << 30})
	require.NoError(t, err)
	ds = obs(p, near, near)
	require.Len(t, ds, 2)
	assert.Equal(t, RestartServer, ds[0].Kind)
}

// coresSeen: cores used while working below a process's cores bound what it can use; a
// process that used all it had says it might use more, unless a right-size of the bound
// explains it.
func TestCoresSeen(t *testing.T) {
	var c coresSeen
	assert.Zero(t, c.bound(1.15, 0.5))
	c.add(3, 8)
	assert.Equal(t, 3.0, c.bound(1.15, 0.5))
	c.add(3.5, 3.5) // right-sized to 3.5 and using all of it: within what the bound allows
	assert.InDelta(t, 3.43, c.bound(1.15, 0.5), 0.01)
	c.add(6, 6) // used all of 6: it can use at least 6
	assert.Zero(t, c.bound(1.15, 0.5))
	v, atLeast := c.record(1.15, 0.5)
	assert.Equal(t, 6.0, v)
	assert.True(t, atLeast)
	c.add(7, 12)
	v, atLeast = c.record(1.15, 0.5)
	assert.Equal(t, 7.0, v)
	assert.False(t, atLeast)
}
