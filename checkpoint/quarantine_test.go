package checkpoint

import (
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A commit skipped for a corrupt chunk is reported with the object and moved aside with its
// reason; retention keeps everything it names while it is in quarantine.
func TestChooseReportsAndQuarantineKeepsTheEvidence(t *testing.T) {
	ctx := context.Background()
	st := NewMemStorage()
	cl := newCluster(t, st, 64)
	fourSteps(t, cl) // 1 full, 2, 3 deltas, 4 full
	chunk := objects(t, st, 4, "-p0")[1]
	require.NoError(t, st.Update(chunk, func(b []byte) []byte { b[len(b)/2] ^= 0x40; return b }))
	require.NoError(t, st.Update(commitName("job", 3), func(b []byte) []byte { return b[:len(b)-3] }))

	tabs, _ := tables2()
	cfg := cl.cfg("restorer", tabs)
	cfg.ShmDir = t.TempDir()
	ck := cl.open(cfg)
	m := cl.committer()
	info, skipped, err := m.ChooseReport(ctx, func(ctx context.Context, step uint64) error { return ck.Verify(ctx, step) })
	require.NoError(t, err)
	assert.Equal(t, uint64(2), info.Step)
	require.Len(t, skipped, 2)
	assert.Equal(t, uint64(4), skipped[0].Step)
	assert.ErrorIs(t, skipped[0].Err, ErrCorrupt)
	assert.Contains(t, skipped[0].Err.Error(), chunk, "the reason names the damaged object")
	assert.Equal(t, uint64(3), skipped[1].Step)
	assert.ErrorIs(t, skipped[1].Err, ErrCorrupt)

	dir, err := m.Quarantine(ctx, 4, skipped[0].Err)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(dir, "job/quarantine/"+stepName(4)+"-"), dir)
	r, err := st.Open(ctx, dir+"/reason")
	require.NoError(t, err)
	why, _ := io.ReadAll(r)
	assert.Contains(t, string(why), chunk)
	_, err = st.Open(ctx, commitName("job", 4))
	assert.ErrorIs(t, err, ErrNotFound, "the commit record is moved, not copied")
	_, err = m.Quarantine(ctx, 4, nil)
	assert.ErrorIs(t, err, ErrNotCommitted)

	// Retention with the quarantined commit's data older than the newest commit: kept, and the
	// unreadable record of 3 is quarantined too rather than deleted.
	before, err := st.List(ctx, "job/data/"+stepName(4)+"/")
	require.NoError(t, err)
	m1, err := NewCommitter(CommitterConfig{Job: "job", Storage: st, KeepLast: 1, Logger: testLogger(t)})
	require.NoError(t, err)
	ck.Close()
	tabs2, ts2 := tables2()
	fill(rand.New(rand.NewPCG(1, 2)), ts2, 50, 500)
	ck2 := cl.open(cl.cfg("ps1", tabs2))
	_, ref := snap(t, ck2, 9, SnapshotFull())
	_, err = m1.Commit(ctx, 9, []ManifestRef{ref})
	require.NoError(t, err)
	after, err := st.List(ctx, "job/data/"+stepName(4)+"/")
	require.NoError(t, err)
	assert.Equal(t, before, after, "objects of a quarantined commit were deleted")
	q, err := m1.Quarantined(ctx)
	require.NoError(t, err)
	require.Len(t, q, 2)
	assert.True(t, strings.HasPrefix(q[0], "job/quarantine/"+stepName(3)+"-"), q[0])
	_, err = st.Open(ctx, commitName("job", 3))
	assert.ErrorIs(t, err, ErrNotFound)

	// Once an operator deletes the quarantine, retention reclaims the data.
	names, err := st.List(ctx, "job/quarantine/")
	require.NoError(t, err)
	for _, n := range names {
		require.NoError(t, st.Delete(ctx, n))
	}
	_, err = m1.Prune(ctx)
	require.NoError(t, err)
	after, err = st.List(ctx, "job/data/"+stepName(4)+"/")
	require.NoError(t, err)
	assert.Empty(t, after)
}

