package shard

import "fmt"

// Record is one training example in the form a DLRM trainer consumes: a label, dense features
// and sparse categorical ids grouped by field. A Record is reused from one record to the next:
// Reset keeps the capacity of its slices, so reading allocates nothing once they have grown.
type Record struct {
	// Offset is the record's position within its shard (in the shard's visiting order). Sources
	// set it; parsers leave it alone.
	Offset int64
	Label  float32
	Dense  []float32
	// IDs holds the sparse feature ids, field after field; FieldEnds[f] is the end of field f in
	// IDs (field f is IDs[FieldEnds[f-1]:FieldEnds[f]]). A field may hold zero, one or many ids.
	IDs       []uint64
	FieldEnds []int32
	// Values optionally weighs each id (libSVM and libFM values); empty means every weight is 1.
	Values []float32

	// Scratch of the parsers that group ids by field (LibFM, LibSVM with a FieldMap): the field
	// of each id, per-field counts, and the reordered ids and values.
	fieldOf  []int32
	counts   []int32
	sortIDs  []uint64
	sortVals []float32
}

// Reset empties the record, keeping its slices' capacity.
func (r *Record) Reset() {
	r.Offset, r.Label = 0, 0
	r.Dense, r.IDs, r.FieldEnds, r.Values = r.Dense[:0], r.IDs[:0], r.FieldEnds[:0], r.Values[:0]
	r.fieldOf = r.fieldOf[:0]
}

// NumFields returns the number of sparse fields.
func (r *Record) NumFields() int { return len(r.FieldEnds) }

// Field returns the ids of field f.
func (r *Record) Field(f int) []uint64 {
	start := int32(0)
	if f > 0 {
		start = r.FieldEnds[f-1]
	}
	return r.IDs[start:r.FieldEnds[f]]
}

// EndField closes the field being filled: the ids appended since the previous EndField form it.
func (r *Record) EndField() { r.FieldEnds = append(r.FieldEnds, int32(len(r.IDs))) }

// groupFields closes nf fields from ids appended in any field order: IDs and Values (parallel,
// with fieldOf giving each id's field in [0, nf)) are reordered stably by field (a counting
// sort, linear in ids + nf) and FieldEnds gets one end per field.
func (r *Record) groupFields(nf int) {
	f := r.fieldOf
	sorted := true
	for i := 1; i < len(f); i++ {
		if f[i] < f[i-1] {
			sorted = false
			break
		}
	}
	c := r.counts[:0]
	for range nf + 1 {
		c = append(c, 0)
	}
	r.counts = c
	for _, x := range f {
		c[x+1]++
	}
	for i := 1; i <= nf; i++ {
		c[i] += c[i-1]
	}
	if sorted {
		r.FieldEnds = append(r.FieldEnds, c[1:]...)
		return
	}
	n := len(f)
	r.sortIDs = append(r.sortIDs[:0], make([]uint64, n)...)
	r.sortVals = append(r.sortVals[:0], make([]float32, n)...)
	for i, x := range f {
		j := c[x]
		c[x]++
		r.sortIDs[j], r.sortVals[j] = r.IDs[i], r.Values[i]
	}
	copy(r.IDs, r.sortIDs)
	copy(r.Values, r.sortVals)
	r.FieldEnds = append(r.FieldEnds, c[:nf]...) // each cursor stopped at its field's end
}

// Schema is the shape of the records a parser or data set produces.
type Schema struct {
	Dense  int      // dense features per record
	Fields []string // names of the sparse fields, in order
}

// Batch is a run of consecutive records of one lease, in columnar form. It belongs to the caller
// of Reader.Next until it is passed to Reader.Done, after which the reader reuses its slices.
type Batch struct {
	Lease LeaseID
	Epoch int
	Shard Shard
	// Start and End are the shard offsets the batch covers: its records and the malformed lines
	// skipped among them. Reporting the batch done reports progress through End.
	Start, End int64

	Labels    []float32 // one per record
	DenseDim  int       // dense features per record
	Dense     []float32 // Len()*DenseDim, record-major
	NumFields int       // sparse fields per record
	IDs       []uint64  // sparse ids, record after record, field after field
	// Offsets has Len()*NumFields+1 entries: the ids of record i, field f are
	// IDs[Offsets[i*NumFields+f]:Offsets[i*NumFields+f+1]].
	Offsets []int32
	// Values is empty, or holds one weight per id when any record carried values.
	Values []float32
	// RecordOffsets gives each record's offset within the shard.
	RecordOffsets []int64
}

// Len returns the number of records in the batch.
func (b *Batch) Len() int { return len(b.Labels) }

// Skipped returns how many malformed lines were skipped within the batch's range.
func (b *Batch) Skipped() int64 { return b.End - b.Start - int64(len(b.Labels)) }

// Field returns the ids of record i, field f.
func (b *Batch) Field(i, f int) []uint64 {
	k := i*b.NumFields + f
	return b.IDs[b.Offsets[k]:b.Offsets[k+1]]
}

// Reset empties the batch, keeping its slices' capacity.
func (b *Batch) Reset() {
	b.Lease, b.Epoch, b.Shard, b.Start, b.End = LeaseID{}, 0, Shard{}, 0, 0
	b.Labels, b.Dense, b.IDs, b.Values, b.RecordOffsets = b.Labels[:0], b.Dense[:0], b.IDs[:0], b.Values[:0], b.RecordOffsets[:0]
	b.Offsets = append(b.Offsets[:0], 0)
	b.DenseDim, b.NumFields = 0, 0
}

// Append adds a record. The first record fixes the batch's dense width and field count; a
// record that differs is an ErrSchema error and leaves the batch unchanged.
func (b *Batch) Append(r *Record) error {
	if len(b.Offsets) == 0 {
		b.Offsets = append(b.Offsets, 0)
	}
	if len(b.Labels) == 0 {
		b.DenseDim, b.NumFields = len(r.Dense), len(r.FieldEnds)
	} else if len(r.Dense) != b.DenseDim || len(r.FieldEnds) != b.NumFields {
		return fmt.Errorf("%w: record has %d dense and %d fields, batch %d and %d", ErrSchema, len(r.Dense), len(r.FieldEnds), b.DenseDim, b.NumFields)
	}
	if len(r.Values) != 0 && len(r.Values) != len(r.IDs) {
		return fmt.Errorf("%w: record has %d values for %d ids", ErrSchema, len(r.Values), len(r.IDs))
	}
	if len(r.FieldEnds) > 0 && int(r.FieldEnds[len(r.FieldEnds)-1]) != len(r.IDs) {
		return fmt.Errorf("%w: record fields end at %d of %d ids", ErrSchema, r.FieldEnds[len(r.FieldEnds)-1], len(r.IDs))
	}
	base := int32(len(b.IDs))
	if len(r.Values) != 0 || len(b.Values) != 0 {
		for len(b.Values) < len(b.IDs) { // earlier records had no values: weight 1
			b.Values = append(b.Values, 1)
		}
		if len(r.Values) != 0 {
			b.Values = append(b.Values, r.Values...)
		} else {
			for range r.IDs {
				b.Values = append(b.Values, 1)
			}
		}
	}
	b.Labels = append(b.Labels, r.Label)
	b.Dense = append(b.Dense, r.Dense...)
	b.IDs = append(b.IDs, r.IDs...)
	for _, e := range r.FieldEnds {
		b.Offsets = append(b.Offsets, base+e)
	}
	b.RecordOffsets = append(b.RecordOffsets, r.Offset)
	return nil
}
