package autoscale

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bruteNNLS solves the problem by trying every set of free variables: the solution is the
// unconstrained least-squares solution over some set, non-negative, with no gradient that
// would lower the residual by freeing another variable (the KKT conditions). It solves the
// normal equations by Gaussian elimination, independent of the QR NNLS uses.
func bruteNNLS(a [][]float64, b []float64) []float64 {
	n := len(a[0])
	best, bestRes := make([]float64, n), residual(a, b, make([]float64, n))
	for set := 1; set < 1<<n; set++ {
		var cols []int
		for k := range n {
			if set&(1<<k) != 0 {
				cols = append(cols, k)
			}
		}
		p := len(cols)
		// Normal equations (A_S^T A_S) z = A_S^T b as an augmented matrix.
		g := make([][]float64, p)
		for r := range p {
			g[r] = make([]float64, p+1)
			for c := range p {
				for i := range a {
					g[r][c] += a[i][cols[r]] * a[i][cols[c]]
				}
			}
			for i := range a {
				g[r][p] += a[i][cols[r]] * b[i]
			}
		}
		ok := true
		for c := range p {
			piv := c
			for r := c + 1; r < p; r++ {
				if math.Abs(g[r][c]) > math.Abs(g[piv][c]) {
					piv = r
				}
			}
			if math.Abs(g[piv][c]) < 1e-14 {
				ok = false
				break
			}
			g[c], g[piv] = g[piv], g[c]
			for r := range p {
				if r != c {
					f := g[r][c] / g[c][c]
					for k := c; k <= p; k++ {
						g[r][k] -= f * g[c][k]
					}
				}
			}
		}
		if !ok {
			continue
		}
		x := make([]float64, n)
		for c, k := range cols {
			x[k] = g[c][p] / g[c][c]
			if x[k] < 0 {
				ok = false
			}
		}
		if !ok {
			continue
		}
		if r := residual(a, b, x); r < bestRes {
			best, bestRes = x, r
		}
	}
	return best
}

func residual(a [][]float64, b, x []float64) float64 {
	var s float64
	for i, row := range a {
		r := b[i]
		for k, v := range row {
			r -= v * x[k]
		}
		s += r * r
	}
	return s
}

// TestNNLSMatchesBruteForce compares NNLS with the exhaustive search on random problems, many
// of whose unconstrained solutions have negative entries.
func TestNNLSMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	bound := 0
	for trial := range 500 {
		n := 1 + rng.IntN(6)
		m := n + rng.IntN(10)
		a := make([][]float64, m)
		b := make([]float64, m)
		for i := range a {
			a[i] = make([]float64, n)
			for k := range a[i] {
				a[i][k] = rng.NormFloat64() * math.Pow(10, float64(rng.IntN(3)-1))
			}
			b[i] = rng.NormFloat64() * 3
		}
		x, err := NNLS(a, b)
		require.NoError(t, err, "trial %d", trial)
		want := bruteNNLS(a, b)
		for k := range x {
			require.GreaterOrEqual(t, x[k], 0.0, "trial %d", trial)
			if want[k] == 0 {
				bound++
			}
		}
		rx, rw := residual(a, b, x), residual(a, b, want)
		require.InDelta(t, rw, rx, 1e-9*(1+rw), "trial %d: residual %g, optimum %g", trial, rx, rw)
		for k := range x {
			assert.InDelta(t, want[k], x[k], 1e-6*(1+math.Abs(want[k])), "trial %d x[%d]", trial, k)
		}
	}
	// The constraints must have been binding often, or the test says nothing about them.
	assert.Greater(t, bound, 300)
}

func TestNNLSDimensions(t *testing.T) {
	_, err := NNLS(nil, nil)
	assert.ErrorIs(t, err, ErrDimension)
	_, err = NNLS([][]float64{{1, 2}, {3}}, []float64{1, 2})
	assert.ErrorIs(t, err, ErrDimension)
	_, err = NNLS([][]float64{{1, 2}}, []float64{1, 2})
	assert.ErrorIs(t, err, ErrDimension)
	// A dependent column (twice another) and a zero column still give the optimum.
	x, err := NNLS([][]float64{{1, 2, 0}, {2, 4, 0}, {3, 6, 0}}, []float64{2, 4, 6})
	require.NoError(t, err)
	assert.InDelta(t, 2, x[0]+2*x[1], 1e-9)
	assert.Zero(t, x[2])
}
