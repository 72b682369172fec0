package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Digest is a fingerprint of a model's tables (embedding tables and dense tensors alike), to tell
// whether two models are equal bit for bit without moving them: a job's rows now and those of a
// commit, or a commit and the job restored from it onto any number of servers.
//
// A table's digest is its schema, its row count and a 128-bit sum of its rows: two independent
// 64-bit hashes of each row's raw record (id, last step, frequency, weights and optimizer
// state; see Table.RawRowSize), each summed modulo 2^64 over the rows. The sum does not depend
// on the order the rows are visited in, so it is a function of the set of (table, id, record)
// alone: the same model spread over 2 or 3 servers, or saved by any number of them, has one
// digest, and the digests of disjoint parts of a model add up (Merge). Two models that differ in
// one bit of one row digest differently but for a chance of 2^-128 per difference. The hashes
// are not cryptographic: a digest detects accidents, not forgery.
//
// The rows a digest counts are those the model holds: a row that a pull created and no update
// changed holds its initial value and counts like any other, so compare two models at points
// where the same ids have rows (no pull of new ids in between).
type Digest struct {
	// Step is the step the model was at: the commit's, or the job's when the digest was taken.
	// Equal ignores it.
	Step uint64
	// Tables are the model's tables, sorted by name.
	Tables []TableDigest
}

// TableDigest is the fingerprint of one table's rows (see Digest).
type TableDigest struct {
	Name string
	// Schema is the table's row layout (Table.Schema).
	Schema []byte
	// Rows counts the rows.
	Rows int64
	// Sum is the sums of the two hashes of every row's record.
	Sum [2]uint64
}

// ErrDigestMismatch is returned by Digest.Compare for two digests that differ, and by Merge for
// parts that hold one table with two schemas.
var ErrDigestMismatch = errors.New("checkpoint: digests differ")

// digestSeed keys the second of a row's two hashes.
const digestSeed = 0x9e3779b97f4a7c15

// rowHash returns the two hashes of one raw record.
func rowHash(rec []byte, h *xxhash.Digest) [2]uint64 {
	h.ResetWithSeed(digestSeed)
	h.Write(rec)
	return [2]uint64{xxhash.Sum64(rec), h.Sum64()}
}

func (d *TableDigest) addHash(h [2]uint64) {
	d.Rows++
	d.Sum[0] += h[0]
	d.Sum[1] += h[1]
}

// Add counts the raw records in records, each rowSize bytes (the table's RawRowSize), as rows
// of the table. A deletion record, or records that are not a whole number of rows, is an error
// wrapping ErrCorrupt, and nothing is counted.
func (d *TableDigest) Add(records []byte, rowSize int) error {
	if rowSize < minRowSize || len(records)%rowSize != 0 {
		return corruptf("digest of %s: %d bytes of %d-byte records", d.Name, len(records), rowSize)
	}
	for off := 0; off < len(records); off += rowSize {
		if binary.LittleEndian.Uint32(records[off+8:]) == DeletionMark {
			return corruptf("digest of %s: a deletion record among the rows", d.Name)
		}
	}
	h := xxhash.New()
	for off := 0; off < len(records); off += rowSize {
		d.addHash(rowHash(records[off:off+rowSize], h))
	}
	return nil
}

