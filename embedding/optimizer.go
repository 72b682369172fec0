package embedding

import "math"

// update applies one optimizer step to weights w with state st and gradient g (all len Dim except
// st). The arithmetic is float32 except where noted, in the order of the formulas documented on
// OptimizerKind.
//
// Optimizer.L2 is weight decay, applied lazily: only a row that receives a gradient decays, at
// the step that updates it. For every kind but FTRL the gradient the rule sees is g + L2*w (the
// gradient of the penalty L2/2*|w|², w as it was before the step, coupled as in PyTorch's
// weight_decay); FTRL has L2 in its closed form. g itself is never written (it may be the
// caller's).
func (t *Table) update(w, st, g []float32) {
	o := &t.cfg.Optimizer
	lr, eps, l2 := o.LearningRate, o.Eps, o.L2
	switch o.Kind {
	case SGD:
		for j := range w {
			w[j] -= lr * (g[j] + l2*w[j])
		}
	case Adagrad:
		a := st[:len(w)]
		g = g[:len(w)]
		for j := range w {
			gj := g[j] + l2*w[j]
			a[j] += gj * gj
			w[j] -= lr * gj / (sqrt32(a[j]) + eps)
		}
	case RowWiseAdagrad:
		var s float32
		g = g[:len(w)]
		for j := range w {
			gj := g[j] + l2*w[j]
			s += gj * gj
		}
		st[0] += s / float32(len(g))
		step := lr / (sqrt32(st[0]) + eps)
		for j := range w {
			w[j] -= step * (g[j] + l2*w[j])
		}
	case Adam:
		d := len(w)
		m, v := st[:d], st[d:2*d]
		tw := math.Float32bits(st[2*d]) + 1
		st[2*d] = math.Float32frombits(tw)
		b1, b2 := o.Beta1, o.Beta2
		c1 := float32(1 - math.Pow(float64(b1), float64(tw)))
		c2 := float32(1 - math.Pow(float64(b2), float64(tw)))
		for j := range w {
			gj := g[j] + l2*w[j]
			m[j] = b1*m[j] + (1-b1)*gj
			v[j] = b2*v[j] + (1-b2)*gj*gj
			w[j] -= lr * (m[j] / c1) / (sqrt32(v[j]/c2) + eps)
		}
	case FTRL:
		d := len(w)
		z, n := st[:d], st[d:2*d]
		for j := range w {
			gj := g[j]
			nn := n[j] + gj*gj
			sigma := (sqrt32(nn) - sqrt32(n[j])) / lr
			z[j] += gj - sigma*w[j]
			n[j] = nn
			w[j] = ftrlWeight(z[j], nn, lr, o.Beta, o.L1, o.L2)
		}
	}
}

// ftrlWeight is FTRL-Proximal's closed-form weight for accumulators z and n.
func ftrlWeight(z, n, alpha, beta, l1, l2 float32) float32 {
	if z <= l1 && z >= -l1 {
		return 0
	}
	sz := l1
	if z < 0 {
		sz = -l1
	}
	return -(z - sz) / ((beta+sqrt32(n))/alpha + l2)
}

func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }
