package checkpoint

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
)

// fakeTable is a map-based Table: id -> fixed-size record, with a change set since the last base.
type fakeTable struct {
	mu      sync.Mutex
	rowSize int
	schema  []byte
	rows    map[uint64][]byte
	changed map[uint64]bool
	// copyHook, if set, runs inside CopyRaw before copying (with the lock released), so a test can
	// hold a snapshot mid-copy.
	copyHook func()
	// loadErr, if set, makes LoadRaw fail (after the given number of successful calls).
	loadErrAfter int
	loadErr      error
	loads        int
}

func newFakeTable(rowSize int) *fakeTable {
	return &fakeTable{rowSize: rowSize, schema: []byte(fmt.Sprintf("fake/%d", rowSize)),
		rows: map[uint64][]byte{}, changed: map[uint64]bool{}}
}

func (t *fakeTable) Schema() []byte  { return t.schema }
func (t *fakeTable) RawRowSize() int { return t.rowSize }

func (t *fakeTable) RawSize(changedOnly bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if changedOnly {
		return len(t.changed) * t.rowSize
	}
	return len(t.rows) * t.rowSize
}

func (t *fakeTable) CopyRaw(dst []byte, changedOnly, newBase bool) (int, error) {
	if t.copyHook != nil {
		t.copyHook()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var ids []uint64
	if changedOnly {
		ids = slices.Sorted(maps.Keys(t.changed))
	} else {
		ids = slices.Sorted(maps.Keys(t.rows))
	}
	if len(ids)*t.rowSize > len(dst) {
		return 0, io.ErrShortBuffer
	}
	o := 0
	for _, id := range ids {
		if r, ok := t.rows[id]; ok {
			copy(dst[o:], r)
		} else {
			clear(dst[o : o+t.rowSize])
			binary.LittleEndian.PutUint64(dst[o:], id)
			binary.LittleEndian.PutUint32(dst[o+8:], DeletionMark)
		}
		o += t.rowSize
	}
	if newBase {
		clear(t.changed)
	}
	return o, nil
}

func (t *fakeTable) LoadRaw(src []byte, keep func(id uint64) bool) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.loadErr != nil && t.loads >= t.loadErrAfter {
		return 0, t.loadErr
	}
	t.loads++
	if len(src)%t.rowSize != 0 {
		return 0, fmt.Errorf("fake: %d bytes is not whole records", len(src))
	}
	for o := 0; o < len(src); o += t.rowSize {
		if m := binary.LittleEndian.Uint32(src[o+8:]); m != 0 && m != DeletionMark {
			return 0, fmt.Errorf("fake: bad mark %#x", m)
		}
	}
	n := 0
	for o := 0; o < len(src); o += t.rowSize {
		rec := src[o : o+t.rowSize]
		id := binary.LittleEndian.Uint64(rec)
		if keep != nil && !keep(id) {
			continue
		}
		n++
		t.changed[id] = true
		if binary.LittleEndian.Uint32(rec[8:]) == DeletionMark {
			delete(t.rows, id)
			continue
		}
		t.rows[id] = append([]byte(nil), rec...)
	}
	return n, nil
}

// put writes a row with pseudo-random payload derived from (id, version).
func (t *fakeTable) put(id uint64, version uint64) {
	r := make([]byte, t.rowSize)
	binary.LittleEndian.PutUint64(r, id)
	rng := rand.New(rand.NewPCG(id, version))
	for o := 12; o < t.rowSize; o++ {
		r[o] = byte(rng.Uint32())
	}
	t.mu.Lock()
	t.rows[id] = r
	t.changed[id] = true
	t.mu.Unlock()
}

func (t *fakeTable) del(id uint64) {
	t.mu.Lock()
	delete(t.rows, id)
	t.changed[id] = true
	t.mu.Unlock()
}

