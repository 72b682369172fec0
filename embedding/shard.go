package embedding

import (
	"sync"
	"unsafe"
)

// Row layout inside a shard's slab, in 32-bit words:
//
//	[0,2)          id, little-endian uint64 (low word first)
//	2              last step touched (freeMark in a free row)
//	3              frequency: number of updates, saturating
//	[4, 4+Dim)     weights (float32)
//	[4+Dim, ...)   optimizer state (float32; Adam's step count is a uint32)
//
// The same bytes, little-endian, are the raw record of CopyRaw and LoadRaw.
const (
	hdrWords = 4
	wordStep = 2
	wordFreq = 3
	freeMark = ^uint32(0) // wordStep of a free row, and of a deletion record
	maxStep  = freeMark - 1
)

// Rows live in chunks of chunkRows rows; only a shard's first chunk may be smaller, and it grows by
// doubling until it is full, so small tables stay small. Later chunks are made whole, so big tables
// have at most one partly-used chunk per shard.
const (
	chunkShift   = 9
	chunkRows    = 1 << chunkShift
	chunkMask    = chunkRows - 1
	minChunkRows = 8
)

// Index entries: low 24 bits hold row+1 (0 = empty), high 8 bits a tag from the id's hash, so a
// probe rarely has to read a row to reject it. A tombstone marks the place of an entry removed in
// bulk (DeleteSlots): probes go past it and inserts take it, and it costs the removal no read of
// any row, where taking an entry out moves the later entries of its probe run back, reading the
// row of each to find where it may go. Row+1 never reaches entryRowMask (see MaxRowsPerShard).
const (
	entryRowMask = 1<<24 - 1
	tagMask      = 0xff000000
	tombstone    = entryRowMask
)

// Index load: grow to growNum/growDen of the size when more than loadNum/loadDen is used. The
// index costs 4 bytes per entry, so 5 to 7 bytes per row.
const (
	loadNum, loadDen = 4, 5
	growNum, growDen = 7, 5
)

// shard is one independently locked part of a table. Every field is guarded by mu.
type shard struct {
	mu sync.RWMutex
	_  [64]byte // readers' lock traffic must not evict the fields below from other cores' caches

	arena *arena
	words [][]uint32  // chunks, as words
	flts  [][]float32 // the same chunks, as float32
	hi    uint32      // rows ever allocated; row indices < hi exist
	live  int         // rows in use
	free  []uint32    // free row indices, reused first

	idx   []uint32 // open-addressing index, linear probing
	tombs int      // tombstones in idx; live+tombs stays under the load limit
	rng   uint64   // victim sampling
	trks  []trackBits

	_ [64]byte // keep neighbouring shards' locks off one cache line
}

// trackBits is one Tracker's record of a shard's changes.
type trackBits struct {
	tr      *Tracker
	bits    []uint64 // changed row indices
	deleted []uint64 // ids removed
}

func tagOf(h uint64) uint32 { return uint32(h>>8) & tagMask }

func (s *shard) pos(h uint64) int { return int((uint64(uint32(h)) * uint64(len(s.idx))) >> 32) }

// rowWords returns row r's words.
func (s *shard) rowWords(r uint32, stride int) []uint32 {
	o := int(r&chunkMask) * stride
	return s.words[r>>chunkShift][o : o+stride : o+stride]
}

// rowFloats returns row r's words as float32.
func (s *shard) rowFloats(r uint32, stride int) []float32 {
	o := int(r&chunkMask) * stride
	return s.flts[r>>chunkShift][o : o+stride : o+stride]
}

func (s *shard) rowID(r uint32, stride int) uint64 {
	o := int(r&chunkMask) * stride
	w := s.words[r>>chunkShift]
	return uint64(w[o]) | uint64(w[o+1])<<32
}

// touchLocked loads one word of every cache line of row r's first upto words, so the row is
// on its way into the cache while the caller works on earlier rows (Go has no prefetch
// instruction; independent loads get the memory system working in parallel the same way).
func (s *shard) touchLocked(r uint32, stride, upto int) uint32 {
	w := s.rowWords(r, stride)[:upto]
	var x uint32
	for k := 0; k < len(w); k += 16 {
		x += w[k]
	}
	return x + w[len(w)-1]
}

// touchIndex loads the index entry where a probe for hash h starts.
func (s *shard) touchIndex(h uint64) uint32 {
	if len(s.idx) == 0 {
		return 0
	}
	return s.idx[s.pos(h)]
}

// candidateLocked returns the row of the first index entry in the probe run of h whose tag
// matches, without reading any row: almost always id's row, if id is present.
func (s *shard) candidateLocked(h uint64) int {
	n := len(s.idx)
	if n == 0 {
		return -1
	}
	tag := tagOf(h)
	for i := s.pos(h); ; {
		e := s.idx[i]
		if e == 0 {
			return -1
		}
		if e&tagMask == tag && e != tombstone {
			return int(e&entryRowMask - 1)
		}
		if i++; i == n {
			i = 0
		}
	}
}

