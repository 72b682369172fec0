package model_test

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/model"
)

// refNet is an independent float64 implementation of the DLRM forward pass,
// written for clarity, that reads the flat parameter vector through the
// documented tensor layout (Model.Tensors).
type refNet struct {
	cfg     model.Config
	tensors map[string]model.Tensor
	pool    []model.Pooling
}

func newRefNet(m *model.Model) *refNet {
	r := &refNet{cfg: m.Config(), tensors: map[string]model.Tensor{}}
	for _, t := range m.Tensors() {
		r.tensors[t.Name] = t
	}
	for f := range r.cfg.Fields {
		p := r.cfg.Pooling
		if r.cfg.FieldPooling != nil {
			p = r.cfg.FieldPooling[f]
		}
		r.pool = append(r.pool, p)
	}
	return r
}

// layer applies tensor pair "<prefix>.weight"/"<prefix>.bias" to x.
func (r *refNet) layer(params []float64, prefix string, x []float64, relu bool) []float64 {
	w, b := r.tensors[prefix+".weight"], r.tensors[prefix+".bias"]
	in, out := w.Shape[0], w.Shape[1]
	if len(x) != in {
		panic("reference: shape mismatch in " + prefix)
	}
	y := make([]float64, out)
	for o := range out {
		s := params[b.Offset+o]
		for i := range in {
			s += x[i] * params[w.Offset+i*out+o]
		}
		if relu && s < 0 {
			s = 0
		}
		y[o] = s
	}
	return y
}

// logits returns the logit of every sample; rows are the embedding rows and
// biases their first-order weights (Config.FirstOrder; nil without).
func (r *refNet) logits(params []float64, b *model.Batch, rows, biases []float64) []float64 {
	cfg := r.cfg
	d, f := cfg.EmbeddingDim, cfg.Fields
	nb, nt := len(cfg.BottomHidden)+1, len(cfg.TopHidden)+1
	out := make([]float64, b.Size)
	for s := range b.Size {
		x := make([]float64, cfg.DenseFeatures)
		for j := range x {
			x[j] = float64(b.Dense[s*cfg.DenseFeatures+j])
		}
		for l := range nb {
			x = r.layer(params, "bottom."+strconv.Itoa(l), x, true)
		}
		vecs := [][]float64{x}
		for fi := range f {
			k := s*f + fi
			lo, hi := k, k+1
			if b.Bags != nil {
				lo, hi = int(b.Bags[k]), int(b.Bags[k+1])
			}
			v := make([]float64, d)
			var first float64
			for q := lo; q < hi; q++ {
				row := q
				if b.Index != nil {
					row = int(b.Index[q])
				}
				w := 1.0
				if b.Weights != nil {
					w = float64(b.Weights[q])
				}
				for c := range d {
					v[c] += w * rows[row*d+c]
				}
				if biases != nil {
					first += w * biases[row]
				}
			}
			if r.pool[fi] == model.PoolMean && hi > lo {
				for c := range v {
					v[c] /= float64(hi - lo)
				}
				first /= float64(hi - lo)
			}
			vecs = append(vecs, v)
			out[s] += first
		}
		top := append([]float64{}, x...)
		if cfg.ConcatEmbeddings {
			for _, v := range vecs[1:] {
				top = append(top, v...)
			}
		}
		for i := range vecs {
			for j := i + 1; j < len(vecs); j++ {
				var dp float64
				for c := range d {
					dp += vecs[i][c] * vecs[j][c]
				}
				top = append(top, dp)
			}
		}
		for l := range nt {
			top = r.layer(params, "top."+strconv.Itoa(l), top, l < nt-1)
		}
		out[s] += top[0]
	}
	return out
}

// loss is the mean binary cross-entropy, written the textbook way.
func (r *refNet) loss(params []float64, b *model.Batch, rows, biases []float64) float64 {
	var sum float64
	for s, z := range r.logits(params, b, rows, biases) {
		p := 1 / (1 + math.Exp(-z))
		y := float64(b.Labels[s])
		sum -= y*math.Log(p) + (1-y)*math.Log(1-p)
	}
	return sum / float64(b.Size)
}

func to64(s []float32) []float64 {
	d := make([]float64, len(s))
	for i, v := range s {
		d[i] = float64(v)
	}
	return d
}

