package elastic_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A resume that skips a damaged commit says which commit, which object and what failed, moves
// the commit aside instead of deleting it, and cleans what no commit can restore.
func TestResumeReportsAndQuarantinesADamagedCommit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	store := checkpoint.NewMemStorage()
	adagrad := embedding.Optimizer{Kind: embedding.Adagrad, LearningRate: 0.1}
	cfg := local.Config{Job: "rep", Servers: 2, Slots: 64,
		Tables:      []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 4, Seed: 3, Optimizer: adagrad}}},
		Coordinator: elastic.Config{Storage: store, Dispatcher: shard.Config{Dataset: shard.IndexedDataset(20)}},
		Checkpoint:  checkpoint.Config{ShmDir: filepath.Join(dir, "shm"), FullEvery: 2},
	}
	job, err := local.Start(ctx, cfg)
	require.NoError(t, err)
	sess := tinySession(t, job, 20)
	train := func() {
		require.NoError(t, sess.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
			ids := append([]uint64(nil), b.IDs...)
			g := make([]float32, 4*len(ids))
			for i := range g {
				g[i] = 0.25 * float32(i+1)
			}
			return b.Push(ctx, "emb", ids, g)
		}))
	}
	var steps []uint64
	var want map[string]map[uint64][]float32
	for range 3 {
		train()
		step, err := job.Coordinator().Checkpoint(ctx)
		require.NoError(t, err)
		steps = append(steps, step)
		if len(steps) == 2 {
			want = allRows(job)
		}
	}
	require.NoError(t, sess.Close())
	require.NoError(t, job.Close())
	// Restore from storage only, and damage one chunk of the newest commit there.
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "shm")))
	newest := steps[2]
	names, err := store.List(ctx, "rep/data/")
	require.NoError(t, err)
	var chunk string
	for _, n := range names {
		if strings.Contains(n, stepDir(newest)) && strings.Contains(n, "/t0-") {
			chunk = n
			break
		}
	}
	require.NotEmpty(t, chunk)
	require.NoError(t, store.Update(chunk, func(b []byte) []byte { b[len(b)/2] ^= 0x08; return b }))
	// A generation persisted but never committed, left by a job that died.
	orphan := "rep/data/" + stepDir(newest+5) + "/ps-0/00000000000000ff/manifest"
	w, err := store.Create(ctx, orphan)
	require.NoError(t, err)
	_, err = w.Write([]byte("never committed"))
	require.NoError(t, err)
	require.NoError(t, w.Commit())

	again, err := local.Start(ctx, cfg)
	require.NoError(t, err)
	defer again.Close()
	res, err := again.Coordinator().ResumeReport(ctx)
	require.NoError(t, err)
	assert.Equal(t, steps[1], res.Step)
	assert.Equal(t, want, allRows(again))
	require.Len(t, res.Skipped, 1)
	assert.Equal(t, newest, res.Skipped[0].Step)
	assert.ErrorIs(t, res.Skipped[0].Err, checkpoint.ErrCorrupt)
	assert.Contains(t, res.Skipped[0].Err.Error(), chunk, "the reason names the damaged object")
	require.Len(t, res.Quarantined, 1)
	assert.True(t, strings.HasPrefix(res.Quarantined[0], "rep/quarantine/"+stepDir(newest)+"-"), res.Quarantined[0])
	_, err = store.Open(ctx, res.Quarantined[0]+"/commit")
	assert.NoError(t, err, "the damaged commit's record is kept in quarantine")
	_, err = store.Open(ctx, chunk)
	assert.NoError(t, err, "the damaged object is kept as evidence")
	_, err = store.Open(ctx, "rep/commits/"+stepDir(newest))
	assert.ErrorIs(t, err, checkpoint.ErrNotFound)
	_, err = store.Open(ctx, orphan)
	assert.ErrorIs(t, err, checkpoint.ErrNotFound, "the persist never committed is left")
	assert.Positive(t, res.Cleaned)
}

// stepDir is the 20-digit step of storage names.
func stepDir(step uint64) string { return fmt.Sprintf("%020d", step) }
