package checkpoint

import (
	"context"
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
