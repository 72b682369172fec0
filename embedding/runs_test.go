package embedding

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestForRunsMatchesBitByBit checks forRuns against a scan of every bit: bit sets of every
// density, words all set or all clear, runs across words, limits inside and beyond the words.
func TestForRunsMatchesBitByBit(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for trial := range 2000 {
		b := make([]uint64, rng.IntN(6))
		for i := range b {
			switch rng.IntN(4) {
			case 0:
				b[i] = ^uint64(0)
			case 1:
				b[i] = 0
			case 2:
				b[i] = rng.Uint64() & rng.Uint64() & rng.Uint64() // sparse
			default:
				b[i] = rng.Uint64() | rng.Uint64() // dense
			}
		}
		limit := uint32(rng.IntN(len(b)*64 + 80))
		var want [][2]uint32
		open := false
		for r := uint32(0); r < limit && r < uint32(len(b))*64; r++ {
			set := b[r/64]&(1<<(r%64)) != 0
			switch {
			case set && !open:
				want = append(want, [2]uint32{r, r + 1})
				open = true
			case set:
				want[len(want)-1][1] = r + 1
			default:
				open = false
			}
		}
		var got [][2]uint32
		forRuns(b, limit, func(lo, hi uint32) { got = append(got, [2]uint32{lo, hi}) })
		require.Equal(t, want, got, "trial %d: bits %x limit %d", trial, b, limit)
	}
}

// TestChangedCopyOverRuns checks the changed rows' copies, which copy runs of consecutive rows at
// once, against the rows themselves: one shard of several chunks, runs of changed rows across
// chunk boundaries, changed rows deleted since (free rows inside runs) and rows reused.
func TestChangedCopyOverRuns(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 3, Seed: 5, Shards: 1, Optimizer: Optimizer{Kind: Adagrad}})
	const n = 3 * chunkRows
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(i)*104729 + 1
	}
	require.NoError(t, tab.Lookup(ids, make([]float32, 3*n)))
	base := make([]byte, tab.RawSize(false))
	_, err := tab.CopyRaw(base, false, true)
	require.NoError(t, err)

	rng := rand.New(rand.NewPCG(3, 9))
	var changed []uint64
	for lo := 0; lo < n; {
		k := 1 + rng.IntN(300)
		if rng.IntN(2) == 0 {
			changed = append(changed, ids[lo:min(lo+k, n)]...)
		}
		lo += k
	}
	g := make([]float32, 3*len(changed))
	for i := range g {
		g[i] = float32(rng.NormFloat64())
	}
	require.NoError(t, tab.Apply(changed, g, 7))
	deleted := map[uint64]bool{}
	for _, id := range changed {
		if rng.IntN(9) == 0 {
			require.True(t, tab.Delete(id))
			deleted[id] = true
		}
	}
	for _, id := range ids {
		if !deleted[id] && !slices.Contains(changed, id) && rng.IntN(40) == 0 {
			require.True(t, tab.Delete(id)) // unchanged rows deleted: holes outside the runs
			deleted[id] = true
		}
	}
	require.NotEmpty(t, deleted)

	rec := tab.RawRowSize()
	check := func(name string, buf []byte) {
		t.Helper()
		require.Zero(t, len(buf)%rec, name)
		var dels, rows []uint64
		for o := 0; o < len(buf); o += rec {
			r := buf[o : o+rec]
			id := binary.LittleEndian.Uint64(r)
			if binary.LittleEndian.Uint32(r[8:]) == freeMark {
				require.Empty(t, rows, "%s: deletion record of %d after a row", name, id)
				dels = append(dels, id)
				continue
			}
			row, ok := tab.Row(id)
			require.True(t, ok, "%s: row %d copied but not in the table", name, id)
			want := make([]byte, rec)
			binary.LittleEndian.PutUint64(want, id)
			binary.LittleEndian.PutUint32(want[8:], row.LastStep)
			binary.LittleEndian.PutUint32(want[12:], row.Freq)
			for k, w := range append(row.Weights, row.State...) {
				binary.LittleEndian.PutUint32(want[16+4*k:], math.Float32bits(w))
			}
			require.Equal(t, want, r, "%s: record of row %d", name, id)
			rows = append(rows, id)
		}
		var wantRows, wantDels []uint64
		for _, id := range changed {
			if !deleted[id] {
				wantRows = append(wantRows, id)
			}
		}
		for id := range deleted {
			wantDels = append(wantDels, id)
		}
		slices.Sort(rows)
		slices.Sort(dels)
		slices.Sort(wantRows)
		slices.Sort(wantDels)
		assert.Equal(t, wantRows, rows, "%s: rows", name)
		assert.Equal(t, wantDels, dels, "%s: deletion records", name)
	}
	buf := make([]byte, tab.RawSize(true))
	k, err := tab.CopyRaw(buf, true, false)
	require.NoError(t, err)
	check("CopyRaw", buf[:k])
	buf = make([]byte, tab.RawSize(true))
	k, err = tab.CopyRawDelta(buf, func(uint64) bool { return true }, nil, false)
	require.NoError(t, err)
	check("CopyRawDelta", buf[:k])

	// The full copy skips the holes.
	full := make([]byte, tab.RawSize(false))
	k, err = tab.CopyRaw(full, false, false)
	require.NoError(t, err)
	require.Equal(t, (n-len(deleted))*rec, k)
}
