package embedding

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shardCopy returns a full grouped copy of tab with its counts and key.
func shardCopy(t *testing.T, tab *Table) ([]byte, []int, []byte) {
	buf := make([]byte, tab.RawSize(false))
	n, counts, key, err := tab.CopyRawShards(buf, false)
	require.NoError(t, err)
	sum := 0
	for _, c := range counts {
		sum += c
	}
	require.Equal(t, tab.Len(), sum)
	require.Equal(t, sum*tab.RawRowSize(), n)
	return buf[:n], counts, key
}

// loadShards loads a grouped copy with every shard in its own goroutine, each in pieces of
// random whole-record sizes.
func loadShards(t *testing.T, dst *Table, buf []byte, counts []int, key []byte, seed uint64) error {
	load, end, err := dst.LoadRawShards(key, counts)
	require.NoError(t, err)
	rec := dst.RawRowSize()
	var wg sync.WaitGroup
	errs := make([]error, len(counts))
	off := 0
	for i, c := range counts {
		part := buf[min(off, len(buf)):min(off+c*rec, len(buf))]
		off += c * rec
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			for len(part) > 0 {
				m := min(len(part)/rec, 1+rng.IntN(700)) * rec
				if errs[i] = load(i, part[:m]); errs[i] != nil {
					return
				}
				part = part[m:]
			}
		}()
	}
	wg.Wait()
	if err = errors.Join(errs...); err != nil {
		_, endErr := end(false)
		require.NoError(t, endErr, "undoing a failed load")
		return err
	}
	_, err = end(true)
	return err
}

func TestLoadRawShardsBitExact(t *testing.T) {
	src := trained(t, 5000, 3)
	for i := uint64(0); i < 300; i++ { // holes: the copy skips free rows
		src.Delete(i * 7919 * 3)
	}
	buf, counts, key := shardCopy(t, src)
	for _, reserve := range []bool{false, true} {
		dst := newTestTable(t, src.Config())
		if reserve {
			dst.Reserve(src.Len())
		}
		require.NoError(t, loadShards(t, dst, buf, counts, key, 1))
		assert.Equal(t, src.Len(), dst.Len())
		assert.Equal(t, dump(src), dump(dst))
		// The index works: reads find the rows, a new id gets a row, a deletion finds its row.
		ids := []uint64{7919, 2 * 7919, 4000 * 7919}
		want, got := make([]float32, 3*6), make([]float32, 3*6)
		require.NoError(t, src.Peek(ids, want))
		require.NoError(t, dst.Peek(ids, got))
		assert.Equal(t, want, got)
		require.NoError(t, dst.Lookup([]uint64{1 << 50}, got[:6]))
		assert.Equal(t, src.Len()+1, dst.Len())
		assert.True(t, dst.Delete(7919))
		_, ok := dst.Row(7919)
		assert.False(t, ok)
		assert.Equal(t, src.Len(), dst.Len())
	}
}

func TestLoadRawShardsRefusesWhatItCannotLoad(t *testing.T) {
	src := trained(t, 500, 4)
	buf, counts, key := shardCopy(t, src)
	// Another placement: a different seed or shard count.
	for _, cfg := range []Config{{Dim: 6, Seed: 10, Shards: 8, Optimizer: Optimizer{Kind: Adam}},
		{Dim: 6, Seed: 9, Shards: 16, Optimizer: Optimizer{Kind: Adam}}} {
		_, _, err := newTestTable(t, cfg).LoadRawShards(key, counts)
		assert.ErrorIs(t, err, errors.ErrUnsupported)
	}
	// A table that already has rows.
	dst := newTestTable(t, src.Config())
	_, err := dst.LoadRaw(buf[:dst.RawRowSize()], nil)
	require.NoError(t, err)
	_, _, err = dst.LoadRawShards(key, counts)
	assert.ErrorIs(t, err, errors.ErrUnsupported)
	assert.Equal(t, 1, dst.Len())
}

func TestLoadRawShardsCorruptLeavesTheTableEmpty(t *testing.T) {
	src := trained(t, 3000, 5)
	buf, counts, key := shardCopy(t, src)
	rec := src.RawRowSize()
	// Shard 0's first record moved to shard 1's place: the id is of another shard.
	wrongShard := append([]byte(nil), buf...)
	copy(wrongShard[counts[0]*rec:], buf[:rec])
	// A repeated id inside shard 0.
	twice := append([]byte(nil), buf...)
	copy(twice[rec:2*rec], buf[:rec])
	// A deletion record in a full copy.
	deletion := append([]byte(nil), buf...)
	binary.LittleEndian.PutUint32(deletion[5*rec+8:], freeMark)
	// One record fewer than counted.
	short := buf[:len(buf)-rec]
	for name, c := range map[string][]byte{"wrong shard": wrongShard, "twice": twice, "deletion": deletion, "short": short} {
		dst := newTestTable(t, src.Config())
		dst.Reserve(src.Len())
		tr := dst.NewTracker()
		err := loadShards(t, dst, c, counts, key, 2)
		require.ErrorIs(t, err, ErrCorrupt, name)
		assert.Equal(t, 0, dst.Len(), name)
		assert.Empty(t, dump(dst), name)
		n, err := tr.CopyRaw(make([]byte, 1<<20), nil, false)
		require.NoError(t, err)
		assert.Zero(t, n, "%s: an aborted load changes nothing a tracker sees", name)
		// The table is usable as an empty one: the copy loads normally afterwards.
		_, err = dst.LoadRaw(buf, nil)
		require.NoError(t, err, name)
		assert.Equal(t, dump(src), dump(dst), name)
	}
}
