package checkpoint

import (
	"cmp"
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
		// Fulls are 1, 4, 7, ...: commit s chains back to base(s). Besides the newest two and
		// every 4th, a commit on an older base than the newest's stays: the newest such one,
		// unless a kept one is.
		base := func(s uint64) uint64 { return (s-1)/3*3 + 1 }
		var expect []uint64
		fallback := false
		for s := step; s >= 1; s-- {
			if s+2 > step || s%4 == 0 {
				expect = append(expect, s)
				fallback = fallback || base(s) != base(step)
			}
		}
		if b := base(step); !fallback && b > 1 && !slices.Contains(expect, b-1) {
			expect = append(expect, b-1)
			slices.SortFunc(expect, func(a, b uint64) int { return cmp.Compare(b, a) })
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

	// With KeepLast 1 the newest stays, with what 5's chain needs (4 is its base), and so does
	// 2, the newest commit sharing nothing with 5's chain; 1 goes.
	m1, err := NewCommitter(CommitterConfig{Job: "job", Storage: st, KeepLast: 1})
	require.NoError(t, err)
	res, err = m1.Prune(ctx)
	require.NoError(t, err)
	assert.Equal(t, []uint64{5, 2}, res.Kept)
	assert.Equal(t, []uint64{1}, res.DeletedCommits)
	got, _, err = cl.restoreFresh(0)
	require.NoError(t, err)
	assert.Equal(t, states(ts), got)
	require.NoError(t, m1.DropAfter(ctx, 4))
	info, err := m1.Choose(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), info.Step)
}

// TestRetentionKeepsAChainIndependentOfTheNewest: with the default retention, once a second full
// checkpoint is committed, corrupting every object of the newest commit's chain (its base
// included, which every kept delta shares) still leaves a commit to restore.
func TestRetentionKeepsAChainIndependentOfTheNewest(t *testing.T) {
	ctx := context.Background()
	st := NewMemStorage()
	cl := newCluster(t, st, 64) // FullEvery 3: fulls at 1, 4, 7, 10
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(31, 32))
	fill(rng, ts, 200, 2000)
	ck := cl.open(cl.cfg("ps0", tabs))
	m, err := NewCommitter(CommitterConfig{Job: "job", Storage: st, Logger: testLogger(t)}) // KeepLast 3
	require.NoError(t, err)
	want := map[uint64][]map[uint64]string{}
	for step := uint64(1); step <= 12; step++ {
		mutate(rng, ts, step, 2000)
		_, ref := snap(t, ck, step)
		want[step] = states(ts)
		_, err := m.Commit(ctx, step, []ManifestRef{ref})
		require.NoError(t, err)

		base := (step-1)/3*3 + 1
		damaged := cloneStorage(t, st)
		names, err := damaged.List(ctx, "job/data/")
		require.NoError(t, err)
		for _, n := range names {
			if s, _ := dataStep("job", n); s >= base && s <= step {
				require.NoError(t, damaged.Update(n, func(b []byte) []byte { b[len(b)-9] ^= 0x80; return b }))
			}
		}
		got, r, err := newCluster(t, damaged, 64).restoreFresh(0)
		if base == 1 {
			require.ErrorIs(t, err, ErrNoCheckpoint, "after step %d: only one chain exists yet", step)
			continue
		}
		require.NoError(t, err, "after step %d, with the chain from %d damaged", step, base)
		assert.Less(t, r.Step, base, "after step %d", step)
		assert.Equal(t, want[r.Step], got, "after step %d: restored step %d", step, r.Step)
	}
}
