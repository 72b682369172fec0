package autoscale

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// truth is a model in the range of a CTR job: 400 us of worker compute per sample on one
// core, 150 us of server work per sample on one server core.
var truth = Model{Base: 20e-6, WorkerCompute: 400e-6, ServerCompute: 150e-6, PerWorker: 2e-6, PerServer: 5e-6}

// synthetic returns n samples of m at random shapes, the throughput off by a seeded
// multiplicative noise of relative size noise.
func synthetic(m Model, n int, noise float64, seed uint64) []Sample {
	rng := rand.New(rand.NewPCG(seed, 7))
	cores := []float64{1, 2, 4, 8}
	out := make([]Sample, n)
	for i := range out {
		s := Shape{
			Workers: 1 + rng.IntN(32), Servers: 1 + rng.IntN(16),
			Worker: Resources{CPU: cores[rng.IntN(4)]}, Server: Resources{CPU: cores[rng.IntN(4)]},
		}
		out[i] = Sample{Shape: s, Throughput: m.Throughput(s) * math.Exp(noise*rng.NormFloat64())}
	}
	return out
}

func TestFitRecoversCoefficients(t *testing.T) {
	for _, noise := range []float64{0, 0.02, 0.05} {
		fit, err := Fit(synthetic(truth, 300, noise, 42), nil)
		require.NoError(t, err)
		got, want := fit.coef(), truth.coef()
		for k := range want {
			// Each coefficient within 5% per 1% of noise (and 1e-9 s absolute).
			tol := math.Max(5*noise, 1e-6)*want[k] + 1e-9
			assert.InDelta(t, want[k], got[k], tol, "noise %g: coefficient %d of %v", noise, k, fit)
		}
	}
}

// TestFitZeroCoefficient: a term the job does not have fits to zero, never below, where an
// unconstrained fit of the same noisy samples goes negative.
func TestFitZeroCoefficient(t *testing.T) {
	m := truth
	m.PerServer = 0
	m.PerWorker = 0
	samples := synthetic(m, 200, 0.05, 9)
	fit, err := Fit(samples, nil)
	require.NoError(t, err)
	for k, c := range fit.coef() {
		assert.GreaterOrEqual(t, c, 0.0, "coefficient %d", k)
	}
	// Within half a microsecond per sample per process, against terms of 20 to 400.
	assert.InDelta(t, 0, fit.PerServer, 5e-7)
	assert.InDelta(t, 0, fit.PerWorker, 5e-7)
	// The unconstrained solution (every column free) has a negative entry for this seed, so
	// the constraint is what keeps the fit above zero.
	rows := make([][]float64, len(samples))
	ys := make([]float64, len(samples))
	for i, s := range samples {
		f := features(s.Shape)
		y := float64(s.Shape.Workers) / s.Throughput
		for k := range f {
			f[k] /= y
		}
		rows[i], ys[i] = f[:], 1
	}
	ls := solveFree(rows, ys, []bool{true, true, true, true, true})
	require.NotNil(t, ls)
	assert.Less(t, min(ls[3], ls[4]), 0.0, "unconstrained %v", ls)
}

// TestFitPrior: samples at one shape do not determine how the job scales; the prior fills in
// the terms they leave open, while the fit still matches the samples.
func TestFitPrior(t *testing.T) {
	s := Shape{Workers: 4, Servers: 2, Worker: Resources{CPU: 4}, Server: Resources{CPU: 4}}
	var samples []Sample
	for range 20 {
		samples = append(samples, Sample{Shape: s, Throughput: truth.Throughput(s)})
	}
	fit, err := Fit(samples, &Prior{Model: truth, Weight: 1})
	require.NoError(t, err)
	bigger := s
	bigger.Workers, bigger.Servers = 16, 8
	assert.InEpsilon(t, truth.Throughput(s), fit.Throughput(s), 1e-3)
	assert.InEpsilon(t, truth.Throughput(bigger), fit.Throughput(bigger), 0.02)
	// With a prior 3 times as slow the fit stays on the samples.
	slow := Model{Base: 3 * truth.Base, WorkerCompute: 3 * truth.WorkerCompute, ServerCompute: 3 * truth.ServerCompute, PerWorker: 3 * truth.PerWorker, PerServer: 3 * truth.PerServer}
	fit, err = Fit(samples, &Prior{Model: slow, Weight: 1})
	require.NoError(t, err)
	assert.InEpsilon(t, truth.Throughput(s), fit.Throughput(s), 0.1)
	// The prior alone is the fit.
	fit, err = Fit(nil, &Prior{Model: truth, Weight: 1})
	require.NoError(t, err)
	assert.InEpsilon(t, truth.Throughput(bigger), fit.Throughput(bigger), 1e-9)
}

func TestFitErrors(t *testing.T) {
	_, err := Fit(nil, nil)
	assert.ErrorIs(t, err, ErrNoModel)
	s := Shape{Workers: 1, Servers: 1, Worker: Resources{CPU: 1}, Server: Resources{CPU: 1}}
	_, err = Fit([]Sample{{Shape: s, Throughput: 0}, {Shape: Shape{}, Throughput: 5}}, nil)
	assert.ErrorIs(t, err, ErrInvalidSample)
	assert.ErrorContains(t, err, "sample 0")
	assert.ErrorContains(t, err, "sample 1")
	assert.Zero(t, truth.Throughput(Shape{}))
	assert.Zero(t, Model{}.Throughput(s))
}

