package embedding

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkIndex verifies every shard's index: its entries are exactly the live rows, each with its
// id's tag and reachable from its id's home place (no empty place between), the tombstones are
// counted, and rows and tombstones together stay under the load limit.
func checkIndex(t *testing.T, tab *Table) {
	t.Helper()
	for si := range tab.shards {
		s := &tab.shards[si]
		s.mu.RLock()
		entries, tombs := 0, 0
		n := len(s.idx)
		for j, e := range s.idx {
			switch e {
			case 0:
				continue
			case tombstone:
				tombs++
				continue
			}
			entries++
			r := e&entryRowMask - 1
			if r >= s.hi {
				t.Fatalf("shard %d: entry %d points past the rows", si, j)
			}
			if s.rowWords(r, tab.stride)[wordStep] == freeMark {
				t.Fatalf("shard %d: entry %d points to a free row", si, j)
			}
			h := tab.hash(s.rowID(r, tab.stride))
			if tagOf(h) != e&tagMask {
				t.Fatalf("shard %d: entry %d has another id's tag", si, j)
			}
			for i := s.pos(h); i != j; i = (i + 1) % n {
				if s.idx[i] == 0 {
					t.Fatalf("shard %d: entry %d cut off from its home by an empty place at %d", si, j, i)
				}
			}
		}
		require.Equal(t, s.live, entries, "shard %d: entries", si)
		require.Equal(t, s.tombs, tombs, "shard %d: tombstones", si)
		if n > 0 {
			require.LessOrEqual(t, (s.live+s.tombs)*loadDen, n*loadNum, "shard %d: over the load limit", si)
		}
		s.mu.RUnlock()
	}
}

// Random inserts, single deletions (which shift entries back, tombstones too), bulk deletions of
// slots (which leave tombstones), loads of rows and of deletion records, against a map: after
// every step each id is present exactly when the map holds it, with its own row, and every
// index is sound. One or two small shards make long probe runs, and some ids share the tag of
// the tombstone.
func TestIndexWithTombstones(t *testing.T) {
	const slots = 16
	for _, shards := range []int{1, 2} {
		tab := newTestTable(t, Config{Dim: 2, Seed: 5, Shards: shards, Optimizer: Optimizer{Kind: SGD}})
		rng := rand.New(rand.NewPCG(uint64(shards), 77))
		universe := make([]uint64, 3000)
		tag0 := 0
		for i := range universe {
			universe[i] = rng.Uint64()
			if tagOf(tab.hash(universe[i])) == tombstone&tagMask {
				tag0++
			}
		}
		require.Positive(t, tag0, "some ids share the tombstone's tag")
		model := map[uint64]bool{}
		rec := tab.RawRowSize()
		pick := func(k int) []uint64 {
			ids := make([]uint64, k)
			for i := range ids {
				ids[i] = universe[rng.IntN(len(universe))]
			}
			return ids
		}
		bulk := 0
		for step := 0; step < 400; step++ {
			switch op := rng.IntN(10); {
			case op < 4: // create (Lookup creates the missing ids)
				ids := pick(1 + rng.IntN(200))
				require.NoError(t, tab.Lookup(ids, make([]float32, 2*len(ids))))
				for _, id := range ids {
					model[id] = true
				}
			case op < 6: // single deletions
				for _, id := range pick(1 + rng.IntN(50)) {
					assert.Equal(t, model[id], tab.Delete(id))
					delete(model, id)
				}
			case op < 8: // bulk deletion of slots
				set := NewSlotSet(slots)
				for range 1 + rng.IntN(6) {
					set.Add(rng.IntN(slots))
				}
				want := 0
				for id := range model {
					if set.Contains(id) {
						want++
						delete(model, id)
					}
				}
				assert.Equal(t, want, tab.DeleteSlots(set))
				bulk += want
			default: // a load of rows and deletion records
				ids := pick(1 + rng.IntN(100))
				raw := make([]byte, len(ids)*rec)
				// Records apply in order: the last one of an id decides.
				for i, id := range ids {
					binary.LittleEndian.PutUint64(raw[i*rec:], id)
					if rng.IntN(3) == 0 {
						binary.LittleEndian.PutUint32(raw[i*rec+8:], freeMark)
						delete(model, id)
					} else {
						model[id] = true
					}
				}
				_, err := tab.LoadRaw(raw, nil)
				require.NoError(t, err)
			}
			checkIndex(t, tab)
			require.Equal(t, len(model), tab.Len(), "step %d", step)
			var present []uint64
			for _, id := range universe {
				_, ok := tab.Row(id)
				if ok != model[id] {
					t.Fatalf("step %d: id %d present %v, want %v", step, id, ok, model[id])
				}
				if ok {
					present = append(present, id)
				}
			}
			// Batched lookups of present ids (their candidate pass skips tombstones) read
			// each id's own row and create nothing.
			w := make([]float32, 2*len(present))
			require.NoError(t, tab.Lookup(present, w))
			for i, id := range present {
				if row, _ := tab.Row(id); row.Weights[0] != w[2*i] || row.Weights[1] != w[2*i+1] {
					t.Fatalf("step %d: id %d looked up %v, its row holds %v", step, id, w[2*i:2*i+2], row.Weights)
				}
			}
			require.Equal(t, len(model), tab.Len())
		}
		assert.Greater(t, bulk, 1000, "bulk deletions ran")
	}
}

