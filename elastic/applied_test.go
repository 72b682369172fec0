package elastic_test

import (
	"context"
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

// The servers' record of applied batches, saved with every checkpoint, does not grow with the
// steps: after ten times more steps it is the same size, and a long run between two checkpoints
// leaves a watermark per shard trained since the commit before, nothing per step, while the job
// still trains every record exactly once.
func TestAppliedRecordStaysBoundedBetweenCheckpoints(t *testing.T) {
	ctx := context.Background()
	const records, batch = 1 << 15, 16
	tables := []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 4, Seed: 3}}}
	job, err := local.Start(ctx, local.Config{Job: "bounded", Servers: 2, Slots: 256, Tables: tables,
		Coordinator: elastic.Config{Storage: checkpoint.NewMemStorage(), CheckpointEvery: 1 << 30,
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(records), ShardSize: 4096}},
		Checkpoint: checkpoint.Config{ShmDir: t.TempDir()},
	})
	require.NoError(t, err)
	defer job.Close()
	sess, err := job.NewSession("w", shard.ReaderConfig{BatchSize: batch, Source: shard.IndexedSource{Data: shard.IndexedFunc(records,
		func(i int64, rec *shard.Record) error {
			for f := range 8 {
				rec.IDs = append(rec.IDs, uint64(i%997)*8+uint64(f))
			}
			rec.EndField()
			return nil
		})}})
	require.NoError(t, err)
	defer sess.Close()
	step := func(ctx context.Context, b *elastic.Batch) error {
		g := make([]float32, 4*len(b.IDs))
		for i := range g {
			g[i] = 0.01
		}
		return b.Push(ctx, "emb", b.IDs, g)
	}
	train := func(n int) {
		for range n {
			require.NoError(t, sess.Step(ctx, step))
		}
	}
	record := func() (bytes, entries int) {
		for _, s := range job.Servers {
			bytes += len(s.Server().AppliedState(nil))
			entries += s.Server().AppliedCount()
		}
		return
	}
	checkpointEvery := func(every, steps int) {
		for range steps / every {
			train(every)
			_, err := job.Coordinator().Checkpoint(ctx)
			require.NoError(t, err)
		}
	}
	// A checkpoint every 25 steps (400 records; a shard is 4096): the record after 50 steps and
	// after 500.
	checkpointEvery(25, 50)
	b1, e1 := record()
	checkpointEvery(25, 450)
	b10, e10 := record()
	t.Logf("record after 50 and 500 steps, a checkpoint every 25: %d and %d bytes, %d and %d entries", b1, b10, e1, e10)
	assert.LessOrEqual(t, float64(b10), 1.2*float64(b1), "record bytes after 10x the steps")
	assert.LessOrEqual(t, e10, e1+len(job.Servers), "entries after 10x the steps")
	// 800 steps between two checkpoints (12800 records: four shards): a watermark per shard
	// trained since the newest commit, nothing per step.
	checkpointEvery(800, 800)
	b800, e800 := record()
	t.Logf("record after 800 steps between checkpoints: %d bytes, %d entries", b800, e800)
	assert.LessOrEqual(t, e800, 5*len(job.Servers), "a watermark per shard trained since the commit before")
	for _, e := range job.Coordinator().ExactlyOnce() {
		assert.True(t, e.OK(), "%s", e)
	}
}