// TestModelShape: throughput is concave and saturating in the workers, and peaks in the
// servers where the doc says.
func TestModelShape(t *testing.T) {
	s := Shape{Servers: 2, Worker: Resources{CPU: 4}, Server: Resources{CPU: 4}}
	prev, prevGain := 0.0, math.Inf(1)
	for w := 1; w <= 200; w++ {
		s.Workers = w
		x := truth.Throughput(s)
		gain := x - prev
		require.Greater(t, gain, 0.0, "w=%d", w)
		require.Less(t, gain, prevGain, "w=%d", w)
		prev, prevGain = x, gain
	}
	limit := 1 / (truth.ServerCompute/(2*4) + truth.PerWorker)
	assert.Less(t, prev, limit)
	assert.Greater(t, prev, 0.8*limit)

	s.Workers = 32
	best, bestP := 0.0, 0
	for p := 1; p <= 64; p++ {
		s.Servers = p
		if x := truth.Throughput(s); x > best {
			best, bestP = x, p
		}
	}
	want := math.Sqrt(truth.ServerCompute * 32 / (4 * truth.PerServer))
	assert.InDelta(t, want, float64(bestP), 1)
}

// TestFitShares: measured at a few worker counts and one server count, the throughput alone
// cannot tell the servers' work from the contention of more workers (both grow with w/p at a
// fixed p); the measured compute and serve shares of the step can, and the fit then predicts
// what more servers would do. Workers are free to change, servers are not: this is what lets
// a job learn its servers' worth without moving a row.
func TestFitShares(t *testing.T) {
	measure := func(s Shape, shares bool) Sample {
		compute, serve, _ := truth.Terms(s)
		step := truth.SecondsPerSample(s)
		sm := Sample{Shape: s, Throughput: truth.Throughput(s), Weight: 10}
		if shares {
			sm.Compute, sm.Serve = compute/step, serve/step
		}
		return sm
	}
	s := Shape{Workers: 4, Servers: 2, Worker: Resources{CPU: 4}, Server: Resources{CPU: 4}}
	one := measure(s, true)
	fit, err := Fit([]Sample{one}, nil)
	require.NoError(t, err)
	assert.InEpsilon(t, truth.WorkerCompute, fit.WorkerCompute, 1e-3, "one shape's shares give the compute term")
	assert.InEpsilon(t, truth.ServerCompute, fit.ServerCompute, 1e-3, "and the serve term")

	// What one server count leaves open is only the fixed cost per server against the fixed
	// cost per sample (Base, 20 us, against PerServer, 5 us a server), a tenth of the step.
	servers := with(s, 2, 2) // 6 workers, 4 servers
	var miss [2]float64
	for i, shares := range []bool{true, false} {
		fit, err := Fit([]Sample{measure(s, shares), measure(with(s, 2, 0), shares), measure(with(s, 4, 0), shares)}, nil)
		require.NoError(t, err)
		assert.InEpsilon(t, truth.Throughput(with(s, 12, 0)), fit.Throughput(with(s, 12, 0)), 0.02, "more workers, shares %v", shares)
		miss[i] = math.Abs(fit.Throughput(servers)/truth.Throughput(servers) - 1)
		t.Logf("shares %v: %v, %.1f%% off at 4 servers", shares, fit, 100*miss[i])
	}
	assert.Less(t, miss[0], 0.1, "more servers predicted from the shares")
	assert.Greater(t, miss[1], 3*miss[0], "more servers cannot be predicted from the throughput alone")
	// A share outside [0, 1] is invalid.
	bad := one
	bad.Serve = 1.5
	_, err = Fit([]Sample{bad}, nil)
	assert.ErrorIs(t, err, ErrInvalidSample)
}

// TestModelCores: cores beyond the bound add nothing; the prior's bounds carry to the fit and
// bound its samples' cores.
func TestModelCores(t *testing.T) {
	m := truth
	m.WorkerCores, m.ServerCores = 2, 3
	s := Shape{Workers: 4, Servers: 2, Worker: Resources{CPU: 2}, Server: Resources{CPU: 3}}
	big := s
	big.Worker.CPU, big.Server.CPU = 8, 8
	assert.Equal(t, m.Throughput(s), m.Throughput(big))
	small := s
	small.Worker.CPU = 1
	assert.Less(t, m.Throughput(small), m.Throughput(s))
	assert.Contains(t, m.String(), "cw <= 2")
	// Samples of a job whose workers use 2 cores, measured at 2 and at 8 cores a worker, fit
	// one model with the bound and are contradictory without it.
	samples := []Sample{{Shape: s, Throughput: m.Throughput(s)}, {Shape: big, Throughput: m.Throughput(big)}}
	for _, sh := range []Shape{with(s, 4, 0), with(big, 0, 2), with(s, 0, 1)} {
		samples = append(samples, Sample{Shape: sh, Throughput: m.Throughput(sh)})
	}
	fit, err := Fit(samples, &Prior{Model: Model{WorkerCores: 2, ServerCores: 3}})
	require.NoError(t, err)
	assert.Equal(t, 2.0, fit.WorkerCores)
	for _, sm := range samples {
		assert.InEpsilon(t, sm.Throughput, fit.Throughput(sm.Shape), 1e-3, "%v", sm.Shape)
	}
	unbounded, err := Fit(samples, nil)
	require.NoError(t, err)
	worst := 0.0
	for _, sm := range samples {
		worst = math.Max(worst, math.Abs(unbounded.Throughput(sm.Shape)/sm.Throughput-1))
	}
	assert.Greater(t, worst, 0.05)
}