// A shard that lost slots keeps its index's size when new rows fill their room: the rebuild that
// drops the tombstones is made at the same size while the rows fit. A shard that lost every row
// has its index cleared, and takes rows again.
func TestTombstonesAfterDeleteSlots(t *testing.T) {
	const slots = 16
	tab := newTestTable(t, Config{Dim: 2, Seed: 3, Shards: 1, Optimizer: Optimizer{Kind: SGD}})
	ids := make([]uint64, 100_000)
	for i := range ids {
		ids[i] = uint64(i)*2654435761 + 1
	}
	require.NoError(t, tab.Lookup(ids, make([]float32, 2*len(ids))))
	s := &tab.shards[0]
	size := len(s.idx)
	set := NewSlotSet(slots, 1, 4, 7, 10, 13)
	gone := tab.DeleteSlots(set)
	require.Greater(t, gone, 20_000)
	assert.Equal(t, gone, s.tombs, "each removed row leaves a tombstone")
	checkIndex(t, tab)
	// New ids, through creation (insertLocked) and through a load (insertAtLocked after
	// reserveIndexLocked), more than the tombstones left room for.
	more := make([]uint64, gone/2+2000)
	for i := range more {
		more[i] = uint64(i)*2654435761 + 1<<50
	}
	half := len(more) / 2
	require.NoError(t, tab.Lookup(more[:half], make([]float32, 2*half)))
	rec := tab.RawRowSize()
	raw := make([]byte, (len(more)-half)*rec)
	for i, id := range more[half:] {
		binary.LittleEndian.PutUint64(raw[i*rec:], id)
	}
	_, err := tab.LoadRaw(raw, nil)
	require.NoError(t, err)
	checkIndex(t, tab)
	assert.Equal(t, size, len(s.idx), "the index keeps its size")
	assert.Equal(t, len(ids)-gone+len(more), tab.Len())
	for _, id := range append(ids[:1000:1000], more...) {
		_, ok := tab.Row(id)
		assert.Equal(t, !set.Contains(id) || id >= 1<<50, ok, "id %d", id)
	}

	all := NewSlotSet(slots)
	for sl := range slots {
		all.Add(sl)
	}
	assert.Equal(t, tab.Len(), tab.DeleteSlots(all))
	assert.Zero(t, s.live)
	assert.Zero(t, s.tombs, "an emptied shard's index is cleared")
	checkIndex(t, tab)
	require.NoError(t, tab.Lookup(ids[:10], make([]float32, 20)))
	assert.Equal(t, 10, tab.Len())
	checkIndex(t, tab)
}
