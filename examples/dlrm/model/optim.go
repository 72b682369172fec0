package model

import (
	"errors"
	"fmt"
	"math"
)

// ErrOptimizerLength is returned (wrapped) by Optimizer.Update when params
// and grads differ in length, or when the length differs from the one the
// optimizer's state was created for.
var ErrOptimizerLength = errors.New("model: optimizer length mismatch")

// Optimizer applies gradient steps to a dense parameter vector in place. It
// is used when training locally (tests, single-process runs); in the
// parameter-server trainer the servers apply their own optimizer to the
// pushed Gradients.Dense. An Optimizer keeps per-parameter state for one
// vector and is not safe for concurrent use.
type Optimizer interface {
	// Update applies one step: params -= step(grads). len(params) must
	// equal len(grads) and stay the same across calls.
	Update(params, grads []float32) error
}

// Compile-time checks that the optimizers implement Optimizer.
var (
	_ Optimizer = (*SGD)(nil)
	_ Optimizer = (*Adagrad)(nil)
	_ Optimizer = (*Adam)(nil)
)

func checkLengths(params, grads []float32, state int) error {
	if len(params) != len(grads) {
		return fmt.Errorf("%w: %d params, %d grads", ErrOptimizerLength, len(params), len(grads))
	}
	if state >= 0 && state != len(params) {
		return fmt.Errorf("%w: state holds %d values, got %d", ErrOptimizerLength, state, len(params))
	}
	return nil
}

func validRate(name string, v float64, errs []error) []error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		errs = append(errs, fmt.Errorf("%w: %s %v must be finite and ≥ 0", ErrInvalidConfig, name, v))
	}
	return errs
}

// SGDConfig configures plain stochastic gradient descent.
type SGDConfig struct {
	// LearningRate is the step size. Default 0.01.
	LearningRate float64
}

// SGD is params -= LearningRate·grads.
type SGD struct{ lr float32 }

// NewSGD returns an SGD optimizer.
func NewSGD(cfg SGDConfig) (*SGD, error) {
	if cfg.LearningRate == 0 {
		cfg.LearningRate = 0.01
	}
	if err := errors.Join(validRate("LearningRate", cfg.LearningRate, nil)...); err != nil {
		return nil, err
	}
	return &SGD{lr: float32(cfg.LearningRate)}, nil
}

// Update implements Optimizer.
func (o *SGD) Update(params, grads []float32) error {
	if err := checkLengths(params, grads, -1); err != nil {
		return err
	}
	axpy(params, -o.lr, grads)
	return nil
}

// AdagradConfig configures Adagrad.
type AdagradConfig struct {
	// LearningRate is the step size. Default 0.01.
	LearningRate float64
	// InitialAccumulator is the starting value of every squared-gradient
	// accumulator. Default 0.1 (larger values damp the first steps).
	InitialAccumulator float64
	// Epsilon is added to the square root of the accumulator. Default 1e-8.
	Epsilon float64
}

// Adagrad is acc += g²; params -= LearningRate·g/(√acc + Epsilon).
type Adagrad struct {
	lr, eps float32
	init    float32
	acc     []float32
}

// NewAdagrad returns an Adagrad optimizer whose state is created on the
// first Update.
func NewAdagrad(cfg AdagradConfig) (*Adagrad, error) {
	if cfg.LearningRate == 0 {
		cfg.LearningRate = 0.01
	}
	if cfg.InitialAccumulator == 0 {
		cfg.InitialAccumulator = 0.1
	}
	if cfg.Epsilon == 0 {
		cfg.Epsilon = 1e-8
	}
	var errs []error
	errs = validRate("LearningRate", cfg.LearningRate, errs)
	errs = validRate("InitialAccumulator", cfg.InitialAccumulator, errs)
	errs = validRate("Epsilon", cfg.Epsilon, errs)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Adagrad{lr: float32(cfg.LearningRate), eps: float32(cfg.Epsilon), init: float32(cfg.InitialAccumulator)}, nil
}

// Update implements Optimizer.
func (o *Adagrad) Update(params, grads []float32) error {
	state := len(o.acc)
	if o.acc == nil {
		state = -1
	}
	if err := checkLengths(params, grads, state); err != nil {
		return err
	}
	if o.acc == nil {
		o.acc = make([]float32, len(params))
		for i := range o.acc {
			o.acc[i] = o.init
		}
	}
	acc := o.acc[:len(params)]
	grads = grads[:len(params)]
	for i, g := range grads {
		a := acc[i] + g*g
		acc[i] = a
		params[i] -= o.lr * g / (float32(math.Sqrt(float64(a))) + o.eps)
	}
	return nil
}

// AdamConfig configures Adam (Kingma & Ba, with bias correction).
type AdamConfig struct {
	// LearningRate is the step size. Default 0.001.
	LearningRate float64
	// Beta1 is the decay of the first-moment average. Default 0.9.
	Beta1 float64
	// Beta2 is the decay of the second-moment average. Default 0.999.
	Beta2 float64
	// Epsilon is added to the root of the second moment. Default 1e-8.
	Epsilon float64
}

// Adam is the Adam optimizer.
type Adam struct {
	cfg  AdamConfig
	step int
	m, v []float32
}

// NewAdam returns an Adam optimizer whose state is created on the first
// Update.
func NewAdam(cfg AdamConfig) (*Adam, error) {
	if cfg.LearningRate == 0 {
		cfg.LearningRate = 0.001
	}
	if cfg.Beta1 == 0 {
		cfg.Beta1 = 0.9
	}
	if cfg.Beta2 == 0 {
		cfg.Beta2 = 0.999
	}
	if cfg.Epsilon == 0 {
		cfg.Epsilon = 1e-8
	}
	var errs []error
	errs = validRate("LearningRate", cfg.LearningRate, errs)
	errs = validRate("Epsilon", cfg.Epsilon, errs)
	for _, b := range []struct {
		name string
		v    float64
	}{{"Beta1", cfg.Beta1}, {"Beta2", cfg.Beta2}} {
		if !(b.v >= 0 && b.v < 1) {
			errs = append(errs, fmt.Errorf("%w: %s %v must be in [0, 1)", ErrInvalidConfig, b.name, b.v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Adam{cfg: cfg}, nil
}

// Update implements Optimizer.
func (o *Adam) Update(params, grads []float32) error {
	state := len(o.m)
	if o.m == nil {
		state = -1
	}
	if err := checkLengths(params, grads, state); err != nil {
		return err
	}
	if o.m == nil {
		o.m = make([]float32, len(params))
		o.v = make([]float32, len(params))
	}
	o.step++
	b1, b2 := float32(o.cfg.Beta1), float32(o.cfg.Beta2)
	// Fold both bias corrections into the step size and epsilon.
	c1 := 1 - math.Pow(o.cfg.Beta1, float64(o.step))
	c2 := 1 - math.Pow(o.cfg.Beta2, float64(o.step))
	lr := float32(o.cfg.LearningRate * math.Sqrt(c2) / c1)
	eps := float32(o.cfg.Epsilon * math.Sqrt(c2))
	m, v := o.m[:len(params)], o.v[:len(params)]
	grads = grads[:len(params)]
	for i, g := range grads {
		mi := b1*m[i] + (1-b1)*g
		vi := b2*v[i] + (1-b2)*g*g
		m[i], v[i] = mi, vi
		params[i] -= lr * mi / (float32(math.Sqrt(float64(vi))) + eps)
	}
	return nil
}
