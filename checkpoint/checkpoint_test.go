package checkpoint

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRoundTripFullAndDeltas(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t, NewMemStorage(), 64)
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(1, 2))
	fill(rng, ts, 400, 2000)
	ck := cl.open(cl.cfg("ps0", tabs))
	m := cl.committer()

	want := map[uint64][]map[uint64]string{}
	var fulls []bool
	for step := uint64(1); step <= 7; step++ {
		mutate(rng, ts, step, 2000)
		info, ref := snap(t, ck, step, SnapshotBlob("dense", []byte{byte(step), 1, 2, 3}))
		fulls = append(fulls, info.Full)
		want[step] = states(ts)
		_, err := m.Commit(ctx, step, []ManifestRef{ref}, Blob{Name: "dispatcher", Data: []byte{byte(step)}})
		require.NoError(t, err)
	}
	assert.Equal(t, []bool{true, false, false, true, false, false, true}, fulls)

	for step := uint64(1); step <= 7; step++ {
		got, r, err := cl.restoreFresh(step)
		require.NoError(t, err, "step %d", step)
		assert.Equal(t, want[step], got, "step %d", step)
		assert.Equal(t, SourceStorage, r.Sources["ps0"])
		require.Len(t, r.Blobs, 1)
		assert.Equal(t, NodeBlob{"ps0", Blob{"dense", []byte{byte(step), 1, 2, 3}}}, r.Blobs[0])
		blob, err := m.Blob(ctx, step, "dispatcher")
		require.NoError(t, err)
		assert.Equal(t, []byte{byte(step)}, blob)
	}

	// A restarted process on the same host reattaches to the region and restores from it.
	require.NoError(t, ck.Close())
	tabs2, ts2 := tables2()
	ck2 := cl.open(cl.cfg("ps0", tabs2))
	r, err := ck2.Restore(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(7), r.Step)
	assert.Equal(t, SourceShm, r.Sources["ps0"])
	assert.Equal(t, want[7], states(ts2))

	// Training goes on from the restored state: the next snapshot is full and restorable.
	mutate(rng, ts2, 8, 2000)
	info, ref := snap(t, ck2, 8)
	assert.True(t, info.Full)
	_, err = m.Commit(ctx, 8, []ManifestRef{ref})
	require.NoError(t, err)
	got, _, err := cl.restoreFresh(0)
	require.NoError(t, err)
	assert.Equal(t, states(ts2), got)
}

// A table that gains rows between the bound a snapshot placed its room by and its copy (a
// snapshot outside a barrier) is refused there and copied again on its own, while the other
// tables are copied at once; full snapshots and deltas restore exactly.
func TestSnapshotTableOutgrowsItsRoom(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t, NewMemStorage(), 64)
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(3, 4))
	fill(rng, ts, 400, 1<<40)
	a := ts[0]
	var calls int
	grow := 0
	a.copyHook = func() {
		calls++
		if grow > 0 {
			for range grow {
				a.put(rng.Uint64N(1<<40), 9)
			}
			grow = 0
		}
	}
	ck := cl.open(cl.cfg("ps0", tabs))
	m := cl.committer()
	want := map[uint64][]map[uint64]string{}
	for step := uint64(1); step <= 4; step++ {
		mutate(rng, ts, step, 1<<40)
		grow, calls = 3*a.len(), 0 // far past a sixteenth and 64 rows of slack
		info, ref := snap(t, ck, step)
		assert.Equal(t, step == 1 || step == 4, info.Full, "step %d", step)
		assert.Equal(t, 2, calls, "step %d: refused in its room, then copied alone", step)
		want[step] = states(ts)
		_, err := m.Commit(ctx, step, []ManifestRef{ref})
		require.NoError(t, err)
	}
	for step := uint64(1); step <= 4; step++ {
		got, _, err := cl.restoreFresh(step)
		require.NoError(t, err, "step %d", step)
		assert.Equal(t, want[step], got, "step %d", step)
	}
}

// fillCompressible writes rows 1..n whose payloads compress well.
func fillCompressible(t *fakeTable, n int, version uint64) {
	for id := uint64(1); id <= uint64(n); id++ {
		r := make([]byte, t.rowSize)
		for o := 12; o < t.rowSize; o++ {
			r[o] = byte(version) ^ byte(o%4)
		}
		copy(r, []byte{byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24), 0, 0, 0, 0})
		t.mu.Lock()
		t.rows[id] = r
		t.changed[id] = true
		t.mu.Unlock()
	}
}

func TestCodecsEndToEnd(t *testing.T) {
	ctx := context.Background()
	for _, codec := range []Codec{CodecS2, CodecZstd, CodecNone} {
		for _, chunkBytes := range []int{4 << 10, 2 << 20} { // small chunks, and chunks large enough to sample
			t.Run(fmt.Sprintf("%v/%d", codec, chunkBytes), func(t *testing.T) {
				cl := newCluster(t, NewMemStorage(), 64)
				tabs, ts := tables2()
				fillCompressible(ts[0], 20000, 1)
				fillCompressible(ts[1], 20000, 2)
				cfg := cl.cfg("ps0", tabs)
				cfg.Codec, cfg.ChunkBytes = codec, chunkBytes
				ck := cl.open(cfg)
				_, ref := snap(t, ck, 1, SnapshotBlob("dense", make([]byte, 100000)))
				_, err := cl.committer().Commit(ctx, 1, []ManifestRef{ref})
				require.NoError(t, err)
				st := ck.Stats()
				if codec == CodecNone {
					assert.Greater(t, st.PersistedStored, st.PersistedRaw)
				} else {
					assert.Less(t, st.PersistedStored, st.PersistedRaw/3, "compressed")
				}
				got, r, err := cl.restoreFresh(0, RestoreBlobs(func(node, name string) bool { return name == "dense" }))
				require.NoError(t, err)
				assert.Equal(t, states(ts), got)
				require.Len(t, r.Blobs, 1)
				assert.Len(t, r.Blobs[0].Data, 100000)
				_, r, err = cl.restoreFresh(0, RestoreBlobs(func(node, name string) bool { return false }))
				require.NoError(t, err)
				assert.Empty(t, r.Blobs)
			})
		}
	}
}
