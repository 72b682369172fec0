package model

import (
	"errors"
	"fmt"
)

// ErrInvalidConfig is returned (wrapped, one error per problem, joined) by
// Config.Validate and New when a Config field is out of range.
var ErrInvalidConfig = errors.New("model: invalid config")

// Limits that keep every index of the flat parameter vector and of the
// per-batch buffers well inside int32 range on any platform.
const (
	maxWidth  = 1 << 16 // widest layer, embedding dim or dense input
	maxFields = 1 << 10 // categorical fields (interactions grow quadratically)
	maxLayers = 64      // hidden layers per MLP
	maxParams = 1 << 28 // dense parameters in total (1 GiB of float32)
)

// Pooling says how the embedding vectors of a multi-valued categorical field
// (a bag of ids) are reduced to the one vector that enters the interaction.
type Pooling uint8

const (
	// PoolSum adds the vectors of the bag. Every id receives the full gradient
	// of the pooled vector. An empty bag pools to the zero vector.
	PoolSum Pooling = iota
	// PoolMean averages the vectors of the bag. Every id receives the
	// gradient of the pooled vector divided by the bag size (an id that occurs
	// twice receives it twice). An empty bag pools to the zero vector.
	PoolMean
)

// String returns "sum" or "mean".
func (p Pooling) String() string {
	switch p {
	case PoolSum:
		return "sum"
	case PoolMean:
		return "mean"
	default:
		return fmt.Sprintf("Pooling(%d)", uint8(p))
	}
}

// Config describes the shape of a DLRM model. The zero value is the default
// model: 13 dense features, 26 categorical fields of dimension 16, bottom MLP
// 13-64-32-16, top MLP 367-128-64-1, sum pooling. It is sized so one core
// trains tens of thousands of samples per second.
type Config struct {
	// DenseFeatures is the number of dense (continuous) inputs per sample,
	// the width of the bottom MLP's input. Default 13 (as in Criteo). Inputs
	// should be roughly unit-scaled, e.g. log(1+count).
	DenseFeatures int

	// Fields is the number of categorical fields; each sample brings one
	// pooled embedding vector per field. Default 26 (as in Criteo). The
	// interaction layer grows as Fields²/2 dot products per sample.
	Fields int

	// EmbeddingDim is the width of every embedding vector and of the bottom
	// MLP's output. Default 16. Larger values raise capacity and the cost of
	// the interaction and of the PS traffic linearly.
	EmbeddingDim int

	// BottomHidden lists the widths of the bottom MLP's hidden layers; a
	// final layer of width EmbeddingDim is always appended, and every bottom
	// layer (the final one included) is followed by ReLU. nil means the
	// default {64, 32}; an empty non-nil slice means no hidden layer (one
	// layer DenseFeatures -> EmbeddingDim).
	BottomHidden []int

	// TopHidden lists the widths of the top MLP's hidden layers (each
	// followed by ReLU); a final linear layer of width 1 producing the logit
	// is always appended. nil means the default {128, 64}; an empty non-nil
	// slice means a single linear layer (logistic regression over the
	// interactions). The first top layer dominates the cost: its input has
	// EmbeddingDim + Fields*(Fields+1)/2 entries.
	TopHidden []int

	// Pooling is the pooling of every field not listed in FieldPooling.
	// Default (zero value) PoolSum.
	Pooling Pooling

	// FieldPooling optionally overrides Pooling per field; if non-nil its
	// length must equal Fields.
	FieldPooling []Pooling

	// FirstOrder adds a first-order (linear) term to the logit: every
	// embedding row comes with a scalar weight (Batch.Biases), pooled per field
	// like its row, and the pooled scalars of all fields are added to the top
	// MLP's output. It is the per-id bias of factorisation machines and of the
	// wide part of wide-and-deep models: a popular or well-rated id gets its
	// own offset without spending its vector's dimensions or the MLP's
	// capacity on it. Default false: Batch.Biases must be nil.
	FirstOrder bool

	// ConcatEmbeddings puts the pooled embedding vectors themselves into the
	// top MLP's input, after the bottom output and before the dot products
	// (t and its pairwise products, rather than z0 and the products), so the
	// MLP sees each field's vector and not only how it aligns with the
	// others. The first top layer gets Fields×EmbeddingDim more inputs.
	// Default false: the DLRM reference's dot interaction.
	ConcatEmbeddings bool

	// Seed seeds the initial dense parameters (every seed, 0 included, is a
	// valid seed; the same seed gives bit-identical parameters).
	Seed uint64
}