// Clean, at a job's start, removes a generation persisted but never committed and the temporary
// files of a persist killed halfway, and keeps every commit's chain.
func TestCleanRemovesUncommittedPersistsAndTemporaryFiles(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	st, err := NewFSStorage(root)
	require.NoError(t, err)
	cl := newCluster(t, st, 64)
	want, ck, ts := fourSteps(t, cl)
	mutate(rand.New(rand.NewPCG(7, 7)), ts, 5, 3000)
	_, ref5 := snap(t, ck, 5) // persisted, never committed
	require.NoError(t, ck.Close())
	// A persist killed halfway: a temporary file in its directory, and one of another job.
	half := filepath.Join(root, "job", "data", stepName(6), "ps0", "00000000000000aa")
	require.NoError(t, os.MkdirAll(half, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(half, ".tmp-t0-s0-p0-123"), []byte("half"), 0o644))
	other := filepath.Join(root, "other", "data")
	require.NoError(t, os.MkdirAll(other, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(other, ".tmp-x-1"), []byte("theirs"), 0o644))

	m := cl.committer()
	res, err := m.Clean(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, res.Temporary)
	assert.Positive(t, res.DeletedObjects)
	_, err = st.Open(ctx, ref5.Name)
	assert.ErrorIs(t, err, ErrNotFound, "the uncommitted persist of step 5 is left")
	_, err = os.Stat(filepath.Join(half, ".tmp-t0-s0-p0-123"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the temporary file of the killed persist is left")
	_, err = os.Stat(filepath.Join(other, ".tmp-x-1"))
	assert.NoError(t, err, "another job's temporary file was removed")
	names, err := st.List(ctx, "job/data/")
	require.NoError(t, err)
	for _, n := range names {
		s, _ := dataStep("job", n)
		assert.LessOrEqual(t, s, uint64(4), "object %s", n)
	}
	for step := uint64(1); step <= 4; step++ {
		got, _, err := cl.restoreFresh(step)
		require.NoError(t, err, "step %d", step)
		assert.Equal(t, want[step], got, "step %d", step)
	}

	// With no commit at all, Clean removes every persist.
	st2 := NewMemStorage()
	cl2 := newCluster(t, st2, 64)
	tabs, ts2 := tables2()
	fill(rand.New(rand.NewPCG(3, 3)), ts2, 50, 500)
	ck2 := cl2.open(cl2.cfg("ps0", tabs))
	snap(t, ck2, 1)
	_, err = cl2.committer().Clean(ctx)
	require.NoError(t, err)
	left, err := st2.List(ctx, "job/data/")
	require.NoError(t, err)
	assert.Empty(t, left)
}

// A restore from shared memory leaves the storage copy unread; it is verified in the background
// and a damaged one is reported.
func TestRestoreFromSharedMemoryVerifiesTheStorageCopy(t *testing.T) {
	ctx := context.Background()
	for _, damaged := range []bool{false, true} {
		t.Run(map[bool]string{false: "intact", true: "damaged"}[damaged], func(t *testing.T) {
			st := NewMemStorage()
			cl := newCluster(t, st, 64)
			want, ck, _ := fourSteps(t, cl)
			require.NoError(t, ck.Close())
			var chunk string
			if damaged {
				chunk = objects(t, st, 4, "-p0")[0]
				require.NoError(t, st.Update(chunk, func(b []byte) []byte { b[len(b)/2] ^= 0x02; return b }))
			}
			type result struct {
				step uint64
				err  error
			}
			got := make(chan result, 1)
			tabs, ts := tables2()
			cfg := cl.cfg("ps0", tabs)
			cfg.OnStorageVerified = func(step uint64, err error) { got <- result{step, err} }
			ck2 := cl.open(cfg)
			r, err := ck2.Restore(ctx)
			require.NoError(t, err)
			require.Equal(t, SourceShm, r.Sources["ps0"])
			assert.Equal(t, uint64(4), r.Step)
			assert.Equal(t, want[4], states(ts))
			select {
			case res := <-got:
				assert.Equal(t, uint64(4), res.step)
				if damaged {
					require.ErrorIs(t, res.err, ErrCorrupt)
					assert.Contains(t, res.err.Error(), chunk)
				} else {
					assert.NoError(t, res.err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the storage copy was never verified")
			}
		})
	}
}
