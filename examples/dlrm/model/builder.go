package model

import "fmt"

// Sample is one raw training example: dense features, the ids of every
// categorical field, and the click label.
type Sample struct {
	// Dense holds DenseFeatures values.
	Dense []float32
	// IDs holds the ids of all fields, field after field.
	IDs []uint64
	// Offsets has Fields+1 entries: field f's ids are
	// IDs[Offsets[f]:Offsets[f+1]]. A single-valued field has one id.
	Offsets []int32
	// Label is 1 for a click, 0 otherwise (values in between are soft
	// labels).
	Label float32
	// Values optionally weighs each id (value × its embedding row): one
	// finite value per id, or empty for 1 everywhere.
	Values []float32
}

// Key identifies one embedding row: an id of one field. Fields normally have
// their own embedding tables, so the same id in two fields is two rows.
type Key struct {
	Field int
	ID    uint64
}

// BatchBuilder assembles a Batch from Samples and de-duplicates the
// embedding rows the batch needs, so each distinct (field, id) is pulled
// from and pushed to the parameter servers once per batch. Use:
//
//	bb.Reset()
//	for each sample: bb.Add(&sample)
//	keys := bb.Keys()      // distinct rows, first-seen order
//	rows := bb.Rows()      // len(keys)*EmbeddingDim, fill row r with keys[r]'s vector
//	m.ComputeGradients(bb.Batch(), &g)
//	push g.Rows[r*dim:(r+1)*dim] as the gradient of keys[r]
//
// The builder copies what Add is given. Keys, Rows and Batch return slices
// owned by the builder, valid until the next Reset or Add. Its buffers are
// reused, so steady-state batches do not allocate. A BatchBuilder is not
// safe for concurrent use.
type BatchBuilder struct {
	dense, fields, dim int
	firstOrder         bool
	biases             []float32
	batch              Batch
	keys               []Key
	index              map[Key]int32
	weights            []float32 // per reference, kept once a sample had values
	weighted           bool
}

// NewBatchBuilder returns a builder for models of shape cfg (only
// DenseFeatures, Fields and EmbeddingDim matter).
func NewBatchBuilder(cfg Config) (*BatchBuilder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	bb := &BatchBuilder{dense: cfg.DenseFeatures, fields: cfg.Fields, dim: cfg.EmbeddingDim, firstOrder: cfg.FirstOrder, index: make(map[Key]int32)}
	bb.Reset()
	return bb, nil
}

// Reset empties the builder, keeping its buffers.
func (bb *BatchBuilder) Reset() {
	b := &bb.batch
	b.Size = 0
	b.Dense = b.Dense[:0]
	b.Labels = b.Labels[:0]
	b.Bags = append(b.Bags[:0], 0)
	b.Index = b.Index[:0]
	bb.weights, b.Weights = bb.weights[:0], nil
	bb.weighted = false
	b.Rows = b.Rows[:0]
	bb.keys = bb.keys[:0]
	clear(bb.index)
}

// Len returns the number of samples added since the last Reset.
func (bb *BatchBuilder) Len() int { return bb.batch.Size }

// Add appends a copy of s to the batch. A sample that does not fit the
// model's shape is rejected with ErrBatch and leaves the builder unchanged.
func (bb *BatchBuilder) Add(s *Sample) error {
	if s == nil {
		return fmt.Errorf("%w: nil sample", ErrBatch)
	}
	if len(s.Dense) != bb.dense {
		return fmt.Errorf("%w: sample has %d dense values, want %d", ErrBatch, len(s.Dense), bb.dense)
	}
	if len(s.Offsets) != bb.fields+1 || s.Offsets[0] != 0 || int(s.Offsets[bb.fields]) != len(s.IDs) {
		return fmt.Errorf("%w: sample offsets must have %d entries from 0 to len(IDs) = %d", ErrBatch, bb.fields+1, len(s.IDs))
	}
	for f := 0; f < bb.fields; f++ {
		if s.Offsets[f+1] < s.Offsets[f] {
			return fmt.Errorf("%w: sample offsets decrease at field %d", ErrBatch, f)
		}
	}
	if !(s.Label >= 0 && s.Label <= 1) {
		return fmt.Errorf("%w: sample label %v, want a value in [0, 1]", ErrBatch, s.Label)
	}
	if i, ok := firstNonFinite(s.Dense); !ok {
		return fmt.Errorf("%w: sample dense value %d is %v", ErrNonFinite, i, s.Dense[i])
	}
	if len(s.Values) != 0 {
		if len(s.Values) != len(s.IDs) {
			return fmt.Errorf("%w: sample has %d values for %d ids", ErrBatch, len(s.Values), len(s.IDs))
		}
		if i, ok := firstNonFinite(s.Values); !ok {
			return fmt.Errorf("%w: sample value %d is %v", ErrNonFinite, i, s.Values[i])
		}
	}
	b := &bb.batch
	if len(s.Values) != 0 && !bb.weighted { // earlier samples had weight 1
		bb.weighted = true
		for range b.Index {
			bb.weights = append(bb.weights, 1)
		}
	}
	if bb.weighted {
		if len(s.Values) != 0 {
			bb.weights = append(bb.weights, s.Values...)
		} else {
			for range s.IDs {
				bb.weights = append(bb.weights, 1)
			}
		}
		b.Weights = bb.weights
	}
	b.Size++
	b.Dense = append(b.Dense, s.Dense...)
	b.Labels = append(b.Labels, s.Label)
	for f := 0; f < bb.fields; f++ {
		for _, id := range s.IDs[s.Offsets[f]:s.Offsets[f+1]] {
			k := Key{Field: f, ID: id}
			r, ok := bb.index[k]
			if !ok {
				r = int32(len(bb.keys))
				bb.index[k] = r
				bb.keys = append(bb.keys, k)
			}
			b.Index = append(b.Index, r)
		}
		b.Bags = append(b.Bags, int32(len(b.Index)))
	}
	return nil
}

// Keys returns the distinct (field, id) pairs of the batch in first-seen
// order; row r of Rows and of Gradients.Rows belongs to Keys()[r].
func (bb *BatchBuilder) Keys() []Key { return bb.keys }

// Rows returns the batch's embedding buffer, len(Keys())*EmbeddingDim
// values, for the caller to fill with the pulled vectors (its previous
// contents are unspecified).
func (bb *BatchBuilder) Rows() []float32 {
	n := len(bb.keys) * bb.dim
	if cap(bb.batch.Rows) < n {
		bb.batch.Rows = make([]float32, n, n+n/4)
	}
	bb.batch.Rows = bb.batch.Rows[:n]
	return bb.batch.Rows
}

// Biases returns the batch's first-order buffer (Config.FirstOrder), one
// value per key, for the caller to fill with the pulled scalars; nil for a
// model without FirstOrder.
func (bb *BatchBuilder) Biases() []float32 {
	if !bb.firstOrder {
		return nil
	}
	n := len(bb.keys)
	if cap(bb.biases) < n {
		bb.biases = make([]float32, n, n+n/4)
	}
	bb.biases = bb.biases[:n]
	return bb.biases
}

// Batch returns the assembled batch; its Rows and Biases are the buffers
// returned by Rows and Biases, which must have been filled first.
func (bb *BatchBuilder) Batch() *Batch {
	bb.Rows()
	bb.batch.Biases = bb.Biases()
	return &bb.batch
}