// gradCheckBatch builds a batch exercising every input path: multi-valued
// bags with sum and mean pooling, an empty bag, a row shared between
// samples and repeated within one bag, and a row nobody references.
func gradCheckBatch(t *testing.T, cfg model.Config, n int, r *rand.Rand) *model.Batch {
	t.Helper()
	d, f := cfg.EmbeddingDim, cfg.Fields
	const rowsN = 9 // row 8 is never referenced
	b := &model.Batch{Size: n, Bags: []int32{0}}
	for range n * cfg.DenseFeatures {
		b.Dense = append(b.Dense, float32(r.NormFloat64()))
	}
	for s := range n {
		b.Labels = append(b.Labels, float32(s%2))
	}
	b.Labels[n-1] = 0.3 // a soft label
	for range rowsN * d {
		b.Rows = append(b.Rows, float32(0.5*r.NormFloat64()))
	}
	for s := range n {
		for fi := range f {
			bag := 1 + r.IntN(3)
			switch {
			case s == 1 && fi == 1:
				bag = 0 // empty bag
			case s == 0 && fi == 1:
				b.Index = append(b.Index, 3) // repeated row within a bag
			}
			for range bag {
				b.Index = append(b.Index, int32(r.IntN(rowsN-1)))
			}
			b.Bags = append(b.Bags, int32(len(b.Index)))
		}
	}
	return b
}

// weigh gives every reference of b a weight (libFM values): some negative,
// one zero, most around 1.
func weigh(b *model.Batch, r *rand.Rand) {
	b.Weights = b.Weights[:0]
	for q := range b.Index {
		w := float32(1 + r.NormFloat64())
		if q == 2 {
			w = 0
		}
		b.Weights = append(b.Weights, w)
	}
}

func TestGradientsMatchFiniteDifferences(t *testing.T) {
	cfg := model.Config{
		DenseFeatures: 3,
		Fields:        3,
		EmbeddingDim:  4,
		BottomHidden:  []int{6},
		TopHidden:     []int{7, 5},
		FieldPooling:  []model.Pooling{model.PoolSum, model.PoolMean, model.PoolSum},
		Seed:          7,
	}
	m, err := model.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, weighted := range []bool{false, true} {
		t.Run(map[bool]string{false: "unweighted", true: "weighted"}[weighted], func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			b := gradCheckBatch(t, cfg, 5, r)
			if weighted {
				weigh(b, r)
			}
			checkGradients(t, m, b)
		})
	}
	// The pooled vectors in the top MLP's input, beside the bottom output.
	cfg.ConcatEmbeddings = true
	m, err = model.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("concatenated embeddings", func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		checkGradients(t, m, gradCheckBatch(t, cfg, 5, r))
	})
	cfg.ConcatEmbeddings = false
	// First-order terms: a scalar per row, pooled like the rows (summed, averaged in the
	// mean-pooled field, weighted) and added to the logit.
	cfg.FirstOrder = true
	m, err = model.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, weighted := range []bool{false, true} {
		t.Run(map[bool]string{false: "first-order", true: "first-order weighted"}[weighted], func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			b := gradCheckBatch(t, cfg, 5, r)
			if weighted {
				weigh(b, r)
			}
			for range len(b.Rows) / cfg.EmbeddingDim {
				b.Biases = append(b.Biases, float32(r.NormFloat64()))
			}
			checkGradients(t, m, b)
		})
	}
}

