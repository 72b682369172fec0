package checkpoint

import "fmt"

// A seal file describes the sealed segments of one shared-memory generation: where each table's
// records and each blob lie in the generation's extent files, and an xxhash64 per piece of them
// (a span of whole records of at most sealPiece bytes, within one group of a grouped table).
// Segment 0 is a full snapshot; segments 1.. are deltas appended after it, each holding the rows
// changed since the previous segment. Each segment records the slots the node owned: since
// version 3 they may differ along a chain (a delta after a change of slot set also holds every
// row of the slots gained), and a reader keeps a row of segment k only if its slot is owned in
// segments k, k+1, ... through the newest one read. Chains sealed by versions 1 and 2 own one set
// throughout, so the rule reads them as they were written. A seal is replaced as a whole by
// rename, so a reader sees the old or the new one; a generation about to be overwritten loses
// its seal first.
type sealFile struct {
	Job, Node string
	Gen       uint32
	Slots     int
	Piece     uint64
	Extents   []extentRef
	Segments  []*segment
}

type extentRef struct {
	Name string
	Size uint64
}

// segment is one snapshot in a generation.
type segment struct {
	ID       uint64
	Step     uint64
	Full     bool
	BaseStep uint64
	Owned    slotSet
	Tables   []segTable
	Blobs    []segBlob
}

type segTable struct {
	Name    string
	Schema  []byte
	RowSize uint32
	Extent  uint32
	Off     uint64
	Len     uint64
	// Groups are the record counts of the table's groups, one after another in [Off, Off+Len),
	// and Key names the table's grouping, for a full copy of a ShardedTable (else both are empty).
	Groups []uint64
	Key    []byte
	// WholeRecords says how the checksums cut the records: each group (all the records when there
	// are no groups) in runs of whole records of at most the seal's Piece bytes (at least one
	// record), as since seal version 2; without it, every Piece bytes from Off (version 1).
	WholeRecords bool
	Sums         []uint64 // one per span (see spans); filled when sealed
}

// span is a range [lo, hi) of a table's records, relative to its Off.
type span struct{ lo, hi int }

// spans returns the ranges of t's records that its checksums cover, in order.
func (t *segTable) spans(piece uint64) []span {
	n := int(t.Len)
	if !t.WholeRecords {
		out := make([]span, 0, pieces(t.Len, piece))
		for lo := 0; lo < n; lo += int(piece) {
			out = append(out, span{lo, min(lo+int(piece), n)})
		}
		return out
	}
	rec := int(t.RowSize)
	step := max(1, int(piece)/rec) * rec
	var out []span
	cut := func(lo, hi int) {
		for ; lo < hi; lo += step {
			out = append(out, span{lo, min(lo+step, hi)})
		}
	}
	if len(t.Groups) == 0 {
		cut(0, n)
		return out
	}
	lo := 0
	for _, g := range t.Groups {
		hi := lo + int(g)*rec
		cut(lo, hi)
		lo = hi
	}
	return out
}

// spanCount is len(t.spans(piece)), computed without making them.
func (t *segTable) spanCount(piece uint64) int {
	if !t.WholeRecords {
		return pieces(t.Len, piece)
	}
	step := max(1, piece/uint64(t.RowSize)) * uint64(t.RowSize)
	if len(t.Groups) == 0 {
		return pieces(t.Len, step)
	}
	n := 0
	for _, g := range t.Groups {
		n += pieces(g*uint64(t.RowSize), step)
	}
	return n
}

// groupSpans returns, for each group of t, the index range [first, last) of its spans.
func (t *segTable) groupSpans(spans []span) [][2]int {
	out := make([][2]int, len(t.Groups))
	k, hi := 0, 0
	for g, c := range t.Groups {
		hi += int(c) * int(t.RowSize)
		first := k
		for k < len(spans) && spans[k].lo < hi {
			k++
		}
		out[g] = [2]int{first, k}
	}
	return out
}

type segBlob struct {
	Name   string
	Extent uint32
	Off    uint64
	Len    uint64
	Sum    uint64
}

const (
	sealMagic = "EPSSEAL1"
	// sealVersion is written when a chain's slots change, version 2 (the same layout) when every
	// segment owns the same slots, which an earlier release reads right; version 1 (no groups,
	// checksums every Piece bytes) is still read.
	sealVersion = 3
	// sealPiece is the span of one shared-memory checksum.
	sealPiece = 4 << 20
)

func pieces(n uint64, piece uint64) int { return int((n + piece - 1) / piece) }

