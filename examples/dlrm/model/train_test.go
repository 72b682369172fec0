package model_test

import (
	"math"
	"testing"
	"time"

	"github.com/elasticps/elasticps/examples/dlrm/model"
)

// localTable is a minimal in-memory embedding table for tests: one table for
// all fields keyed by (field, id), rows created on first pull with a value
// that is a pure function of the key, updated by row-wise Adagrad.
type localTable struct {
	dim   int
	lr    float32
	scale float32
	index map[model.Key]int32
	w     []float32
	acc   []float32 // one accumulator per row (row-wise Adagrad)
}

func newLocalTable(dim int, lr, initScale float32) *localTable {
	return &localTable{dim: dim, lr: lr, scale: initScale, index: map[model.Key]int32{}}
}

// initRow writes the initial value of key into dst: uniform in ±scale.
func (t *localTable) initRow(k model.Key, dst []float32) {
	s := uint64(k.Field)*0x9e3779b97f4a7c15 ^ k.ID
	for i := range dst {
		s += 0x9e3779b97f4a7c15
		z := s
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		u := float32(z>>40) / (1 << 24) // [0, 1)
		dst[i] = (2*u - 1) * t.scale
	}
}

// pull copies the rows of keys into dst, creating missing rows when create
// is set (training) and using the initial value without storing it
// otherwise (evaluation).
func (t *localTable) pull(keys []model.Key, dst []float32, create bool) {
	d := t.dim
	for r, k := range keys {
		row := dst[r*d : r*d+d]
		i, ok := t.index[k]
		switch {
		case ok:
			copy(row, t.w[int(i)*d:int(i)*d+d])
		case create:
			i = int32(len(t.acc))
			t.index[k] = i
			t.w = append(t.w, make([]float32, d)...)
			t.initRow(k, t.w[int(i)*d:])
			t.acc = append(t.acc, 0)
			copy(row, t.w[int(i)*d:int(i)*d+d])
		default:
			t.initRow(k, row)
		}
	}
}

// push applies row-wise Adagrad to the rows of keys.
func (t *localTable) push(keys []model.Key, grads []float32) {
	d := t.dim
	for r, k := range keys {
		i := int(t.index[k])
		g := grads[r*d : r*d+d]
		var sq float32
		for _, v := range g {
			sq += v * v
		}
		t.acc[i] += sq / float32(d)
		step := t.lr / (float32(math.Sqrt(float64(t.acc[i]))) + 1e-8)
		w := t.w[i*d : i*d+d]
		for c, v := range g {
			w[c] -= step * v
		}
	}
}

type trainer struct {
	gen   *model.Synth
	m     *model.Model
	bb    *model.BatchBuilder
	opt   model.Optimizer
	tab   *localTable
	g     model.Gradients
	s     model.Sample
	batch int
}

func newTrainer(t *testing.T, scfg model.SynthConfig, mcfg model.Config, batch int) *trainer {
	t.Helper()
	gen, err := model.NewSynth(scfg)
	if err != nil {
		t.Fatal(err)
	}
	mc := gen.ModelConfig()
	mcfg.DenseFeatures, mcfg.Fields = mc.DenseFeatures, mc.Fields
	m, err := model.New(mcfg)
	if err != nil {
		t.Fatal(err)
	}
	bb, err := model.NewBatchBuilder(m.Config())
	if err != nil {
		t.Fatal(err)
	}
	opt, err := model.NewAdam(model.AdamConfig{LearningRate: 2e-3})
	if err != nil {
		t.Fatal(err)
	}
	return &trainer{gen: gen, m: m, bb: bb, opt: opt, tab: newLocalTable(m.Config().EmbeddingDim, 0.05, 0.05), batch: batch}
}

// fill loads records [from, from+n) into the batch builder.
func (tr *trainer) fill(t *testing.T, from uint64, n int) {
	tr.bb.Reset()
	for i := range n {
		tr.gen.Sample(from+uint64(i), &tr.s)
		if err := tr.bb.Add(&tr.s); err != nil {
			t.Fatal(err)
		}
	}
}

// step trains on records [from, from+batch) and returns the batch loss.
func (tr *trainer) step(t *testing.T, from uint64) float64 {
	tr.fill(t, from, tr.batch)
	tr.tab.pull(tr.bb.Keys(), tr.bb.Rows(), true)
	if err := tr.m.ComputeGradients(tr.bb.Batch(), &tr.g); err != nil {
		t.Fatal(err)
	}
	if err := tr.opt.Update(tr.m.Params(), tr.g.Dense); err != nil {
		t.Fatal(err)
	}
	tr.tab.push(tr.bb.Keys(), tr.g.Rows)
	return tr.g.Loss
}

