package embedding

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// A full raw copy (CopyRaw without changedOnly) holds each shard's rows together, shard after
// shard. CopyRawShards says how many rows each shard holds, and LoadRawShards puts such a copy
// back into an empty table of the same placement shard by shard: each shard's records are copied
// in bulk into its row slabs, with no pass to group them and no row found twice.

const shardKeyMagic = "EPSK\x01"

// shardKey names the table's placement of ids into shards: the shard count and the hash seed.
func (t *Table) shardKey() []byte {
	b := append([]byte(nil), shardKeyMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(t.shards)))
	return binary.LittleEndian.AppendUint64(b, t.hashSeed)
}

// CopyRawShards is CopyRaw(dst, false, newBase) that also says how the copy is grouped: counts[i]
// records of shard i follow those of shard i-1 in dst, and key names the table's placement of ids
// into shards (tables with equal keys place every id in the same shard). LoadRawShards takes both.
func (t *Table) CopyRawShards(dst []byte, newBase bool) (n int, counts []int, key []byte, err error) {
	counts = make([]int, len(t.shards))
	n, err = t.copyRawBase(dst, false, newBase, counts)
	if err != nil {
		return n, nil, nil, err
	}
	return n, counts, t.shardKey(), nil
}

// LoadRawShards starts loading a full copy that CopyRawShards wrote, with its key and counts, into
// this table, which must be empty (no row ever added, as after New and Reserve) and place ids as
// the key says; otherwise it returns an error matching errors.ErrUnsupported and changes nothing,
// and LoadRaw is the way to load the copy.
//
// load(i, src) adds the next records of shard i, in the order CopyRawShards wrote them: it copies
// them in bulk into the shard's slabs and indexes them. Calls for different shards may run
// concurrently; the calls for one shard come one at a time. Records that are not whole, not of
// shard i, deletion records, repeated ids or more records than counts[i] return ErrCorrupt.
//
// end(true) finishes the load and returns the rows loaded; unless every shard got exactly its
// count it returns ErrCorrupt and, like end(false), removes every row the load added, so the
// table is empty again. Exactly one end call must follow, after every load call has returned.
// Meanwhile the table must be left alone: a shard that changes under the load fails it.
func (t *Table) LoadRawShards(key []byte, counts []int) (load func(shard int, src []byte) error, end func(keep bool) (int, error), err error) {
	if !bytes.Equal(key, t.shardKey()) {
		return nil, nil, fmt.Errorf("%w: %s: the copy places ids into shards otherwise", errors.ErrUnsupported, t.name())
	}
	if len(counts) != len(t.shards) {
		return nil, nil, fmt.Errorf("%w: %s: %d shard counts for %d shards", ErrCorrupt, t.name(), len(counts), len(t.shards))
	}
	for i, c := range counts {
		if c < 0 || c > MaxRowsPerShard {
			return nil, nil, fmt.Errorf("%w: %s: %d rows in shard %d", ErrCorrupt, t.name(), c, i)
		}
		s := &t.shards[i]
		s.mu.RLock()
		empty := s.hi == 0
		s.mu.RUnlock()
		if !empty {
			return nil, nil, fmt.Errorf("%w: %s: bulk loads go into empty tables only", errors.ErrUnsupported, t.name())
		}
	}
	l := &shardLoad{t: t, counts: append([]int(nil), counts...), done: make([]int, len(counts))}
	return l.load, l.end, nil
}

// shardLoad is one LoadRawShards. done[i] is guarded by shard i's lock.
type shardLoad struct {
	t      *Table
	counts []int
	done   []int // rows loaded into each shard
	ended  bool
}

