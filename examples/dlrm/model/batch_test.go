package model_test

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/model"
)

func smallModel(t testing.TB) *model.Model {
	t.Helper()
	m, err := model.New(model.Config{DenseFeatures: 2, Fields: 2, EmbeddingDim: 3, BottomHidden: []int{4}, TopHidden: []int{4}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// validSmallBatch is a 2-sample batch for smallModel using Bags and Index.
func validSmallBatch() *model.Batch {
	return &model.Batch{
		Size:   2,
		Dense:  []float32{1, 2, 3, 4},
		Labels: []float32{0, 1},
		Rows:   []float32{.1, .2, .3, .4, .5, .6, .7, .8, .9},
		Bags:   []int32{0, 1, 3, 3, 4},
		Index:  []int32{0, 1, 2, 1},
	}
}

func TestBatchValidation(t *testing.T) {
	m := smallModel(t)
	var g model.Gradients
	if err := m.ComputeGradients(validSmallBatch(), &g); err != nil {
		t.Fatalf("valid batch rejected: %v", err)
	}
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, tc := range []struct {
		name   string
		mutate func(b *model.Batch)
		want   error
	}{
		{"zero size", func(b *model.Batch) { b.Size = 0 }, model.ErrBatch},
		{"short dense", func(b *model.Batch) { b.Dense = b.Dense[:3] }, model.ErrBatch},
		{"short labels", func(b *model.Batch) { b.Labels = b.Labels[:1] }, model.ErrBatch},
		{"label above 1", func(b *model.Batch) { b.Labels[0] = 2 }, model.ErrBatch},
		{"NaN label", func(b *model.Batch) { b.Labels[1] = nan }, model.ErrBatch},
		{"ragged rows", func(b *model.Batch) { b.Rows = b.Rows[:8] }, model.ErrBatch},
		{"index out of range", func(b *model.Batch) { b.Index[2] = 3 }, model.ErrBatch},
		{"negative index", func(b *model.Batch) { b.Index[0] = -1 }, model.ErrBatch},
		{"bags length", func(b *model.Batch) { b.Bags = b.Bags[:4] }, model.ErrBatch},
		{"bags start", func(b *model.Batch) { b.Bags[0] = 1 }, model.ErrBatch},
		{"bags decrease", func(b *model.Batch) { b.Bags[2] = 0 }, model.ErrBatch},
		{"bags end", func(b *model.Batch) { b.Bags[4] = 3 }, model.ErrBatch},
		{"no bags, wrong count", func(b *model.Batch) { b.Bags, b.Index = nil, b.Index[:3] }, model.ErrBatch},
		{"NaN dense", func(b *model.Batch) { b.Dense[2] = nan }, model.ErrNonFinite},
		{"Inf row", func(b *model.Batch) { b.Rows[4] = inf }, model.ErrNonFinite},
		{"first-order weights without FirstOrder", func(b *model.Batch) { b.Biases = []float32{0, 0, 0} }, model.ErrBatch},
	} {
		b := validSmallBatch()
		tc.mutate(b)
		if err := m.ComputeGradients(b, &g); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := m.ComputeGradients(nil, &g); !errors.Is(err, model.ErrBatch) {
		t.Errorf("nil batch: err %v", err)
	}
	if err := m.ComputeGradients(validSmallBatch(), nil); !errors.Is(err, model.ErrBatch) {
		t.Errorf("nil gradients: err %v", err)
	}
	// With first-order terms every row has its scalar.
	fm, err := model.New(model.Config{DenseFeatures: 2, Fields: 2, EmbeddingDim: 3, BottomHidden: []int{4}, TopHidden: []int{4}, FirstOrder: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		biases []float32
		want   error
	}{
		{"three scalars", []float32{.1, -.2, .3}, nil},
		{"no scalars", nil, model.ErrBatch},
		{"a scalar short", []float32{.1, -.2}, model.ErrBatch},
		{"NaN scalar", []float32{.1, nan, .3}, model.ErrNonFinite},
	} {
		b := validSmallBatch()
		b.Biases = tc.biases
		if err := fm.ComputeGradients(b, &g); !errors.Is(err, tc.want) {
			t.Errorf("first-order, %s: err %v, want %v", tc.name, err, tc.want)
		}
	}
	// Predict does not need labels.
	b := validSmallBatch()
	b.Labels = nil
	probs, err := m.Predict(nil, b)
	if err != nil || len(probs) != 2 {
		t.Errorf("Predict without labels: %v, %v", probs, err)
	}
	// Diverged parameters are reported, not silently propagated.
	for i := range m.Params() {
		m.Params()[i] = 1e30
	}
	if err := m.ComputeGradients(validSmallBatch(), &g); !errors.Is(err, model.ErrNonFinite) {
		t.Errorf("diverged parameters: err %v, want ErrNonFinite", err)
	}
}

func TestComputeGradientsDoesNotAllocate(t *testing.T) {
	m, err := model.New(model.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b := benchBatch(m, 64)
	var g model.Gradients
	if err := m.ComputeGradients(b, &g); err != nil {
		t.Fatal(err)
	}
	probs := make([]float32, 0, 64)
	allocs := testing.AllocsPerRun(5, func() {
		if err := m.ComputeGradients(b, &g); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Predict(probs[:0], b); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per steady-state step, want 0", allocs)
	}
	// A smaller batch reuses the buffers too; results do not depend on
	// what a larger batch left behind.
	small := benchBatch(m, 5)
	var g1, g2 model.Gradients
	if err := m.ComputeGradients(small, &g1); err != nil {
		t.Fatal(err)
	}
	fresh, _ := model.New(model.Config{})
	if err := fresh.ComputeGradients(small, &g2); err != nil {
		t.Fatal(err)
	}
	if g1.Loss != g2.Loss {
		t.Errorf("loss %v after a larger batch, %v on a fresh model", g1.Loss, g2.Loss)
	}
	for i := range g1.Dense {
		if g1.Dense[i] != g2.Dense[i] {
			t.Fatalf("dense gradient %d: %v after a larger batch, %v fresh", i, g1.Dense[i], g2.Dense[i])
		}
	}
}

// FuzzBatch feeds arbitrary batch shapes and values to the model: it must
// either reject the batch with ErrBatch/ErrNonFinite or return finite
// gradients of the right lengths, and never panic.
func FuzzBatch(f *testing.F) {
	f.Add([]byte{2, 4, 0, 1, 2, 3, 1, 0, 9, 9, 9}, true, true)
	f.Add([]byte{1, 2, 5, 5, 5, 5, 5, 5, 5, 5}, false, false)
	f.Add([]byte{3, 0, 255, 128, 7, 1, 2, 3}, true, false)
	m := smallModel(f)
	f.Fuzz(func(t *testing.T, data []byte, useBags, useIndex bool) {
		if len(data) < 2 {
			return
		}
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			c := data[0]
			data = data[1:]
			return c
		}
		n := int(next() % 5)
		rows := int(next() % 8)
		b := &model.Batch{Size: n}
		val := func() float32 {
			var buf [4]byte
			for i := range buf {
				buf[i] = next()
			}
			return math.Float32frombits(binary.LittleEndian.Uint32(buf[:]))
		}
		for range int(next()) % (2*n + 2) {
			b.Dense = append(b.Dense, val())
		}
		for range n {
			b.Labels = append(b.Labels, float32(next()%3)/2)
		}
		for range rows * 3 {
			b.Rows = append(b.Rows, val()/1e30)
		}
		if useBags {
			b.Bags = []int32{0}
			for range 2*n + int(next()%2) {
				b.Bags = append(b.Bags, b.Bags[len(b.Bags)-1]+int32(next()%3)-int32(next()%2))
			}
		}
		if useIndex {
			for range int(next() % 12) {
				b.Index = append(b.Index, int32(next()%9)-1)
			}
		}
		var g model.Gradients
		err := m.ComputeGradients(b, &g)
		if err != nil {
			if !errors.Is(err, model.ErrBatch) && !errors.Is(err, model.ErrNonFinite) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		if len(g.Dense) != m.NumParams() || len(g.Rows) != len(b.Rows) || len(g.Logits) != n {
			t.Fatalf("gradient lengths %d/%d/%d", len(g.Dense), len(g.Rows), len(g.Logits))
		}
		if math.IsNaN(g.Loss) || math.IsInf(g.Loss, 0) {
			t.Fatalf("loss %v accepted", g.Loss)
		}
	})
}
