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
