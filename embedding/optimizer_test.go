package embedding

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newTestTable(t testing.TB, cfg Config) *Table {
	t.Helper()
	tab, err := New(cfg)
	require.NoError(t, err)
	return tab
}

// steps applies each gradient vector in turn to id 1 and returns the weights after each.
func steps(t *testing.T, opt Optimizer, dim int, grads ...[]float32) [][]float32 {
	tab := newTestTable(t, Config{Dim: dim, Optimizer: opt, Init: Init{Kind: InitZeros}})
	var out [][]float32
	for i, g := range grads {
		require.NoError(t, tab.Apply([]uint64{1}, g, uint32(i+1)))
		r, ok := tab.Row(1)
		require.True(t, ok)
		out = append(out, r.Weights)
	}
	return out
}

func TestOptimizersHandComputed(t *testing.T) {
	near := func(want []float32, got []float32) {
		t.Helper()
		require.Len(t, got, len(want))
		for i := range want {
			assert.InDelta(t, want[i], got[i], 1e-6, "coordinate %d", i)
		}
	}
	t.Run("sgd", func(t *testing.T) {
		w := steps(t, Optimizer{Kind: SGD, LearningRate: 0.5}, 1, []float32{1}, []float32{-3})
		near([]float32{-0.5}, w[0])
		near([]float32{1}, w[1])
	})
	t.Run("adagrad", func(t *testing.T) {
		// a=4, w=-0.1*2/2; a=8, w-=0.1*2/sqrt(8)
		w := steps(t, Optimizer{Kind: Adagrad, LearningRate: 0.1}, 1, []float32{2}, []float32{2})
		near([]float32{-0.1}, w[0])
		near([]float32{-0.1707107}, w[1])
	})
	t.Run("adagrad initial accumulator", func(t *testing.T) {
		// a=0.1+4, w=-0.1*2/sqrt(4.1)
		w := steps(t, Optimizer{Kind: Adagrad, LearningRate: 0.1, InitialAccumulator: 0.1}, 1, []float32{2})
		near([]float32{-0.0987730}, w[0])
	})
	t.Run("rowwise adagrad", func(t *testing.T) {
		// a = mean(1, 9) = 5
		w := steps(t, Optimizer{Kind: RowWiseAdagrad, LearningRate: 0.1}, 2, []float32{1, 3})
		near([]float32{-0.0447214, -0.1341641}, w[0])
	})
	t.Run("adam", func(t *testing.T) {
		// constant gradient: bias-corrected m and v are 1, so each step moves lr.
		// third step: m=0.071, mhat=0.071/0.271, vhat=1.
		w := steps(t, Optimizer{Kind: Adam, LearningRate: 0.1}, 1, []float32{1}, []float32{1}, []float32{-1})
		near([]float32{-0.1}, w[0])
		near([]float32{-0.2}, w[1])
		near([]float32{-0.2261993}, w[2])
	})
	t.Run("ftrl", func(t *testing.T) {
		// n=1, sigma=10, z=1, w=-1/((1+1)/0.1); n=2, sigma=(sqrt2-1)/0.1, z=2+sigma*0.05
		w := steps(t, Optimizer{Kind: FTRL, LearningRate: 0.1}, 1, []float32{1}, []float32{1})
		near([]float32{-0.05}, w[0])
		near([]float32{-0.0914214}, w[1])
	})
	t.Run("ftrl l1", func(t *testing.T) {
		// |z|=1 <= l1 gives 0; then z=2, w=-(2-1)/((1+sqrt2)/0.1)
		w := steps(t, Optimizer{Kind: FTRL, LearningRate: 0.1, L1: 1}, 1, []float32{1}, []float32{1})
		near([]float32{0}, w[0])
		near([]float32{-0.0414214}, w[1])
	})
	t.Run("ftrl l2", func(t *testing.T) {
		// w=-1/(20+1)
		w := steps(t, Optimizer{Kind: FTRL, LearningRate: 0.1, L2: 1}, 1, []float32{1})
		near([]float32{-1.0 / 21}, w[0])
	})
}

