package embedding

import (
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfigValidateReportsEveryProblem(t *testing.T) {
	err := Config{Dim: 0, Shards: 3, Optimizer: Optimizer{Kind: 9, Beta1: 2}, Admission: Admission{Probability: 1.5}}.Validate()
	require.ErrorIs(t, err, ErrBadConfig)
	for _, want := range []string{"Dim 0", "optimizer kind 9", "Beta1", "Probability", "Shards 3"} {
		assert.Contains(t, err.Error(), want)
	}
	_, err = New(Config{Dim: -1})
	require.ErrorIs(t, err, ErrBadConfig)
	require.NoError(t, DefaultConfig(8).Validate())
}

func TestLookupCreatesDeterministicRows(t *testing.T) {
	for _, kind := range []InitKind{InitUniform, InitNormal, InitTruncatedNormal, InitZeros} {
		a := newTestTable(t, Config{Dim: 16, Seed: 11, Init: Init{Kind: kind}, Shards: 8})
		b := newTestTable(t, Config{Dim: 16, Seed: 11, Init: Init{Kind: kind}, Shards: 2})
		c := newTestTable(t, Config{Dim: 16, Seed: 12, Init: Init{Kind: kind}})
		ids := []uint64{5, 1 << 40, 5, 99}
		wa := make([]float32, 64)
		wb := make([]float32, 64)
		wc := make([]float32, 64)
		require.NoError(t, a.Lookup(ids, wa))
		require.NoError(t, b.Lookup([]uint64{99, 5, 1 << 40, 5}, wb[:64]))
		require.NoError(t, c.Lookup(ids, wc))
		assert.Equal(t, wa[:16], wa[32:48], "same id, same row")
		assert.Equal(t, wa[:16], wb[16:32])
		assert.Equal(t, wa[48:64], wb[:16])
		if kind != InitZeros {
			assert.NotEqual(t, wa[:16], wa[48:64], "different ids differ")
			assert.NotEqual(t, wa[:16], wc[:16], "different seeds differ")
		}
		assert.Equal(t, 3, a.Len())
	}
}

func TestInitDistributions(t *testing.T) {
	const n = 4000
	stats := func(kind InitKind) (mean, std, maxAbs float64) {
		tab := newTestTable(t, Config{Dim: 25, Seed: 1, Init: Init{Kind: kind, Scale: 0.5}})
		w := make([]float32, 25)
		var s, ss float64
		for id := uint64(0); id < n; id++ {
			require.NoError(t, tab.InitialWeights(id, w))
			for _, v := range w {
				s += float64(v)
				ss += float64(v) * float64(v)
				maxAbs = math.Max(maxAbs, math.Abs(float64(v)))
			}
		}
		m := s / (n * 25)
		return m, math.Sqrt(ss/(n*25) - m*m), maxAbs
	}
	m, sd, mx := stats(InitUniform)
	assert.InDelta(t, 0, m, 0.005)
	assert.InDelta(t, 0.5/math.Sqrt(3), sd, 0.005)
	assert.LessOrEqual(t, mx, 0.5)
	m, sd, _ = stats(InitNormal)
	assert.InDelta(t, 0, m, 0.005)
	assert.InDelta(t, 0.5, sd, 0.005)
	m, sd, mx = stats(InitTruncatedNormal)
	assert.InDelta(t, 0, m, 0.005)
	assert.InDelta(t, 0.5*0.8796, sd, 0.005) // std of a normal truncated at 2 sigma
	assert.LessOrEqual(t, mx, 1.0)
}

func TestBadInputChangesNothing(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 2, Optimizer: Optimizer{Kind: SGD}})
	require.ErrorIs(t, tab.Lookup([]uint64{1}, make([]float32, 3)), ErrLength)
	require.ErrorIs(t, tab.Apply([]uint64{1, 2}, make([]float32, 2), 1), ErrLength)
	assert.Equal(t, 0, tab.Len())

	require.NoError(t, tab.Apply([]uint64{1}, []float32{1, 1}, 1))
	before, _ := tab.Row(1)
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		err := tab.Apply([]uint64{1, 2}, []float32{1, 1, 0, bad}, 2)
		require.ErrorIs(t, err, ErrNonFinite)
	}
	after, _ := tab.Row(1)
	assert.Equal(t, before, after)
	assert.Equal(t, 1, tab.Len(), "id 2 was not created by a rejected batch")
	assert.Equal(t, uint64(3), tab.Stats().RejectedBatches)
}

