package embedding

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestChunkedCopyWithTrackerUnderConcurrentWriters rebuilds the rows of some slots from a base
// copied shard by shard plus tracker deltas, while writers apply, assign, delete and load rows
// the whole time, and compares the rebuilt rows with the live table once the writers stop. A
// tracker made after the base copy started, a reset that loses a write racing with it, or loaded
// rows not recorded as changes each leave a difference. Run it with -race.
func TestChunkedCopyWithTrackerUnderConcurrentWriters(t *testing.T) {
	const slots, ids, dim = 64, 4000, 4
	cfg := Config{Dim: dim, Seed: 3, Shards: 16, Optimizer: Optimizer{Kind: Adagrad}}
	live := newTestTable(t, cfg)
	donor := newTestTable(t, cfg) // rows LoadRaw brings in
	grads := func(rng *rand.Rand, n int) []float32 {
		g := make([]float32, n*dim)
		for i := range g {
			g[i] = float32(rng.NormFloat64())
		}
		return g
	}
	seed := rand.New(rand.NewPCG(1, 2))
	all := make([]uint64, ids)
	for i := range all {
		all[i] = uint64(i) * 104729
	}
	require.NoError(t, live.Apply(all, grads(seed, ids), 1))
	require.NoError(t, donor.Apply(all[:500], grads(seed, 500), 1))
	donorRaw := make([]byte, donor.RawSize(false))
	n, err := donor.CopyRaw(donorRaw, false, false)
	require.NoError(t, err)
	donorRaw = donorRaw[:n]

	moving := NewSlotSet(slots)
	for s := 0; s < slots; s += 3 {
		moving.Add(s)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var writes atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for step := uint32(2); !stop.Load(); step++ {
				batch := make([]uint64, 32)
				for i := range batch {
					batch[i] = all[rng.IntN(ids)] + uint64(rng.IntN(2)) // some ids are new
				}
				switch rng.IntN(10) {
				case 0:
					live.Delete(batch[0])
				case 1:
					assert.NoError(t, live.Assign(batch[:4], grads(rng, 4)))
				case 2:
					k := rng.IntN(len(donorRaw) / live.RawRowSize())
					rec := live.RawRowSize()
					_, err := live.LoadRaw(donorRaw[k*rec:(k+1)*rec], nil)
					assert.NoError(t, err)
				default:
					assert.NoError(t, live.Apply(batch, grads(rng, len(batch)), step))
				}
				writes.Add(1)
			}
		}()
	}
	// Wait until writes run, then copy: tracker first, base shard by shard, deltas in rounds.
	for writes.Load() < 50 {
		runtime.Gosched()
	}
	tr := live.NewTracker()
	defer tr.Close()
	copyAll := func(opt ExportOptions) []byte {
		var out []byte
		for from := 0; from < live.Shards(); {
			out, from, err = live.AppendRawShards(out, from, 3*live.RawRowSize(), opt)
			require.NoError(t, err)
		}
		return out
	}
	rebuilt := newTestTable(t, cfg)
	var base []byte
	for cur := (Cursor{}); cur.Shard < live.Shards(); {
		base, cur = live.AppendRawRows(base, cur, 3*live.RawRowSize(), moving)
	}
	_, err = rebuilt.LoadRaw(base, nil)
	require.NoError(t, err)
	for round := 0; round < 3; round++ {
		// Writes land between the rounds, whatever the machine's load.
		for target := writes.Load() + 30; writes.Load() < target; {
			runtime.Gosched()
		}
		delta := copyAll(ExportOptions{Slots: moving, Changed: tr, Reset: true})
		_, err = rebuilt.LoadRaw(delta, nil)
		require.NoError(t, err)
	}
	stop.Store(true)
	wg.Wait()
	final := copyAll(ExportOptions{Slots: moving, Changed: tr, Reset: true})
	_, err = rebuilt.LoadRaw(final, nil)
	require.NoError(t, err)

	want := map[uint64]RowData{}
	for id, r := range dump(live) {
		if moving.Contains(id) {
			want[id] = r
		}
	}
	got := dump(rebuilt)
	require.NotEmpty(t, want)
	assert.Equal(t, len(want), len(got), "rows")
	for id, r := range want {
		g, ok := got[id]
		if !assert.True(t, ok, "row %d missing", id) {
			continue
		}
		assert.Equal(t, r, g, "row %d", id)
	}
	for id := range got {
		assert.Contains(t, want, id, "row %d should be gone", id)
	}
}