// probeLocked returns the row of id, or -1 and the index position where id would be inserted: the
// first tombstone of its probe run, else the empty place that ends it (valid until the index
// changes).
func (s *shard) probeLocked(id, h uint64, stride int) (row, free int) {
	n := len(s.idx)
	if n == 0 {
		return -1, -1
	}
	tag := tagOf(h)
	free = -1
	for i := s.pos(h); ; {
		e := s.idx[i]
		if e == 0 {
			if free < 0 {
				free = i
			}
			return -1, free
		}
		if e == tombstone {
			if free < 0 {
				free = i
			}
		} else if e&tagMask == tag {
			r := e&entryRowMask - 1
			if s.rowID(r, stride) == id {
				return int(r), -1
			}
		}
		if i++; i == n {
			i = 0
		}
	}
}

// insertAtLocked adds id -> row at index position at, found by probeLocked, when the index has
// room; otherwise (or with at < 0) it inserts the usual way.
func (s *shard) insertAtLocked(id, h uint64, row uint32, at int, t *Table) {
	switch {
	case at >= 0 && s.idx[at] == tombstone:
		s.tombs--
	case at < 0 || (s.live+s.tombs+1)*loadDen > len(s.idx)*loadNum:
		s.insertLocked(id, h, row, t)
		return
	}
	s.idx[at] = tagOf(h) | (row + 1)
	s.live++
}

// findLocked returns the row of id, or -1.
func (s *shard) findLocked(id, h uint64, stride int) int {
	n := len(s.idx)
	if n == 0 {
		return -1
	}
	tag := tagOf(h)
	for i := s.pos(h); ; {
		e := s.idx[i]
		if e == 0 {
			return -1
		}
		if e&tagMask == tag && e != tombstone {
			r := e&entryRowMask - 1
			if s.rowID(r, stride) == id {
				return int(r)
			}
		}
		if i++; i == n {
			i = 0
		}
	}
}

// allocLocked returns a row index for a new row (reusing a free one first) and makes sure the slab
// holds it. It returns false when the shard is full.
func (s *shard) allocLocked(stride int) (uint32, bool) {
	if n := len(s.free); n > 0 {
		r := s.free[n-1]
		s.free = s.free[:n-1]
		return r, true
	}
	if s.hi >= MaxRowsPerShard {
		return 0, false
	}
	r := s.hi
	c := int(r >> chunkShift)
	in := int(r & chunkMask)
	if c == len(s.words) {
		// Only a shard's first chunk starts small and grows by doubling, so small tables stay
		// small; a shard that filled a chunk gets its next ones whole, which spares the copies
		// (and, off-heap, the map and unmap calls) of growing each one.
		n := minChunkRows
		if c > 0 {
			n = chunkRows
		}
		w := s.arena.alloc(n * stride)
		if w == nil {
			return 0, false
		}
		s.setChunk(c, w, true)
	} else if have := len(s.words[c]) / stride; in >= have {
		if !s.growChunkLocked(c, min(2*have, chunkRows)*stride) {
			return 0, false
		}
	}
	s.hi++
	return r, true
}

// growChunkLocked replaces chunk c by a copy of n words.
func (s *shard) growChunkLocked(c, n int) bool {
	grown := s.arena.alloc(n)
	if grown == nil {
		return false
	}
	copy(grown, s.words[c])
	old := s.words[c]
	s.setChunk(c, grown, false)
	s.arena.free(old)
	return true
}

func (s *shard) setChunk(c int, w []uint32, appendNew bool) {
	f := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(w))), len(w))
	if appendNew {
		s.words = append(s.words, w)
		s.flts = append(s.flts, f)
		return
	}
	s.words[c] = w
	s.flts[c] = f
}

// insertLocked adds id -> row to the index; id must be absent.
func (s *shard) insertLocked(id, h uint64, row uint32, t *Table) {
	if (s.live+s.tombs+1)*loadDen > len(s.idx)*loadNum {
		s.roomLocked(t, s.live+1)
	}
	s.placeLocked(h, tagOf(h)|(row+1))
	s.live++
}

// placeLocked puts index entry e, of an id with hash h, in the first empty place or tombstone of
// h's probe run.
func (s *shard) placeLocked(h uint64, e uint32) {
	n := len(s.idx)
	i := s.pos(h)
	for s.idx[i] != 0 && s.idx[i] != tombstone {
		if i++; i == n {
			i = 0
		}
	}
	if s.idx[i] == tombstone {
		s.tombs--
	}
	s.idx[i] = e
}

// reserveIndexLocked makes room in the index at once for rows entries under the load limit (see
// roomLocked). When it grows the index, it grows it by at least the usual factor, so that loading
// rows in many chunks rehashes the index a logarithmic number of times, not once per chunk.
func (s *shard) reserveIndexLocked(t *Table, rows int) {
	if need := (rows+s.tombs)*loadDen/loadNum + 1; need > len(s.idx) {
		s.roomLocked(t, rows)
	}
}

