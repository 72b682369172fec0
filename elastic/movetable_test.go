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

// twoServerJob starts a job of two servers and a 64-slot table, closed with the test.
func twoServerJob(t *testing.T, name string) *local.Job {
	job, err := local.Start(context.Background(), local.Config{Job: name, Servers: 2, Slots: 64,
		Tables:      []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 2}}},
		Coordinator: elastic.Config{Storage: checkpoint.NewMemStorage(), Dispatcher: shard.Config{Dataset: shard.IndexedDataset(100)}},
		Checkpoint:  checkpoint.Config{ShmDir: t.TempDir()},
	})
	require.NoError(t, err)
	t.Cleanup(func() { job.Close() })
	return job
}

// A server left on an older owner table (its install of the job's table failed) gets the
// job's table before it snapshots: by its own table it would save slots it gave away.
func TestSnapshotBringsServersToTheJobsTable(t *testing.T) {
	ctx := context.Background()
	job := twoServerJob(t, "sync")
	c := job.Coordinator()
	cur := elastic.JobTable(c)
	slot := cur.SlotsOf("ps-0").Members()[0]
	next, err := cur.WithMoves(cur.Version+1, cur.Nodes, []ps.Move{{Slot: slot, From: "ps-0", To: "ps-1"}})
	require.NoError(t, err)
	elastic.SetJobTable(c, next)
	_, err = job.Servers[1].Server().SetOwnerTable(next) // ps-0's install "failed"
	require.NoError(t, err)

	// A step to checkpoint: one batch through a session.
	sess, err := job.NewSession("w", shard.ReaderConfig{Source: shard.IndexedSource{Data: shard.IndexedFunc(100, func(i int64, rec *shard.Record) error {
		rec.IDs = append(rec.IDs, uint64(i))
		rec.EndField()
		return nil
	})}, BatchSize: 10})
	require.NoError(t, err)
	defer sess.Close()
	require.NoError(t, sess.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
		return b.Push(ctx, "emb", b.IDs, make([]float32, 2*len(b.IDs)))
	}))
	_, err = c.Checkpoint(ctx)
	require.NoError(t, err)
	for _, s := range job.Servers {
		assert.Equal(t, next.Version, s.Server().OwnerTable().Version, "%s has the job's table", s.Node().ID)
	}
}

// A move's owner table is published only if it follows the job's (its version is the job's
// plus one): one made from a table a recovery has replaced since, or from a stale one, is
// refused with ps.ErrNotPublished and changes nothing, on the coordinator or on any server.
func TestMoveTableMustFollowTheJobs(t *testing.T) {
	ctx := context.Background()
	job := twoServerJob(t, "moves")
	c := job.Coordinator()
	cur := elastic.JobTable(c)
	slot := cur.SlotsOf("ps-0").Members()[0]
	moves := []ps.Move{{Slot: slot, From: "ps-0", To: "ps-1"}}
	for _, v := range []uint64{cur.Version + 2, cur.Version + 9} {
		next, err := cur.WithMoves(v, cur.Nodes, moves)
		require.NoError(t, err)
		err = elastic.PublishMove(ctx, c, next)
		require.ErrorIs(t, err, ps.ErrNotPublished, "version %d after %d", v, cur.Version)
		assert.Same(t, cur, elastic.JobTable(c), "the job's table changed")
		for _, s := range job.Servers {
			assert.Equal(t, cur.Version, s.Server().OwnerTable().Version, "%s installed a refused table", s.Node().ID)
		}
	}
	older, err := ps.NewOwnerTable(cur.Version, cur.Slots, cur.Nodes, nil)
	require.NoError(t, err)
	require.ErrorIs(t, elastic.PublishMove(ctx, c, older), ps.ErrNotPublished, "a table of the job's own version")

	next, err := cur.WithMoves(cur.Version+1, cur.Nodes, moves)
	require.NoError(t, err)
	require.NoError(t, elastic.PublishMove(ctx, c, next))
	assert.Same(t, next, elastic.JobTable(c))
	for _, s := range job.Servers {
		assert.Equal(t, next.Version, s.Server().OwnerTable().Version, "%s has the job's table", s.Node().ID)
	}
}