// checkGradients compares the model's loss, logits and gradients on b with the reference's.
func checkGradients(t *testing.T, m *model.Model, b *model.Batch) {
	cfg := m.Config()
	var g model.Gradients
	if err := m.ComputeGradients(b, &g); err != nil {
		t.Fatal(err)
	}

	ref := newRefNet(m)
	params, rows := to64(m.Params()), to64(b.Rows)
	var biases []float64
	if cfg.FirstOrder {
		biases = to64(b.Biases)
	}
	want := ref.loss(params, b, rows, biases)
	if math.Abs(g.Loss-want) > 1e-5*math.Max(1, want) {
		t.Fatalf("loss %v, reference %v", g.Loss, want)
	}
	refLogits := ref.logits(params, b, rows, biases)
	probs, err := m.Predict(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	logits, err := m.Logits(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	for s, z := range refLogits {
		if logits[s] != g.Logits[s] {
			t.Errorf("logit %d: Logits %v, ComputeGradients %v", s, logits[s], g.Logits[s])
		}
		if math.Abs(float64(g.Logits[s])-z) > 1e-5*math.Max(1, math.Abs(z)) {
			t.Errorf("logit %d: %v, reference %v", s, g.Logits[s], z)
		}
		if p := 1 / (1 + math.Exp(-z)); math.Abs(float64(probs[s])-p) > 1e-6 {
			t.Errorf("probability %d: %v, reference %v", s, probs[s], p)
		}
	}

	const h = 1e-6
	check := func(what string, i int, got float32, vec []float64) {
		t.Helper()
		old := vec[i]
		vec[i] = old + h
		up := ref.loss(params, b, rows, biases)
		vec[i] = old - h
		down := ref.loss(params, b, rows, biases)
		vec[i] = old
		fd := (up - down) / (2 * h)
		if diff := math.Abs(float64(got) - fd); diff > 1e-5+2e-3*math.Abs(fd) {
			t.Errorf("%s[%d]: analytic %.8g, finite difference %.8g", what, i, got, fd)
		}
	}
	if len(g.Dense) != m.NumParams() {
		t.Fatalf("dense gradient has %d values, want %d", len(g.Dense), m.NumParams())
	}
	nonzero := 0
	for i := range params {
		check("dense", i, g.Dense[i], params)
		if g.Dense[i] != 0 {
			nonzero++
		}
	}
	if nonzero < len(params)/2 {
		t.Errorf("only %d of %d dense gradients are non-zero; the check would be vacuous", nonzero, len(params))
	}
	if len(g.Rows) != len(b.Rows) {
		t.Fatalf("row gradient has %d values, want %d", len(g.Rows), len(b.Rows))
	}
	for i := range rows {
		check("rows", i, g.Rows[i], rows)
	}
	d := cfg.EmbeddingDim
	for c := range d {
		if g.Rows[8*d+c] != 0 {
			t.Errorf("unreferenced row 8 has gradient %v", g.Rows[8*d:9*d])
			break
		}
	}
	if !cfg.FirstOrder {
		if len(g.Biases) != 0 {
			t.Errorf("first-order gradients %v without first-order terms", g.Biases)
		}
		return
	}
	if len(g.Biases) != len(b.Biases) {
		t.Fatalf("first-order gradient has %d values, want %d", len(g.Biases), len(b.Biases))
	}
	for i := range biases {
		check("biases", i, g.Biases[i], biases)
	}
	if g.Biases[8] != 0 {
		t.Errorf("unreferenced row 8 has first-order gradient %v", g.Biases[8])
	}
}

// TestBatchFormsAgree checks that the de-duplicated form (Bags + Index) and
// the plain form (one row per reference, no Index, no Bags) give the same
// loss and dense gradient, and that row gradients of the plain form summed
// per shared row equal those of the de-duplicated form.
func TestBatchFormsAgree(t *testing.T) {
	cfg := model.Config{DenseFeatures: 4, Fields: 5, EmbeddingDim: 8, BottomHidden: []int{16}, TopHidden: []int{16}, Seed: 3}
	m, err := model.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	const n, rowsN = 16, 20
	d := cfg.EmbeddingDim
	dedup := &model.Batch{Size: n}
	plain := &model.Batch{Size: n}
	for range n * cfg.DenseFeatures {
		dedup.Dense = append(dedup.Dense, float32(r.NormFloat64()))
	}
	plain.Dense = dedup.Dense
	for s := range n {
		dedup.Labels = append(dedup.Labels, float32(s%3%2))
	}
	plain.Labels = dedup.Labels
	for range rowsN * d {
		dedup.Rows = append(dedup.Rows, float32(0.3*r.NormFloat64()))
	}
	for range n * cfg.Fields {
		row := r.IntN(rowsN)
		dedup.Index = append(dedup.Index, int32(row))
		plain.Rows = append(plain.Rows, dedup.Rows[row*d:row*d+d]...)
	}
	var gd, gp model.Gradients
	if err := m.ComputeGradients(dedup, &gd); err != nil {
		t.Fatal(err)
	}
	if err := m.ComputeGradients(plain, &gp); err != nil {
		t.Fatal(err)
	}
	if gd.Loss != gp.Loss {
		t.Errorf("loss %v (dedup) vs %v (plain)", gd.Loss, gp.Loss)
	}
	for i := range gd.Dense {
		if gd.Dense[i] != gp.Dense[i] {
			t.Fatalf("dense grad %d: %v vs %v", i, gd.Dense[i], gp.Dense[i])
		}
	}
	sum := make([]float64, len(gd.Rows))
	for q, row := range dedup.Index {
		for c := range d {
			sum[int(row)*d+c] += float64(gp.Rows[q*d+c])
		}
	}
	for i, v := range sum {
		if math.Abs(v-float64(gd.Rows[i])) > 1e-6 {
			t.Fatalf("row grad %d: dedup %v, plain summed %v", i, gd.Rows[i], v)
		}
	}
}
