package elastic_test

import (
	"context"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/elastictest"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A server whose shared-memory generations are both still being persisted refuses snapshots
// (checkpoint.ErrBusy) for as long as the persists take, which after a takeover are an earlier
// coordinator's that no commit here waits for: Checkpoint takes the snapshot again, pausing
// longer each time, until the server has room.
func TestCheckpointWaitsOutABusyServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var busy *elastictest.Fault
	job, err := elastictest.Start(ctx, elastictest.Config{T: t, Servers: 2,
		Tables:      []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 2}}},
		Coordinator: elastic.Config{Storage: checkpoint.NewMemStorage(), Dispatcher: shard.Config{Dataset: shard.IndexedDataset(256), ShardSize: 64}},
		WrapServer: func(s elastic.ParameterServer) elastic.ParameterServer {
			f := elastictest.NewFaultServer(s)
			if s.Node().ID == "ps-1" {
				busy = f.Inject(elastictest.Rule{Method: elastictest.MethodSnapshot, Times: 5, Err: checkpoint.ErrBusy})
			}
			return f
		},
	})
	require.NoError(t, err)
	data := shard.IndexedSource{Data: shard.IndexedFunc(256, func(i int64, rec *shard.Record) error {
		rec.IDs = append(rec.IDs, uint64(i))
		rec.EndField()
		return nil
	})}
	sess, err := job.Session("w0", shard.ReaderConfig{Source: data, BatchSize: 32})
	require.NoError(t, err)
	require.NoError(t, sess.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
		return b.Push(ctx, "emb", b.IDs, make([]float32, 2*len(b.IDs)))
	}))
	step, err := job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), step)
	assert.Len(t, busy.Hits(), 5, "refused five times, then taken")
}
