package model

import (
	"errors"
	"fmt"
)

// ErrBatch is returned (wrapped with the first problem found) by Predict and
// ComputeGradients when a Batch does not match the model's Config: wrong
// slice lengths, bag offsets that are not a non-decreasing cover of the row
// references, a row index out of range, or a label outside [0, 1].
var ErrBatch = errors.New("model: malformed batch")

// ErrNonFinite is returned (wrapped) when a dense feature, label or embedding
// row of a Batch is NaN or ±Inf, or when the loss of a batch is not finite
// (diverged parameters). Gradients are then not valid and must not be pushed.
var ErrNonFinite = errors.New("model: non-finite value")

// Batch is one mini-batch as the trainer hands it to the model. The model
// reads it and never keeps or modifies any of its slices.
//
// Categorical input is a set of embedding rows (Rows) plus, for every
// (sample, field) pair — a bag, numbered k = sample*Fields + field — the list
// of rows pooled into that field's vector. Rows is typically the result of
// one pull from the parameter servers of the distinct ids of the batch, so a
// popular id appears once in Rows however often it occurs, and the gradient
// ComputeGradients returns for that row is already the sum over all its
// occurrences — exactly what is pushed back for that id.
//
// The two index slices are optional:
//
//   - Bags == nil: every bag holds exactly one reference (single-valued
//     fields); bag k is reference k. Otherwise len(Bags) == Size*Fields+1,
//     Bags[0] == 0, Bags is non-decreasing and bag k holds references
//     Bags[k] .. Bags[k+1]-1. Empty bags pool to the zero vector.
//   - Index == nil: reference q is row q. Otherwise reference q is row
//     Index[q], and rows may be shared between bags and samples.
//
// The number of references is len(Index), or the number of rows when Index
// is nil. So the plainest batch — every field single-valued, no
// de-duplication — sets only Size, Dense, Labels and Rows, with Rows holding
// Size*Fields vectors in sample-major, field-minor order.
type Batch struct {
	// Size is the number of samples in the batch (≥ 1).
	Size int
	// Dense holds Size×DenseFeatures values, row-major (sample-major).
	Dense []float32
	// Labels holds Size click labels in [0, 1] (0/1 for clicks; soft
	// labels are allowed). ComputeGradients needs it; Predict ignores it.
	Labels []float32
	// Rows holds R×EmbeddingDim embedding values, row-major, R ≥ 0.
	Rows []float32
	// Biases holds one first-order weight per row of Rows (R values), pooled
	// per bag like the rows (weighted, averaged for mean-pooled fields) and
	// added to the logit, when the model's Config.FirstOrder is set; nil
	// otherwise.
	Biases []float32
	// Bags optionally delimits each (sample, field) bag; see above.
	Bags []int32
	// Index optionally maps references to rows; see above.
	Index []int32
	// Weights optionally multiplies each reference's row before pooling
	// (value × row, as libSVM and libFM values weigh their features):
	// one finite weight per reference, or nil for weight 1 everywhere. Mean
	// pooling divides the weighted sum by the number of references of the bag.
	Weights []float32
}