// DefaultConfig returns the default Config with every field filled in.
func DefaultConfig() Config {
	return Config{}.withDefaults()
}

// withDefaults returns a copy of c with zero fields replaced by defaults. The
// slices of the result are fresh copies, so the model never aliases the
// caller's slices.
func (c Config) withDefaults() Config {
	if c.DenseFeatures == 0 {
		c.DenseFeatures = 13
	}
	if c.Fields == 0 {
		c.Fields = 26
	}
	if c.EmbeddingDim == 0 {
		c.EmbeddingDim = 16
	}
	if c.BottomHidden == nil {
		c.BottomHidden = []int{64, 32}
	} else {
		c.BottomHidden = append([]int{}, c.BottomHidden...)
	}
	if c.TopHidden == nil {
		c.TopHidden = []int{128, 64}
	} else {
		c.TopHidden = append([]int{}, c.TopHidden...)
	}
	if c.FieldPooling != nil {
		c.FieldPooling = append([]Pooling{}, c.FieldPooling...)
	}
	return c
}

// Validate reports every problem of c (after defaults are applied) at once;
// each wraps ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.DenseFeatures < 1 || c.DenseFeatures > maxWidth {
		bad("DenseFeatures %d out of range [1, %d]", c.DenseFeatures, maxWidth)
	}
	if c.Fields < 1 || c.Fields > maxFields {
		bad("Fields %d out of range [1, %d]", c.Fields, maxFields)
	}
	if c.EmbeddingDim < 1 || c.EmbeddingDim > maxWidth {
		bad("EmbeddingDim %d out of range [1, %d]", c.EmbeddingDim, maxWidth)
	}
	for _, mlp := range []struct {
		name   string
		hidden []int
	}{{"BottomHidden", c.BottomHidden}, {"TopHidden", c.TopHidden}} {
		name, hidden := mlp.name, mlp.hidden
		if len(hidden) > maxLayers {
			bad("%s has %d layers, more than %d", name, len(hidden), maxLayers)
		}
		for i, w := range hidden {
			if w < 1 || w > maxWidth {
				bad("%s[%d] = %d out of range [1, %d]", name, i, w, maxWidth)
			}
		}
	}
	if c.Pooling > PoolMean {
		bad("unknown Pooling %d", uint8(c.Pooling))
	}
	if c.FieldPooling != nil && len(c.FieldPooling) != c.Fields {
		bad("FieldPooling has %d entries, want Fields = %d", len(c.FieldPooling), c.Fields)
	}
	for i, p := range c.FieldPooling {
		if p > PoolMean {
			bad("FieldPooling[%d]: unknown Pooling %d", i, uint8(p))
		}
	}
	if len(errs) == 0 {
		if n := c.numParams(); n > maxParams {
			bad("%d dense parameters, more than %d", n, maxParams)
		}
	}
	return errors.Join(errs...)
}

// bottomWidths returns the widths of the bottom MLP from input to output.
func (c Config) bottomWidths() []int {
	w := []int{c.DenseFeatures}
	w = append(w, c.BottomHidden...)
	return append(w, c.EmbeddingDim)
}

// numPairs is the number of pairwise interactions (strict upper triangle
// over the bottom output and the Fields pooled embeddings).
func (c Config) numPairs() int {
	return (c.Fields + 1) * c.Fields / 2
}

// topHead is the number of top MLP inputs before the dot products: the
// bottom output, and with ConcatEmbeddings the pooled vectors after it.
func (c Config) topHead() int {
	if c.ConcatEmbeddings {
		return (c.Fields + 1) * c.EmbeddingDim
	}
	return c.EmbeddingDim
}

// topWidths returns the widths of the top MLP from input to the logit.
func (c Config) topWidths() []int {
	w := []int{c.topHead() + c.numPairs()}
	w = append(w, c.TopHidden...)
	return append(w, 1)
}

// numParams counts dense parameters; only meaningful for in-range configs
// (int64 arithmetic keeps it overflow-free for any validated widths).
func (c Config) numParams() int64 {
	var n int64
	for _, ws := range [][]int{c.bottomWidths(), c.topWidths()} {
		for i := 1; i < len(ws); i++ {
			n += int64(ws[i-1])*int64(ws[i]) + int64(ws[i])
		}
	}
	return n
}
