package elastic_test

import (
	"context"
	"crypto/sha256"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// freshJob starts a local job of the fault tests' model over the checkpoint directory dir.
func freshJob(t *testing.T, dir string, tune func(*elastic.Config)) *local.Job {
	t.Helper()
	st, err := checkpoint.NewFSStorage(dir)
	require.NoError(t, err)
	cfg := local.Config{Job: "fresh", Servers: 2, Slots: faultSlots, Tables: []ps.TableSpec{faultTable},
		Coordinator: elastic.Config{Storage: st, CheckpointEvery: 6, KeepLast: 2, Logger: testLogger(t),
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(faultRecords), ShardSize: 96, Epochs: faultEpochs, Seed: 3}},
		Checkpoint: checkpoint.Config{ShmDir: t.TempDir(), FullEvery: 2},
	}
	if tune != nil {
		tune(&cfg.Coordinator)
	}
	job, err := local.Start(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { job.Close() })
	return job
}

// storageFiles returns every file under dir with the digest of its contents.
func storageFiles(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[p] = sha256.Sum256(b)
		return nil
	})
	require.NoError(t, err)
	return out
}

// changedFiles returns the files of before that are gone or changed in dir, relative to it.
func changedFiles(t *testing.T, dir string, before map[string][32]byte) []string {
	t.Helper()
	after := storageFiles(t, dir)
	var out []string
	for name, sum := range before {
		if now, ok := after[name]; !ok || now != sum {
			rel, _ := filepath.Rel(dir, name)
			out = append(out, rel)
		}
	}
	slices.Sort(out)
	return out
}

// trainSteps trains up to n batches with a new session of job and returns the first error.
func trainSteps(ctx context.Context, t *testing.T, job *local.Job, n int) error {
	t.Helper()
	sess, err := job.NewSession("w0", shard.ReaderConfig{Source: faultData, BatchSize: 32})
	require.NoError(t, err)
	defer sess.Close()
	for range n {
		if err := sess.Step(ctx, trainStep); err != nil {
			return err
		}
	}
	return nil
}

// A program that starts a job over storage holding an earlier run's commits, and trains and
// checkpoints without Resume, gets ErrExistingCommits and deletes nothing (retention used to
// delete the earlier run's commits at the new run's first commit). Resume, or Overwrite, is the
// explicit choice that lets it train.
func TestFreshStartOverEarlierCommitsIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()

	first := freshJob(t, dir, nil)
	require.NoError(t, trainSteps(ctx, t, first, 40))
	newest, err := first.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, first.Close())
	before := storageFiles(t, dir)
	require.NotEmpty(t, before)

	second := freshJob(t, dir, nil)
	err = trainSteps(ctx, t, second, 40)
	assert.ErrorIs(t, err, checkpoint.ErrExistingCommits, "a worker joins a coordinator over an earlier run's commits")
	var existing *checkpoint.ExistingCommitsError
	if assert.ErrorAs(t, err, &existing) {
		assert.Equal(t, "fresh", existing.Job)
		assert.Positive(t, existing.Commits, "the earlier run's commit records (how many retention kept depends on the commits that ran)")
		assert.Equal(t, newest, existing.Newest)
	}
	_, err = second.Coordinator().Checkpoint(ctx)
	assert.ErrorIs(t, err, checkpoint.ErrExistingCommits)
	assert.Error(t, second.Coordinator().Finish(ctx, true, 0), "the final checkpoint of a program's end")
	require.NoError(t, second.Close())
	assert.Empty(t, changedFiles(t, dir, before), "of the earlier run's %d checkpoint files, these were deleted or changed", len(before))

	// Resume is one way on.
	resumed := freshJob(t, dir, nil)
	res, err := resumed.Coordinator().ResumeReport(ctx)
	require.NoError(t, err)
	assert.Equal(t, newest, res.Step)
	assert.Equal(t, 32, res.BatchSize, "the batch size every worker must read with")
	require.NoError(t, trainSteps(ctx, t, resumed, 5))
	_, err = resumed.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, resumed.Close())

	// Overwrite is the other: the earlier run goes, and the new one trains and commits.
	over := freshJob(t, dir, func(c *elastic.Config) { c.Overwrite = true })
	require.NoError(t, trainSteps(ctx, t, over, 10))
	step, err := over.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(10), step, "the overwriting run counts its steps from the start")
	require.NoError(t, over.Close())
	st, err := checkpoint.NewFSStorage(dir)
	require.NoError(t, err)
	m, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "fresh", Storage: st, KeepLast: -1})
	require.NoError(t, err)
	records, err := m.Records(ctx)
	require.NoError(t, err)
	assert.Equal(t, []uint64{10, 6}, records, "only the overwriting run's commits")
	for name := range before {
		if filepath.Base(filepath.Dir(name)) == "commits" {
			assert.NoFileExists(t, name, "an earlier run's commit outlived the overwrite")
		}
	}
}

// checkpoint.Committer.PrepareFresh refuses with the figures of the earlier run, deletes nothing without overwrite,
// everything of the job (and nothing of another job) with it, and finds nothing to refuse after.
func TestPrepareFresh(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	job := freshJob(t, dir, nil)
	require.NoError(t, trainSteps(ctx, t, job, 13))
	_, err := job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, job.Close())
	st, err := checkpoint.NewFSStorage(dir)
	require.NoError(t, err)
	require.NoError(t, st.PutNew(ctx, "fresh2/commits/x", []byte("another job's")))
	before := storageFiles(t, dir)
	m, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "fresh", Storage: st, KeepLast: -1})
	require.NoError(t, err)

	err = m.PrepareFresh(ctx, false)
	var existing *checkpoint.ExistingCommitsError
	require.ErrorAs(t, err, &existing)
	assert.ErrorIs(t, err, checkpoint.ErrExistingCommits)
	assert.Equal(t, checkpoint.ExistingCommitsError{Job: "fresh", Commits: 2, Newest: 13}, *existing)
	assert.Empty(t, changedFiles(t, dir, before))

	require.NoError(t, m.PrepareFresh(ctx, true))
	left, err := st.List(ctx, "")
	require.NoError(t, err)
	assert.Equal(t, []string{"fresh2/commits/x"}, left)
	require.NoError(t, m.PrepareFresh(ctx, false))
}
