package model_test

import (
	"fmt"

	"github.com/elasticps/elasticps/examples/dlrm/model"
)

// A tiny model takes one SGD step on a batch of two samples. The embedding
// rows are given per (sample, field) — what a trainer pulls from the
// parameter servers — and the row gradients come back in the same layout.
func Example() {
	m, err := model.New(model.Config{
		DenseFeatures: 2,
		Fields:        2,
		EmbeddingDim:  4,
		BottomHidden:  []int{8},
		TopHidden:     []int{8},
		Seed:          1,
	})
	if err != nil {
		panic(err)
	}
	for _, t := range m.Tensors() {
		fmt.Println(t.Name, t.Shape, "at", t.Offset)
	}

	b := &model.Batch{
		Size:   2,
		Dense:  []float32{0.5, 1.0, 2.0, 0.0},
		Labels: []float32{1, 0},
		Rows: []float32{ // sample 0 field 0, sample 0 field 1, sample 1 field 0, sample 1 field 1
			0.1, -0.2, 0.3, 0.0,
			0.2, 0.1, -0.1, 0.4,
			-0.3, 0.2, 0.0, 0.1,
			0.0, -0.1, 0.2, -0.2,
		},
	}
	var g model.Gradients
	if err := m.ComputeGradients(b, &g); err != nil {
		panic(err)
	}
	fmt.Println("dense gradients:", len(g.Dense), "row gradients:", len(g.Rows)/4)

	// Apply locally (a parameter-server trainer pushes g.Dense and g.Rows
	// instead).
	opt, err := model.NewSGD(model.SGDConfig{LearningRate: 0.5})
	if err != nil {
		panic(err)
	}
	if err := opt.Update(m.Params(), g.Dense); err != nil {
		panic(err)
	}
	for i, v := range g.Rows {
		b.Rows[i] -= 0.5 * v
	}
	before := g.Loss
	if err := m.ComputeGradients(b, &g); err != nil {
		panic(err)
	}
	fmt.Println("loss fell:", g.Loss < before)
	// Output:
	// bottom.0.weight [2 8] at 0
	// bottom.0.bias [8] at 16
	// bottom.1.weight [8 4] at 24
	// bottom.1.bias [4] at 56
	// top.0.weight [7 8] at 60
	// top.0.bias [8] at 116
	// top.1.weight [8 1] at 124
	// top.1.bias [1] at 132
	// dense gradients: 133 row gradients: 4
	// loss fell: true
}

// The trainer's data path: synthetic records, a de-duplicated batch, rows
// pulled by key, gradients pushed by key.
func ExampleBatchBuilder() {
	gen, err := model.NewSynth(model.SynthConfig{Seed: 1, DenseFeatures: 3, Vocab: []int{2, 1000}})
	if err != nil {
		panic(err)
	}
	cfg := gen.ModelConfig()
	cfg.EmbeddingDim = 4
	m, err := model.New(cfg)
	if err != nil {
		panic(err)
	}
	bb, err := model.NewBatchBuilder(m.Config())
	if err != nil {
		panic(err)
	}
	var s model.Sample
	for i := range 64 {
		gen.Sample(uint64(i), &s)
		if err := bb.Add(&s); err != nil {
			panic(err)
		}
	}
	rows := bb.Rows() // pull: one vector per distinct (field, id)
	for i := range rows {
		rows[i] = 0.01
	}
	var g model.Gradients
	if err := m.ComputeGradients(bb.Batch(), &g); err != nil {
		panic(err)
	}
	field0 := 0
	for _, k := range bb.Keys() {
		if k.Field == 0 {
			field0++
		}
	}
	fmt.Println("samples:", bb.Len())
	fmt.Println("distinct ids in the 2-id field:", field0)
	fmt.Println("one gradient row per distinct key:", len(g.Rows) == len(bb.Keys())*4)
	// Output:
	// samples: 64
	// distinct ids in the 2-id field: 2
	// one gradient row per distinct key: true
}

func ExampleAUC() {
	auc, err := model.AUC([]float32{0, 0, 1, 1}, []float32{0.1, 0.4, 0.35, 0.8})
	if err != nil {
		panic(err)
	}
	fmt.Println(auc)
	// Output: 0.75
}
