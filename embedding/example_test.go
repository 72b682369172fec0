package embedding_test

import (
	"bytes"
	"fmt"

	"github.com/elasticps/elasticps/embedding"
)

func Example() {
	t, err := embedding.New(embedding.Config{
		Dim:       4,
		Seed:      7,
		Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.5},
		Init:      embedding.Init{Kind: embedding.InitZeros},
	})
	if err != nil {
		panic(err)
	}
	ids := []uint64{42, 7, 42}
	w := make([]float32, len(ids)*t.Dim())
	if err := t.Lookup(ids, w); err != nil { // rows are created on first use
		panic(err)
	}
	grads := []float32{
		1, 0, 0, 0, // id 42
		0, 2, 0, 0, // id 7
		1, 0, 0, 0, // id 42 again: summed with the first
	}
	if err := t.Apply(ids, grads, 1); err != nil {
		panic(err)
	}
	row, _ := t.Row(42)
	fmt.Println("rows:", t.Len(), "id 42:", row.Weights, "updates:", row.Freq)

	// Move every row to another table, bit-exactly.
	var buf bytes.Buffer
	n, _ := t.Export(&buf, embedding.ExportOptions{})
	other, _ := embedding.New(t.Config())
	m, err := other.Import(&buf, embedding.ImportOptions{})
	fmt.Println("exported", n, "imported", m, err)
	row7, _ := other.Row(7)
	fmt.Println("id 7 elsewhere:", row7.Weights)
	// Output:
	// rows: 2 id 42: [-1 0 0 0] updates: 1
	// exported 2 imported 2 <nil>
	// id 7 elsewhere: [0 -1 0 0]
}
