package autoscale

import (
	"fmt"
	"math"
)

// NNLS solves the non-negative least-squares problem: the x >= 0 that minimises ||A x - b||,
// for the m-by-n matrix a given by rows (every row of length n) and b of length m. It is the
// active-set method of Lawson and Hanson (Solving Least Squares Problems, 1974, chapter 23):
// the variables held at zero leave the zero set one at a time, the one whose gradient most
// promises to reduce the residual first, and each step solves an unconstrained least-squares
// problem over the free variables by Householder QR, stepping back to the boundary when a free
// variable would turn negative. It returns ErrDimension for ragged or empty input and
// ErrNotConverged when the iteration limit (3n outer steps) is reached, which takes a badly
// conditioned problem. a and b are not modified.
func NNLS(a [][]float64, b []float64) ([]float64, error) {
	m := len(a)
	if m == 0 || len(b) != m || len(a[0]) == 0 {
		return nil, fmt.Errorf("%w: %d rows, %d targets", ErrDimension, m, len(b))
	}
	n := len(a[0])
	for i, row := range a {
		if len(row) != n {
			return nil, fmt.Errorf("%w: row %d has %d columns, row 0 has %d", ErrDimension, i, len(row), n)
		}
	}
	// The tolerance on the gradient scales with the size of the problem's numbers.
	var scale float64
	for i := range a {
		for _, v := range a[i] {
			scale = math.Max(scale, math.Abs(v))
		}
	}
	var bmax float64
	for _, v := range b {
		bmax = math.Max(bmax, math.Abs(v))
	}
	tol := 1e-12 * math.Max(scale, 1e-300) * math.Max(bmax, 1e-300) * float64(m*n)

	x := make([]float64, n)
	free := make([]bool, n)
	w := make([]float64, n)
	// blocked marks the variables that could not be freed at the current x (their free
	// solution was dependent or pointed below zero); any change of x clears it.
	blocked := make([]bool, n)
	for iter := 0; ; iter++ {
		gradient(a, b, x, w)
		j := -1
		for k := range n {
			if !free[k] && !blocked[k] && w[k] > tol && (j < 0 || w[k] > w[j]) {
				j = k
			}
		}
		if j < 0 {
			return x, nil
		}
		if iter >= 3*n {
			return x, fmt.Errorf("%w after %d steps", ErrNotConverged, iter)
		}
		free[j] = true
		for inner := 0; ; inner++ {
			if inner > 3*n {
				return x, fmt.Errorf("%w: inner loop", ErrNotConverged)
			}
			z := solveFree(a, b, free)
			if z == nil || (inner == 0 && z[j] <= 0) {
				// The free columns are dependent, or freeing j does not move it above zero
				// (rounding): leave it at zero until x changes.
				free[j] = false
				blocked[j] = true
				break
			}
			clear(blocked)
			// Step from x towards z, stopping where the first free variable reaches zero.
			alpha, feasible := 1.0, true
			for k := range n {
				if free[k] && z[k] <= 0 {
					feasible = false
					if t := x[k] / (x[k] - z[k]); t < alpha {
						alpha = t
					}
				}
			}
			if feasible {
				copy(x, z)
				break
			}
			for k := range n {
				if free[k] {
					x[k] += alpha * (z[k] - x[k])
					if x[k] <= 1e-15*math.Max(1, math.Abs(z[k])) {
						x[k] = 0
						free[k] = false
					}
				}
			}
		}
	}
}

// gradient sets w to the negative gradient of the squared residual: A^T (b - A x).
func gradient(a [][]float64, b, x, w []float64) {
	clear(w)
	for i, row := range a {
		r := b[i]
		for k, v := range row {
			r -= v * x[k]
		}
		for k, v := range row {
			w[k] += v * r
		}
	}
}

// solveFree solves the unconstrained least-squares problem over the free columns and returns
// the solution with zeros in the other places, or nil if the free columns are numerically
// dependent.
func solveFree(a [][]float64, b []float64, free []bool) []float64 {
	var cols []int
	for k, f := range free {
		if f {
			cols = append(cols, k)
		}
	}
	m, p := len(a), len(cols)
	if p > m {
		return nil
	}
	// Column-major copy of the free columns, with b beside them.
	q := make([][]float64, p)
	for c, k := range cols {
		q[c] = make([]float64, m)
		for i := range m {
			q[c][i] = a[i][k]
		}
	}
	y := append([]float64(nil), b...)
	// Householder QR: column c is reflected onto e_c, and the reflection applied to the later
	// columns and to y.
	for c := range p {
		col := q[c]
		var norm float64
		for i := c; i < m; i++ {
			norm = math.Hypot(norm, col[i])
		}
		var orig float64
		for i := range m {
			orig = math.Max(orig, math.Abs(a[i][cols[c]]))
		}
		if norm <= 1e-12*orig || norm == 0 {
			return nil
		}
		alpha := -math.Copysign(norm, col[c])
		v := make([]float64, m-c)
		copy(v, col[c:])
		v[0] -= alpha
		var vv float64
		for _, e := range v {
			vv += e * e
		}
		reflect := func(u []float64) {
			var d float64
			for i, e := range v {
				d += e * u[c+i]
			}
			f := 2 * d / vv
			for i, e := range v {
				u[c+i] -= f * e
			}
		}
		for c2 := c; c2 < p; c2++ {
			reflect(q[c2])
		}
		reflect(y)
	}
	// Back substitution on the upper triangle R x = Q^T y.
	z := make([]float64, p)
	for c := p - 1; c >= 0; c-- {
		s := y[c]
		for c2 := c + 1; c2 < p; c2++ {
			s -= q[c2][c] * z[c2]
		}
		z[c] = s / q[c][c]
	}
	out := make([]float64, len(free))
	for c, k := range cols {
		out[k] = z[c]
	}
	return out
}
