package embedding

import "math"

// initRow writes the initial weights of id into w (len Dim). The values are a pure function of
// (seed, id, Init): element j is drawn from a counter-based generator keyed by the pair, so any
// process computes the same row.
func (t *Table) initRow(id uint64, w []float32) {
	scale := t.cfg.Init.Scale
	base := mix64(t.cfg.Seed ^ mix64(id+golden))
	switch t.cfg.Init.Kind {
	case InitZeros:
		clear(w)
	case InitUniform:
		for j := range w {
			u := mix64(base + uint64(j+1)*golden)
			// 24 random bits -> [0,1) -> [-scale, scale)
			w[j] = (float32(u>>40)*(1.0/(1<<23)) - 1) * scale
		}
	case InitNormal:
		for j := range w {
			w[j] = float32(normal(base, uint64(j))) * scale
		}
	case InitTruncatedNormal:
		d := uint64(len(w))
		for j := range w {
			z := normal(base, uint64(j))
			for k := uint64(1); math.Abs(z) > 2; k++ {
				z = normal(base, uint64(j)+k*d)
			}
			w[j] = float32(z) * scale
		}
	}
}

// normal returns a standard normal draw for counter i from key base (Box-Muller; even counters
// take the cosine branch and odd counters the sine branch of the same pair).
func normal(base, i uint64) float64 {
	p := i >> 1
	a := mix64(base + (2*p+1)*golden)
	b := mix64(base + (2*p+2)*golden)
	u1 := (float64(a>>11) + 1) * (1.0 / (1 << 53)) // (0, 1]
	u2 := float64(b>>11) * (1.0 / (1 << 53))       // [0, 1)
	r := math.Sqrt(-2 * math.Log(u1))
	if i&1 == 0 {
		return r * math.Cos(2*math.Pi*u2)
	}
	return r * math.Sin(2*math.Pi*u2)
}

// initState writes the initial optimizer state of a new row into st.
func (t *Table) initState(st []float32) {
	switch t.cfg.Optimizer.Kind {
	case Adagrad, RowWiseAdagrad:
		for j := range st {
			st[j] = t.cfg.Optimizer.InitialAccumulator
		}
	default:
		clear(st)
	}
}
