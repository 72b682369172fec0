package embedding

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSlabsAreFreedWithTheirTable fills a table, drops it, and waits for its off-heap slabs to be
// returned to the system.
func TestSlabsAreFreedWithTheirTable(t *testing.T) {
	if !offHeap {
		t.Skip("slabs are on Go's heap in this build (race detector or platform)")
	}
	a := func() *arena {
		tab := newTestTable(t, Config{Dim: 8, Shards: 4})
		ids := make([]uint64, 5000)
		for i := range ids {
			ids[i] = uint64(i)
		}
		require.NoError(t, tab.Lookup(ids, make([]float32, len(ids)*8)))
		tab.Reserve(20000)
		a := tab.shards[0].arena
		a.mu.Lock()
		n := len(a.regions)
		a.mu.Unlock()
		require.Positive(t, n)
		return a
	}()
	for i := 0; i < 100; i++ {
		runtime.GC()
		a.mu.Lock()
		n := len(a.regions)
		a.mu.Unlock()
		if n == 0 {
			return
		}
		runtime.Gosched()
	}
	assert.Fail(t, "the slabs of an unreachable table were not freed")
}

func TestChunkGrowthFreesTheOldSlab(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 2, Shards: 1})
	for id := uint64(0); id < 2000; id++ { // the last chunk grows 8, 16, ... 512 rows, then new chunks
		require.NoError(t, tab.Lookup([]uint64{id}, make([]float32, 2)))
	}
	s := &tab.shards[0]
	if offHeap {
		s.arena.mu.Lock()
		assert.Len(t, s.arena.regions, len(s.words), "exactly the live chunks are mapped")
		s.arena.mu.Unlock()
	}
	for id := uint64(0); id < 2000; id++ {
		_, ok := tab.Row(id)
		require.True(t, ok)
	}
}
