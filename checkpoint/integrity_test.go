package checkpoint

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// blobSteps commits steps 1 and 2 of node ps0, each snapshot with a "dense" blob, and step 2 with
// a coordinator blob; it returns the dense blob of each step.
func blobSteps(t *testing.T, cl *cluster) (*Checkpointer, *Committer, map[uint64][]byte) {
	ctx := context.Background()
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(21, 22))
	fill(rng, ts, 200, 2000)
	ck := cl.open(cl.cfg("ps0", tabs))
	m := cl.committer()
	dense := map[uint64][]byte{}
	for step := uint64(1); step <= 2; step++ {
		mutate(rng, ts, step, 2000)
		d := bytes.Repeat([]byte{byte(step), 0x5a, 0xc3}, 3000)
		dense[step] = d
		_, ref := snap(t, ck, step, SnapshotBlob("dense", d))
		_, err := m.Commit(ctx, step, []ManifestRef{ref}, Blob{Name: "dispatcher", Data: []byte("position of step " + stepName(step))})
		require.NoError(t, err)
	}
	return ck, m, dense
}

func TestVerifyChecksNodeBlobsInStorage(t *testing.T) {
	ctx := context.Background()
	st := NewMemStorage()
	cl := newCluster(t, st, 64)
	_, _, dense := blobSteps(t, cl)
	blob := objects(t, st, 2, "/b0")[0]
	require.NoError(t, st.Update(blob, func(b []byte) []byte { b[len(b)/2] ^= 0x10; return b }))

	tabs, ts := tables2()
	cfg := cl.cfg("restorer", tabs)
	cfg.ShmDir = t.TempDir()
	ck := cl.open(cfg)
	err := ck.Verify(ctx, 2)
	require.ErrorIs(t, err, ErrCorrupt, "Verify of a step whose dense blob is corrupt")
	_, err = ck.Load(ctx, 2)
	require.ErrorIs(t, err, ErrCorrupt)
	require.NotErrorIs(t, err, ErrPartialRestore, "the blob must be checked before any table changes")
	assert.Empty(t, ts[0].state(), "a failed Load changed a table")

	r, err := ck.Restore(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), r.Step, "Restore must skip the commit with the corrupt blob")
	require.Len(t, r.Blobs, 1)
	assert.Equal(t, dense[1], r.Blobs[0].Data)
}

func TestChooseSkipsCommitWithCorruptCoordinatorBlob(t *testing.T) {
	ctx := context.Background()
	st := NewMemStorage()
	cl := newCluster(t, st, 64)
	_, m, _ := blobSteps(t, cl)
	names, err := st.List(ctx, "job/data/"+stepName(2)+"/"+coordinatorNode+"/")
	require.NoError(t, err)
	require.Len(t, names, 1)
	require.NoError(t, st.Update(names[0], func(b []byte) []byte { b[len(b)/2] ^= 0x01; return b }))

	info, err := m.Choose(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), info.Step)
	_, err = m.Blob(ctx, 2, "dispatcher")
	assert.ErrorIs(t, err, ErrCorrupt)
}

func TestSharedMemoryBlobChecksum(t *testing.T) {
	ctx := context.Background()
	st := NewMemStorage()
	cl := newCluster(t, st, 64)
	ck, _, dense := blobSteps(t, cl)
	require.NoError(t, ck.Close())

	// Flip one byte of step 2's dense blob in the shared-memory generation that holds it.
	dir := filepath.Join(cl.shmDir, "job", "ps0")
	var found bool
	for g := range 2 {
		raw, err := os.ReadFile(sealPath(dir, g))
		if err != nil {
			continue
		}
		sf, err := decodeSeal(raw)
		require.NoError(t, err)
		for _, s := range sf.Segments {
			if s.Step != 2 {
				continue
			}
			require.Len(t, s.Blobs, 1)
			b := s.Blobs[0]
			f, err := os.OpenFile(filepath.Join(dir, sf.Extents[b.Extent].Name), os.O_RDWR, 0)
			require.NoError(t, err)
			one := make([]byte, 1)
			_, err = f.ReadAt(one, int64(b.Off)+int64(b.Len)/2)
			require.NoError(t, err)
			one[0] ^= 0x20
			_, err = f.WriteAt(one, int64(b.Off)+int64(b.Len)/2)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			found = true
		}
	}
	require.True(t, found, "no sealed segment of step 2 in shared memory")

	tabs, _ := tables2()
	ck2 := cl.open(cl.cfg("ps0", tabs))
	require.NoError(t, ck2.Verify(ctx, 2), "storage holds a good copy")
	r, err := ck2.Load(ctx, 2)
	require.NoError(t, err)
	assert.Equal(t, SourceStorage, r.Sources["ps0"], "shared memory with a corrupt blob must not be used")
	require.Len(t, r.Blobs, 1)
	assert.Equal(t, dense[2], r.Blobs[0].Data, "the restored blob differs from the one saved")
}

func TestCommitChecksEveryChunkExists(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		gone func(t *testing.T, st Storage) string
	}{
		{"chunk of the step", func(t *testing.T, st Storage) string { return objects(t, st, 2, "-p0")[1] }},
		{"blob of the step", func(t *testing.T, st Storage) string { return objects(t, st, 2, "/b0")[0] }},
		{"chunk of the base a delta needs", func(t *testing.T, st Storage) string { return objects(t, st, 1, "-p0")[0] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := NewMemStorage()
			cl := newCluster(t, st, 64)
			tabs, ts := tables2()
			rng := rand.New(rand.NewPCG(23, 24))
			fill(rng, ts, 200, 2000)
			ck := cl.open(cl.cfg("ps0", tabs))
			m := cl.committer()
			_, ref1 := snap(t, ck, 1, SnapshotBlob("dense", []byte("one")))
			_, err := m.Commit(ctx, 1, []ManifestRef{ref1})
			require.NoError(t, err)
			mutate(rng, ts, 2, 2000)
			_, ref2 := snap(t, ck, 2, SnapshotBlob("dense", []byte("two"))) // a delta on 1
			require.NoError(t, st.Delete(ctx, tc.gone(t, st)))

			_, err = m.Commit(ctx, 2, []ManifestRef{ref2})
			require.ErrorIs(t, err, ErrIncomplete)
			_, err = st.Open(ctx, commitName("job", 2))
			assert.ErrorIs(t, err, ErrNotFound, "a commit record was written for an incomplete checkpoint")
		})
	}
}
