package model

// The three products of a dense layer (forward, weight gradient, input
// gradient) all go through one kernel, gemm, in "axpy" form: every output row
// is built as a sum of scaled rows of b, four at a time, so the inner loop
// walks two contiguous slices with no loop-carried dependency and no bounds
// checks. In pure Go (no SIMD) this measured faster than dot-product and
// register-blocked dot-product kernels on the shapes of this model.

// gemm computes C = A·B (or C += A·B when acc is true) where C is m×n and B is
// k×n, both row-major and contiguous, and A is m×k addressed with strides:
// A(i,p) = a[i*as + p*ps]. With as=k, ps=1 A is row-major; with as=1, ps=m A
// is read transposed (A = Xᵀ for a row-major k×m matrix X).
//
// The caller guarantees len(c) >= m*n, len(b) >= k*n and that every A(i,p)
// index is in range.
func gemm(c, a, b []float32, m, n, k, as, ps int, acc bool) {
	if n == 1 {
		gemv(c, a, b, m, k, as, ps, acc)
		return
	}
	for i := 0; i < m; i++ {
		cr := c[i*n : i*n+n]
		if !acc {
			clear(cr)
		}
		p := 0
		for ; p+4 <= k; p += 4 {
			o := i*as + p*ps
			x0, x1, x2, x3 := a[o], a[o+ps], a[o+2*ps], a[o+3*ps]
			b0 := b[p*n : p*n+n]
			b1 := b[(p+1)*n : (p+1)*n+n]
			b2 := b[(p+2)*n : (p+2)*n+n]
			b3 := b[(p+3)*n : (p+3)*n+n]
			b0, b1, b2, b3 = b0[:len(cr)], b1[:len(cr)], b2[:len(cr)], b3[:len(cr)]
			for j := range cr {
				cr[j] += (x0*b0[j] + x1*b1[j]) + (x2*b2[j] + x3*b3[j])
			}
		}
		for ; p < k; p++ {
			x := a[i*as+p*ps]
			br := b[p*n : p*n+n]
			br = br[:len(cr)]
			for j, y := range br {
				cr[j] += x * y
			}
		}
	}
}

// gemv is gemm for n == 1: c[i] (+)= Σ_p A(i,p)·b[p].
func gemv(c, a, b []float32, m, k, as, ps int, acc bool) {
	b = b[:k]
	for i := 0; i < m; i++ {
		var s0, s1 float32
		o := i * as
		p := 0
		for ; p+2 <= k; p += 2 {
			s0 += a[o+p*ps] * b[p]
			s1 += a[o+(p+1)*ps] * b[p+1]
		}
		if p < k {
			s0 += a[o+p*ps] * b[p]
		}
		if acc {
			c[i] += s0 + s1
		} else {
			c[i] = s0 + s1
		}
	}
}

// transpose writes the transpose of the rows×cols row-major matrix src into
// dst (cols×rows, row-major), in small tiles so both sides stay in cache.
func transpose(dst, src []float32, rows, cols int) {
	const tile = 32
	for r0 := 0; r0 < rows; r0 += tile {
		r1 := min(r0+tile, rows)
		for c0 := 0; c0 < cols; c0 += tile {
			c1 := min(c0+tile, cols)
			for r := r0; r < r1; r++ {
				row := src[r*cols : r*cols+cols]
				for c := c0; c < c1; c++ {
					dst[c*rows+r] = row[c]
				}
			}
		}
	}
}

// axpy computes y += a·x over len(y) entries (len(x) >= len(y)).
func axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i, v := range x {
		y[i] += a * v
	}
}

// dot returns Σ x[i]·y[i] over len(x) entries (len(y) >= len(x)).
func dot(x, y []float32) float32 {
	y = y[:len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		xx := x[i : i+4 : i+4]
		yy := y[i : i+4 : i+4]
		s0 += xx[0] * yy[0]
		s1 += xx[1] * yy[1]
		s2 += xx[2] * yy[2]
		s3 += xx[3] * yy[3]
	}
	for ; i < len(x); i++ {
		s0 += x[i] * y[i]
	}
	return (s0 + s1) + (s2 + s3)
}
