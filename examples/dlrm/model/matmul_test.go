package model

import (
	"math"
	"math/rand/v2"
	"testing"
)

func naiveGemm(c, a, b []float32, m, n, k, as, ps int, acc bool) {
	for i := range m {
		for j := range n {
			var s float64
			for p := range k {
				s += float64(a[i*as+p*ps]) * float64(b[p*n+j])
			}
			if acc {
				c[i*n+j] += float32(s)
			} else {
				c[i*n+j] = float32(s)
			}
		}
	}
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// TestGemmMatchesNaive covers every remainder path (k mod 4, n == 1),
// transposed A and accumulation.
func TestGemmMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, m := range []int{1, 3, 8} {
		for _, n := range []int{1, 2, 5, 16} {
			for _, k := range []int{1, 3, 4, 7, 13} {
				for _, trans := range []bool{false, true} {
					for _, acc := range []bool{false, true} {
						a, b := randSlice(r, m*k), randSlice(r, k*n)
						as, ps := k, 1
						if trans {
							as, ps = 1, m
						}
						got, want := randSlice(r, m*n), make([]float32, m*n)
						copy(want, got)
						gemm(got, a, b, m, n, k, as, ps, acc)
						naiveGemm(want, a, b, m, n, k, as, ps, acc)
						for i := range got {
							if math.Abs(float64(got[i]-want[i])) > 1e-4*(1+math.Abs(float64(want[i]))) {
								t.Fatalf("m=%d n=%d k=%d trans=%v acc=%v: c[%d] = %v, want %v", m, n, k, trans, acc, i, got[i], want[i])
							}
						}
					}
				}
			}
		}
	}
}

func TestTranspose(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	for _, sh := range [][2]int{{1, 1}, {3, 70}, {65, 33}} {
		rows, cols := sh[0], sh[1]
		src := randSlice(r, rows*cols)
		dst := make([]float32, rows*cols)
		transpose(dst, src, rows, cols)
		for i := range rows {
			for j := range cols {
				if dst[j*rows+i] != src[i*cols+j] {
					t.Fatalf("%dx%d: (%d,%d) not transposed", rows, cols, i, j)
				}
			}
		}
	}
}

// BenchmarkGemm compares the kernel with a plain triple loop (float32
// accumulation, same memory order as a textbook i-j-p loop) on the largest
// product of the default model: the first top layer, batch 256.
func BenchmarkGemm(b *testing.B) {
	const m, n, k = 256, 128, 367
	r := rand.New(rand.NewPCG(3, 3))
	a, bm, c := randSlice(r, m*k), randSlice(r, k*n), make([]float32, m*n)
	flops := 2.0 * m * n * k
	b.Run("kernel", func(b *testing.B) {
		for b.Loop() {
			gemm(c, a, bm, m, n, k, k, 1, false)
		}
		b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	})
	b.Run("baseline-triple-loop", func(b *testing.B) {
		for b.Loop() {
			for i := range m {
				for j := range n {
					var s float32
					for p := range k {
						s += a[i*k+p] * bm[p*n+j]
					}
					c[i*n+j] = s
				}
			}
		}
		b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	})
}
