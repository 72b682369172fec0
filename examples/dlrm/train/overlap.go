package train

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
	"github.com/elasticps/elasticps/shard"
)

// ErrOverlap is returned (as an *OverlapError) by Run when test records given apart from the
// training data (Config.TestFiles) are also in it and Config.AllowOverlap is not set: a model
// scored on records it trained on reports a figure it has not earned.
var ErrOverlap = errors.New("train: test records also in the training data")

// Overlap is what the check of the test records against the training records found: Records of
// the Of test records evaluated are identical, after parsing, to a training record (label, dense
// values, ids of every field and their values).
//
// Run, which reports the test figure, checks before training (and before an evaluation of a
// commit; the roles of a multi-process job do not check) for every data kind but the synthetic
// one, whose held-out records have a range of their own. It hashes each test
// record (xxhash of its parsed fields, 64 bits) into a sorted table, then reads the training
// records once, parsing each and looking its hash up: its memory is about 33 bytes per test
// record evaluated (hash and index 16, file and line 16, a flag), none per training record, and its
// time one parsing pass over the training data. Two different records sharing a 64-bit hash are
// taken for the same: a chance of about one in 400 000 for a million test records against
// Criteo Kaggle's 45 million training records (pairs / 2^64), one in 1 800 against ten billion;
// a refusal for such a pair alone names it: one record, two lines that differ.
type Overlap struct {
	Records, Of int
	// Examples are the first few records found in both, in the training data's order.
	Examples []OverlapPair
	// Split is set when the test records are a seeded random split of the training data: there
	// a record in both is a line (or rating) the data holds more than once, which the split
	// shares between the two sides as it would share any two draws of the same record. Such an
	// overlap is counted and reported, never refused.
	Split bool
}

// OverlapPair is a record in both the test and the training data: where each was read, as
// "file:line".
type OverlapPair struct{ Test, Train string }

// maxOverlapExamples is the number of pairs an Overlap keeps.
const maxOverlapExamples = 5

