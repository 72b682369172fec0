package model_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/model"
)

func sampleEqual(a, b *model.Sample) bool {
	return slices.Equal(a.Dense, b.Dense) && slices.Equal(a.IDs, b.IDs) &&
		slices.Equal(a.Offsets, b.Offsets) && a.Label == b.Label
}

func TestSynthRecordsArePureFunctionsOfSeedAndIndex(t *testing.T) {
	cfg := model.SynthConfig{Seed: 3, Vocab: []int{5, 100, 1000}, Hotness: []int{1, 3, 2}}
	g1, err := model.NewSynth(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := model.NewSynth(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var a, b model.Sample
	// Forward on one generator, backward and sparse on the other.
	const n = 500
	want := make([]model.Sample, n)
	probs := make([]float64, n)
	for i := range n {
		probs[i] = g1.Sample(uint64(i), &a)
		want[i] = model.Sample{Dense: slices.Clone(a.Dense), IDs: slices.Clone(a.IDs), Offsets: slices.Clone(a.Offsets), Label: a.Label}
	}
	for i := n - 1; i >= 0; i -= 7 {
		if p := g2.Sample(uint64(i), &b); p != probs[i] || !sampleEqual(&b, &want[i]) {
			t.Fatalf("record %d differs when read in another order or by another generator", i)
		}
	}
	// A far index is just another record.
	g1.Sample(1<<63+5, &a)
	g2.Sample(1<<63+5, &b)
	if !sampleEqual(&a, &b) {
		t.Fatal("far record differs")
	}
	// Another seed is another data set.
	cfg.Seed = 4
	g3, err := model.NewSynth(cfg)
	if err != nil {
		t.Fatal(err)
	}
	same := 0
	for i := range 50 {
		g3.Sample(uint64(i), &b)
		if sampleEqual(&b, &want[i]) {
			same++
		}
	}
	if same > 0 {
		t.Errorf("%d of 50 records identical across seeds", same)
	}
}

func TestSynthShapeAndDistribution(t *testing.T) {
	vocab := []int{10, 1000, 50000}
	hot := []int{1, 4, 1}
	const s = 1.1
	g, err := model.NewSynth(model.SynthConfig{Seed: 8, DenseFeatures: 5, Vocab: vocab, Hotness: hot, ZipfExponent: s})
	if err != nil {
		t.Fatal(err)
	}
	if mc := g.ModelConfig(); mc.DenseFeatures != 5 || mc.Fields != 3 {
		t.Fatalf("ModelConfig %+v, want 5 dense, 3 fields", mc)
	}
	const n = 40000
	counts := make([]map[uint64]int, len(vocab))
	for f := range counts {
		counts[f] = map[uint64]int{}
	}
	bagSizes := map[int]int{}
	var smp model.Sample
	var labels, probSum float64
	for i := range n {
		p := g.Sample(uint64(i), &smp)
		if len(smp.Dense) != 5 || len(smp.Offsets) != 4 || smp.Offsets[0] != 0 || int(smp.Offsets[3]) != len(smp.IDs) {
			t.Fatalf("record %d: malformed sample %+v", i, smp)
		}
		for _, x := range smp.Dense {
			if !(x >= 0) || math.IsInf(float64(x), 0) { // log(1+count) ≥ 0
				t.Fatalf("record %d: dense value %v", i, x)
			}
		}
		for f := range vocab {
			bag := int(smp.Offsets[f+1] - smp.Offsets[f])
			if bag < 1 || bag > hot[f] {
				t.Fatalf("record %d field %d: bag of %d, want 1..%d", i, f, bag, hot[f])
			}
			if f == 1 {
				bagSizes[bag]++
			}
			for _, id := range smp.IDs[smp.Offsets[f]:smp.Offsets[f+1]] {
				counts[f][id]++
			}
		}
		if !(p > 0 && p < 1) || (smp.Label != 0 && smp.Label != 1) {
			t.Fatalf("record %d: probability %v, label %v", i, p, smp.Label)
		}
		labels += float64(smp.Label)
		probSum += p
	}
	if rate := labels / n; math.Abs(rate-0.25) > 0.02 {
		t.Errorf("positive rate %.4f, want ≈ 0.25", rate)
	}
	if math.Abs(labels-probSum)/n > 0.01 {
		t.Errorf("labels (%v) and probabilities (%v) disagree: labels are not drawn from the returned probability", labels, probSum)
	}
	for b := 1; b <= 4; b++ {
		if c := bagSizes[b]; math.Abs(float64(c)/n-0.25) > 0.02 {
			t.Errorf("bag size %d in %d of %d samples, want a quarter", b, c, n)
		}
	}
	for f, v := range vocab {
		if len(counts[f]) > v {
			t.Errorf("field %d: %d distinct ids, vocabulary %d", f, len(counts[f]), v)
		}
		// The most frequent id has probability 1/H(v, s) under Zipf.
		var h float64
		for k := 1; k <= v; k++ {
			h += math.Pow(float64(k), -s)
		}
		draws := 0
		top := 0
		for _, c := range counts[f] {
			draws += c
			top = max(top, c)
		}
		want := 1 / h
		if got := float64(top) / float64(draws); math.Abs(got-want) > 0.1*want {
			t.Errorf("field %d: top id frequency %.4f, Zipf predicts %.4f", f, got, want)
		}
	}
}

func TestSynthCeiling(t *testing.T) {
	const from, n = 1 << 40, 20000
	var prev float64
	for _, signal := range []float64{0.5, 1, 2} {
		g, err := model.NewSynth(model.SynthConfig{Seed: 2, Signal: signal, Vocab: []int{20, 300, 5000, 40000, 7}})
		if err != nil {
			t.Fatal(err)
		}
		c, err := g.Ceiling(from, from+n)
		if err != nil {
			t.Fatal(err)
		}
		if c.N != n || math.Abs(c.PositiveRate-0.25) > 0.02 {
			t.Errorf("signal %v: ceiling %+v", signal, c)
		}
		if c.AUC <= prev || c.AUC > 0.99 {
			t.Errorf("signal %v: ceiling AUC %.4f, want above %.4f (weaker signal) and below 0.99", signal, c.AUC, prev)
		}
		if signal == 1 && (c.AUC < 0.75 || c.AUC > 0.87) {
			t.Errorf("default signal: ceiling AUC %.4f, want about 0.8", c.AUC)
		}
		// The true probabilities are calibrated: their log loss beats
		// predicting the base rate.
		base := -(c.PositiveRate*math.Log(c.PositiveRate) + (1-c.PositiveRate)*math.Log(1-c.PositiveRate))
		if c.LogLoss >= base {
			t.Errorf("signal %v: ceiling log loss %.4f not below base-rate entropy %.4f", signal, c.LogLoss, base)
		}
		prev = c.AUC
	}
	g, err := model.NewSynth(model.SynthConfig{Vocab: []int{10}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Ceiling(5, 5); !errors.Is(err, model.ErrMetric) {
		t.Errorf("empty range: err %v, want ErrMetric", err)
	}
}

func TestSynthDefaultConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the full 26-field hidden model")
	}
	g, err := model.NewSynth(model.SynthConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := g.Config()
	if cfg.DenseFeatures != 13 || len(cfg.Vocab) != 26 || cfg.ZipfExponent != 1.05 || cfg.PositiveRate != 0.25 {
		t.Errorf("default config %+v", cfg)
	}
	c, err := g.Ceiling(0, 20000)
	if err != nil {
		t.Fatal(err)
	}
	if c.AUC < 0.77 || c.AUC > 0.85 {
		t.Errorf("default ceiling AUC %.4f, want about 0.8", c.AUC)
	}
	m, err := model.New(g.ModelConfig())
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Config(); got.Fields != 26 || got.DenseFeatures != 13 {
		t.Errorf("model config for the default data %+v", got)
	}
}

func TestSynthConfigValidate(t *testing.T) {
	err := model.SynthConfig{
		DenseFeatures: -1,
		Vocab:         []int{10, 0},
		Hotness:       []int{1},
		ZipfExponent:  -2,
		LatentDim:     1000,
		Signal:        math.NaN(),
		PositiveRate:  1.5,
	}.Validate()
	if !errors.Is(err, model.ErrInvalidConfig) {
		t.Fatalf("err %v, want ErrInvalidConfig", err)
	}
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) != 7 {
		t.Errorf("want 7 problems reported at once, got: %v", err)
	}
	if _, err := model.NewSynth(model.SynthConfig{Vocab: []int{}}); !errors.Is(err, model.ErrInvalidConfig) {
		t.Errorf("no fields: err %v, want ErrInvalidConfig", err)
	}
}

// TestSynthConcurrentReaders reads the same records from several
// goroutines (run with -race): a Synth is safe for concurrent use.
func TestSynthConcurrentReaders(t *testing.T) {
	g, err := model.NewSynth(model.SynthConfig{Seed: 6, Vocab: []int{50, 500}, Hotness: []int{2, 1}})
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	want := make([]float64, n)
	var s model.Sample
	for i := range n {
		want[i] = g.Sample(uint64(i), &s)
	}
	errs := make(chan error, 4)
	for w := range 4 {
		go func() {
			var s model.Sample
			for i := range n {
				j := (i*7 + w) % n
				if p := g.Sample(uint64(j), &s); p != want[j] {
					errs <- fmt.Errorf("worker %d record %d: %v, want %v", w, j, p, want[j])
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
