package embedding

import "runtime"

// Shards returns the table's shard count: the cursor range of AppendRawShards.
func (t *Table) Shards() int { return len(t.shards) }

// AppendRawShards appends to dst the raw records (see RawRowSize) of the rows opt selects, one
// whole shard at a time from shard from on, and stops after the shard that takes the appended
// bytes to budget or beyond (at least one shard is always copied). It returns the extended dst
// and the shard to go on from; next == Shards() means the last shard was copied. With
// opt.Changed, a shard's deletion records come before its rows, and opt.Reset clears the
// tracker's record of each shard copied, in the same critical section as the copy.
//
// Each shard is one consistent cut taken under that shard's read lock only, so writers of other
// shards never wait and a shard's writers wait for one shard's copy. A sequence of calls over
// every shard is therefore not one cut of the table: create a Tracker before the first call and
// copy its changes afterwards (they are whole rows, so copying a row twice is harmless) to end
// with an exact copy. This is how a slot migrates while it is being written.
func (t *Table) AppendRawShards(dst []byte, from, budget int, opt ExportOptions) ([]byte, int, error) {
	if from < 0 || from >= len(t.shards) {
		return dst, len(t.shards), nil
	}
	var keep func(uint64) bool
	if opt.Slots != nil {
		keep = opt.Slots.Contains
	}
	tr := opt.Changed
	if tr != nil {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if tr.isClosed() {
			return dst, from, ErrClosed
		}
	}
	start := len(dst)
	i := from
	for ; i < len(t.shards) && (i == from || len(dst)-start < budget); i++ {
		s := &t.shards[i]
		s.mu.RLock()
		need := t.boundLocked(s, tr)
		if cap(dst)-len(dst) < need {
			grown := make([]byte, len(dst), max(2*cap(dst), len(dst)+need))
			copy(grown, dst)
			dst = grown
		}
		n := t.copyShardSelectedLocked(s, dst[len(dst):len(dst)+need], tr, keep)
		if opt.Reset && tr != nil {
			s.bitsLocked(tr).reset()
		}
		s.mu.RUnlock()
		dst = dst[:len(dst)+n]
	}
	return dst, i, nil
}

// holdRows is the most rows AppendRawRows visits under one hold of a shard's lock.
const holdRows = 256

// Cursor is a place in a table's rows, for copies in chunks: a shard, and a row index in it.
type Cursor struct {
	Shard int
	Row   uint32
}

// AppendRawRows appends to dst the raw records of the rows in slots (nil: every row) from cur
// on, and stops once the appended bytes reach budget, at a row boundary: it returns the
// extended dst and the cursor to go on from (Shard == Shards() once every row was visited).
// It holds one shard's read lock at a time, for a few hundred rows at most, so writers
// of the shard wait for little longer than that, and lets other goroutines run between holds
// (runtime.Gosched): a copy is bulk work, and requests beside it should not wait for a CPU until
// the scheduler preempts it. Rows changed, added or removed behind the cursor are not seen:
// track changes with a Tracker made before the first call (see AppendRawShards).
func (t *Table) AppendRawRows(dst []byte, cur Cursor, budget int, slots *SlotSet) ([]byte, Cursor) {
	start := len(dst)
	stride := t.stride
	rec := 4 * stride
	for cur.Shard < len(t.shards) {
		if len(dst)-start >= budget {
			return dst, cur
		}
		s := &t.shards[cur.Shard]
		s.mu.RLock()
		// At most holdRows rows per hold of the lock: a writer of this shard waits for that
		// much copying, not for the whole chunk.
		stop := cur.Row + holdRows
		for ; cur.Row < s.hi && cur.Row < stop && len(dst)-start < budget; cur.Row++ {
			w := s.rowWords(cur.Row, stride)
			if w[wordStep] == freeMark || (slots != nil && !slots.Contains(uint64(w[0])|uint64(w[1])<<32)) {
				continue
			}
			if cap(dst)-len(dst) < rec {
				grown := make([]byte, len(dst), max(2*cap(dst), len(dst)+rec, start+min(budget, 4<<20)+rec))
				copy(grown, dst)
				dst = grown
			}
			putWords(dst[len(dst):len(dst)+rec], w)
			dst = dst[:len(dst)+rec]
		}
		done := cur.Row >= s.hi
		s.mu.RUnlock()
		if done {
			cur = Cursor{Shard: cur.Shard + 1}
		}
		runtime.Gosched()
	}
	return dst, cur
}

// DeleteSlots removes every row whose slot is in set, one shard at a time, and returns the rows
// removed. Trackers record the removals as deletions. A server whose slot moved away calls it,
// so that a slot that later comes back never revives rows its other owner deleted meanwhile.
//
// The rows to delete are found under the shard's read lock, a few hundred rows per hold, with
// other goroutines let run between holds (runtime.Gosched), and removed under its write lock,
// their index entries left as tombstones: no other row is read (but the few left in a shard
// that lost most of its rows, whose index is rebuilt from them), and probes are as long as
// before the removal until inserts take the tombstones or the index is next rebuilt. The shards
// are visited in the opposite order to lookups and updates, so that a batch meets the removal in
// at most one of its shards instead of following it from shard to shard.
func (t *Table) DeleteSlots(set *SlotSet) int {
	total := 0
	var doomed []uint32
	var ids []uint64
	for i := len(t.shards) - 1; i >= 0; i-- {
		s := &t.shards[i]
		s.mu.RLock()
		empty := s.live == 0 // a destination discarding slots it never held, say
		s.mu.RUnlock()
		if empty {
			continue
		}
		doomed, ids = doomed[:0], ids[:0]
		for r := uint32(0); ; {
			s.mu.RLock()
			hi := s.hi
			for stop := min(r+holdRows, hi); r < stop; r++ {
				w := s.rowWords(r, t.stride)
				if id := uint64(w[0]) | uint64(w[1])<<32; w[wordStep] != freeMark && set.Contains(id) {
					doomed, ids = append(doomed, r), append(ids, id)
				}
			}
			s.mu.RUnlock()
			runtime.Gosched()
			if r >= hi {
				break
			}
		}
		if len(doomed) == 0 {
			continue
		}
		s.mu.Lock()
		k := t.deleteRowsLocked(s, doomed, ids)
		s.mu.Unlock()
		t.rows.Add(-int64(k))
		total += k
	}
	return total
}

// deleteRowsLocked removes those of rows (of shard s, write-locked) that still hold ids (rows[i]
// held ids[i] when it was found under the read lock: it may have been removed since, evicted, and
// its place given to another row). It records their ids as deleted for every tracker and returns
// how many it removed. Their index entries become tombstones, found without reading any other
// row; a shard left with more tombstones than twice its rows has its index rebuilt from those
// few rows, and an emptied one is cleared.
func (t *Table) deleteRowsLocked(s *shard, rows []uint32, ids []uint64) int {
	stride := t.stride
	k := 0
	for i, r := range rows {
		w := s.rowWords(r, stride)
		if w[wordStep] == freeMark || uint64(w[0])|uint64(w[1])<<32 != ids[i] {
			continue
		}
		s.buryLocked(t.hash(ids[i]), r)
		w[wordStep] = freeMark
		for q := range s.trks {
			s.trks[q].deleted = append(s.trks[q].deleted, ids[i])
		}
		rows[k] = r
		k++
	}
	if k == 0 {
		return 0
	}
	s.free = append(s.free, rows[:k]...)
	s.live -= k
	switch {
	case s.live == 0:
		clear(s.idx)
		s.tombs = 0
	case s.tombs > 2*s.live:
		s.resizeIndexLocked(t, len(s.idx))
	}
	return k
}
