package model

import (
	"errors"
	"fmt"
	"math"
)

// ErrParamLength is returned (wrapped) by SetParams when the given vector
// does not have NumParams entries.
var ErrParamLength = errors.New("model: wrong parameter vector length")

// Tensor names one dense parameter tensor: the slice
// Params()[Offset : Offset+Len()] seen as a row-major array of Shape.
// Weights have Shape {in, out} (a layer computes y = x·W + b for a row
// vector x); biases have Shape {out}.
type Tensor struct {
	// Name is "bottom.<i>.weight", "bottom.<i>.bias", "top.<i>.weight" or
	// "top.<i>.bias", layers numbered from 0 at the input side.
	Name string
	// Offset is the index of the tensor's first value in the flat vector.
	Offset int
	// Shape is {in, out} for a weight, {out} for a bias.
	Shape []int
}

// Len returns the number of values of the tensor.
func (t Tensor) Len() int {
	n := 1
	for _, s := range t.Shape {
		n *= s
	}
	return n
}

// layer is one fully connected layer: y = x·W + b, W stored [in][out].
type layer struct {
	in, out int
	w, b    int // offsets of W and b in the flat parameter vector
	relu    bool
}

// Model is a DLRM network: dense parameters, their layout and the scratch
// buffers of one forward/backward pass. It is not safe for concurrent use;
// run one Model per goroutine (they may share nothing, or copy parameters
// with Params/SetParams).
type Model struct {
	cfg     Config
	pooling []Pooling // per field
	bottom  []layer
	top     []layer
	params  []float32
	ws      workspace
}

// New returns a model for cfg with freshly initialised dense parameters:
// weights drawn from N(0, 2/(in+out)) and biases from N(0, 1/out), seeded by
// cfg.Seed (the initialisation of the DLRM reference implementation).
func New(cfg Config) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m := &Model{cfg: cfg, pooling: make([]Pooling, cfg.Fields)}
	for i := range m.pooling {
		m.pooling[i] = cfg.Pooling
		if cfg.FieldPooling != nil {
			m.pooling[i] = cfg.FieldPooling[i]
		}
	}
	off := 0
	build := func(widths []int, lastReLU bool) []layer {
		ls := make([]layer, len(widths)-1)
		for i := range ls {
			in, out := widths[i], widths[i+1]
			ls[i] = layer{in: in, out: out, w: off, b: off + in*out, relu: lastReLU || i < len(ls)-1}
			off += in*out + out
		}
		return ls
	}
	m.bottom = build(cfg.bottomWidths(), true)
	m.top = build(cfg.topWidths(), false)
	m.params = make([]float32, off)
	m.initParams(cfg.Seed)
	return m, nil
}

func (m *Model) initParams(seed uint64) {
	r := newRNG(seed, 0x646c726d) // "dlrm"
	for _, ls := range [][]layer{m.bottom, m.top} {
		for _, l := range ls {
			sw := math.Sqrt(2 / float64(l.in+l.out))
			for i := range l.in * l.out {
				m.params[l.w+i] = float32(sw * r.normal())
			}
			sb := math.Sqrt(1 / float64(l.out))
			for i := range l.out {
				m.params[l.b+i] = float32(sb * r.normal())
			}
		}
	}
}

// Config returns the model's configuration with every default filled in.
func (m *Model) Config() Config { return m.cfg.withDefaults() }

// NumParams returns the length of the flat dense parameter vector (and of
// Gradients.Dense).
func (m *Model) NumParams() int { return len(m.params) }

// Params returns the model's live dense parameter vector, laid out as
// Tensors describes. The slice is owned by the model: the caller may read it
// or write it in place (for example with values pulled from the parameter
// servers) between calls, but must not keep using it across a call running
// in another goroutine.
func (m *Model) Params() []float32 { return m.params }

// SetParams copies p into the model's parameters; p must have NumParams
// entries (ErrParamLength otherwise). The model does not keep p.
func (m *Model) SetParams(p []float32) error {
	if len(p) != len(m.params) {
		return fmt.Errorf("%w: got %d, want %d", ErrParamLength, len(p), len(m.params))
	}
	copy(m.params, p)
	return nil
}

// Tensors lists the dense parameter tensors in the order they are laid out
// in the flat vector: bottom layers from the input side, then top layers,
// each weight followed by its bias. The tensors tile the vector exactly. The
// returned slice is freshly allocated.
func (m *Model) Tensors() []Tensor {
	var ts []Tensor
	for _, part := range []struct {
		name   string
		layers []layer
	}{{"bottom", m.bottom}, {"top", m.top}} {
		for i, l := range part.layers {
			ts = append(ts,
				Tensor{Name: fmt.Sprintf("%s.%d.weight", part.name, i), Offset: l.w, Shape: []int{l.in, l.out}},
				Tensor{Name: fmt.Sprintf("%s.%d.bias", part.name, i), Offset: l.b, Shape: []int{l.out}})
		}
	}
	return ts
}
