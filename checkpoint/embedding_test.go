package checkpoint_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
)

// rowsOf returns every row of tab as a string of its fields, by id.
func rowsOf(tab *embedding.Table) map[uint64]string {
	out := map[uint64]string{}
	tab.Range(func(v embedding.RowView) bool {
		out[v.ID] = fmt.Sprint(v.Weights, v.State, v.LastStep, v.Freq)
		return true
	})
	return out
}

// A checkpoint of an embedding table (a ShardedTable) restores bit-exactly from shared memory into a
// new table, group by group, and from storage when a piece of shared memory is damaged.
func TestEmbeddingTableRestore(t *testing.T) {
	ctx := context.Background()
	cfg := embedding.Config{Name: "emb", Dim: 8, Seed: 3, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}}
	src, err := embedding.New(cfg)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	ids := make([]uint64, 40000)
	for i := range ids {
		ids[i] = rng.Uint64()
	}
	grads := make([]float32, len(ids)*8)
	for i := range grads {
		grads[i] = float32(rng.NormFloat64())
	}
	require.NoError(t, src.Apply(ids, grads, 1))
	shm := t.TempDir()
	st := checkpoint.NewMemStorage()
	ccfg := checkpoint.Config{Job: "job", Node: "ps0", Tables: map[string]checkpoint.Table{"emb": src}, Storage: st,
		ShmDir: shm, FullEvery: 2, Slots: 64}
	ck, err := checkpoint.New(ccfg)
	require.NoError(t, err)
	m, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "job", Storage: st})
	require.NoError(t, err)
	for step := uint64(1); step <= 2; step++ {
		if step == 2 { // a delta: some rows trained again, some deleted
			require.NoError(t, src.Apply(ids[:5000], grads[:5000*8], 2))
			for _, id := range ids[5000:5100] {
				src.Delete(id)
			}
		}
		_, err := ck.Snapshot(ctx, step)
		require.NoError(t, err)
		ref, err := ck.WaitPersisted(ctx, step)
		require.NoError(t, err)
		_, err = m.Commit(ctx, step, []checkpoint.ManifestRef{ref})
		require.NoError(t, err)
	}
	require.NoError(t, ck.Close())
	want := rowsOf(src)

	restore := func() (*embedding.Table, *checkpoint.Restored) {
		dst, err := embedding.New(cfg)
		require.NoError(t, err)
		c := ccfg
		c.Tables = map[string]checkpoint.Table{"emb": dst}
		ck, err := checkpoint.New(c)
		require.NoError(t, err)
		defer ck.Close()
		r, err := ck.Restore(ctx)
		require.NoError(t, err)
		return dst, r
	}
	dst, r := restore()
	assert.Equal(t, checkpoint.SourceShm, r.Sources["ps0"])
	assert.Equal(t, uint64(2), r.Step)
	assert.Equal(t, want, rowsOf(dst))

	// Damage the records of the full snapshot (generation 0) in the middle.
	region := filepath.Join(shm, "job", "ps0")
	entries, err := os.ReadDir(region)
	require.NoError(t, err)
	damaged := false
	for _, e := range entries {
		if e.Name() == "g0-0" {
			f, err := os.OpenFile(filepath.Join(region, e.Name()), os.O_RDWR, 0)
			require.NoError(t, err)
			b := make([]byte, 1)
			_, err = f.ReadAt(b, 1<<20)
			require.NoError(t, err)
			b[0] ^= 1
			_, err = f.WriteAt(b, 1<<20)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			damaged = true
		}
	}
	require.True(t, damaged)
	dst, r = restore()
	assert.Equal(t, checkpoint.SourceStorage, r.Sources["ps0"])
	assert.Equal(t, want, rowsOf(dst))
}
