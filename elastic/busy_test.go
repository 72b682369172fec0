package elastic_test

import (
	"context"
	"errors"
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
	stepper(t, ctx, job)()
	step, err := job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), step)
	assert.Len(t, busy.Hits(), 5, "refused five times, then taken")
}

// A checkpoint asked for while Config.CommitBacklog snapshots wait for their commit (storage
// is slow) is refused at first (elastic.ErrCommitsBehind), as a scheduled one is: Checkpoint,
// and the final checkpoint of Finish, take it again once the commits in the way are done.
func TestCheckpointWaitsOutTheCommitBacklog(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	storage := checkpoint.NewFaultStorage(checkpoint.NewMemStorage())
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	behind := make(chan struct{}, 1)
	snapped := make(chan uint64, 8)
	job, err := elastictest.Start(ctx, elastictest.Config{T: t, Servers: 1,
		Tables: []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 2}}},
		Coordinator: elastic.Config{Storage: storage, CommitBacklog: 1,
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(256), ShardSize: 32},
			OnCheckpoint: func(ev elastic.CheckpointEvent) {
				if !ev.Commit && ev.Err == nil {
					snapped <- ev.Step
				}
				if errors.Is(ev.Err, elastic.ErrCommitsBehind) {
					select {
					case behind <- struct{}{}:
					default:
					}
				}
			}},
	})
	require.NoError(t, err)
	step := stepper(t, ctx, job)
	step()
	// The first commit hangs in storage (and then fails).
	storage.Inject(checkpoint.Fault{Op: checkpoint.OpRename, Nth: 1, Hold: hold, Reached: held})
	first := make(chan error, 1)
	go func() { _, err := job.Coordinator().Checkpoint(ctx); first <- err }()
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the first commit never reached storage")
	}
	// The second snapshot waits in the backlog; the third finds it full.
	step()
	second := make(chan error, 1)
	go func() { _, err := job.Coordinator().Checkpoint(ctx); second <- err }()
	for s := uint64(0); s != 2; {
		select {
		case s = <-snapped:
		case <-ctx.Done():
			t.Fatal("the second snapshot never came")
		}
	}
	step()
	third := make(chan error, 1)
	var got uint64
	go func() {
		var err error
		got, err = job.Coordinator().Checkpoint(ctx)
		third <- err
	}()
	select {
	case <-behind:
	case err := <-third:
		t.Fatalf("the third checkpoint returned while the first commit was held: %v", err)
	}
	close(hold)
	<-first // its commit failed, or a later one covers its step
	<-second
	require.NoError(t, <-third, "the third checkpoint was taken again once the backlog cleared")
	assert.Equal(t, uint64(3), got)
}

// stepper returns a step of worker w0 of job over 256 indexed records, batches of 32, each
// pushing a gradient of zeros to table "emb" (of dimension 2): what these tests checkpoint.
func stepper(t *testing.T, ctx context.Context, job *elastictest.Job) func() {
	t.Helper()
	data := shard.IndexedSource{Data: shard.IndexedFunc(256, func(i int64, rec *shard.Record) error {
		rec.IDs = append(rec.IDs, uint64(i))
		rec.EndField()
		return nil
	})}
	sess, err := job.Session("w0", shard.ReaderConfig{Source: data, BatchSize: 32})
	require.NoError(t, err)
	return func() {
		require.NoError(t, sess.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
			return b.Push(ctx, "emb", b.IDs, make([]float32, 2*len(b.IDs)))
		}))
	}
}