// TestL2WeightDecayHandComputed checks L2 on every kind but FTRL (whose L2 is above) with a zero
// gradient: the rule sees g' = L2*w0, so the row shrinks towards 0 by the rule's own step.
func TestL2WeightDecayHandComputed(t *testing.T) {
	const lr, l2 = 0.1, 0.5
	// step applies a zero gradient to id 1 and returns its initial and new weights.
	step := func(t *testing.T, kind OptimizerKind) (w0, w []float32) {
		tab := newTestTable(t, Config{Dim: 2, Seed: 11, Optimizer: Optimizer{Kind: kind, LearningRate: lr, L2: l2},
			Init: Init{Kind: InitUniform, Scale: 2}})
		w0 = make([]float32, 2)
		require.NoError(t, tab.InitialWeights(1, w0))
		require.NoError(t, tab.Apply([]uint64{1}, []float32{0, 0}, 1))
		r, ok := tab.Row(1)
		require.True(t, ok)
		return w0, r.Weights
	}
	sign := func(v float32) float32 {
		if v < 0 {
			return -1
		}
		return 1
	}
	check := func(t *testing.T, kind OptimizerKind, want func(w0 []float32, j int) float32) {
		w0, w := step(t, kind)
		require.NotZero(t, w0[0]*w0[1])
		for j := range w {
			assert.InDelta(t, want(w0, j), w[j], 1e-6, "coordinate %d of %v", j, w0)
		}
	}
	t.Run("sgd", func(t *testing.T) {
		check(t, SGD, func(w0 []float32, j int) float32 { return w0[j] * (1 - lr*l2) })
	})
	t.Run("adagrad", func(t *testing.T) { // a = g'², so the step is lr*sign(g')
		check(t, Adagrad, func(w0 []float32, j int) float32 { return w0[j] - lr*sign(w0[j]) })
	})
	t.Run("rowwise adagrad", func(t *testing.T) { // a = mean(g'²)
		check(t, RowWiseAdagrad, func(w0 []float32, j int) float32 {
			a := l2 * l2 * (w0[0]*w0[0] + w0[1]*w0[1]) / 2
			return w0[j] - lr*l2*w0[j]/float32(math.Sqrt(float64(a)))
		})
	})
	t.Run("adam", func(t *testing.T) { // first step: mhat = g', vhat = g'², so lr*sign(g')
		check(t, Adam, func(w0 []float32, j int) float32 { return w0[j] - lr*sign(w0[j]) })
	})
}

// TestL2Lazy: weight decay acts on the rows a step updates (row 1, zero gradients: it shrinks)
// and on no other row (row 2, created at step 1 and never touched again), however many steps
// pass.
func TestL2Lazy(t *testing.T) {
	for _, kind := range []OptimizerKind{SGD, Adagrad, RowWiseAdagrad, Adam, FTRL} {
		t.Run(kind.String(), func(t *testing.T) {
			tab := newTestTable(t, Config{Dim: 3, Seed: 5, Optimizer: Optimizer{Kind: kind, LearningRate: 0.1, L2: 0.5},
				Init: Init{Kind: InitUniform, Scale: 0.5}})
			require.NoError(t, tab.Apply([]uint64{1, 2}, make([]float32, 6), 1))
			before, ok := tab.Row(2)
			require.True(t, ok)
			one, _ := tab.Row(1)
			for s := uint32(2); s < 50; s++ {
				require.NoError(t, tab.Apply([]uint64{1}, make([]float32, 3), s))
			}
			after, _ := tab.Row(2)
			assert.Equal(t, before.Weights, after.Weights, "an untouched row decayed")
			now, _ := tab.Row(1)
			var n0, n1 float64
			for j := range now.Weights {
				n0 += float64(one.Weights[j] * one.Weights[j])
				n1 += float64(now.Weights[j] * now.Weights[j])
			}
			if kind != FTRL { // FTRL's rows are a function of its accumulators: 0 after zero gradients
				assert.Less(t, n1, 0.5*n0, "the updated row did not shrink under decay")
			}
		})
	}
}

func TestL1OnlyForFTRL(t *testing.T) {
	err := Config{Dim: 2, Optimizer: Optimizer{Kind: Adagrad, L1: 0.1}}.Validate()
	require.ErrorIs(t, err, ErrBadConfig)
	assert.ErrorContains(t, err, "only ftrl has L1")
	assert.NoError(t, Config{Dim: 2, Optimizer: Optimizer{Kind: FTRL, L1: 0.1}}.Validate())
}

// refTable is the naive reference: a Go map of rows updated coordinate by coordinate.
type refTable struct {
	dim  int
	opt  Optimizer
	init func(id uint64) []float32
	rows map[uint64]*refRow
}

type refRow struct {
	w, a, m, v, z, n []float32
	ra               float32
	t                int
}

func (r *refTable) row(id uint64) *refRow {
	if x, ok := r.rows[id]; ok {
		return x
	}
	d := r.dim
	x := &refRow{w: r.init(id), a: make([]float32, d), m: make([]float32, d), v: make([]float32, d), z: make([]float32, d), n: make([]float32, d)}
	for j := range x.a {
		x.a[j] = r.opt.InitialAccumulator
	}
	x.ra = r.opt.InitialAccumulator
	r.rows[id] = x
	return x
}

