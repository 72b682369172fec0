package model_test

import (
	"fmt"
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

// BenchmarkComputeGradients measures training throughput (forward +
// backward, no optimizer) of the default model; forward-only (Predict) in
// the same run is the baseline the ratio is read against.
func BenchmarkComputeGradients(b *testing.B) {
	m, err := model.New(model.Config{})
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{32, 256, 1024} {
		batch := benchBatch(m, n)
		b.Run(fmt.Sprintf("fwd+bwd/batch=%d", n), func(b *testing.B) {
			var g model.Gradients
			if err := m.ComputeGradients(batch, &g); err != nil { // size the buffers
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := m.ComputeGradients(batch, &g); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "samples/s")
		})
		b.Run(fmt.Sprintf("fwd/batch=%d", n), func(b *testing.B) {
			probs := make([]float32, 0, n)
			if _, err := m.Predict(probs[:0], batch); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := m.Predict(probs[:0], batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "samples/s")
		})
	}
}

// BenchmarkTrainStep measures one full local training step on synthetic
// data as the in-process test runs it: generate 256 records, build and
// de-duplicate the batch, pull rows from a map table, forward + backward,
// Adam on the dense parameters, Adagrad push of the rows.
func BenchmarkTrainStep(b *testing.B) {
	gen, err := model.NewSynth(model.SynthConfig{Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	m, err := model.New(gen.ModelConfig())
	if err != nil {
		b.Fatal(err)
	}
	bb, err := model.NewBatchBuilder(m.Config())
	if err != nil {
		b.Fatal(err)
	}
	opt, err := model.NewAdam(model.AdamConfig{})
	if err != nil {
		b.Fatal(err)
	}
	tab := newLocalTable(m.Config().EmbeddingDim, 0.1, 0.05)
	const n = 256
	var s model.Sample
	var g model.Gradients
	var idx uint64
	b.ReportAllocs()
	for b.Loop() {
		bb.Reset()
		for range n {
			gen.Sample(idx, &s)
			idx++
			if err := bb.Add(&s); err != nil {
				b.Fatal(err)
			}
		}
		tab.pull(bb.Keys(), bb.Rows(), true)
		if err := m.ComputeGradients(bb.Batch(), &g); err != nil {
			b.Fatal(err)
		}
		if err := opt.Update(m.Params(), g.Dense); err != nil {
			b.Fatal(err)
		}
		tab.push(bb.Keys(), g.Rows)
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "samples/s")
}

// BenchmarkSynthSample measures record generation of the default data set.
func BenchmarkSynthSample(b *testing.B) {
	gen, err := model.NewSynth(model.SynthConfig{Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	var s model.Sample
	var i uint64
	b.ReportAllocs()
	for b.Loop() {
		gen.Sample(i, &s)
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}