func TestApplySumsDuplicates(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 1, Optimizer: Optimizer{Kind: Adagrad, LearningRate: 1}, Init: Init{Kind: InitZeros}})
	require.NoError(t, tab.Apply([]uint64{3, 3, 3}, []float32{1, 1, 1}, 9))
	r, _ := tab.Row(3)
	// one step with g=3: a=9, w=-3/3
	assert.InDelta(t, -1, r.Weights[0], 1e-6)
	assert.InDelta(t, 9, r.State[0], 1e-6)
	assert.Equal(t, uint32(9), r.LastStep)
	assert.Equal(t, uint32(1), r.Freq)
}

func TestDeleteAndIndexAgainstMap(t *testing.T) {
	// Many inserts and deletes in one small shard exercise probing, wrap-around, growth and
	// backward-shift deletion; a Go map is the reference.
	tab := newTestTable(t, Config{Dim: 1, Shards: 1, Init: Init{Kind: InitZeros}, Optimizer: Optimizer{Kind: SGD, LearningRate: 1}})
	rng := rand.New(rand.NewPCG(5, 6))
	ref := map[uint64]float32{}
	for i := 0; i < 20000; i++ {
		id := uint64(rng.IntN(3000))
		switch rng.IntN(3) {
		case 0:
			assert.Equal(t, ref[id] != 0 || hasKey(ref, id), tab.Delete(id))
			delete(ref, id)
		default:
			require.NoError(t, tab.Apply([]uint64{id}, []float32{-1}, 1))
			ref[id]++
		}
	}
	require.Equal(t, len(ref), tab.Len())
	for id, v := range ref {
		r, ok := tab.Row(id)
		require.True(t, ok, "id %d", id)
		require.Equal(t, v, r.Weights[0], "id %d", id)
	}
	seen := 0
	tab.Range(func(v RowView) bool {
		seen++
		assert.Equal(t, ref[v.ID], v.Weights[0])
		return true
	})
	assert.Equal(t, len(ref), seen)
}

func hasKey(m map[uint64]float32, k uint64) bool { _, ok := m[k]; return ok }

func TestMemoryOverheadPerRow(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 600k rows")
	}
	tab := newTestTable(t, Config{Dim: 8, Optimizer: Optimizer{Kind: SGD}, Init: Init{Kind: InitZeros}})
	const n = 600_000
	ids := make([]uint64, 4096)
	w := make([]float32, len(ids)*8)
	for base := 0; base < n; base += len(ids) {
		for i := range ids {
			ids[i] = uint64(base + i)
		}
		require.NoError(t, tab.Lookup(ids, w))
	}
	over := float64(tab.MemoryBytes()-int64(tab.Len()*tab.PayloadBytesPerRow())) / float64(tab.Len())
	t.Logf("overhead %.1f bytes/row at %d rows", over, tab.Len())
	assert.LessOrEqual(t, over, 24.0)
	assert.Greater(t, over, 16.0, "the 16-byte header alone is more than this: MemoryBytes under-reports")
}

func TestConcurrentUse(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 4, Shards: 4, Eviction: Eviction{MaxRows: 500, TTL: 50}})
	tr := tab.NewTracker()
	defer tr.Close()
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			ids := make([]uint64, 64)
			buf := make([]float32, 64*4)
			for it := 0; it < 200; it++ {
				for i := range ids {
					ids[i] = uint64(rng.IntN(2000))
				}
				switch g % 3 {
				case 0:
					assert.NoError(t, tab.Lookup(ids, buf))
				case 1:
					for i := range buf {
						buf[i] = float32(rng.NormFloat64())
					}
					assert.NoError(t, tab.Apply(ids, buf, uint32(it)))
				case 2:
					raw := make([]byte, tab.RawSize(false)+10*tab.RawRowSize())
					if _, err := tab.CopyRaw(raw, false, it%10 == 0); err != nil && !errors.Is(err, io.ErrShortBuffer) {
						t.Error(err)
					}
					tab.EvictExpired(uint32(it))
					tab.Delete(ids[0])
					_ = tr.Size()
				}
			}
		}(g)
	}
	wg.Wait()
	assert.LessOrEqual(t, tab.Len(), 500)
}

