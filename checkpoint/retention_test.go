package checkpoint

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRetentionKeepsLastNEveryMthAndNeededBases(t *testing.T) {
	ctx := context.Background()
	st := NewMemStorage()
	cl := newCluster(t, st, 64)
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(11, 12))
	fill(rng, ts, 200, 2000)
	ck := cl.open(cl.cfg("ps0", tabs)) // FullEvery 3
	m, err := NewCommitter(CommitterConfig{Job: "job", Storage: st, KeepLast: 2, KeepEvery: 4, Logger: testLogger(t)})
	require.NoError(t, err)
	want := map[uint64][]map[uint64]string{}
	for step := uint64(1); step <= 14; step++ {
		mutate(rng, ts, step, 2000)
		_, ref := snap(t, ck, step)
		want[step] = states(ts)
		info, err := m.Commit(ctx, step, []ManifestRef{ref})
		require.NoError(t, err)
		assert.Equal(t, step, info.Seq) // one commit per step, so seq == step

		commits, err := m.Commits(ctx)
		require.NoError(t, err)
		var kept []uint64
		for _, c := range commits {
			kept = append(kept, c.Step)
		}
		var expect []uint64
		for s := step; s >= 1; s-- {
			if s+2 > step || s%4 == 0 {
				expect = append(expect, s)
			}
		}
		require.Equal(t, expect, kept, "after step %d", step)
		for _, s := range kept {
			got, _, err := cl.restoreFresh(s)
			require.NoError(t, err, "step %d after committing %d", s, step)
			require.Equal(t, want[s], got, "step %d after committing %d", s, step)
		}
	}
	// Fulls are 1, 4, 7, 10, 13. Kept commits 14, 13, 12, 8, 4 need 13-14, 10-12, 7-8 and 4.
	names, err := st.List(ctx, "job/data/")
	require.NoError(t, err)
	var steps []uint64
	for _, n := range names {
		s, ok := dataStep("job", n)
		require.True(t, ok)
		if !slices.Contains(steps, s) {
			steps = append(steps, s)
		}
	}
	assert.Equal(t, []uint64{4, 7, 8, 10, 11, 12, 13, 14}, steps)
	assert.Equal(t, uint64(0), m.Stats().PruneErrors)
}

func TestPruneNeverDeletesNewestOrInProgress(t *testing.T) {
	ctx := context.Background()
	st := NewMemStorage()
	cl := newCluster(t, st, 64)
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(13, 14))
	fill(rng, ts, 100, 1000)
	ck := cl.open(cl.cfg("ps0", tabs))
	m, err := NewCommitter(CommitterConfig{Job: "job", Storage: st, KeepLast: -1})
	require.NoError(t, err)
	var refs []ManifestRef
	for step := uint64(1); step <= 5; step++ {
		mutate(rng, ts, step, 1000)
		_, ref := snap(t, ck, step)
		refs = append(refs, ref)
		if step <= 2 {
			_, err := m.Commit(ctx, step, []ManifestRef{ref})
			require.NoError(t, err)
		}
	}
	// Steps 3-5 are persisted but not committed (a delta chain 4 <- 5 on full 4, 3 on 1).
	res, err := m.Prune(ctx)
	require.NoError(t, err)
	assert.Equal(t, []uint64{2, 1}, res.Kept)
	for _, r := range refs {
		_, err := st.Open(ctx, r.Name)
		assert.NoError(t, err, "manifest of step %d", r.Step)
	}
	// Committing 5 later still works: its chain survived.
	_, err = m.Commit(ctx, 5, []ManifestRef{refs[4]})
	require.NoError(t, err)
	got, _, err := cl.restoreFresh(5)
	require.NoError(t, err)
	assert.Equal(t, states(ts), got)

	// With KeepLast 1 the newest stays and the rest goes, except what 5's chain needs (4 is its base).
	m1, err := NewCommitter(CommitterConfig{Job: "job", Storage: st, KeepLast: 1})
	require.NoError(t, err)
	res, err = m1.Prune(ctx)
	require.NoError(t, err)
	assert.Equal(t, []uint64{5}, res.Kept)
	assert.Equal(t, []uint64{2, 1}, res.DeletedCommits)
	got, _, err = cl.restoreFresh(0)
	require.NoError(t, err)
	assert.Equal(t, states(ts), got)
	require.NoError(t, m1.DropAfter(ctx, 4))
	_, err = m1.Choose(ctx, nil)
	assert.ErrorIs(t, err, ErrNoCheckpoint)
}