// roomLocked rebuilds the index so that rows entries fit under the load limit: at the same size,
// dropping the tombstones, when the rows alone fit with an eighth to spare (a shard refilling the
// room of slots that moved away keeps its index's size); grown by at least the usual factor
// otherwise.
func (s *shard) roomLocked(t *Table, rows int) {
	need := rows*loadDen/loadNum + 1
	if s.tombs > 0 && need+need/8 <= len(s.idx) {
		s.resizeIndexLocked(t, len(s.idx))
		return
	}
	s.resizeIndexLocked(t, max(16, need, len(s.idx)*growNum/growDen))
}

// reserveRowsLocked allocates slab chunks for rows rows in all, touching every page so that later
// inserts do not stop on page faults. It stops early when the system is out of memory.
func (s *shard) reserveRowsLocked(rows, stride int) { s.growRowsLocked(rows, stride, true) }

// growRowsLocked allocates slab chunks for rows rows in all, touching every page with touch. The
// whole chunks it adds come from one allocation, one after another in memory, so rows loaded in
// bulk are copied in runs longer than a chunk. It stops early when the system is out of memory.
func (s *shard) growRowsLocked(rows, stride int, touch bool) {
	rows = min(rows, MaxRowsPerShard)
	touchPages := func(w []uint32) {
		if !touch {
			return
		}
		for k := 0; k < len(w); k += 1024 { // one word per 4 KiB page
			w[k] = 0
		}
	}
	if n := len(s.words); n > 0 && len(s.words[n-1]) < chunkRows*stride && (n-1)*chunkRows < rows {
		had := len(s.words[n-1])
		if !s.growChunkLocked(n-1, chunkRows*stride) {
			return
		}
		touchPages(s.words[n-1][had:])
	}
	missing := (rows - len(s.words)*chunkRows + chunkRows - 1) / chunkRows
	if missing <= 0 {
		return
	}
	cw := chunkRows * stride
	w := s.arena.alloc(missing * cw)
	if w == nil {
		// No room for all of them at once: as many single chunks as there is memory for.
		for len(s.words)*chunkRows < rows {
			c := s.arena.alloc(cw)
			if c == nil {
				return
			}
			touchPages(c)
			s.setChunk(len(s.words), c, true)
		}
		return
	}
	touchPages(w)
	// Chunks cut from one allocation are full, so never grown or freed alone; the table frees
	// the allocation as a whole.
	for k := range missing {
		s.setChunk(len(s.words), w[k*cw:(k+1)*cw:(k+1)*cw], true)
	}
}

func (s *shard) resizeIndexLocked(t *Table, size int) {
	old := s.idx
	s.idx = make([]uint32, size)
	s.tombs = 0
	for _, e := range old {
		if e == 0 || e == tombstone {
			continue
		}
		s.placeLocked(t.hash(s.rowID(e&entryRowMask-1, t.stride)), e)
	}
}

// buryLocked turns the index entry of row r, of an id with hash h, into a tombstone.
func (s *shard) buryLocked(h uint64, r uint32) {
	n := len(s.idx)
	i := s.pos(h)
	for s.idx[i]&entryRowMask != r+1 {
		if i++; i == n {
			i = 0
		}
	}
	s.idx[i] = tombstone
	s.tombs++
}

// removeLocked takes id (at row r) out of the index and frees its row. Deletion shifts later
// entries of the probe run back (tombstones too), so it adds no tombstone.
func (s *shard) removeLocked(id, h uint64, r uint32, t *Table) {
	n := len(s.idx)
	i := s.pos(h)
	for s.idx[i]&entryRowMask != r+1 {
		if i++; i == n {
			i = 0
		}
	}
	for j := i; ; {
		if j++; j == n {
			j = 0
		}
		e := s.idx[j]
		if e == 0 {
			break
		}
		if e == tombstone { // no home: it moves back like an entry that may
			s.idx[i] = e
			i = j
			continue
		}
		k := s.pos(t.hash(s.rowID(e&entryRowMask-1, t.stride)))
		// The entry at j stays if its home k lies cyclically in (i, j].
		if (i <= j && i < k && k <= j) || (i > j && (i < k || k <= j)) {
			continue
		}
		s.idx[i] = e
		i = j
	}
	s.idx[i] = 0
	s.live--
	s.rowWords(r, t.stride)[wordStep] = freeMark
	s.free = append(s.free, r)
	for k := range s.trks {
		s.trks[k].deleted = append(s.trks[k].deleted, id)
	}
}

// markLocked records that row r changed, for every tracker.
func (s *shard) markLocked(r uint32) {
	for k := range s.trks {
		b := &s.trks[k]
		w := int(r >> 6)
		if w >= len(b.bits) {
			b.bits = append(b.bits, make([]uint64, w+1-len(b.bits))...)
		}
		b.bits[w] |= 1 << (r & 63)
	}
}

// memoryBytesLocked is the shard's heap footprint.
func (s *shard) memoryBytesLocked() int64 {
	var n int64
	for _, w := range s.words {
		n += slabBytes(len(w))
	}
	n += int64(cap(s.words)+cap(s.flts)) * 24
	n += int64(cap(s.idx))*4 + int64(cap(s.free))*4
	for _, b := range s.trks {
		n += int64(cap(b.bits))*8 + int64(cap(b.deleted))*8
	}
	return n
}
