package embedding

import (
	"encoding/binary"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// records parses raw records into the rows (by id, the last record of each) and the ids of
// deletion records, failing on an id copied twice as a row.
func records(t *testing.T, b []byte, rec int) (rows map[uint64]string, dels map[uint64]bool) {
	t.Helper()
	require.Zero(t, len(b)%rec)
	rows, dels = map[uint64]string{}, map[uint64]bool{}
	for o := 0; o < len(b); o += rec {
		id := binary.LittleEndian.Uint64(b[o:])
		if binary.LittleEndian.Uint32(b[o+8:]) == freeMark {
			dels[id] = true
			continue
		}
		_, dup := rows[id]
		require.False(t, dup, "row %d copied twice", id)
		rows[id] = string(b[o : o+rec])
	}
	return rows, dels
}

// rawRows returns every live row of tab as its raw record, by id.
func rawRows(t *testing.T, tab *Table) map[uint64]string {
	t.Helper()
	b := make([]byte, tab.RawSize(false))
	n, err := tab.CopyRaw(b, false, false)
	require.NoError(t, err)
	rows, dels := records(t, b[:n], tab.RawRowSize())
	require.Empty(t, dels)
	return rows
}

// CopyRawDelta copies every live row of the whole slots and the changes of the others that
// changed accepts, in exact room; a short buffer says how much it needs and changes nothing.
func TestCopyRawDelta(t *testing.T) {
	const S = 16
	tab := trained(t, 3000, 3)
	_, err := tab.CopyRawDelta(nil, nil, nil, true)
	require.ErrorIs(t, err, ErrNoBase)
	_, err = tab.CopyRaw(make([]byte, tab.RawSize(false)), false, true)
	require.NoError(t, err)

	owned := NewSlotSet(S, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
	gained := NewSlotSet(S, 8, 9)
	rng := rand.New(rand.NewPCG(5, 5))
	changed := map[uint64]bool{}
	deleted := map[uint64]bool{}
	ids := make([]uint64, 0, 300)
	for range 300 {
		ids = append(ids, rng.Uint64N(3000)*7919)
	}
	g := make([]float32, len(ids)*6)
	for i := range g {
		g[i] = float32(rng.NormFloat64())
	}
	require.NoError(t, tab.Apply(ids, g, 9))
	for _, id := range ids {
		changed[id] = true
	}
	for range 100 {
		id := rng.Uint64N(3000) * 7919
		if tab.Delete(id) {
			deleted[id] = true
		}
	}
	// One id of an owned slot, not a gained one, removed and created again: its deletion record
	// comes before its row.
	again := ids[slices.IndexFunc(ids, func(id uint64) bool { return owned.Contains(id) && !gained.Contains(id) })]
	tab.Delete(again)
	deleted[again] = true
	require.NoError(t, tab.Apply([]uint64{again}, g[:6], 10))

	live := rawRows(t, tab)
	wantRows := map[uint64]string{}
	for id, r := range live {
		if gained.Contains(id) || (changed[id] && owned.Contains(id)) {
			wantRows[id] = r
		}
	}
	wantDels := map[uint64]bool{}
	for id := range deleted {
		if owned.Contains(id) && !gained.Contains(id) {
			wantDels[id] = true
		}
	}
	require.NotEmpty(t, wantDels)

	// Without whole slots the bound counts every changed row, whatever its slot.
	bound, err := tab.CopyRawDelta(nil, owned.Contains, nil, false)
	require.ErrorIs(t, err, io.ErrShortBuffer)
	changedOnly := make([]byte, bound)
	n, err := tab.CopyRawDelta(changedOnly, owned.Contains, nil, false)
	require.NoError(t, err)
	rows, dels := records(t, changedOnly[:n], tab.RawRowSize())
	for id, r := range live {
		if changed[id] && owned.Contains(id) {
			assert.Equal(t, r, rows[id])
			delete(rows, id)
		}
	}
	assert.Empty(t, rows)
	assert.Len(t, dels, len(deleted)-func() int {
		k := 0
		for id := range deleted {
			if !owned.Contains(id) {
				k++
			}
		}
		return k
	}())
	require.NotZero(t, tab.RawSize(true), "without newBase the change set stays")

	need, err := tab.CopyRawDelta(nil, owned.Contains, gained.Contains, true)
	require.ErrorIs(t, err, io.ErrShortBuffer)
	require.Equal(t, (len(wantRows)+len(wantDels))*tab.RawRowSize(), need)
	dst := make([]byte, need)
	n, err = tab.CopyRawDelta(dst, owned.Contains, gained.Contains, true)
	require.NoError(t, err, "the short copy changed nothing: the same copy fits exactly")
	require.Equal(t, need, n)
	rows, dels = records(t, dst[:n], tab.RawRowSize())
	assert.Equal(t, wantRows, rows)
	assert.Equal(t, wantDels, dels)
	require.True(t, dels[again])
	rec := tab.RawRowSize()
	first := map[bool]int{}
	for o := 0; o < n; o += rec {
		if binary.LittleEndian.Uint64(dst[o:]) == again {
			del := binary.LittleEndian.Uint32(dst[o+8:]) == freeMark
			if _, seen := first[del]; !seen {
				first[del] = o
			}
		}
	}
	require.Len(t, first, 2, "id %d has a deletion record and a row", again)
	assert.Less(t, first[true], first[false], "the deletion record comes before the row, which a load would otherwise delete")
	assert.Zero(t, tab.RawSize(true), "newBase clears every change, also of slots neither filter accepts")

	// CopyRawSlots needs room for the rows it copies only.
	need, err = tab.CopyRawSlots(nil, gained.Contains)
	require.ErrorIs(t, err, io.ErrShortBuffer)
	dst = make([]byte, need)
	n, err = tab.CopyRawSlots(dst, gained.Contains)
	require.NoError(t, err)
	rows, dels = records(t, dst[:n], tab.RawRowSize())
	assert.Empty(t, dels)
	for id, r := range live {
		if gained.Contains(id) {
			assert.Equal(t, r, rows[id])
			delete(rows, id)
		}
	}
	assert.Empty(t, rows)
}

// A reader that keeps a row of a copy only while its slot stays in the set, and applies each
// CopyRawDelta (changes of the set's slots, whole rows of the slots new to it), holds exactly
// the table's rows of the current set after every copy, while writers change the table.
func TestCopyRawDeltaFollowsChangingSlots(t *testing.T) {
	const S = 32
	cfg := Config{Dim: 4, Seed: 2, Shards: 4, Optimizer: Optimizer{Kind: Adagrad}}
	src := newTestTable(t, cfg)
	reader := newTestTable(t, cfg)
	rng := rand.New(rand.NewPCG(8, 1))
	write := func(rng *rand.Rand, step uint32) {
		ids := make([]uint64, 50)
		for i := range ids {
			ids[i] = rng.Uint64N(4000)
		}
		g := make([]float32, len(ids)*4)
		for i := range g {
			g[i] = float32(rng.NormFloat64())
		}
		assert.NoError(t, src.Apply(ids, g, step)) // assert: writers run on other goroutines too
		for range 10 {
			src.Delete(rng.Uint64N(4000))
		}
	}
	for step := range uint32(20) {
		write(rng, step)
	}
	set := func(rng *rand.Rand) *SlotSet {
		s := NewSlotSet(S)
		for i := range S {
			if rng.IntN(3) > 0 {
				s.Add(i)
			}
		}
		return s
	}
	owned := set(rng)
	buf := make([]byte, src.RawSize(false))
	n, err := src.CopyRaw(buf, false, true)
	require.NoError(t, err)
	_, err = reader.LoadRaw(buf[:n], owned.Contains)
	require.NoError(t, err)
	for round := range 12 {
		// Writers run while the copy is taken: each row is copied consistently, and what the
		// copy misses is in the next one.
		var wg sync.WaitGroup
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(round), uint64(w)))
				for k := range 5 {
					write(r, uint32(100+round*10+k))
				}
			}()
		}
		prev := owned
		owned = set(rng)
		gained := NewSlotSet(S)
		for i := range S {
			if owned.Has(i) && !prev.Has(i) {
				gained.Add(i)
			}
		}
		// The reader drops the rows of slots that left the set.
		lost := NewSlotSet(S)
		for i := range S {
			if !owned.Has(i) {
				lost.Add(i)
			}
		}
		reader.DeleteSlots(lost)
		var dst []byte
		for {
			n, err = src.CopyRawDelta(dst, owned.Contains, gained.Contains, true)
			if err == io.ErrShortBuffer {
				dst = make([]byte, n+n/4+1024)
				continue
			}
			require.NoError(t, err)
			break
		}
		_, err = reader.LoadRaw(dst[:n], nil)
		require.NoError(t, err)
		wg.Wait()
		// The writers' last changes go into one more copy, with the set unchanged.
		for {
			n, err = src.CopyRawDelta(dst, owned.Contains, nil, true)
			if err == io.ErrShortBuffer {
				dst = make([]byte, n+1024)
				continue
			}
			require.NoError(t, err)
			break
		}
		_, err = reader.LoadRaw(dst[:n], nil)
		require.NoError(t, err)
		want := map[uint64]string{}
		for id, r := range rawRows(t, src) {
			if owned.Contains(id) {
				want[id] = r
			}
		}
		require.Equal(t, want, rawRows(t, reader), "round %d", round)
	}
}