// check validates b against the model shape. labels says whether Labels is
// required.
func (m *Model) check(b *Batch, labels bool) error {
	if b == nil {
		return fmt.Errorf("%w: nil batch", ErrBatch)
	}
	n, f, d := b.Size, m.cfg.Fields, m.cfg.EmbeddingDim
	if n < 1 || n > len(b.Dense) { // every sample has ≥ 1 dense value; also keeps n*f from overflowing
		return fmt.Errorf("%w: size %d, want 1 ≤ size ≤ %d dense values / %d features", ErrBatch, n, len(b.Dense), m.cfg.DenseFeatures)
	}
	if len(b.Dense) != n*m.cfg.DenseFeatures {
		return fmt.Errorf("%w: %d dense values, want size %d × %d features", ErrBatch, len(b.Dense), n, m.cfg.DenseFeatures)
	}
	if len(b.Rows)%d != 0 {
		return fmt.Errorf("%w: %d row values is not a multiple of embedding dim %d", ErrBatch, len(b.Rows), d)
	}
	rows := len(b.Rows) / d
	switch {
	case m.cfg.FirstOrder && len(b.Biases) != rows:
		return fmt.Errorf("%w: %d first-order weights for %d rows", ErrBatch, len(b.Biases), rows)
	case !m.cfg.FirstOrder && b.Biases != nil:
		return fmt.Errorf("%w: first-order weights given to a model without FirstOrder", ErrBatch)
	}
	if i, ok := firstNonFinite(b.Biases); !ok {
		return fmt.Errorf("%w: first-order weight %d is %v", ErrNonFinite, i, b.Biases[i])
	}
	refs := rows
	if b.Index != nil {
		refs = len(b.Index)
		for q, r := range b.Index {
			if r < 0 || int(r) >= rows {
				return fmt.Errorf("%w: Index[%d] = %d, want a row in [0, %d)", ErrBatch, q, r, rows)
			}
		}
	}
	if b.Bags == nil {
		if refs != n*f {
			return fmt.Errorf("%w: %d references without Bags, want one per (sample, field) = %d", ErrBatch, refs, n*f)
		}
	} else {
		if len(b.Bags) != n*f+1 {
			return fmt.Errorf("%w: %d bag offsets, want size %d × %d fields + 1", ErrBatch, len(b.Bags), n, f)
		}
		if b.Bags[0] != 0 {
			return fmt.Errorf("%w: Bags[0] = %d, want 0", ErrBatch, b.Bags[0])
		}
		for k := 1; k < len(b.Bags); k++ {
			if b.Bags[k] < b.Bags[k-1] {
				return fmt.Errorf("%w: Bags[%d] = %d < Bags[%d] = %d", ErrBatch, k, b.Bags[k], k-1, b.Bags[k-1])
			}
		}
		if last := b.Bags[len(b.Bags)-1]; int(last) != refs {
			return fmt.Errorf("%w: bags cover %d references, have %d", ErrBatch, last, refs)
		}
	}
	if b.Weights != nil {
		if len(b.Weights) != refs {
			return fmt.Errorf("%w: %d weights for %d references", ErrBatch, len(b.Weights), refs)
		}
		if i, ok := firstNonFinite(b.Weights); !ok {
			return fmt.Errorf("%w: weight %d is %v", ErrNonFinite, i, b.Weights[i])
		}
	}
	if i, ok := firstNonFinite(b.Dense); !ok {
		return fmt.Errorf("%w: dense value %d is %v", ErrNonFinite, i, b.Dense[i])
	}
	if i, ok := firstNonFinite(b.Rows); !ok {
		return fmt.Errorf("%w: embedding value %d (row %d) is %v", ErrNonFinite, i, i/d, b.Rows[i])
	}
	if labels {
		if len(b.Labels) != n {
			return fmt.Errorf("%w: %d labels, want %d", ErrBatch, len(b.Labels), n)
		}
		for i, y := range b.Labels {
			if !(y >= 0 && y <= 1) { // also rejects NaN
				return fmt.Errorf("%w: label %d is %v, want a value in [0, 1]", ErrBatch, i, y)
			}
		}
	}
	return nil
}

// firstNonFinite returns the index of the first NaN or ±Inf in s and false,
// or -1 and true when every value is finite.
func firstNonFinite(s []float32) (int, bool) {
	for i, v := range s {
		if v-v != 0 { // NaN - NaN and Inf - Inf are NaN; finite - itself is 0
			return i, false
		}
	}
	return -1, true
}

// bag returns the reference range [lo, hi) of bag k.
func (b *Batch) bag(k int) (lo, hi int) {
	if b.Bags == nil {
		return k, k + 1
	}
	return int(b.Bags[k]), int(b.Bags[k+1])
}

// weight returns the weight of reference q.
func (b *Batch) weight(q int) float32 {
	if b.Weights == nil {
		return 1
	}
	return b.Weights[q]
}

// row returns the row number of reference q.
func (b *Batch) row(q int) int {
	if b.Index == nil {
		return q
	}
	return int(b.Index[q])
}
