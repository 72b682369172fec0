package checkpoint

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fourSteps commits steps 1..4 of one node (full, delta, delta, full) and returns the states and refs.
func fourSteps(t *testing.T, cl *cluster) (map[uint64][]map[uint64]string, *Checkpointer, []*fakeTable) {
	ctx := context.Background()
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(3, 4))
	fill(rng, ts, 300, 3000)
	ck := cl.open(cl.cfg("ps0", tabs))
	m := cl.committer()
	want := map[uint64][]map[uint64]string{}
	for step := uint64(1); step <= 4; step++ {
		mutate(rng, ts, step, 3000)
		_, ref := snap(t, ck, step)
		want[step] = states(ts)
		_, err := m.Commit(ctx, step, []ManifestRef{ref})
		require.NoError(t, err)
	}
	return want, ck, ts
}

// objects returns the chunk objects of step's persist of node ps0.
func objects(t *testing.T, st Storage, step uint64, suffix string) []string {
	names, err := st.List(context.Background(), "job/data/"+stepName(step)+"/ps0/")
	require.NoError(t, err)
	var out []string
	for _, n := range names {
		if strings.HasSuffix(n, suffix) {
			out = append(out, n)
		}
	}
	require.NotEmpty(t, out)
	return out
}

func TestCorruptCheckpointFallsBackToPreviousCommit(t *testing.T) {
	flip := func(b []byte) []byte { b[len(b)/2] ^= 0x40; return b }
	cases := []struct {
		name   string
		damage func(t *testing.T, st *MemStorage)
		want   uint64 // step restored; 0 means no checkpoint
	}{
		{"one byte of a chunk", func(t *testing.T, st *MemStorage) {
			require.NoError(t, st.Update(objects(t, st, 4, "-p0")[1], flip))
		}, 3},
		{"truncated chunk", func(t *testing.T, st *MemStorage) {
			require.NoError(t, st.Update(objects(t, st, 4, "-p0")[0], func(b []byte) []byte { return b[:len(b)-5] }))
		}, 3},
		{"missing chunk", func(t *testing.T, st *MemStorage) {
			require.NoError(t, st.Delete(context.Background(), objects(t, st, 4, "-p0")[2]))
		}, 3},
		{"manifest", func(t *testing.T, st *MemStorage) {
			require.NoError(t, st.Update(objects(t, st, 4, "/manifest")[0], flip))
		}, 3},
		{"commit record", func(t *testing.T, st *MemStorage) {
			require.NoError(t, st.Update(commitName("job", 4), flip))
		}, 3},
		{"delta the newest chain needs", func(t *testing.T, st *MemStorage) {
			require.NoError(t, st.Update(objects(t, st, 4, "-p0")[0], flip))
			require.NoError(t, st.Update(objects(t, st, 2, "-p0")[0], flip))
		}, 1},
		{"base of every chain", func(t *testing.T, st *MemStorage) {
			require.NoError(t, st.Update(objects(t, st, 4, "-p0")[0], flip))
			require.NoError(t, st.Update(objects(t, st, 1, "-p0")[0], flip))
		}, 0},
		{"uncommitted newer step", func(t *testing.T, st *MemStorage) {}, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := NewMemStorage()
			cl := newCluster(t, st, 64)
			want, ck, ts := fourSteps(t, cl)
			mutate(rand.New(rand.NewPCG(9, 9)), ts, 5, 3000)
			snap(t, ck, 5) // persisted, never committed
			tc.damage(t, st)
			got, r, err := cl.restoreFresh(0)
			if tc.want == 0 {
				require.ErrorIs(t, err, ErrNoCheckpoint)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, r.Step)
			assert.Equal(t, want[tc.want], got)
			if tc.want != 4 {
				_, _, err := cl.restoreFresh(4)
				assert.True(t, skippable(err), "Load(4): %v", err)
			}
		})
	}
}

func TestCorruptSharedMemoryFallsBackToStorage(t *testing.T) {
	st := NewMemStorage()
	cl := newCluster(t, st, 64)
	want, ck, _ := fourSteps(t, cl)
	require.NoError(t, ck.Close())
	// Damage one byte of the generation holding step 4 (a full snapshot) in place.
	dir := filepath.Join(cl.shmDir, "job", "ps0")
	seal, err := os.ReadFile(sealPath(dir, 1))
	require.NoError(t, err)
	sf, err := decodeSeal(seal)
	require.NoError(t, err)
	require.Equal(t, uint64(4), sf.Segments[0].Step)
	tb := sf.Segments[0].Tables[0]
	f, err := os.OpenFile(filepath.Join(dir, sf.Extents[tb.Extent].Name), os.O_RDWR, 0)
	require.NoError(t, err)
	b := make([]byte, 1)
	_, err = f.ReadAt(b, int64(tb.Off)+100)
	require.NoError(t, err)
	b[0] ^= 1
	_, err = f.WriteAt(b, int64(tb.Off)+100)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	tabs, ts := tables2()
	ck2 := cl.open(cl.cfg("ps0", tabs))
	r, err := ck2.Restore(context.Background())
	require.NoError(t, err)
	assert.Equal(t, uint64(4), r.Step)
	assert.Equal(t, SourceStorage, r.Sources["ps0"])
	assert.Equal(t, want[4], states(ts))
}

// A commit whose manifest a later release wrote, in a format version this one does not read,
// stops a restore with ErrUnsupportedVersion instead of being skipped for an older commit, and
// retention does not delete what such a manifest may refer to (here the base of step 2's
// chain, which step 1 alone would leave behind).
func TestNewerFormatStopsRestore(t *testing.T) {
	st := NewMemStorage()
	cl := newCluster(t, st, 64)
	fourSteps(t, cl)
	// A later release's manifest of step 2, and its commit record naming it by size and sum.
	man := objects(t, st, 2, "/manifest")[0]
	var newer []byte
	require.NoError(t, st.Update(man, func(b []byte) []byte {
		newer = withVersion(b, manifestVersion+1)
		return newer
	}))
	require.NoError(t, st.Update(commitName("job", 2), func(b []byte) []byte {
		rec, err := decodeCommit(b)
		require.NoError(t, err)
		rec.Nodes[0].Size, rec.Nodes[0].Sum = uint64(len(newer)), xxhashSum(newer)
		return appendCommit(nil, rec)
	}))
	_, _, err := cl.restoreFresh(2)
	require.ErrorIs(t, err, ErrUnsupportedVersion)
	base := objects(t, st, 1, "")
	_, err = cl.committer().Prune(context.Background())
	if err != nil {
		require.ErrorIs(t, err, ErrUnsupportedVersion)
	}
	assert.Equal(t, base, objects(t, st, 1, ""), "the base of step 2's chain is kept")
}
