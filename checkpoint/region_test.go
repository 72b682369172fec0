package checkpoint

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// regionFiles lists the files of a node's region.
func regionFiles(t *testing.T, shmDir, node string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(shmDir, "job", node))
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

// requireOnlyRegionFiles checks that a region holds nothing but its lock, extents and seals.
func requireOnlyRegionFiles(t *testing.T, names []string) {
	t.Helper()
	for _, n := range names {
		_, _, extent := parseExtentName(n)
		require.True(t, n == "lock" || n == "g0.seal" || n == "g1.seal" || extent, "unexpected file %q in %v", n, names)
	}
}

// TestNewCleansUpAfterADeadProcess: a process that dies while creating an extent or writing a seal
// leaves a temporary file, or (extent files were once created under their final name) an empty
// extent no seal names. The next owner removes them and reattaches to the rest; it must not fail
// to open the region because of them. Snapshots, Reserve, a failed New and Close leave no such
// files themselves.
func TestNewCleansUpAfterADeadProcess(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t, NewMemStorage(), 16)
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(9, 10))
	fill(rng, ts, 200, 2000)
	ck, err := New(cl.cfg("ps0", tabs))
	require.NoError(t, err)
	require.NoError(t, ck.Reserve(ctx, 2<<20))
	m := cl.committer()
	for step := uint64(1); step <= 4; step++ {
		mutate(rng, ts, step, 2000)
		_, ref := snap(t, ck, step)
		_, err := m.Commit(ctx, step, []ManifestRef{ref})
		require.NoError(t, err)
	}
	want := states(ts)
	require.NoError(t, ck.Flush(ctx))
	before := regionFiles(t, cl.shmDir, "ps0")
	requireOnlyRegionFiles(t, before)
	_, err = New(cl.cfg("ps0", tabs))
	require.ErrorIs(t, err, ErrRegionLocked)
	assert.Equal(t, before, regionFiles(t, cl.shmDir, "ps0"), "a failed New changes nothing")
	require.NoError(t, ck.Close())
	requireOnlyRegionFiles(t, regionFiles(t, cl.shmDir, "ps0"))

	dir := filepath.Join(cl.shmDir, "job", "ps0")
	leftovers := map[string][]byte{
		tmpPrefix + "g0-90":   make([]byte, 4096), // an extent being created
		tmpPrefix + "g1.seal": []byte("half a seal"),
		"g1-91":               nil, // an extent cut short right after it was created
	}
	for name, data := range leftovers {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o600))
	}
	tabs2, ts2 := tables2()
	ck2 := cl.open(cl.cfg("ps0", tabs2))
	for name := range leftovers {
		assert.NoFileExists(t, filepath.Join(dir, name))
	}
	r, err := ck2.Restore(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(4), r.Step)
	assert.Equal(t, SourceShm, r.Sources["ps0"])
	assert.Equal(t, want, states(ts2))

	// New extents appear under their final names only.
	require.NoError(t, ck2.Reserve(ctx, 8<<20))
	requireOnlyRegionFiles(t, regionFiles(t, cl.shmDir, "ps0"))
	mutate(rng, ts2, 5, 2000)
	_, ref := snap(t, ck2, 5)
	_, err = m.Commit(ctx, 5, []ManifestRef{ref})
	require.NoError(t, err)
	require.NoError(t, ck2.Close())
	requireOnlyRegionFiles(t, regionFiles(t, cl.shmDir, "ps0"))
}
