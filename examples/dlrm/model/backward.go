package model

import (
	"fmt"
	"math"
)

// Gradients receives the result of ComputeGradients. Its slices are owned by
// the caller and reused: ComputeGradients resizes each one to the needed
// length, reallocating only when its capacity is too small, so a Gradients
// value kept across steps makes the steady state allocation-free. Keep two
// values to push one batch's gradients while computing the next.
type Gradients struct {
	// Loss is the mean binary cross-entropy of the batch.
	Loss float64
	// Logits holds the Size logits of the forward pass (probability =
	// sigmoid(logit)), for training metrics.
	Logits []float32
	// Dense holds ∂Loss/∂Params: NumParams values laid out like Params
	// (see Model.Tensors).
	Dense []float32
	// Rows holds ∂Loss/∂Batch.Rows: one gradient row per embedding row, in
	// the same layout as Batch.Rows, summed over every bag that references
	// the row (with the reference's weight and the 1/bag-size factor of mean
	// pooling). Rows that no bag references get zeros.
	Rows []float32
	// Biases holds ∂Loss/∂Batch.Biases (Config.FirstOrder): one value per
	// embedding row, summed over its references like Rows. Empty without
	// FirstOrder.
	Biases []float32
}

// resize returns s with length n, reusing its array when large enough.
func resize(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// ComputeGradients runs the forward and backward pass of b and writes the
// mean loss and the gradients of the mean loss with respect to every dense
// parameter and every embedding row into g. It does not change the
// parameters: apply g.Dense with an Optimizer, or push it to the parameter
// servers. On error g is left unspecified.
func (m *Model) ComputeGradients(b *Batch, g *Gradients) error {
	if g == nil {
		return fmt.Errorf("%w: nil Gradients", ErrBatch)
	}
	if err := m.check(b, true); err != nil {
		return err
	}
	n := b.Size
	logits := m.forward(b)
	ws := &m.ws
	f, d := m.cfg.Fields, m.cfg.EmbeddingDim

	g.Logits = resize(g.Logits, n)
	g.Dense = resize(g.Dense, len(m.params))
	g.Rows = resize(g.Rows, len(b.Rows))
	g.Biases = resize(g.Biases, len(b.Biases))
	copy(g.Logits, logits)

	// Loss and its gradient with respect to the logits.
	dOut := ws.gradA[:n]
	var loss float64
	inv := 1 / float64(n)
	for s, z := range logits {
		zz, y := float64(z), float64(b.Labels[s])
		loss += bceWithLogits(zz, y)
		dOut[s] = float32((sigmoid(zz) - y) * inv)
	}
	loss *= inv
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return fmt.Errorf("%w: loss is %v", ErrNonFinite, loss)
	}
	g.Loss = loss

	// The first-order term: every reference's scalar gets the logit's
	// gradient, weighted and scaled like its row's.
	if m.cfg.FirstOrder {
		clear(g.Biases)
		for s := range n {
			for fi := range f {
				lo, hi := b.bag(s*f + fi)
				scale := dOut[s]
				if m.pooling[fi] == PoolMean && hi-lo > 1 {
					scale /= float32(hi - lo)
				}
				for q := lo; q < hi; q++ {
					g.Biases[b.row(q)] += scale * b.weight(q)
				}
			}
		}
	}

	// Top MLP, last layer first. dOut is the gradient of the layer output;
	// each step leaves the gradient of its input in the other buffer.
	spare := ws.gradB
	for i := len(m.top) - 1; i >= 0; i-- {
		l := m.top[i]
		x := ws.topIn
		if i > 0 {
			x = ws.top[i-1]
		}
		dx := spare[:n*l.in]
		m.denseBackward(g.Dense, dOut, dx, x[:n*l.in], ws.top[i][:n*l.out], l, n)
		dOut, spare = dx, dOut[:cap(dOut)]
	}
	dTopIn := dOut // n × (d + pairs)

	// Interaction: the top input is [z0, <t_i, t_j> for i < j], or with
	// ConcatEmbeddings [t, <t_i, t_j> for i < j].
	stride := (f + 1) * d
	width := m.top[0].in
	head := m.cfg.topHead()
	for s := range n {
		t := ws.inter[s*stride : s*stride+stride]
		dt := ws.dInter[s*stride : s*stride+stride]
		din := dTopIn[s*width : s*width+width]
		copy(dt[:head], din[:head])
		clear(dt[head:])
		k := head
		for i := 0; i < f; i++ {
			ti, dti := t[i*d:i*d+d], dt[i*d:i*d+d]
			for j := i + 1; j <= f; j++ {
				gij := din[k]
				k++
				if gij == 0 {
					continue
				}
				axpy(dti, gij, t[j*d:j*d+d])
				axpy(dt[j*d:j*d+d], gij, ti)
			}
		}
	}

	// Embedding rows: scatter each bag's pooled gradient onto its rows.
	clear(g.Rows)
	for s := range n {
		dt := ws.dInter[s*stride : s*stride+stride]
		for fi := range f {
			lo, hi := b.bag(s*f + fi)
			if lo == hi {
				continue
			}
			gv := dt[(fi+1)*d : (fi+2)*d]
			scale := float32(1)
			if m.pooling[fi] == PoolMean {
				scale = 1 / float32(hi-lo)
			}
			for q := lo; q < hi; q++ {
				r := b.row(q)
				axpy(g.Rows[r*d:r*d+d], scale*b.weight(q), gv)
			}
		}
	}

	// Bottom MLP, starting from the gradient of its output z0.
	dOut = spare[:n*d]
	for s := range n {
		copy(dOut[s*d:s*d+d], ws.dInter[s*stride:s*stride+d])
	}
	spare = dTopIn[:cap(dTopIn)]
	for i := len(m.bottom) - 1; i >= 0; i-- {
		l := m.bottom[i]
		x := b.Dense
		var dx []float32
		if i > 0 {
			x = ws.bot[i-1][:n*l.in]
			dx = spare[:n*l.in]
		}
		m.denseBackward(g.Dense, dOut, dx, x, ws.bot[i][:n*l.out], l, n)
		if i > 0 {
			dOut, spare = dx, dOut[:cap(dOut)]
		}
	}
	return nil
}

// denseBackward back-propagates through layer l for n rows. dy is the
// gradient of the layer's output y (overwritten with the gradient of the
// pre-activation when l has a ReLU); x is the layer input. It writes the
// weight and bias gradients into grad and, when dx is non-nil, the gradient
// of the input into dx.
func (m *Model) denseBackward(grad, dy, dx, x, y []float32, l layer, n int) {
	if l.relu {
		y = y[:len(dy)]
		for j, v := range y {
			if v <= 0 {
				dy[j] = 0
			}
		}
	}
	// dW = xᵀ·dy: A(i,p) = x[p*in + i].
	gemm(grad[l.w:l.w+l.in*l.out], x, dy, l.in, l.out, n, 1, l.in, false)
	db := grad[l.b : l.b+l.out]
	clear(db)
	for s := range n {
		axpy(db, 1, dy[s*l.out:s*l.out+l.out])
	}
	if dx == nil {
		return
	}
	// dx = dy·Wᵀ with Wᵀ materialised as out×in.
	wT := m.ws.wT[:l.in*l.out]
	transpose(wT, m.params[l.w:l.w+l.in*l.out], l.in, l.out)
	gemm(dx, dy, wT, n, l.in, l.out, l.out, 1, false)
}
