package embedding

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAdmitCount(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 3, Seed: 2, Admission: Admission{Policy: AdmitCount, MinCount: 3, SketchWidth: 1024}})
	init := make([]float32, 3)
	require.NoError(t, tab.InitialWeights(77, init))
	w := make([]float32, 3)
	for i := 0; i < 2; i++ {
		require.NoError(t, tab.Lookup([]uint64{77}, w))
		assert.Equal(t, init, w, "unadmitted ids read their initial value")
		assert.Equal(t, 0, tab.Len(), "and are not stored")
		require.NoError(t, tab.Apply([]uint64{77}, []float32{1, 1, 1}, 1))
		assert.Equal(t, 0, tab.Len(), "gradients of unadmitted ids are dropped")
	}
	assert.Equal(t, uint64(2), tab.Stats().DroppedGrads)
	require.NoError(t, tab.Lookup([]uint64{77}, w)) // third sighting admits
	assert.Equal(t, 1, tab.Len())
	require.NoError(t, tab.Apply([]uint64{77}, []float32{1, 1, 1}, 2))
	r, _ := tab.Row(77)
	assert.NotEqual(t, init, r.Weights)

	// After eviction the id has been seen often enough to come straight back, with its initial value.
	require.True(t, tab.Delete(77))
	require.NoError(t, tab.Lookup([]uint64{77}, w))
	assert.Equal(t, init, w)
	assert.Equal(t, 1, tab.Len())
}

func TestAdmitProbability(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 1, Admission: Admission{Policy: AdmitProbability, Probability: 0.25}})
	ids := make([]uint64, 20000)
	for i := range ids {
		ids[i] = uint64(i)
	}
	require.NoError(t, tab.Lookup(ids, make([]float32, len(ids))))
	frac := float64(tab.Len()) / float64(len(ids))
	assert.InDelta(t, 0.25, frac, 0.02)
	before := tab.Len()
	require.NoError(t, tab.Apply(ids, make([]float32, len(ids)), 1))
	assert.Equal(t, before, tab.Len(), "Apply admits nothing under AdmitProbability")
}

func TestEvictTTL(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 2, Shards: 2, Eviction: Eviction{TTL: 10}, Init: Init{Kind: InitZeros}})
	g := []float32{1, 1}
	require.NoError(t, tab.Apply([]uint64{1}, g, 5))
	require.NoError(t, tab.Apply([]uint64{2}, g, 12))
	require.NoError(t, tab.Apply([]uint64{3}, g, 20))
	assert.Equal(t, 0, tab.EvictExpired(15), "5 is exactly 10 steps old: kept")
	assert.Equal(t, 1, tab.EvictExpired(16))
	_, ok := tab.Row(1)
	assert.False(t, ok)
	assert.Equal(t, 1, tab.EvictExpired(30), "12 expires at 23; 20 is kept")
	assert.Equal(t, 1, tab.Len())
	assert.Equal(t, uint64(2), tab.Stats().Expired)
	// Evicted ids come back with their initial value.
	w := make([]float32, 2)
	require.NoError(t, tab.Lookup([]uint64{1}, w))
	assert.Equal(t, []float32{0, 0}, w)
}

func TestEvictCapLFUAndLRU(t *testing.T) {
	for _, pol := range []EvictionPolicy{LFU, LRU} {
		tab := newTestTable(t, Config{Dim: 1, Shards: 1, Eviction: Eviction{MaxRows: 4, Policy: pol, Sample: 16}})
		g := []float32{0.1}
		// id 1: updated 5 times long ago; ids 2,3,4: once, recently (3 most recent)
		for s := uint32(1); s <= 5; s++ {
			require.NoError(t, tab.Apply([]uint64{1}, g, s))
		}
		require.NoError(t, tab.Apply([]uint64{2}, g, 10))
		require.NoError(t, tab.Apply([]uint64{4}, g, 11))
		require.NoError(t, tab.Apply([]uint64{3}, g, 12))
		require.Equal(t, 4, tab.Len())
		require.NoError(t, tab.Apply([]uint64{5}, g, 13))
		assert.Equal(t, 4, tab.Len())
		assert.Equal(t, uint64(1), tab.Stats().Evicted)
		_, has1 := tab.Row(1)
		_, has2 := tab.Row(2)
		if pol == LFU {
			assert.True(t, has1, "LFU keeps the frequent row")
			assert.False(t, has2, "LFU evicts the least frequent, oldest on ties")
		} else {
			assert.False(t, has1, "LRU evicts the row untouched longest")
			assert.True(t, has2)
		}
	}
}

func TestEvictCapSampledKeepsHotRows(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 1, Shards: 4, Eviction: Eviction{MaxRows: 1000, Policy: LFU}})
	g := make([]float32, 1)
	hot := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	for step := uint32(0); step < 3000; step++ {
		require.NoError(t, tab.Apply(hot, make([]float32, len(hot)), step))
		require.NoError(t, tab.Apply([]uint64{1000 + uint64(step)}, g, step)) // a stream of cold ids
	}
	assert.LessOrEqual(t, tab.Len(), 1000)
	for _, id := range hot {
		_, ok := tab.Row(id)
		assert.True(t, ok, "hot id %d survived", id)
	}
}

func TestRowsMadeByLookupCarryTheLatestStep(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 2, Admission: Admission{Policy: AdmitProbability, Probability: 1}, Eviction: Eviction{TTL: 100}})
	require.NoError(t, tab.Apply([]uint64{1}, []float32{0, 0}, 1000))
	require.NoError(t, tab.Lookup([]uint64{2}, make([]float32, 2)))
	assert.Equal(t, 0, tab.EvictExpired(1000), "a row admitted this step does not expire before its first push")
	r, ok := tab.Row(2)
	require.True(t, ok)
	assert.Equal(t, uint32(1000), r.LastStep)
}

func TestFTRLRowsStartAtZero(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 3, Optimizer: Optimizer{Kind: FTRL}})
	w := make([]float32, 3)
	require.NoError(t, tab.Lookup([]uint64{9}, w))
	assert.Equal(t, []float32{0, 0, 0}, w)
	other := newTestTable(t, Config{Dim: 3})
	require.NoError(t, other.Lookup([]uint64{9}, w))
	assert.NotEqual(t, []float32{0, 0, 0}, w, "other optimizers default to uniform")
}