// Merge returns the digest of a model whose rows are those of every part (disjoint parts: each
// row in one of them, such as the slots each server owns): each table's rows and sums add up. A
// table that two parts give different schemas is an error wrapping ErrDigestMismatch. The Step
// is the highest of the parts'.
func Merge(parts ...Digest) (Digest, error) {
	var out Digest
	byName := map[string]int{}
	for _, p := range parts {
		out.Step = max(out.Step, p.Step)
		for _, t := range p.Tables {
			i, ok := byName[t.Name]
			if !ok {
				byName[t.Name] = len(out.Tables)
				out.Tables = append(out.Tables, TableDigest{Name: t.Name, Schema: bytes.Clone(t.Schema)})
				i = len(out.Tables) - 1
			}
			o := &out.Tables[i]
			if !bytes.Equal(o.Schema, t.Schema) {
				return Digest{}, fmt.Errorf("%w: table %s has two schemas", ErrDigestMismatch, t.Name)
			}
			o.Rows += t.Rows
			o.Sum[0] += t.Sum[0]
			o.Sum[1] += t.Sum[1]
		}
	}
	slices.SortFunc(out.Tables, func(a, b TableDigest) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Equal reports whether d and o digest equal models: the same tables, each with the same schema,
// row count and sums. Step is not compared.
func (d Digest) Equal(o Digest) bool { return len(d.Diff(o)) == 0 }

// Diff returns what differs between d and o, a line per table, in name order: nothing when they
// are Equal.
func (d Digest) Diff(o Digest) []string {
	var out []string
	theirs := map[string]TableDigest{}
	for _, t := range o.Tables {
		theirs[t.Name] = t
	}
	mine := map[string]bool{}
	for _, t := range d.Tables {
		mine[t.Name] = true
		u, ok := theirs[t.Name]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("table %s: only in the first", t.Name))
		case !bytes.Equal(t.Schema, u.Schema):
			out = append(out, fmt.Sprintf("table %s: schemas differ", t.Name))
		case t.Rows != u.Rows:
			out = append(out, fmt.Sprintf("table %s: %d rows, %d", t.Name, t.Rows, u.Rows))
		case t.Sum != u.Sum:
			out = append(out, fmt.Sprintf("table %s: %d rows each, their values differ", t.Name, t.Rows))
		}
	}
	for _, t := range o.Tables {
		if !mine[t.Name] {
			out = append(out, fmt.Sprintf("table %s: only in the second", t.Name))
		}
	}
	slices.Sort(out)
	return out
}

// Compare returns nil when d and o are Equal, and otherwise an error wrapping ErrDigestMismatch
// that says what differs.
func (d Digest) Compare(o Digest) error {
	if diff := d.Diff(o); len(diff) > 0 {
		return fmt.Errorf("%w: %s", ErrDigestMismatch, strings.Join(diff, "; "))
	}
	return nil
}

// String is the digest in one line: each table's name, row count and sums.
func (d Digest) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "step %d:", d.Step)
	for _, t := range d.Tables {
		fmt.Fprintf(&b, " %s %d rows %016x%016x", t.Name, t.Rows, t.Sum[0], t.Sum[1])
	}
	return b.String()
}

// The encoding of a Digest (AppendDigest), little-endian:
//
//	magic "EPSDIGST", version u32, step u64, table count uvarint
//	per table: name (uvarint length, bytes), schema (uvarint length, bytes), rows u64, sum 2 x u64
//	xxhash64 of everything above
const (
	digestMagic   = "EPSDIGST"
	digestVersion = 1
)

// AppendDigest appends the encoding of d to dst.
func AppendDigest(dst []byte, d Digest) []byte {
	start := len(dst)
	e := encoder{b: append(dst, digestMagic...)}
	e.u32(digestVersion)
	e.u64(d.Step)
	e.uv(uint64(len(d.Tables)))
	for _, t := range d.Tables {
		e.str(t.Name)
		e.bytes(t.Schema)
		e.u64(uint64(t.Rows))
		e.u64(t.Sum[0])
		e.u64(t.Sum[1])
	}
	return binary.LittleEndian.AppendUint64(e.b, xxhash.Sum64(e.b[start:]))
}