// state returns a copy of the rows.
func (t *fakeTable) state() map[uint64]string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[uint64]string, len(t.rows))
	for id, r := range t.rows {
		out[id] = string(r)
	}
	return out
}

func (t *fakeTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.rows)
}

// filterState keeps the rows whose slot (of slots) is in keep.
func filterState(st map[uint64]string, slots int, keep func(int) bool) map[uint64]string {
	out := map[uint64]string{}
	for id, r := range st {
		if keep(slotOf(id, slots)) {
			out[id] = r
		}
	}
	return out
}

// mutate changes a fraction of rows, deletes a few and inserts a few, deterministically.
func mutate(rng *rand.Rand, ts []*fakeTable, version uint64, maxID uint64) {
	for _, t := range ts {
		for range 40 {
			t.put(rng.Uint64N(maxID), version)
		}
		for range 5 {
			t.del(rng.Uint64N(maxID))
		}
	}
}

// shardedFake is a fakeTable that is also a ShardedTable: its full copies group rows by id mod
// groups, and a bulk load adds rows as it goes and removes them all again when it is undone.
type shardedFake struct {
	*fakeTable
	groups    int
	bulkLoads int // LoadRawShards calls accepted
	pieces    int // load calls that added rows
}

func newShardedFake(rowSize, groups int) *shardedFake {
	return &shardedFake{fakeTable: newFakeTable(rowSize), groups: groups}
}

func (t *shardedFake) key() []byte { return []byte(fmt.Sprintf("fake-groups/%d", t.groups)) }

func (t *shardedFake) CopyRawShards(dst []byte, newBase bool) (int, []int, []byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := slices.Collect(maps.Keys(t.rows))
	g := uint64(t.groups)
	slices.SortFunc(ids, func(a, b uint64) int {
		if a%g != b%g {
			return cmp.Compare(a%g, b%g)
		}
		return cmp.Compare(a, b)
	})
	if len(ids)*t.rowSize > len(dst) {
		return 0, nil, nil, io.ErrShortBuffer
	}
	counts := make([]int, t.groups)
	for i, id := range ids {
		copy(dst[i*t.rowSize:], t.rows[id])
		counts[id%g]++
	}
	if newBase {
		clear(t.changed)
	}
	return len(ids) * t.rowSize, counts, t.key(), nil
}

func (t *shardedFake) LoadRawShards(key []byte, counts []int) (func(int, []byte) error, func(bool) (int, error), error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if string(key) != string(t.key()) || len(counts) != t.groups || len(t.rows) != 0 {
		return nil, nil, fmt.Errorf("%w: fake: another grouping or not empty", errors.ErrUnsupported)
	}
	t.bulkLoads++
	var added []uint64
	done := make([]int, t.groups)
	load := func(g int, src []byte) error {
		t.mu.Lock()
		defer t.mu.Unlock()
		if len(src)%t.rowSize != 0 {
			return fmt.Errorf("fake: %d bytes is not whole records", len(src))
		}
		t.pieces++
		for o := 0; o < len(src); o += t.rowSize {
			rec := src[o : o+t.rowSize]
			id := binary.LittleEndian.Uint64(rec)
			_, dup := t.rows[id]
			if int(id%uint64(t.groups)) != g || binary.LittleEndian.Uint32(rec[8:]) == DeletionMark || dup || done[g] == counts[g] {
				return fmt.Errorf("fake: record %d of group %d does not belong", done[g], g)
			}
			t.rows[id] = append([]byte(nil), rec...)
			added = append(added, id)
			done[g]++
		}
		return nil
	}
	end := func(keep bool) (int, error) {
		t.mu.Lock()
		defer t.mu.Unlock()
		if keep && slices.Equal(done, counts) {
			return len(added), nil
		}
		for _, id := range added {
			delete(t.rows, id)
		}
		if keep {
			return 0, fmt.Errorf("fake: groups got %v records, want %v", done, counts)
		}
		return 0, nil
	}
	return load, end, nil
}