func (l *shardLoad) load(i int, src []byte) error {
	t := l.t
	if i < 0 || i >= len(t.shards) {
		return fmt.Errorf("%w: %s: no shard %d", ErrCorrupt, t.name(), i)
	}
	rec := t.RawRowSize()
	if len(src)%rec != 0 {
		return fmt.Errorf("%w: %s: %d bytes is not a whole number of %d-byte records", ErrCorrupt, t.name(), len(src), rec)
	}
	n := len(src) / rec
	s := &t.shards[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	r0 := l.done[i]
	if int(s.hi) != r0 || len(s.free) != 0 {
		return fmt.Errorf("%s: shard %d changed during a bulk load", t.name(), i)
	}
	if r0+n > l.counts[i] {
		return fmt.Errorf("%w: %s: shard %d gets more than its %d records", ErrCorrupt, t.name(), i, l.counts[i])
	}
	if n == 0 {
		return nil
	}
	stride := t.stride
	if r0 == 0 {
		s.reserveIndexLocked(t, l.counts[i])
		s.growRowsLocked(l.counts[i], stride, false)
		if len(s.words)*chunkRows < l.counts[i] {
			return fmt.Errorf("%w: %s: no memory for %d rows", ErrFull, t.name(), l.counts[i])
		}
	}
	s.putRowsLocked(r0, src, stride)
	// Index the rows just copied, reading ids from src (still in cache).
	k := 0
	var bad error
	for ; k < n; k++ {
		b := src[k*rec:]
		id := binary.LittleEndian.Uint64(b)
		h := t.hash(id)
		if t.shardOf(h) != i || binary.LittleEndian.Uint32(b[8:]) == freeMark {
			bad = fmt.Errorf("%w: %s: record %d of shard %d is not a row of that shard", ErrCorrupt, t.name(), r0+k, i)
			break
		}
		r, at := s.probeLocked(id, h, stride)
		if r >= 0 {
			bad = fmt.Errorf("%w: %s: id %d twice in shard %d", ErrCorrupt, t.name(), id, i)
			break
		}
		row := uint32(r0 + k)
		s.hi = row + 1 // probes read the ids of rows below hi
		s.insertAtLocked(id, h, row, at, t)
		s.markLocked(row)
	}
	l.done[i] = r0 + k
	t.rows.Add(int64(k))
	return bad
}

// putRowsLocked copies the records src into rows r0, r0+1, ..., whose chunks exist: whole runs of
// chunks that lie one after another in memory at once.
func (s *shard) putRowsLocked(r0 int, src []byte, stride int) {
	rec := 4 * stride
	for len(src) > 0 {
		c, in := r0>>chunkShift, r0&chunkMask
		w := s.words[c][in*stride:]
		if !nativeLittleEndian() {
			m := min(len(w)/stride, len(src)/rec)
			getWords(w[:m*stride], src[:m*rec])
			r0, src = r0+m, src[m*rec:]
			continue
		}
		// Extend the run over the following chunks while each starts where the previous ends.
		// Off-heap slabs only: heap slabs that happen to touch are distinct objects.
		words := len(w)
		for offHeap && words*4 < len(src) && c+1 < len(s.words) &&
			unsafe.Pointer(unsafe.SliceData(s.words[c+1])) == unsafe.Add(unsafe.Pointer(unsafe.SliceData(w)), words*4) {
			c++
			words += len(s.words[c])
		}
		m := min(words*4, len(src)) / rec
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), m*rec), src[:m*rec])
		r0, src = r0+m, src[m*rec:]
	}
}

func (l *shardLoad) end(keep bool) (int, error) {
	t := l.t
	if l.ended {
		return 0, fmt.Errorf("%s: bulk load already ended", t.name())
	}
	l.ended = true
	total := 0
	var err error
	for i, c := range l.counts {
		total += l.done[i]
		if keep && l.done[i] != c && err == nil {
			err = fmt.Errorf("%w: %s: shard %d got %d of its %d records", ErrCorrupt, t.name(), i, l.done[i], c)
		}
	}
	if keep && err == nil {
		return total, nil
	}
	for i := range t.shards {
		if l.done[i] == 0 {
			continue
		}
		s := &t.shards[i]
		s.mu.Lock()
		if int(s.hi) == l.done[i] && len(s.free) == 0 {
			// Empty again; the slabs and the index keep their room.
			clear(s.idx)
			s.hi, s.live, s.tombs = 0, 0, 0
			for k := range s.trks {
				clear(s.trks[k].bits)
			}
			t.rows.Add(int64(-l.done[i]))
		} else {
			err = errors.Join(err, fmt.Errorf("%s: shard %d changed during a bulk load; its rows stay", t.name(), i))
		}
		s.mu.Unlock()
	}
	return 0, err
}