func appendSeal(dst []byte, s *sealFile) []byte {
	e := encoder{b: append(dst, sealMagic...)}
	version := uint32(2)
	for _, sg := range s.Segments {
		if !sg.Owned.equal(s.Segments[0].Owned) {
			version = sealVersion
		}
	}
	e.u32(version)
	e.str(s.Job)
	e.str(s.Node)
	e.u32(s.Gen)
	e.uv(uint64(s.Slots))
	e.u64(s.Piece)
	e.uv(uint64(len(s.Extents)))
	for _, x := range s.Extents {
		e.str(x.Name)
		e.u64(x.Size)
	}
	e.uv(uint64(len(s.Segments)))
	for _, g := range s.Segments {
		e.u64(g.ID)
		e.u64(g.Step)
		e.bool(g.Full)
		e.u64(g.BaseStep)
		e.slots(g.Owned)
		e.uv(uint64(len(g.Tables)))
		for _, t := range g.Tables {
			e.str(t.Name)
			e.bytes(t.Schema)
			e.u32(t.RowSize)
			e.u32(t.Extent)
			e.u64(t.Off)
			e.u64(t.Len)
			e.bool(t.WholeRecords)
			e.bytes(t.Key)
			e.uv(uint64(len(t.Groups)))
			for _, g := range t.Groups {
				e.uv(g)
			}
			e.uv(uint64(len(t.Sums)))
			for _, x := range t.Sums {
				e.u64(x)
			}
		}
		e.uv(uint64(len(g.Blobs)))
		for _, b := range g.Blobs {
			e.str(b.Name)
			e.u32(b.Extent)
			e.u64(b.Off)
			e.u64(b.Len)
			e.u64(b.Sum)
		}
	}
	return e.seal()
}

// decodeSeal decodes a seal file and checks that every range it names lies inside its extents and
// carries the right number of checksums.
func decodeSeal(src []byte) (*sealFile, error) {
	d, version, err := openFileVersion(src, sealMagic, 1, sealVersion)
	if err != nil {
		return nil, err
	}
	s := &sealFile{Job: d.str(), Node: d.str(), Gen: d.u32()}
	slots := d.uv()
	s.Piece = d.u64()
	if slots == 0 || slots > maxSlots || s.Piece == 0 || s.Piece > 1<<40 || s.Gen > 1 {
		d.fail("seal header")
	}
	s.Slots = int(slots)
	nx := d.count(1 + 8)
	for range nx {
		x := extentRef{Name: d.str(), Size: d.u64()}
		if d.err == nil && !validIdent(x.Name) {
			d.fail("extent name")
		}
		s.Extents = append(s.Extents, x)
	}
	inExtent := func(ext uint32, off, n uint64) bool {
		return int(ext) < len(s.Extents) && off <= s.Extents[ext].Size && n <= s.Extents[ext].Size-off
	}
	ng := d.count(8 + 8 + 1 + 8 + 1 + 1 + 1)
	for i := range ng {
		g := &segment{ID: d.u64(), Step: d.u64(), Full: d.bool(), BaseStep: d.u64(), Owned: d.slots()}
		if d.err == nil && (g.Owned.n != s.Slots || g.Full != (i == 0) || (g.Full && g.BaseStep != g.Step) ||
			(i > 0 && (g.BaseStep != s.Segments[0].Step || g.Step <= s.Segments[i-1].Step))) {
			d.fail("segment header")
		}
		nt := d.count(1 + 1 + 4 + 4 + 16 + 1)
		for range nt {
			t := segTable{Name: d.str(), Schema: d.bytes(), RowSize: d.u32(), Extent: d.u32(), Off: d.u64(), Len: d.u64()}
			groupsOK := true
			if version >= 2 {
				t.WholeRecords = d.bool()
				t.Key = d.bytes()
				ng := d.count(1)
				var sum uint64
				for range ng {
					g := d.uv()
					if g > t.Len {
						groupsOK = false
					}
					t.Groups = append(t.Groups, g)
					sum += g
				}
				groupsOK = groupsOK && (ng == 0 || (t.RowSize > 0 && sum == t.Len/uint64(t.RowSize)))
			}
			ns := d.count(8)
			t.Sums = make([]uint64, 0, ns)
			for range ns {
				t.Sums = append(t.Sums, d.u64())
			}
			if d.err == nil && (!validIdent(t.Name) || t.RowSize < minRowSize || t.Len%uint64(t.RowSize) != 0 ||
				!inExtent(t.Extent, t.Off, t.Len) || !groupsOK || (len(t.Groups) > 0 && !t.WholeRecords) ||
				len(t.Sums) != t.spanCount(s.Piece)) {
				d.fail("segment table")
			}
			g.Tables = append(g.Tables, t)
		}
		nb := d.count(1 + 4 + 24)
		for range nb {
			b := segBlob{Name: d.str(), Extent: d.u32(), Off: d.u64(), Len: d.u64(), Sum: d.u64()}
			if d.err == nil && (!validIdent(b.Name) || !inExtent(b.Extent, b.Off, b.Len)) {
				d.fail("segment blob")
			}
			g.Blobs = append(g.Blobs, b)
		}
		if d.err != nil {
			break
		}
		s.Segments = append(s.Segments, g)
	}
	if err := d.done(); err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	if !validIdent(s.Job) || !validIdent(s.Node) {
		return nil, corruptf("seal: bad job %q or node %q", s.Job, s.Node)
	}
	return s, nil
}

// tableIndex returns the index of the named table in s (checked to exist before use).
func (s *segment) tableIndex(name string) int {
	for i, t := range s.Tables {
		if t.Name == name {
			return i
		}
	}
	return -1
}
