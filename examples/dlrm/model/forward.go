package model

import "math"

// workspace holds the activations of the last forward pass and the scratch
// of the backward pass, sized for the largest batch seen so far; it grows
// (allocates) only when a larger batch arrives.
type workspace struct {
	capN   int         // batch size the buffers are sized for
	bot    [][]float32 // per bottom layer: n×out post-ReLU outputs
	top    [][]float32 // per top layer: n×out outputs (last = logits)
	inter  []float32   // n×(Fields+1)×dim: bottom output and pooled vectors
	topIn  []float32   // n×(dim+pairs): input of the top MLP
	gradA  []float32   // n×widest: gradient ping-pong buffer
	gradB  []float32   // n×widest: gradient ping-pong buffer
	dInter []float32   // n×(Fields+1)×dim: gradient of inter
	wT     []float32   // widest in×out: a transposed weight matrix
}

func (m *Model) ensure(n int) {
	ws := &m.ws
	if n <= ws.capN {
		return
	}
	f, d := m.cfg.Fields, m.cfg.EmbeddingDim
	widest, wmax := 0, 0
	ws.bot = make([][]float32, len(m.bottom))
	for i, l := range m.bottom {
		ws.bot[i] = make([]float32, n*l.out)
		widest, wmax = max(widest, l.in, l.out), max(wmax, l.in*l.out)
	}
	ws.top = make([][]float32, len(m.top))
	for i, l := range m.top {
		ws.top[i] = make([]float32, n*l.out)
		widest, wmax = max(widest, l.in, l.out), max(wmax, l.in*l.out)
	}
	ws.inter = make([]float32, n*(f+1)*d)
	ws.dInter = make([]float32, n*(f+1)*d)
	ws.topIn = make([]float32, n*m.top[0].in)
	ws.gradA = make([]float32, n*widest)
	ws.gradB = make([]float32, n*widest)
	if len(ws.wT) < wmax {
		ws.wT = make([]float32, wmax)
	}
	ws.capN = n
}

// denseForward computes y = act(x·W + b) for n rows.
func (m *Model) denseForward(y, x []float32, l layer, n int) {
	w := m.params[l.w : l.w+l.in*l.out]
	bias := m.params[l.b : l.b+l.out]
	gemm(y, x, w, n, l.out, l.in, l.in, 1, false)
	for s := range n {
		row := y[s*l.out : s*l.out+l.out]
		row = row[:len(bias)]
		if l.relu {
			for j, bj := range bias {
				if v := row[j] + bj; v > 0 {
					row[j] = v
				} else {
					row[j] = 0
				}
			}
		} else {
			for j, bj := range bias {
				row[j] += bj
			}
		}
	}
}

// forward runs the network on a validated batch and leaves every
// activation in the workspace; the logits are ws.top[last][:b.Size].
func (m *Model) forward(b *Batch) []float32 {
	n := b.Size
	m.ensure(n)
	ws := &m.ws
	f, d := m.cfg.Fields, m.cfg.EmbeddingDim

	x := b.Dense
	for i, l := range m.bottom {
		y := ws.bot[i][:n*l.out]
		m.denseForward(y, x, l, n)
		x = y
	}
	z0 := x // n×d bottom output

	stride := (f + 1) * d
	width := m.top[0].in
	for s := range n {
		t := ws.inter[s*stride : s*stride+stride]
		copy(t[:d], z0[s*d:s*d+d])
		for fi := range f {
			v := t[(fi+1)*d : (fi+2)*d]
			clear(v)
			lo, hi := b.bag(s*f + fi)
			for q := lo; q < hi; q++ {
				r := b.row(q)
				axpy(v, b.weight(q), b.Rows[r*d:r*d+d])
			}
			if m.pooling[fi] == PoolMean && hi-lo > 1 {
				inv := 1 / float32(hi-lo)
				for j := range v {
					v[j] *= inv
				}
			}
		}
		in := ws.topIn[s*width : s*width+width]
		head := m.cfg.topHead()
		copy(in[:head], t[:head])
		k := head
		for i := 0; i < f; i++ {
			ti := t[i*d : i*d+d]
			for j := i + 1; j <= f; j++ {
				in[k] = dot(ti, t[j*d:j*d+d])
				k++
			}
		}
	}

	x = ws.topIn[:n*width]
	for i, l := range m.top {
		y := ws.top[i][:n*l.out]
		m.denseForward(y, x, l, n)
		x = y
	}
	if m.cfg.FirstOrder {
		// The first-order term: each bag's scalars pooled like its rows.
		for s := range n {
			var z float32
			for fi := range f {
				lo, hi := b.bag(s*f + fi)
				var v float32
				for q := lo; q < hi; q++ {
					v += b.weight(q) * b.Biases[b.row(q)]
				}
				if m.pooling[fi] == PoolMean && hi-lo > 1 {
					v /= float32(hi - lo)
				}
				z += v
			}
			x[s] += z
		}
	}
	return x
}

// Predict appends to dst the click probability (sigmoid of the logit) of
// every sample of b, in order, and returns the extended slice. Labels are
// ignored. Predict does not allocate beyond growing dst and, the first time a
// batch is larger than any before, the model's scratch buffers.
func (m *Model) Predict(dst []float32, b *Batch) ([]float32, error) {
	if err := m.check(b, false); err != nil {
		return dst, err
	}
	for _, z := range m.forward(b) {
		dst = append(dst, float32(sigmoid(float64(z))))
	}
	return dst, nil
}

// Logits appends to dst the logit (log-odds of a click) of every sample of
// b, in order, and returns the extended slice. Unlike probabilities,
// logits do not saturate in float32, so they rank confident predictions
// exactly (for AUC) and feed LogLossLogits. Labels are ignored.
func (m *Model) Logits(dst []float32, b *Batch) ([]float32, error) {
	if err := m.check(b, false); err != nil {
		return dst, err
	}
	return append(dst, m.forward(b)...), nil
}

// sigmoid is the logistic function, accurate for large |z|.
func sigmoid(z float64) float64 {
	if z >= 0 {
		return 1 / (1 + math.Exp(-z))
	}
	e := math.Exp(z)
	return e / (1 + e)
}

// bceWithLogits is the binary cross-entropy of label y against logit z,
// computed as max(z,0) - z·y + log(1+exp(-|z|)) so it never overflows.
func bceWithLogits(z, y float64) float64 {
	return math.Max(z, 0) - z*y + math.Log1p(math.Exp(-math.Abs(z)))
}
