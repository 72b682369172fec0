package model_test

import (
	"errors"
	"math"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/model"
)

// TestOptimizersHandComputed checks one or two steps of each optimizer
// against values computed by hand.
func TestOptimizersHandComputed(t *testing.T) {
	near := func(name string, got []float32, want ...float64) {
		t.Helper()
		for i := range want {
			if math.Abs(float64(got[i])-want[i]) > 1e-6 {
				t.Errorf("%s: param %d = %v, want %v", name, i, got[i], want[i])
			}
		}
	}

	sgd, err := model.NewSGD(model.SGDConfig{LearningRate: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	p := []float32{1, -1}
	if err := sgd.Update(p, []float32{0.2, -0.4}); err != nil {
		t.Fatal(err)
	}
	near("sgd", p, 0.9, -0.8)

	ada, err := model.NewAdagrad(model.AdagradConfig{LearningRate: 0.1, InitialAccumulator: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	p = []float32{1, 1}
	g := []float32{0.3, -0.4}
	if err := ada.Update(p, g); err != nil {
		t.Fatal(err)
	}
	// acc = 0.01 + g²: 0.1, 0.17.
	w0 := 1 - 0.1*0.3/(math.Sqrt(0.1)+1e-8)
	w1 := 1 + 0.1*0.4/(math.Sqrt(0.17)+1e-8)
	near("adagrad step 1", p, w0, w1)
	if err := ada.Update(p, g); err != nil {
		t.Fatal(err)
	}
	near("adagrad step 2", p, w0-0.1*0.3/(math.Sqrt(0.19)+1e-8), w1+0.1*0.4/(math.Sqrt(0.33)+1e-8))

	adam, err := model.NewAdam(model.AdamConfig{LearningRate: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	p = []float32{0}
	// The first bias-corrected Adam step is lr·sign(g) (for |g| ≫ eps).
	if err := adam.Update(p, []float32{-3}); err != nil {
		t.Fatal(err)
	}
	near("adam step 1", p, 0.1)
	// Second step with g = 1: m = 0.9·(-0.3) + 0.1 = -0.17, v = 0.999·0.009 + 0.001 = 0.009991.
	if err := adam.Update(p, []float32{1}); err != nil {
		t.Fatal(err)
	}
	mh := -0.17 / (1 - 0.81)
	vh := 0.009991 / (1 - 0.998001)
	near("adam step 2", p, 0.1-0.1*mh/(math.Sqrt(vh)+1e-8))
}

func TestOptimizerErrors(t *testing.T) {
	ada, _ := model.NewAdagrad(model.AdagradConfig{})
	adam, _ := model.NewAdam(model.AdamConfig{})
	sgd, _ := model.NewSGD(model.SGDConfig{})
	for name, o := range map[string]model.Optimizer{"sgd": sgd, "adagrad": ada, "adam": adam} {
		if err := o.Update(make([]float32, 3), make([]float32, 2)); !errors.Is(err, model.ErrOptimizerLength) {
			t.Errorf("%s: mismatched lengths: err %v", name, err)
		}
		if err := o.Update(make([]float32, 3), make([]float32, 3)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if name != "sgd" {
			if err := o.Update(make([]float32, 4), make([]float32, 4)); !errors.Is(err, model.ErrOptimizerLength) {
				t.Errorf("%s: changed length: err %v", name, err)
			}
		}
	}
	if _, err := model.NewAdam(model.AdamConfig{LearningRate: -1, Beta1: 1, Beta2: math.NaN()}); !errors.Is(err, model.ErrInvalidConfig) {
		t.Errorf("bad Adam config: err %v", err)
	}
	if _, err := model.NewAdagrad(model.AdagradConfig{Epsilon: math.Inf(1)}); !errors.Is(err, model.ErrInvalidConfig) {
		t.Errorf("bad Adagrad config: err %v", err)
	}
	if _, err := model.NewSGD(model.SGDConfig{LearningRate: math.NaN()}); !errors.Is(err, model.ErrInvalidConfig) {
		t.Errorf("bad SGD config: err %v", err)
	}
}

// TestLocalTrainingReducesLoss runs a few local steps on one fixed batch
// with each optimizer: the loss must fall.
func TestLocalTrainingReducesLoss(t *testing.T) {
	for _, mk := range []func() (model.Optimizer, error){
		func() (model.Optimizer, error) { return model.NewSGD(model.SGDConfig{LearningRate: 0.1}) },
		func() (model.Optimizer, error) { return model.NewAdagrad(model.AdagradConfig{LearningRate: 0.05}) },
		func() (model.Optimizer, error) { return model.NewAdam(model.AdamConfig{LearningRate: 0.01}) },
	} {
		opt, err := mk()
		if err != nil {
			t.Fatal(err)
		}
		m, err := model.New(model.Config{DenseFeatures: 4, Fields: 3, EmbeddingDim: 4, BottomHidden: []int{8}, TopHidden: []int{8}})
		if err != nil {
			t.Fatal(err)
		}
		b := benchBatch(m, 32)
		var g model.Gradients
		var first float64
		for step := range 50 {
			if err := m.ComputeGradients(b, &g); err != nil {
				t.Fatal(err)
			}
			if step == 0 {
				first = g.Loss
			}
			if err := opt.Update(m.Params(), g.Dense); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.ComputeGradients(b, &g); err != nil {
			t.Fatal(err)
		}
		if g.Loss > 0.9*first {
			t.Errorf("%T: loss %v -> %v after 50 steps on one batch", opt, first, g.Loss)
		}
	}
}
