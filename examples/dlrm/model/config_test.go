package model_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/model"
)

func TestDefaultConfigAndLayout(t *testing.T) {
	cfg := model.DefaultConfig()
	if cfg.DenseFeatures != 13 || cfg.Fields != 26 || cfg.EmbeddingDim != 16 ||
		!slices.Equal(cfg.BottomHidden, []int{64, 32}) || !slices.Equal(cfg.TopHidden, []int{128, 64}) {
		t.Fatalf("DefaultConfig %+v", cfg)
	}
	m, err := model.New(model.Config{})
	if err != nil {
		t.Fatal(err)
	}
	top0 := 16 + 27*26/2 // bottom output + pairwise dot products = 367
	want := []struct {
		name  string
		shape []int
	}{
		{"bottom.0.weight", []int{13, 64}}, {"bottom.0.bias", []int{64}},
		{"bottom.1.weight", []int{64, 32}}, {"bottom.1.bias", []int{32}},
		{"bottom.2.weight", []int{32, 16}}, {"bottom.2.bias", []int{16}},
		{"top.0.weight", []int{top0, 128}}, {"top.0.bias", []int{128}},
		{"top.1.weight", []int{128, 64}}, {"top.1.bias", []int{64}},
		{"top.2.weight", []int{64, 1}}, {"top.2.bias", []int{1}},
	}
	ts := m.Tensors()
	if len(ts) != len(want) {
		t.Fatalf("%d tensors, want %d", len(ts), len(want))
	}
	off := 0
	for i, tn := range ts {
		if tn.Name != want[i].name || !slices.Equal(tn.Shape, want[i].shape) || tn.Offset != off {
			t.Errorf("tensor %d: %+v, want %s %v at offset %d", i, tn, want[i].name, want[i].shape, off)
		}
		off += tn.Len()
	}
	if off != 58929 || off != m.NumParams() || len(m.Params()) != off { // the count doc.go quotes
		t.Errorf("tensors cover %d values, NumParams %d, len(Params) %d", off, m.NumParams(), len(m.Params()))
	}
}

func TestConfigValidateReportsEverything(t *testing.T) {
	err := model.Config{
		DenseFeatures: -1,
		Fields:        5000,
		EmbeddingDim:  -3,
		BottomHidden:  []int{0},
		TopHidden:     []int{8, -1},
		Pooling:       9,
		FieldPooling:  []model.Pooling{model.PoolMean},
	}.Validate()
	if !errors.Is(err, model.ErrInvalidConfig) {
		t.Fatalf("err %v, want ErrInvalidConfig", err)
	}
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) != 7 {
		t.Errorf("want 7 problems reported at once, got: %v", err)
	}
	if _, err := model.New(model.Config{EmbeddingDim: 1 << 20}); !errors.Is(err, model.ErrInvalidConfig) {
		t.Errorf("New with a bad config: err %v, want ErrInvalidConfig", err)
	}
	if err := (model.Config{Fields: 1000, EmbeddingDim: 1024, TopHidden: []int{1024}}).Validate(); !errors.Is(err, model.ErrInvalidConfig) {
		t.Errorf("oversized model: err %v, want ErrInvalidConfig", err)
	}
}

func TestEmptyHiddenListsMeanNoHiddenLayer(t *testing.T) {
	m, err := model.New(model.Config{DenseFeatures: 2, Fields: 2, EmbeddingDim: 3, BottomHidden: []int{}, TopHidden: []int{}})
	if err != nil {
		t.Fatal(err)
	}
	// bottom 2→3, top (3+3)→1
	if got, want := m.NumParams(), 2*3+3+6*1+1; got != want {
		t.Errorf("NumParams %d, want %d", got, want)
	}
}

func TestConfigIsCopied(t *testing.T) {
	hidden := []int{8}
	pool := []model.Pooling{model.PoolSum, model.PoolMean}
	m, err := model.New(model.Config{DenseFeatures: 2, Fields: 2, EmbeddingDim: 4, BottomHidden: hidden, TopHidden: hidden, FieldPooling: pool})
	if err != nil {
		t.Fatal(err)
	}
	hidden[0], pool[1] = 99, model.PoolSum
	cfg := m.Config()
	if cfg.BottomHidden[0] != 8 || cfg.FieldPooling[1] != model.PoolMean {
		t.Errorf("model aliases the caller's config slices: %+v", cfg)
	}
}

func TestInitIsSeeded(t *testing.T) {
	a, _ := model.New(model.Config{Seed: 1})
	b, _ := model.New(model.Config{Seed: 1})
	c, _ := model.New(model.Config{Seed: 2})
	if !slices.Equal(a.Params(), b.Params()) {
		t.Error("same seed, different parameters")
	}
	if slices.Equal(a.Params(), c.Params()) {
		t.Error("different seeds, same parameters")
	}
	if err := a.SetParams(c.Params()); err != nil || !slices.Equal(a.Params(), c.Params()) {
		t.Errorf("SetParams: %v", err)
	}
	if err := a.SetParams(c.Params()[1:]); !errors.Is(err, model.ErrParamLength) {
		t.Errorf("SetParams with a short vector: err %v, want ErrParamLength", err)
	}
	if model.PoolSum.String() != "sum" || model.PoolMean.String() != "mean" || model.Pooling(7).String() != "Pooling(7)" {
		t.Error("Pooling.String")
	}
}
