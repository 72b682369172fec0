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

// TestPinSparesOneCommit pins a commit that retention would delete and checks that it survives
// every later commit, restores bit-exactly (its base and deltas kept), and that nothing else is
// kept beyond the normal policy; moving the pin or removing it lets the commit go.
func TestPinSparesOneCommit(t *testing.T) {
	ctx := context.Background()
	st := NewMemStorage()
	cl := newCluster(t, st, 64)
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(21, 22))
	fill(rng, ts, 200, 2000)
	ck := cl.open(cl.cfg("ps0", tabs)) // FullEvery 3: fulls at 1, 4, 7, ...
	m, err := NewCommitter(CommitterConfig{Job: "job", Storage: st, KeepLast: 2, Logger: testLogger(t)})
	require.NoError(t, err)
	// Unpinned, the same commits under the same policy in another storage: what is kept
	// beyond them is what the pin spares.
	ref := NewMemStorage()
	refCl := newCluster(t, ref, 64)
	refCk := refCl.open(refCl.cfg("ps0", tabs))
	rm, err := NewCommitter(CommitterConfig{Job: "job", Storage: ref, KeepLast: 2, Logger: testLogger(t)})
	require.NoError(t, err)

	_, ok, err := m.Pinned(ctx)
	require.NoError(t, err)
	require.False(t, ok)
	want := map[uint64][]map[uint64]string{}
	kept := func(m *Committer) []uint64 {
		commits, err := m.Commits(ctx)
		require.NoError(t, err)
		var steps []uint64
		for _, c := range commits {
			steps = append(steps, c.Step)
		}
		return steps
	}
	commit := func(step uint64) {
		mutate(rng, ts, step, 2000)
		_, r := snap(t, ck, step)
		_, rr := snap(t, refCk, step)
		want[step] = states(ts)
		_, err := m.Commit(ctx, step, []ManifestRef{r})
		require.NoError(t, err)
		_, err = rm.Commit(ctx, step, []ManifestRef{rr})
		require.NoError(t, err)
	}
	for step := uint64(1); step <= 5; step++ {
		commit(step)
		if step == 5 { // a delta on the full of step 4
			require.NoError(t, m.Pin(ctx, 5))
		}
	}
	for step := uint64(6); step <= 14; step++ {
		commit(step)
		got, expect := kept(m), kept(rm)
		if !slices.Contains(expect, 5) {
			expect = append(expect, 5)
			slices.SortFunc(expect, func(a, b uint64) int { return cmp.Compare(b, a) })
		}
		assert.Equal(t, expect, got, "after step %d: the policy's commits and the pinned one", step)
		restored, _, err := cl.restoreFresh(5)
		require.NoError(t, err, "the pinned commit after step %d", step)
		require.Equal(t, want[5], restored, "the pinned commit after step %d", step)
	}
	pinned, ok, err := m.Pinned(ctx)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, uint64(5), pinned)

	// Another pin: the old one goes at the next prune, the new one stays.
	require.NoError(t, m.Pin(ctx, 13))
	commit(15)
	commit(16)
	got := kept(m)
	assert.NotContains(t, got, uint64(5))
	assert.Contains(t, got, uint64(13))
	restored, _, err := cl.restoreFresh(13)
	require.NoError(t, err)
	assert.Equal(t, want[13], restored)
	names, err := st.List(ctx, "job/data/")
	require.NoError(t, err)
	assert.False(t, slices.ContainsFunc(names, func(n string) bool { s, _ := dataStep("job", n); return s == 4 || s == 5 }),
		"the chain of the commit no longer pinned is deleted")

	// Unpinned: it goes too.
	require.NoError(t, m.Unpin(ctx))
	require.NoError(t, m.Unpin(ctx), "unpinning twice is fine")
	commit(17)
	commit(18)
	assert.Equal(t, kept(rm), kept(m))
	assert.Zero(t, m.Stats().PruneErrors)
}

// TestUnreadablePinStopsRetention: a pin that cannot be read deletes nothing.
func TestUnreadablePinStopsRetention(t *testing.T) {
	ctx := context.Background()
	st := NewMemStorage()
	cl := newCluster(t, st, 64)
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(23, 24))
	fill(rng, ts, 200, 2000)
	ck := cl.open(cl.cfg("ps0", tabs))
	m, err := NewCommitter(CommitterConfig{Job: "job", Storage: st, KeepLast: 1, Logger: testLogger(t)})
	require.NoError(t, err)
	require.NoError(t, putObject(ctx, st, pinName("job"), []byte("step five\n")))
	_, _, err = m.Pinned(ctx)
	require.ErrorIs(t, err, ErrCorrupt)
	for step := uint64(1); step <= 4; step++ {
		mutate(rng, ts, step, 2000)
		_, r := snap(t, ck, step)
		_, err := m.Commit(ctx, step, []ManifestRef{r})
		require.NoError(t, err)
	}
	commits, err := m.Commits(ctx)
	require.NoError(t, err)
	assert.Len(t, commits, 4, "no commit deleted")
	assert.Equal(t, uint64(4), m.Stats().PruneErrors, "every commit's retention failed")
	_, err = m.Prune(ctx)
	assert.ErrorIs(t, err, ErrCorrupt)
}
