package autoscale

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func exact(vs ...float64) []bound {
	out := make([]bound, len(vs))
	for i, v := range vs {
		out[i] = bound{v: v}
	}
	return out
}

// TestQuantile: of n values the estimate is the k-th smallest where k/(n+1) reaches q (a
// value drawn anew falls below the k-th of n with chance k/(n+1)); lower bounds count as
// censored, and a q the estimate cannot reach is not given.
func TestQuantile(t *testing.T) {
	vs := exact(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19)
	for _, tc := range []struct{ q, want float64 }{{0.5, 10}, {0.8, 16}, {0.95, 19}, {0.05, 1}} {
		v, ok := quantile(vs, tc.q)
		require.True(t, ok)
		assert.Equal(t, tc.want, v, "q %g", tc.q)
	}
	// The 3rd of 4 values is above a new one only 3 times in 5: the 75% quantile of 4 values
	// is their largest.
	v, ok := quantile(exact(1, 2, 3, 4), 0.75)
	require.True(t, ok)
	assert.Equal(t, 4.0, v)
	// The 95% quantile of five values is beyond their largest: their largest is all they say.
	_, ok = quantile(exact(1, 2, 3, 4, 5), 0.95)
	assert.True(t, ok)
	// A value known only to be at least 3 (the process used all it had) moves the estimate up:
	// its weight goes to the values above it.
	mixed := exact(1, 2, 4, 5, 6, 7, 8, 9, 10)
	mixed = append(mixed, bound{3, true})
	plain := append(exact(1, 2, 4, 5, 6, 7, 8, 9, 10), bound{v: 3})
	m, ok := quantile(mixed, 0.5)
	require.True(t, ok)
	p, _ := quantile(plain, 0.5)
	assert.Greater(t, m, p)
	// When the largest values are all lower bounds the estimate stops short of q ...
	top := append(exact(1, 2, 3), bound{10, true}, bound{11, true}, bound{12, true})
	_, ok = quantile(top, 0.8)
	assert.False(t, ok)
	// ... and the quantile is at least the largest of them.
	v, ok = quantileAtLeast(top, 0.8)
	assert.True(t, ok)
	assert.Equal(t, 12.0, v)
	_, ok = quantile(nil, 0.5)
	assert.False(t, ok)
}

// TestMemoryPerByte: the memory per model byte of a first plan is at least the q-quantile
// of the earlier jobs' measures, and higher for a job that runs briefly against the restore
// of its rows, where running out costs far more than the memory held.
func TestMemoryPerByte(t *testing.T) {
	var vs []float64
	for i := range 100 {
		vs = append(vs, 1+float64(i)/100) // 1.00 .. 1.99
	}
	q95, risk := memoryPerByte(vs, 0.95, 0, 0)
	assert.InDelta(t, 1.95, q95, 1e-9, "the 96th of 100 (96/101 >= 0.95)")
	assert.InDelta(t, 5.0/101, risk, 1e-9, "a new value is above the 96th of 100 with chance 5/101")
	long, _ := memoryPerByte(vs, 0.95, 10*3600, 600)
	assert.Equal(t, q95, long, "a long job: the quantile")
	short, risk := memoryPerByte(vs, 0.95, 60, 3600)
	assert.InDelta(t, 1.99, short, 1e-9, "a one-minute job against an hour's restore: the largest")
	assert.InDelta(t, 1.0/101, risk, 1e-9)
	mid, _ := memoryPerByte(vs, 0.95, 3600, 3*3600)
	assert.GreaterOrEqual(t, mid, q95)
	assert.LessOrEqual(t, mid, short)
}

// records returns n earlier jobs of kind dlrm whose users asked for 2 workers of 8 cores and
// 2 servers of 64 cores, whose processes could use a seeded log-normal share of that (median
// 0.45 for workers, 0.35 for servers), and whose rows took 1 to 1.4 bytes per model byte.
func records(n int, m Model) []JobRecord {
	r := rand.New(rand.NewPCG(11, 12))
	req := Shape{Workers: 2, Servers: 2, Worker: Resources{CPU: 8, Memory: 40 << 30}, Server: Resources{CPU: 64, Memory: 320 << 30}}
	var out []JobRecord
	for i := range n {
		model := int64(200 << 30)
		mm := m
		out = append(out, JobRecord{
			Job:     "earlier",
			Profile: JobProfile{Kind: "dlrm", ModelBytes: model, DatasetSamples: 1e9, BatchSize: 512, Request: req},
			Shape:   req, Model: &mm,
			WorkerCores:      8 * 0.45 * math.Exp(0.5*r.NormFloat64()),
			ServerCores:      64 * 0.35 * math.Exp(0.5*r.NormFloat64()),
			PeakWorkerMemory: 20 << 30,
			PeakRowMemory:    int64(float64(model) * (1 + 0.4*float64(i)/float64(n))),
		})
	}
	return out
}

