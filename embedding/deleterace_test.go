package embedding

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// splitIDs returns doomed ids (of slots in set) and kept ids (of the others), n of each, distinct,
// drawn from the multiples of a prime from first on.
func splitIDs(set *SlotSet, first uint64, n int) (doomed, kept []uint64) {
	for i := first; len(doomed) < n || len(kept) < n; i++ {
		id := i * 104729
		if set.Contains(id) {
			if len(doomed) < n {
				doomed = append(doomed, id)
			}
		} else if len(kept) < n {
			kept = append(kept, id)
		}
	}
	return doomed, kept
}

// gradsFor returns seeded gradients for n ids of dim floats.
func gradsFor(rng *rand.Rand, n, dim int) []float32 {
	g := make([]float32, n*dim)
	for i := range g {
		g[i] = float32(rng.NormFloat64())
	}
	return g
}

// DeleteSlots finds its rows under the read lock and removes them under the write lock; in
// between, eviction may free a found row and an insert of another slot's id may take it. The
// removal then leaves that row alone, and a row freed and not yet taken is not freed twice. The
// window is replayed here step by step on one shard: the rows a scan found, an eviction of them,
// inserts that reuse some, then the removal of what the scan found.
func TestDeleteSlotsLeavesRowsTakenSinceTheScan(t *testing.T) {
	const slots = 16
	set := NewSlotSet(slots, 3, 11)
	cfg := Config{Dim: 4, Seed: 5, Shards: 1, Optimizer: Optimizer{Kind: Adagrad}, Eviction: Eviction{TTL: 10}}
	tab, ref := newTestTable(t, cfg), newTestTable(t, cfg)
	doomed, kept := splitIDs(set, 1, 300)
	rng := rand.New(rand.NewPCG(7, 8))
	require.NoError(t, tab.Apply(doomed, gradsFor(rng, len(doomed), 4), 0))
	g := gradsFor(rng, len(kept), 4)
	require.NoError(t, tab.Apply(kept, g, 100))
	require.NoError(t, ref.Apply(kept, g, 100))

	// The scan, as DeleteSlots makes it under the read lock.
	s := &tab.shards[0]
	var rows []uint32
	var ids []uint64
	s.mu.RLock()
	for r := uint32(0); r < s.hi; r++ {
		if w := s.rowWords(r, tab.stride); w[wordStep] != freeMark && set.Contains(s.rowID(r, tab.stride)) {
			rows, ids = append(rows, r), append(ids, s.rowID(r, tab.stride))
		}
	}
	s.mu.RUnlock()
	require.Len(t, rows, len(doomed))

	// Eviction frees every row the scan found; new rows of kept slots take half of them.
	require.Equal(t, len(doomed), tab.EvictExpired(100))
	_, fresh := splitIDs(set, 100000, len(doomed)/2)
	g = gradsFor(rng, len(fresh), 4)
	require.NoError(t, tab.Apply(fresh, g, 100))
	require.NoError(t, ref.Apply(fresh, g, 100))
	reused := 0
	s.mu.RLock()
	for _, r := range rows {
		if s.rowWords(r, tab.stride)[wordStep] != freeMark {
			reused++
		}
	}
	s.mu.RUnlock()
	require.Equal(t, len(fresh), reused, "the new rows took rows the scan found")

	// The removal of what the scan found removes nothing.
	s.mu.Lock()
	removed := tab.deleteRowsLocked(s, rows, ids)
	s.mu.Unlock()
	assert.Zero(t, removed)
	checkIndex(t, tab)
	assert.Equal(t, dump(ref), dump(tab), "every row of the kept slots, old and new, is kept as it was")

	// The rows left free were not freed twice: as many new rows as there are free rows each get
	// a row of their own.
	_, more := splitIDs(set, 200000, len(doomed))
	g = gradsFor(rng, len(more), 4)
	require.NoError(t, tab.Apply(more, g, 100))
	require.NoError(t, ref.Apply(more, g, 100))
	checkIndex(t, tab)
	assert.Equal(t, dump(ref), dump(tab))
	assert.Equal(t, ref.Len(), tab.Len())
}

