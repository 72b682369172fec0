package checkpoint

import (
	"context"
	"errors"
	"io/fs"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two coordinators of one job: the old one goes on committing after a new one took over from an
// earlier step. Whatever the old one writes above the new one's base is void — never listed,
// chosen or counted by retention — and it is told it was superseded; the new one's commits
// replace the void ones.
func TestClaimVoidsTheCommitsOfASupersededCoordinator(t *testing.T) {
	for _, name := range []string{"mem", "fs"} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var st ExclusiveStorage = NewMemStorage()
			if name == "fs" {
				fsst, err := NewFSStorage(t.TempDir())
				require.NoError(t, err)
				st = fsst
			}
			cl := newCluster(t, st, 64)
			tabs, ts := tables2()
			rng := rand.New(rand.NewPCG(5, 6))
			fill(rng, ts, 100, 1000)
			ck := cl.open(cl.cfg("ps0", tabs))
			old, err := NewCommitter(CommitterConfig{Job: "job", Storage: st, KeepLast: 100, Logger: testLogger(t)})
			require.NoError(t, err)
			want := map[uint64]map[uint64]string{}
			commit := func(m *Committer, step uint64) error {
				mutate(rng, ts, step, 1000)
				_, ref := snap(t, ck, step)
				want[step] = states(ts)[0]
				_, err := m.Commit(ctx, step, []ManifestRef{ref})
				return err
			}
			for step := uint64(1); step <= 3; step++ {
				require.NoError(t, commit(old, step))
			}
			assert.Equal(t, uint64(1), old.Incarnation(), "the first commit claimed the job afresh")

			// The new coordinator restored step 2 (say, 3 did not verify on its servers).
			newer, err := NewCommitter(CommitterConfig{Job: "job", Storage: st, KeepLast: 2, Logger: testLogger(t)})
			require.NoError(t, err)
			inc, err := newer.Claim(ctx, 2)
			require.NoError(t, err)
			assert.Equal(t, uint64(2), inc)
			assert.Equal(t, []uint64{2, 1}, commitStepsOf(t, newer), "step 3 of the old coordinator is void")
			info, err := newer.Choose(ctx, nil)
			require.NoError(t, err)
			assert.Equal(t, uint64(2), info.Step)

			// The old coordinator goes on: refused.
			err = commit(old, 4)
			require.ErrorIs(t, err, ErrSuperseded)
			assert.Equal(t, []uint64{2, 1}, commitStepsOf(t, newer))

			// The new one commits; retention keeps its last two, and 2 as the commit sharing no
			// object with 6 (which chains on the full snapshot of 4), and deletes the void record.
			require.NoError(t, commit(newer, 5))
			require.NoError(t, commit(newer, 6))
			assert.Equal(t, []uint64{6, 5, 2}, commitStepsOf(t, newer))
			names, err := st.List(ctx, commitsPrefix("job"))
			require.NoError(t, err)
			assert.Equal(t, []string{commitName("job", 2), commitName("job", 5), commitName("job", 6)}, names)
			got, _, err := cl.restoreFresh(6)
			require.NoError(t, err)
			assert.Equal(t, want[6], got[0])
		})
	}
}

func commitStepsOf(t *testing.T, m *Committer) []uint64 {
	t.Helper()
	cs, err := m.Commits(context.Background())
	require.NoError(t, err)
	var out []uint64
	for _, c := range cs {
		out = append(out, c.Step)
	}
	return out
}

// Coordinators claiming at once get distinct incarnations; PutNew never replaces an object.
func TestClaimsAreUnique(t *testing.T) {
	ctx := context.Background()
	fsst, err := NewFSStorage(t.TempDir())
	require.NoError(t, err)
	for _, st := range []ExclusiveStorage{NewMemStorage(), fsst} {
		require.NoError(t, st.PutNew(ctx, "job/x", []byte("first")))
		err := st.PutNew(ctx, "job/x", []byte("second"))
		require.ErrorIs(t, err, fs.ErrExist)
		b, err := getObject(ctx, st, "job/x", nil, -1, 100)
		require.NoError(t, err)
		assert.Equal(t, "first", string(b))

		var mu sync.Mutex
		seen := map[uint64]bool{}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				m, err := NewCommitter(CommitterConfig{Job: "job", Storage: st})
				if !assert.NoError(t, err) {
					return
				}
				inc, err := m.Claim(ctx, 0)
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				assert.False(t, seen[inc], "incarnation %d claimed twice", inc)
				seen[inc] = true
				mu.Unlock()
			})
		}
		wg.Wait()
		assert.Len(t, seen, 8)
	}
}

// A storage that cannot create exclusively cannot be claimed; commits on it are not fenced.
func TestClaimNeedsExclusiveStorage(t *testing.T) {
	m, err := NewCommitter(CommitterConfig{Job: "job", Storage: plainStorage{NewMemStorage()}})
	require.NoError(t, err)
	_, err = m.Claim(context.Background(), 0)
	require.Error(t, err)
	assert.False(t, errors.Is(err, ErrSuperseded))
}

type plainStorage struct{ Storage }

func FuzzDecodeClaim(f *testing.F) {
	f.Add(appendClaim(claim{inc: 3, base: 17}))
	f.Add([]byte("EPSCLAIM"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeClaim(b)
		if err != nil {
			assert.ErrorIs(t, err, ErrCorrupt)
			return
		}
		assert.Equal(t, c, mustClaim(t, appendClaim(c)))
	})
}

func mustClaim(t *testing.T, b []byte) claim {
	c, err := decodeClaim(b)
	require.NoError(t, err)
	return c
}
