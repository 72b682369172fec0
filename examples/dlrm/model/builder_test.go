package model_test

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/model"
)

func TestBatchBuilderDeduplicates(t *testing.T) {
	cfg := model.Config{DenseFeatures: 1, Fields: 2, EmbeddingDim: 2, BottomHidden: []int{}, TopHidden: []int{}}
	bb, err := model.NewBatchBuilder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	samples := []model.Sample{
		{Dense: []float32{1}, IDs: []uint64{7, 7, 9}, Offsets: []int32{0, 1, 3}, Label: 1},
		{Dense: []float32{2}, IDs: []uint64{9, 7}, Offsets: []int32{0, 1, 2}, Label: 0},
		{Dense: []float32{3}, IDs: []uint64{7}, Offsets: []int32{0, 0, 1}, Label: 1}, // empty field 0
	}
	for i := range samples {
		if err := bb.Add(&samples[i]); err != nil {
			t.Fatal(err)
		}
	}
	// Field and id together identify a row: 7 in field 0 and 7 in field 1
	// are different rows.
	wantKeys := []model.Key{{0, 7}, {1, 7}, {1, 9}, {0, 9}}
	if !slices.Equal(bb.Keys(), wantKeys) || bb.Len() != 3 {
		t.Fatalf("keys %v (len %d), want %v", bb.Keys(), bb.Len(), wantKeys)
	}
	rows := bb.Rows()
	if len(rows) != 4*2 {
		t.Fatalf("rows buffer %d values, want 8", len(rows))
	}
	for i := range rows {
		rows[i] = float32(i)
	}
	b := bb.Batch()
	if !slices.Equal(b.Bags, []int32{0, 1, 3, 4, 5, 5, 6}) || !slices.Equal(b.Index, []int32{0, 1, 2, 3, 1, 1}) ||
		!slices.Equal(b.Dense, []float32{1, 2, 3}) || !slices.Equal(b.Labels, []float32{1, 0, 1}) || b.Size != 3 {
		t.Fatalf("batch %+v", b)
	}
	m, err := model.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var g model.Gradients
	if err := m.ComputeGradients(b, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Rows) != len(rows) {
		t.Fatalf("row gradients %d, want %d", len(g.Rows), len(rows))
	}

	// Reset keeps nothing from the previous batch.
	bb.Reset()
	if bb.Len() != 0 || len(bb.Keys()) != 0 || len(bb.Rows()) != 0 {
		t.Fatalf("after Reset: len %d, keys %v", bb.Len(), bb.Keys())
	}
	if err := bb.Add(&samples[2]); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(bb.Keys(), []model.Key{{1, 7}}) {
		t.Errorf("keys after Reset %v", bb.Keys())
	}
}

func TestBatchBuilderRejectsBadSamples(t *testing.T) {
	bb, err := model.NewBatchBuilder(model.Config{DenseFeatures: 2, Fields: 2})
	if err != nil {
		t.Fatal(err)
	}
	good := model.Sample{Dense: []float32{1, 2}, IDs: []uint64{1, 2}, Offsets: []int32{0, 1, 2}}
	for _, tc := range []struct {
		name   string
		mutate func(s *model.Sample)
		want   error
	}{
		{"dense length", func(s *model.Sample) { s.Dense = s.Dense[:1] }, model.ErrBatch},
		{"offsets length", func(s *model.Sample) { s.Offsets = s.Offsets[:2] }, model.ErrBatch},
		{"offsets start", func(s *model.Sample) { s.Offsets = []int32{1, 1, 2} }, model.ErrBatch},
		{"offsets end", func(s *model.Sample) { s.Offsets = []int32{0, 1, 1} }, model.ErrBatch},
		{"offsets decrease", func(s *model.Sample) { s.Offsets = []int32{0, 3, 2}; s.IDs = []uint64{1, 2} }, model.ErrBatch},
		{"label", func(s *model.Sample) { s.Label = -1 }, model.ErrBatch},
		{"NaN dense", func(s *model.Sample) { s.Dense = []float32{1, float32(math.NaN())} }, model.ErrNonFinite},
	} {
		s := good
		s.Dense, s.IDs, s.Offsets = slices.Clone(good.Dense), slices.Clone(good.IDs), slices.Clone(good.Offsets)
		tc.mutate(&s)
		if err := bb.Add(&s); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
		if bb.Len() != 0 || len(bb.Keys()) != 0 {
			t.Fatalf("%s: rejected sample changed the builder", tc.name)
		}
	}
	if err := bb.Add(nil); !errors.Is(err, model.ErrBatch) {
		t.Errorf("nil sample: err %v", err)
	}
}