// String says what was found, with the first pairs as "test = train".
func (o *Overlap) String() string {
	var b strings.Builder
	if o.Split {
		fmt.Fprintf(&b, "%d of %d held-out records duplicate a training record (a record the data holds more than once, split between the sides; reported, not refused)", o.Records, o.Of)
	} else {
		fmt.Fprintf(&b, "%d of %d test records also in the training data", o.Records, o.Of)
	}
	for i, e := range o.Examples {
		if i == 0 {
			b.WriteString(", e.g. ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s = %s", e.Test, e.Train)
	}
	if len(o.Examples) < o.Records {
		b.WriteString(", ...")
	}
	return b.String()
}

// OverlapError is the error of a run refused for an overlap (ErrOverlap).
type OverlapError struct{ Overlap Overlap }

func (e *OverlapError) Error() string {
	return fmt.Sprintf("train: %s: a test figure on them would flatter the model; train on data without them (such as the MovieLens 100K u1.base for u1.test), or give -allow-overlap (Config.AllowOverlap) to train and report the figure anyway", e.Overlap.String())
}

func (e *OverlapError) Unwrap() error { return ErrOverlap }

// checkOverlap checks d's test records against its training records (Overlap) and keeps what
// it found in d.overlap: an overlap of test records given apart from the training data is
// an *OverlapError unless allow is set.
func (d *dataSet) checkOverlap(ctx context.Context, allow bool) error {
	if d.trainRecs == nil || d.testRecs == nil {
		return nil
	}
	o, err := checkOverlap(ctx, d.trainRecs, d.testRecs, d.split)
	if err != nil {
		return err
	}
	if o.Records > 0 && !o.Split && !allow {
		return &OverlapError{Overlap: *o}
	}
	d.overlap = o
	return nil
}

// recordAt is where a record was read: a file as given and a 1-based line.
type recordAt struct {
	file string
	line int64
}

func (a recordAt) String() string { return fmt.Sprintf("%s:%d", a.file, a.line) }

// records visits a set of parsed records in turn, each with where it was read; fn keeps neither
// rec nor its slices.
type records func(ctx context.Context, fn func(rec *shard.Record, at recordAt) error) error

// checkOverlap finds the records of test that are also in train (split: test is a random split
// of the same data, see Overlap.Split).
func checkOverlap(ctx context.Context, train, test records, split bool) (*Overlap, error) {
	type key struct {
		hash uint64
		test int32 // index into at
	}
	type location struct {
		file int32 // index into files
		line int64
	}
	var (
		keys  []key
		at    []location
		files []string // at's file names, each once, so that at holds no string per record
		h     recordHasher
	)
	err := test(ctx, func(rec *shard.Record, a recordAt) error {
		if len(files) == 0 || files[len(files)-1] != a.file {
			files = append(files, a.file)
		}
		keys = append(keys, key{h.sum(rec), int32(len(at))})
		at = append(at, location{int32(len(files) - 1), a.line})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("overlap check: test records: %w", err)
	}
	slices.SortFunc(keys, func(a, b key) int { return cmp.Or(cmp.Compare(a.hash, b.hash), cmp.Compare(a.test, b.test)) })
	found := make([]bool, len(at))
	o := &Overlap{Of: len(at), Split: split}
	err = train(ctx, func(rec *shard.Record, a recordAt) error {
		x := h.sum(rec)
		i, _ := slices.BinarySearchFunc(keys, x, func(k key, x uint64) int { return cmp.Compare(k.hash, x) })
		for ; i < len(keys) && keys[i].hash == x; i++ {
			t := keys[i].test
			if found[t] {
				continue
			}
			found[t] = true
			o.Records++
			if len(o.Examples) < maxOverlapExamples {
				o.Examples = append(o.Examples, OverlapPair{Test: recordAt{files[at[t].file], at[t].line}.String(), Train: a.String()})
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("overlap check: training records: %w", err)
	}
	return o, nil
}

// recordHasher hashes parsed records: two records have the same hash when their labels, dense
// values, fields (each field's ids in order) and id values are the same, bit for bit. Not safe
// for concurrent use.
type recordHasher struct{ buf []byte }

func (h *recordHasher) sum(rec *shard.Record) uint64 {
	b := h.buf[:0]
	le := binary.LittleEndian
	b = le.AppendUint32(b, math.Float32bits(rec.Label))
	b = le.AppendUint32(b, uint32(len(rec.Dense)))
	for _, v := range rec.Dense {
		b = le.AppendUint32(b, math.Float32bits(v))
	}
	b = le.AppendUint32(b, uint32(len(rec.FieldEnds)))
	for _, e := range rec.FieldEnds {
		b = le.AppendUint32(b, uint32(e))
	}
	for _, id := range rec.IDs {
		b = le.AppendUint64(b, id)
	}
	b = le.AppendUint32(b, uint32(len(rec.Values)))
	for _, v := range rec.Values {
		b = le.AppendUint32(b, math.Float32bits(v))
	}
	h.buf = b
	return xxhash.Sum64(b)
}

// movieLensRecords visits ratings idx of ml, read from the file named file.
func movieLensRecords(ml *shard.MovieLens, file string, idx []int) records {
	return func(ctx context.Context, fn func(*shard.Record, recordAt) error) error {
		var rec shard.Record
		for k, i := range idx {
			if k%4096 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if err := ml.ReadRecord(int64(i), &rec); err != nil {
				return err
			}
			if err := fn(&rec, recordAt{file, ml.Line(int64(i))}); err != nil {
				return err
			}
		}
		return nil
	}
}

// textRecords visits up to limit records of the shards of src (those keep accepts by dataset
// position, or all), naming their files by name.
func textRecords(src shard.Source, shards []shard.Shard, limit int, keep func(pos int64) bool, name func(string) string) records {
	return func(ctx context.Context, fn func(*shard.Record, recordAt) error) error {
		return eachText(ctx, src, shards, limit, keep, func(sh shard.Shard, rec *shard.Record) error {
			return fn(rec, recordAt{name(sh.File), sh.Line + rec.Offset})
		})
	}
}

// rangeInts returns 0, 1, ..., n-1.
func rangeInts(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