// DecodeDigest decodes a digest AppendDigest wrote at the start of src and returns the bytes
// after it. Malformed input is an error wrapping ErrCorrupt.
func DecodeDigest(src []byte) (Digest, []byte, error) {
	if len(src) < len(digestMagic)+4 || string(src[:len(digestMagic)]) != digestMagic {
		return Digest{}, nil, corruptf("digest: bad magic")
	}
	d := &decoder{b: src[len(digestMagic):]}
	if v := d.u32(); v != digestVersion {
		if v > digestVersion {
			return Digest{}, nil, fmt.Errorf("%w: digest version %d", ErrUnsupportedVersion, v)
		}
		return Digest{}, nil, corruptf("digest: version %d", v)
	}
	var out Digest
	out.Step = d.u64()
	n := d.count(2 + 8 + 16) // two lengths, rows, sums
	for range n {
		t := TableDigest{Name: d.str(), Schema: d.bytes()}
		t.Rows = int64(d.u64())
		t.Sum = [2]uint64{d.u64(), d.u64()}
		if d.err == nil && t.Rows < 0 {
			d.fail("row count")
		}
		out.Tables = append(out.Tables, t)
	}
	body := len(src) - len(d.b)
	sum := d.u64()
	if d.err != nil {
		return Digest{}, nil, fmt.Errorf("digest: %w", d.err)
	}
	if sum != xxhash.Sum64(src[:body]) {
		return Digest{}, nil, corruptf("digest: checksum mismatch")
	}
	return out, d.b, nil
}

// Digest returns the digest of the model the commit of step holds: the rows that a restore of
// it loads, onto any number of servers. It reads every chunk of the commit from storage, checks
// each one, and holds 32 bytes or so per row of the largest node's part while it reads that
// node's chain. An error wraps ErrNotCommitted when step has no commit record, and ErrCorrupt
// when a piece of it is damaged.
func (m *Committer) Digest(ctx context.Context, step uint64) (Digest, error) {
	st := m.cfg.Storage
	rec, err := readCommit(ctx, st, m.cfg.Job, step)
	if err != nil {
		return Digest{}, err
	}
	h := xxhash.New()
	parts := make([]Digest, 0, len(rec.Nodes))
	for _, n := range rec.Nodes {
		np := &nodePlan{node: n.Node, entry: n, ownGen: -1}
		if err := planStorage(ctx, st, np, n, rec); err != nil {
			return Digest{}, fmt.Errorf("checkpoint: digest of step %d: %w", step, err)
		}
		part, err := m.digestChain(ctx, np, h)
		if err != nil {
			return Digest{}, fmt.Errorf("checkpoint: digest of step %d: %w", step, err)
		}
		parts = append(parts, part)
	}
	out, err := Merge(parts...)
	out.Step = step
	return out, err
}

// digestChain digests the rows node np's manifest chain leaves at its last step.
func (m *Committer) digestChain(ctx context.Context, np *nodePlan, h *xxhash.Digest) (Digest, error) {
	var out Digest
	last := np.chain[len(np.chain)-1]
	for _, mt := range last.Tables {
		rows := map[uint64][2]uint64{} // the hashes of the rows that survive so far, by id
		for k, cm := range np.chain {
			ct := cm.table(mt.Name)
			if ct == nil || !bytes.Equal(ct.Schema, mt.Schema) || ct.RowSize != mt.RowSize {
				return Digest{}, corruptf("node %s: table %s is not the same along the chain", np.node, mt.Name)
			}
			size := int(ct.RowSize)
			for _, ch := range ct.Chunks {
				if !np.live[k].anyIn(int(ch.SlotLo), int(ch.SlotHi)) {
					continue
				}
				d, err := readRows(ctx, m.cfg.Storage, cm, ch, ct.RowSize, m.cs)
				if err != nil {
					return Digest{}, fmt.Errorf("node %s: %w", np.node, err)
				}
				for off := 0; off+size <= len(d.rows); off += size {
					r := d.rows[off : off+size]
					id := recordID(r)
					switch {
					case !np.live[k].has(slotOf(id, np.live[k].n)):
					case binary.LittleEndian.Uint32(r[8:]) == DeletionMark:
						delete(rows, id)
					default:
						rows[id] = rowHash(r, h)
					}
				}
				d.release()
			}
		}
		td := TableDigest{Name: mt.Name, Schema: bytes.Clone(mt.Schema)}
		for _, rh := range rows {
			td.addHash(rh)
		}
		out.Tables = append(out.Tables, td)
	}
	return out, nil
}
