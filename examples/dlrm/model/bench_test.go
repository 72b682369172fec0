package model_test

import (
	"math/rand/v2"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/model"
)

// benchBatch returns a batch of n samples with single-valued fields, one
// row per (sample, field), for the model m.
func benchBatch(m *model.Model, n int) *model.Batch {
	cfg := m.Config()
	r := rand.New(rand.NewPCG(9, 9))
	b := &model.Batch{Size: n}
	for range n * cfg.DenseFeatures {
		b.Dense = append(b.Dense, float32(r.ExpFloat64()))
	}
	for range n {
		b.Labels = append(b.Labels, float32(r.IntN(2)))
	}
	for range n * cfg.Fields * cfg.EmbeddingDim {
		b.Rows = append(b.Rows, float32(0.1*r.NormFloat64()))
	}
	return b
}

func BenchmarkComputeGradients(b *testing.B) {
	m, err := model.New(model.Config{})
	if err != nil {
		b.Fatal(err)
	}
	const n = 256
	batch := benchBatch(m, n)
	var g model.Gradients
	b.ReportAllocs()
	for b.Loop() {
		if err := m.ComputeGradients(batch, &g); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "samples/s")
}