// evaluate returns AUC and log loss on records [from, from+n).
func (tr *trainer) evaluate(t *testing.T, from uint64, n int) (auc, logloss float64) {
	var labels, probs []float32
	for off := 0; off < n; off += 1024 {
		k := min(1024, n-off)
		tr.fill(t, from+uint64(off), k)
		tr.tab.pull(tr.bb.Keys(), tr.bb.Rows(), false)
		b := tr.bb.Batch()
		labels = append(labels, b.Labels...)
		var err error
		if probs, err = tr.m.Predict(probs, b); err != nil {
			t.Fatal(err)
		}
	}
	auc, err := model.AUC(labels, probs)
	if err != nil {
		t.Fatal(err)
	}
	if logloss, err = model.LogLoss(labels, probs); err != nil {
		t.Fatal(err)
	}
	return auc, logloss
}

// TestTrainingApproachesCeiling trains DLRM in-process on the synthetic data
// set — dense parameters with local Adam, embeddings in a map-based table
// with row-wise Adagrad, as the parameter servers would — and checks that the
// test AUC rises from chance to within reach of the Bayes-optimal ceiling
// and that the training loss falls. A model with broken gradients, or with
// embeddings that do not learn (about 0.63 here), cannot pass the bound.
func TestTrainingApproachesCeiling(t *testing.T) {
	if raceEnabled {
		t.Skip("single-goroutine numeric test, 15x slower under the race detector; covered by plain go test")
	}
	steps, minAUC := 600, 0.74 // 153 600 samples
	if testing.Short() {
		steps, minAUC = 300, 0.70 // 76 800 samples
	}
	scfg := model.SynthConfig{
		Seed:          11,
		DenseFeatures: 8,
		Vocab:         []int{3, 10, 50, 200, 1000, 5000, 20000, 100},
		Hotness:       []int{1, 1, 1, 3, 1, 1, 1, 4},
		ZipfExponent:  1.2,
	}
	mcfg := model.Config{
		Seed:         5,
		BottomHidden: []int{32},
		TopHidden:    []int{64, 32},
		FieldPooling: []model.Pooling{0, 0, 0, model.PoolMean, 0, 0, 0, model.PoolMean},
	}
	tr := newTrainer(t, scfg, mcfg, 256)
	tr.tab.lr = 0.1
	var err error
	if tr.opt, err = model.NewAdam(model.AdamConfig{LearningRate: 3e-3}); err != nil {
		t.Fatal(err)
	}

	const testFrom, testN = 1 << 40, 10000 // far from the training records
	ceil, err := tr.gen.Ceiling(testFrom, testFrom+testN)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := tr.evaluate(t, testFrom, testN)

	start := time.Now()
	const window = 50
	var first, last float64
	for step := range steps {
		loss := tr.step(t, uint64(step*tr.batch))
		if step < window {
			first += loss / window
		}
		if step >= steps-window {
			last += loss / window
		}
	}
	auc, logloss := tr.evaluate(t, testFrom, testN)
	t.Logf("%d samples in %v: test AUC %.4f -> %.4f (ceiling %.4f), log loss %.4f (ceiling %.4f), train loss %.4f -> %.4f",
		steps*tr.batch, time.Since(start).Round(time.Millisecond), before, auc, ceil.AUC, logloss, ceil.LogLoss, first, last)

	if ceil.AUC < 0.78 || ceil.AUC > 0.86 {
		t.Errorf("ceiling AUC %.4f outside the designed range [0.78, 0.86]", ceil.AUC)
	}
	if before > 0.62 {
		t.Errorf("untrained AUC %.4f; the data set leaks labels into an untrained model", before)
	}
	if auc < minAUC {
		t.Errorf("test AUC %.4f after training, want ≥ %.2f (ceiling %.4f)", auc, minAUC, ceil.AUC)
	}
	if auc > ceil.AUC+0.01 {
		t.Errorf("test AUC %.4f beats the Bayes-optimal ceiling %.4f; the ceiling is wrong", auc, ceil.AUC)
	}
	if logloss < ceil.LogLoss-0.01 {
		t.Errorf("test log loss %.4f beats the ceiling %.4f; the ceiling is wrong", logloss, ceil.LogLoss)
	}
	if last > first-0.02 {
		t.Errorf("training loss went from %.4f to %.4f, want a clear decrease", first, last)
	}
}