func TestAppendRawShardsBudgetAndCursor(t *testing.T) {
	tab := trained(t, 400, 1)
	rec := tab.RawRowSize()
	var out []byte
	calls := 0
	for from := 0; from < tab.Shards(); calls++ {
		before := len(out)
		var err error
		out, from, err = tab.AppendRawShards(out, from, 1, ExportOptions{})
		require.NoError(t, err)
		assert.Positive(t, len(out)-before, "each call copies a whole, non-empty shard")
	}
	assert.Equal(t, tab.Shards(), calls, "budget 1: one shard per call")
	assert.Equal(t, 400*rec, len(out))
	whole, next, err := tab.AppendRawShards(nil, 0, 1<<40, ExportOptions{})
	require.NoError(t, err)
	assert.Equal(t, tab.Shards(), next)
	assert.Equal(t, len(out), len(whole))
	_, next, err = tab.AppendRawShards(nil, tab.Shards(), 1, ExportOptions{})
	require.NoError(t, err)
	assert.Equal(t, tab.Shards(), next, "past the end: nothing to copy")

	tr := tab.NewTracker()
	require.NoError(t, tr.Close())
	_, _, err = tab.AppendRawShards(nil, 0, 1, ExportOptions{Changed: tr})
	assert.ErrorIs(t, err, ErrClosed)
}

func TestAppendRawRowsCursor(t *testing.T) {
	tab := trained(t, 500, 3)
	rec := tab.RawRowSize()
	set := NewSlotSet(16, 0, 3, 9)
	want, _, err := tab.AppendRawShards(nil, 0, 1<<40, ExportOptions{Slots: set})
	require.NoError(t, err)
	require.NotEmpty(t, want)
	var got []byte
	calls := 0
	for cur := (Cursor{}); cur.Shard < tab.Shards(); calls++ {
		before := len(got)
		got, cur = tab.AppendRawRows(got, cur, 2*rec, set)
		assert.LessOrEqual(t, len(got)-before, 2*rec, "a chunk stops at its budget")
	}
	assert.Equal(t, want, got, "the chunks add up to one copy, in the same order")
	assert.Greater(t, calls, len(want)/(2*rec))
	all, cur := tab.AppendRawRows(nil, Cursor{}, 1<<40, nil)
	assert.Equal(t, Cursor{Shard: tab.Shards()}, cur)
	assert.Equal(t, 500*rec, len(all))
}

func TestDeleteSlots(t *testing.T) {
	const slots = 32
	for _, tc := range []struct {
		name    string
		members []int
	}{
		{"many rows: the index is rebuilt", []int{1, 5, 30}},
		{"few rows: taken out one by one", []int{7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tab := trained(t, 5000, 2)
			before := dump(tab)
			set := NewSlotSet(slots, tc.members...)
			tr := tab.NewTracker()
			defer tr.Close()
			want := 0
			for id := range before {
				if set.Contains(id) {
					want++
				}
			}
			require.Positive(t, want)
			assert.Equal(t, want, tab.DeleteSlots(set))
			assert.Equal(t, 5000-want, tab.Len())
			after := dump(tab)
			assert.Len(t, after, 5000-want)
			// Every row left is found through the index, unchanged; every row deleted is gone.
			for id, row := range before {
				got, ok := tab.Row(id)
				if set.Contains(id) {
					assert.False(t, ok, "row %d of a deleted slot survived", id)
					continue
				}
				if assert.True(t, ok, "row %d of a kept slot is lost", id) {
					assert.Equal(t, row, got)
				}
			}
			// The removals are recorded, so a copy of the changes carries them as deletion records.
			delta, _, err := tab.AppendRawShards(nil, 0, 1<<40, ExportOptions{Changed: tr})
			require.NoError(t, err)
			assert.Equal(t, want*tab.RawRowSize(), len(delta))
			assert.Equal(t, 0, tab.DeleteSlots(set), "nothing left to delete")
			// The freed rows are reused and the index takes new ids: rows of the deleted slots
			// come back at their initial value.
			var back []uint64
			for id := range before {
				if set.Contains(id) {
					back = append(back, id)
				}
			}
			dst := make([]float32, len(back)*tab.Dim())
			require.NoError(t, tab.Lookup(back, dst))
			assert.Equal(t, 5000, tab.Len())
			for i, id := range back {
				init := make([]float32, tab.Dim())
				require.NoError(t, tab.InitialWeights(id, init))
				assert.Equal(t, init, dst[i*tab.Dim():(i+1)*tab.Dim()])
				_, ok := tab.Row(id)
				assert.True(t, ok)
			}
		})
	}
}