func TestBatchBuilderDoesNotAllocate(t *testing.T) {
	gen, err := model.NewSynth(model.SynthConfig{Seed: 1, Vocab: []int{5, 50, 500}, Hotness: []int{1, 3, 1}})
	if err != nil {
		t.Fatal(err)
	}
	bb, err := model.NewBatchBuilder(gen.ModelConfig())
	if err != nil {
		t.Fatal(err)
	}
	var s model.Sample
	fill := func() {
		bb.Reset()
		for i := range 128 {
			gen.Sample(uint64(i), &s)
			if err := bb.Add(&s); err != nil {
				t.Fatal(err)
			}
		}
		bb.Rows()
	}
	fill()
	if allocs := testing.AllocsPerRun(5, fill); allocs != 0 {
		t.Errorf("%v allocations per refilled batch, want 0", allocs)
	}
}

// TestBatchBuilderCarriesValues checks that sample values become reference weights (1 for the
// ids of samples without values), that a batch without values has no weights, and that bad
// values are refused.
func TestBatchBuilderCarriesValues(t *testing.T) {
	cfg := model.Config{DenseFeatures: 1, Fields: 2, EmbeddingDim: 2, BottomHidden: []int{}, TopHidden: []int{}}
	bb, err := model.NewBatchBuilder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	plain := model.Sample{Dense: []float32{1}, IDs: []uint64{7, 9}, Offsets: []int32{0, 1, 2}, Label: 1}
	valued := model.Sample{Dense: []float32{1}, IDs: []uint64{7, 9, 9}, Offsets: []int32{0, 1, 3}, Values: []float32{0.5, -2, 3}}
	for _, s := range []*model.Sample{&plain, &valued, &plain} {
		if err := bb.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := bb.Batch().Weights, []float32{1, 1, 0.5, -2, 3, 1, 1}; !slices.Equal(got, want) {
		t.Fatalf("weights %v, want %v", got, want)
	}
	bb.Reset()
	if err := bb.Add(&plain); err != nil {
		t.Fatal(err)
	}
	if w := bb.Batch().Weights; w != nil {
		t.Fatalf("a batch without values has weights %v", w)
	}
	for _, vals := range [][]float32{{1}, {1, float32(math.NaN()), 1}, {1, 1, float32(math.Inf(-1))}} {
		s := valued
		s.Values = vals
		if err := bb.Add(&s); err == nil {
			t.Errorf("values %v accepted", vals)
		}
	}
	if bb.Len() != 1 {
		t.Fatalf("refused samples were added: %d", bb.Len())
	}
}

// TestBatchBuilderFirstOrder: with first-order terms the builder has one scalar per key and
// hands them to the model in the batch; without, none.
func TestBatchBuilderFirstOrder(t *testing.T) {
	cfg := model.Config{DenseFeatures: 1, Fields: 2, EmbeddingDim: 2, BottomHidden: []int{}, TopHidden: []int{}, FirstOrder: true}
	bb, err := model.NewBatchBuilder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := model.Sample{Dense: []float32{1}, IDs: []uint64{7, 7, 9}, Offsets: []int32{0, 1, 3}, Label: 1}
	if err := bb.Add(&s); err != nil {
		t.Fatal(err)
	}
	clear(bb.Rows())
	biases := bb.Biases()
	if len(biases) != len(bb.Keys()) {
		t.Fatalf("%d first-order values for %d keys", len(biases), len(bb.Keys()))
	}
	copy(biases, []float32{0.5, -1, 2}) // keys (0,7), (1,7), (1,9)
	b := bb.Batch()
	if !slices.Equal(b.Biases, []float32{0.5, -1, 2}) {
		t.Fatalf("batch first-order values %v", b.Biases)
	}
	m, err := model.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The first-order terms add 0.5 for field 0 and -1 + 2 for field 1 to the logit.
	logits, err := m.Logits(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	clear(b.Biases)
	if logits, err = m.Logits(logits, b); err != nil {
		t.Fatal(err)
	}
	if got := logits[0] - logits[1]; math.Abs(float64(got)-1.5) > 1e-6 {
		t.Errorf("first-order terms add %v to the logit, want 1.5", got)
	}

	cfg.FirstOrder = false
	plain, err := model.NewBatchBuilder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Add(&s); err != nil {
		t.Fatal(err)
	}
	if plain.Biases() != nil || plain.Batch().Biases != nil {
		t.Error("first-order values without first-order terms")
	}
}