// TestBeginSizesFromTheRequest: with the user's request and earlier jobs that kept theirs, the
// first plan gives each process what those jobs' processes used of their requests; a role
// whose term of the step is larger gets more of the spread; memory per model byte comes from
// all of them; no process gets more than was asked; the rows' memory beyond what the user
// gave the servers raises the memory quota.
func TestBeginSizesFromTheRequest(t *testing.T) {
	req := Shape{Workers: 2, Servers: 2, Worker: Resources{CPU: 8, Memory: 40 << 30}, Server: Resources{CPU: 64, Memory: 320 << 30}}
	profile := JobProfile{Kind: "dlrm", ModelBytes: 200 << 30, DatasetSamples: 1e9, BatchSize: 512, Request: req}
	plan := func(m Model, cfg Config) Decision {
		t.Helper()
		p, err := NewPlanner(cfg)
		require.NoError(t, err)
		d, err := p.Begin(profile, records(40, m), t0)
		require.NoError(t, err)
		return d
	}
	// Per sample: 100 us of a worker's computation on 4 cores, 400 us of the servers' on 20
	// cores: the servers hold the step.
	serverBound := Model{WorkerCompute: 400e-6, ServerCompute: 8e-3, PerWorker: 2e-6, PerServer: 2e-6}
	// The reverse: the workers hold the step.
	workerBound := Model{WorkerCompute: 1600e-6, ServerCompute: 1e-3, PerWorker: 2e-6, PerServer: 2e-6}
	quota := Config{MaxCPU: req.CPU(), MaxMemory: req.Memory(), MaxWorkers: 2, MinWorkers: 2, MaxServers: 2, MinServers: 2, MaxServerMemory: 512 << 30}
	sb, wb := plan(serverBound, quota), plan(workerBound, quota)
	for _, d := range []Decision{sb, wb} {
		assert.Equal(t, 2, d.Shape.Workers)
		assert.Equal(t, 2, d.Shape.Servers)
		assert.LessOrEqual(t, d.Shape.Worker.CPU, 8.0)
		assert.LessOrEqual(t, d.Shape.Server.CPU, 64.0)
		assert.Less(t, d.Shape.CPU(), req.CPU(), "%v", d.Shape)
		assert.Contains(t, d.Reason, "sized by what the 20 nearest earlier jobs used of their requests")
		assert.Contains(t, d.Reason, "of the 40 earlier jobs' measures")
		// 1 to 1.4 bytes per model byte, at least the 95% quantile: 1.37 or more.
		assert.GreaterOrEqual(t, float64(d.Shape.Server.Memory)*2, 1.37*float64(200<<30))
		assert.LessOrEqual(t, float64(d.Shape.Server.Memory)*2, 1.41*float64(200<<30))
		// A worker's memory: the 95% quantile of 20 of 40 GiB asked.
		assert.Equal(t, int64(20<<30), d.Shape.Worker.Memory)
	}
	assert.Greater(t, sb.Shape.Server.CPU, wb.Shape.Server.CPU, "servers that hold the step get more of the spread: %v vs %v", sb.Shape, wb.Shape)
	assert.Greater(t, wb.Shape.Worker.CPU, sb.Shape.Worker.CPU, "workers that hold the step get more of it: %v vs %v", wb.Shape, sb.Shape)
	assert.Contains(t, sb.Reason, "could use more")

	// A model larger than the servers were given: the memory quota grows by what the rows
	// need beyond it, and the workers keep their memory.
	big := profile
	big.ModelBytes = 600 << 30
	p, err := NewPlanner(quota)
	require.NoError(t, err)
	d, err := p.Begin(big, records(40, serverBound), t0)
	require.NoError(t, err)
	assert.Greater(t, d.Shape.Memory(), req.Memory())
	assert.Equal(t, 2, d.Shape.Workers)
	assert.Contains(t, d.Reason, "the memory quota grows by")
	assert.Greater(t, p.Config().MaxMemory, req.Memory())

	// A pending server is never shrunk below the median of the cores the records' servers
	// used of their requests (times this one's), whatever it waits.
	p, err = NewPlanner(quota)
	require.NoError(t, err)
	d, err = p.Begin(profile, records(40, serverBound), t0)
	require.NoError(t, err)
	s := d.Shape
	for range 20 {
		ds := p.Observe(Observation{At: t0, Shape: s, Pending: []Pending{{ID: "ps-0", Role: Server, Size: s.Server, Waited: time.Hour}}})
		if len(ds) == 0 {
			break
		}
		s = ds[len(ds)-1].Shape
	}
	var caps []bound
	for _, r := range records(40, serverBound)[:20] {
		caps = append(caps, bound{v: r.ServerCores / 64})
	}
	med, _ := quantile(caps, 0.5)
	assert.Less(t, s.Server.CPU, d.Shape.Server.CPU)
	assert.InDelta(t, roundUp(64*med, 0.5), s.Server.CPU, 1e-9)

	// Too few records keep their requests: the user's sizes, the memory as before.
	p, err = NewPlanner(quota)
	require.NoError(t, err)
	d, err = p.Begin(profile, records(3, serverBound), t0)
	require.NoError(t, err)
	assert.Equal(t, req.Worker.CPU, d.Shape.Worker.CPU)
	assert.Equal(t, req.Server.CPU, d.Shape.Server.CPU)
	assert.NotContains(t, d.Reason, "sized by what")
}