// TestCopyRawAfterReserve: whole copies and loads of a table whose shards hold slab chunks
// reserved beyond their rows (Reserve, or a big LoadRaw) copy only the rows.
func TestCopyRawAfterReserve(t *testing.T) {
	src := trained(t, 300, 4)
	raw := make([]byte, src.RawSize(false))
	n, err := src.CopyRaw(raw, false, false)
	require.NoError(t, err)
	for _, prep := range []func(*Table){
		func(tab *Table) { tab.Reserve(50000) },
		func(tab *Table) {}, // the big load below reserves whole chunks itself
	} {
		dst := newTestTable(t, src.Config())
		prep(dst)
		_, err := dst.LoadRaw(raw[:n], nil)
		require.NoError(t, err)
		out := make([]byte, dst.RawSize(false))
		m, err := dst.CopyRaw(out, false, false)
		require.NoError(t, err)
		assert.Equal(t, n, m)
		assert.Equal(t, dump(src), dump(dst))
	}
}

// DeleteSlots while other slots' rows are created and updated: the rows of the other slots end
// exactly as in a table that had no deletion, and no row of the deleted slots is left.
func TestDeleteSlotsUnderWriters(t *testing.T) {
	const slots = 32
	set := NewSlotSet(slots, 2, 9, 17, 30)
	cfg := Config{Dim: 4, Seed: 3, Shards: 8, Optimizer: Optimizer{Kind: Adagrad}}
	tab, ref := newTestTable(t, cfg), newTestTable(t, cfg)
	var doomed, kept []uint64
	for i := uint64(0); len(kept) < 20000; i++ {
		if id := i * 104729; set.Contains(id) {
			doomed = append(doomed, id)
		} else {
			kept = append(kept, id)
		}
	}
	w := make([]float32, len(doomed)*4)
	require.NoError(t, tab.Lookup(doomed, w))
	require.NoError(t, tab.Lookup(kept[:10000], make([]float32, 10000*4)))
	require.NoError(t, ref.Lookup(kept[:10000], make([]float32, 10000*4)))
	// The writers update old rows and create new ones; ref gets the same batches afterwards.
	rng := rand.New(rand.NewPCG(5, 6))
	var batches [][]uint64
	for range 200 {
		b := make([]uint64, 256)
		for i := range b {
			b[i] = kept[rng.IntN(len(kept))]
		}
		batches = append(batches, b)
	}
	g := make([]float32, 256*4)
	for i := range g {
		g[i] = float32(rng.NormFloat64())
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for step, b := range batches {
			if err := tab.Apply(b, g, uint32(step)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	assert.Equal(t, len(doomed), tab.DeleteSlots(set))
	<-done
	for step, b := range batches {
		require.NoError(t, ref.Apply(b, g, uint32(step)))
	}
	assert.Equal(t, dump(ref), dump(tab))
	for _, id := range kept {
		want, ok := ref.Row(id)
		got, ok2 := tab.Row(id)
		require.Equal(t, ok, ok2, "id %d", id)
		assert.Equal(t, want, got)
	}
	assert.Equal(t, ref.Len(), tab.Len())
}