// DeleteSlots races with eviction of its slots' rows and with inserts of other slots' ids that
// reuse the freed rows: at the end no row of the deleted slots is left, and every other row is
// exactly as in a table that saw the same inserts and updates and neither the eviction nor the
// deletion. Run with -race.
func TestDeleteSlotsRacingEvictionAndInserts(t *testing.T) {
	const slots = 32
	set := NewSlotSet(slots, 2, 9, 17, 30)
	cfg := Config{Dim: 4, Seed: 3, Shards: 8, Optimizer: Optimizer{Kind: Adagrad}, Eviction: Eviction{TTL: 10}}
	rng := rand.New(rand.NewPCG(11, 12))
	for round := range 4 {
		tab, ref := newTestTable(t, cfg), newTestTable(t, cfg)
		doomed, kept := splitIDs(set, uint64(round)*1000000+1, 4000)
		require.NoError(t, tab.Apply(doomed, gradsFor(rng, len(doomed), 4), 0))
		g := gradsFor(rng, len(kept), 4)
		require.NoError(t, tab.Apply(kept, g, 100))
		require.NoError(t, ref.Apply(kept, g, 100))
		// Batches of new ids of kept slots, and updates of old ones, all at step 100: the
		// eviction at 100 takes only the deleted slots' rows, made at step 0.
		var batches [][]uint64
		var grads [][]float32
		for b := range 40 {
			_, fresh := splitIDs(set, uint64(round)*1000000+uint64(b+1)*10000, 100)
			batch := append(fresh, kept[rng.IntN(len(kept)-50):][:50]...)
			batches, grads = append(batches, batch), append(grads, gradsFor(rng, len(batch), 4))
		}

		var wg sync.WaitGroup
		evicted := 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, b := range batches {
				evicted += tab.EvictExpired(100)
				if err := tab.Apply(b, grads[i], 100); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		deleted := tab.DeleteSlots(set)
		wg.Wait()
		for i, b := range batches {
			require.NoError(t, ref.Apply(b, grads[i], 100))
		}
		assert.Equal(t, len(doomed), deleted+evicted, "round %d: each row of the deleted slots went once", round)
		checkIndex(t, tab)
		assert.Equal(t, dump(ref), dump(tab), "round %d", round)
		assert.Equal(t, ref.Len(), tab.Len(), "round %d", round)
	}
}

// A tracker's Reset runs beside Apply, deletions and copies through the tracker; run with -race.
// After the last reset, the tracker holds exactly the changes made since.
func TestTrackerResetRacingApply(t *testing.T) {
	tab := trained(t, 2000, 4)
	tr := tab.NewTracker()
	defer tr.Close()
	rng := rand.New(rand.NewPCG(13, 14))
	var batches [][]uint64
	for range 100 {
		b := make([]uint64, 64)
		for i := range b {
			b[i] = uint64(rng.IntN(4000)) * 7919 // half of them new rows
		}
		batches = append(batches, b)
	}
	g := gradsFor(rng, 64, 6)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for step, b := range batches {
			if err := tab.Apply(b, g, uint32(10+step)); err != nil {
				t.Error(err)
				return
			}
			tab.Delete(b[0])
		}
	}()
	go func() {
		defer wg.Done()
		for range 100 {
			if _, _, err := tab.AppendRawShards(nil, 0, 1<<20, ExportOptions{Changed: tr, Reset: true}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range 200 {
		require.NoError(t, tr.Reset())
	}
	wg.Wait()
	require.NoError(t, tr.Reset())
	assert.Zero(t, tr.Size())
	require.NoError(t, tab.Apply([]uint64{1}, make([]float32, 6), 500))
	out := make([]byte, tr.Size())
	n, err := tr.CopyRaw(out, nil, false)
	require.NoError(t, err)
	assert.Equal(t, tab.RawRowSize(), n, "only the change after the last reset")
}