func TestFirstNonFinite(t *testing.T) {
	v := make([]float32, 11)
	assert.Equal(t, -1, FirstNonFinite(v))
	for i := range v {
		for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
			clear(v)
			v[i] = bad
			assert.Equal(t, i, FirstNonFinite(v))
		}
	}
	v[3] = math.MaxFloat32
	v[4] = -math.SmallestNonzeroFloat32
	v[10] = float32(math.NaN())
	assert.Equal(t, 10, FirstNonFinite(v))
}

func TestAssign(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 2, Optimizer: Optimizer{Kind: Adagrad, InitialAccumulator: 0.5}})
	require.NoError(t, tab.Assign([]uint64{1, 2}, []float32{1, 2, 3, 4}))
	r, _ := tab.Row(2)
	assert.Equal(t, []float32{3, 4}, r.Weights)
	assert.Equal(t, []float32{0.5, 0.5}, r.State)
	assert.Equal(t, uint32(0), r.Freq)
	require.ErrorIs(t, tab.Assign([]uint64{1}, []float32{1}), ErrLength)
	require.ErrorIs(t, tab.Assign([]uint64{1}, []float32{1, float32(math.NaN())}), ErrNonFinite)
	r, _ = tab.Row(1)
	assert.Equal(t, []float32{1, 2}, r.Weights)
}

func TestReserve(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 4, Shards: 4, Optimizer: Optimizer{Kind: SGD}})
	require.NoError(t, tab.Lookup([]uint64{1, 2, 3}, make([]float32, 12)))
	before, _ := tab.Row(2)
	tab.Reserve(5000)
	grown := tab.MemoryBytes()
	assert.Greater(t, grown, int64(5000*tab.RawRowSize()), "the reserved room is counted")
	after, _ := tab.Row(2)
	assert.Equal(t, before, after, "rows survive a reserve")
	ids := make([]uint64, 5000)
	for i := range ids {
		ids[i] = uint64(i)
	}
	require.NoError(t, tab.Lookup(ids, make([]float32, len(ids)*4)))
	assert.Equal(t, 5000, tab.Len())
	assert.Equal(t, grown, tab.MemoryBytes(), "5000 rows fit in the reserved room")
}

func TestPeekCreatesNothing(t *testing.T) {
	tab := newTestTable(t, Config{Dim: 3, Seed: 4, Optimizer: Optimizer{Kind: SGD, LearningRate: 1}})
	require.NoError(t, tab.Apply([]uint64{1}, []float32{1, 1, 1}, 1))
	got := make([]float32, 6)
	require.NoError(t, tab.Peek([]uint64{1, 2}, got))
	r1, _ := tab.Row(1)
	init2 := make([]float32, 3)
	require.NoError(t, tab.InitialWeights(2, init2))
	assert.Equal(t, r1.Weights, got[:3])
	assert.Equal(t, init2, got[3:])
	assert.Equal(t, 1, tab.Len(), "peek created no row")
	require.ErrorIs(t, tab.Peek([]uint64{1}, got), ErrLength)
}

func TestSlotSet(t *testing.T) {
	s := NewSlotSet(130, 0, 64, 129, 200, -1)
	assert.Equal(t, []int{0, 64, 129}, s.Members())
	assert.Equal(t, 3, s.Len())
	s.Remove(64)
	assert.False(t, s.Has(64))
	assert.Equal(t, 130, s.Slots())
	id := uint64(99)
	assert.Equal(t, s.Has(Slot(id, 130)), s.Contains(id))
}