func (r *refTable) apply(ids []uint64, grads []float32) {
	d := r.dim
	sum := map[uint64][]float32{}
	var order []uint64
	for i, id := range ids {
		if sum[id] == nil {
			sum[id] = make([]float32, d)
			order = append(order, id)
		}
		for j := 0; j < d; j++ {
			sum[id][j] += grads[i*d+j]
		}
	}
	o := r.opt
	for _, id := range order {
		x, g := r.row(id), sum[id]
		if o.Kind != FTRL { // weight decay: the gradient of L2/2*|w|², w before the step
			for j := range g {
				g[j] += o.L2 * x.w[j]
			}
		}
		switch o.Kind {
		case SGD:
			for j := range g {
				x.w[j] -= o.LearningRate * g[j]
			}
		case Adagrad:
			for j := range g {
				x.a[j] += g[j] * g[j]
				x.w[j] -= o.LearningRate * g[j] / (float32(math.Sqrt(float64(x.a[j]))) + o.Eps)
			}
		case RowWiseAdagrad:
			var s float32
			for j := range g {
				s += g[j] * g[j]
			}
			x.ra += s / float32(d)
			for j := range g {
				x.w[j] -= o.LearningRate / (float32(math.Sqrt(float64(x.ra))) + o.Eps) * g[j]
			}
		case Adam:
			x.t++
			c1 := float32(1 - math.Pow(float64(o.Beta1), float64(x.t)))
			c2 := float32(1 - math.Pow(float64(o.Beta2), float64(x.t)))
			for j := range g {
				x.m[j] = o.Beta1*x.m[j] + (1-o.Beta1)*g[j]
				x.v[j] = o.Beta2*x.v[j] + (1-o.Beta2)*g[j]*g[j]
				x.w[j] -= o.LearningRate * (x.m[j] / c1) / (float32(math.Sqrt(float64(x.v[j]/c2))) + o.Eps)
			}
		case FTRL:
			for j := range g {
				n2 := x.n[j] + g[j]*g[j]
				sigma := (float32(math.Sqrt(float64(n2))) - float32(math.Sqrt(float64(x.n[j])))) / o.LearningRate
				x.z[j] += g[j] - sigma*x.w[j]
				x.n[j] = n2
				if float32(math.Abs(float64(x.z[j]))) <= o.L1 {
					x.w[j] = 0
				} else {
					sgn := float32(1)
					if x.z[j] < 0 {
						sgn = -1
					}
					x.w[j] = -(x.z[j] - sgn*o.L1) / ((o.Beta+float32(math.Sqrt(float64(n2))))/o.LearningRate + o.L2)
				}
			}
		}
	}
}

// TestDifferentialAgainstReference runs random batches with repeated ids through a Table and the
// naive reference and compares every row after every batch.
func TestDifferentialAgainstReference(t *testing.T) {
	for _, kind := range []OptimizerKind{SGD, Adagrad, RowWiseAdagrad, Adam, FTRL} {
		t.Run(kind.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(kind)))
			const dim = 5
			cfg := Config{Dim: dim, Seed: 3, Shards: 4, Optimizer: Optimizer{Kind: kind, LearningRate: 0.05, L2: 0.1}}
			if kind == FTRL {
				cfg.Optimizer.L1 = 0.01
			}
			tab := newTestTable(t, cfg)
			ref := &refTable{dim: dim, opt: tab.Config().Optimizer, rows: map[uint64]*refRow{}, init: func(id uint64) []float32 {
				w := make([]float32, dim)
				require.NoError(t, tab.InitialWeights(id, w))
				return w
			}}
			for batch := 0; batch < 60; batch++ {
				n := 1 + rng.IntN(40)
				ids := make([]uint64, n)
				for i := range ids {
					ids[i] = uint64(rng.IntN(30)) * 0x9e3779b97f4a7c15 // few distinct ids: many repeats
				}
				grads := make([]float32, n*dim)
				for i := range grads {
					grads[i] = float32(rng.NormFloat64())
				}
				require.NoError(t, tab.Apply(ids, grads, uint32(batch)))
				ref.apply(ids, grads)
				require.Equal(t, len(ref.rows), tab.Len())
				for id, x := range ref.rows {
					r, ok := tab.Row(id)
					require.True(t, ok)
					for j := range x.w {
						require.InDelta(t, x.w[j], r.Weights[j], 1e-5*(1+math.Abs(float64(x.w[j]))), "batch %d id %d coord %d", batch, id, j)
					}
				}
			}
		})
	}
}

// A zero gradient on a fresh row leaves the accumulators at 0 (the default InitialAccumulator),
// so only Eps keeps Adagrad's and row-wise Adagrad's step from being 0/0: the row must come out
// unchanged and finite, and stay finite through the next real gradient.
func TestAdagradZeroGradientOnFreshRow(t *testing.T) {
	for _, kind := range []OptimizerKind{Adagrad, RowWiseAdagrad} {
		t.Run(kind.String(), func(t *testing.T) {
			tab := newTestTable(t, Config{Dim: 4, Seed: 7, Optimizer: Optimizer{Kind: kind, LearningRate: 0.1},
				Init: Init{Kind: InitUniform, Scale: 0.5}})
			require.NoError(t, tab.Apply([]uint64{9}, []float32{0, 0, 0, 0}, 1))
			r, ok := tab.Row(9)
			require.True(t, ok)
			init := make([]float32, 4)
			require.NoError(t, tab.InitialWeights(9, init))
			for j, w := range r.Weights {
				require.False(t, math.IsNaN(float64(w)) || math.IsInf(float64(w), 0), "weight %d is %v", j, w)
				assert.Equal(t, init[j], w, "weight %d moved on a zero gradient", j)
			}
			require.NoError(t, tab.Apply([]uint64{9}, []float32{1, 0, -1, 0}, 2))
			r, _ = tab.Row(9)
			for j, w := range r.Weights {
				require.False(t, math.IsNaN(float64(w)) || math.IsInf(float64(w), 0), "weight %d is %v after a real step", j, w)
			}
		})
	}
}
