package elastic_test

import (
	"context"
	"io"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A batch applied on every server before a commit and reported only after it (its worker died
// between its pushes and its report, and the batch was trained again after the commit, the
// servers skipping it) is in the rows of that commit. A Partial recovery from it reports the batch held with the restored slots it holds,
// not lost, and the rows equal the failure-free result but for the updates it reports lost.
func TestPartialRecoveryDoesNotCountHeldBatchesLost(t *testing.T) {
	recovered := make(chan elastic.RecoveryEvent, 4)
	job := localFaultJob(t, 3, checkpoint.NewMemStorage(), func(c *elastic.Config) {
		c.Recovery = elastic.Partial
		c.CheckpointEvery = 1 << 20 // the test's checkpoints only
		c.HealthEvery = 20 * time.Millisecond
		c.ServerTimeout = 200 * time.Millisecond
		c.ReplaceWait = time.Minute
		c.WorkerSilence = 300 * time.Millisecond
		c.ArriveTimeout = time.Second
		c.OnRecovery = func(ev elastic.RecoveryEvent) {
			if ev.Err == nil {
				recovered <- ev
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sess, err := job.NewSession("w0", shard.ReaderConfig{Source: faultData, BatchSize: 32})
	require.NoError(t, err)
	for range 3 {
		require.NoError(t, sess.Step(ctx, trainStep))
	}
	// Worker w1 trains a batch and dies between its pushes and its report.
	dying, err := job.NewSession("w1", shard.ReaderConfig{Source: faultData, BatchSize: 32})
	require.NoError(t, err)
	var held ps.Position
	var from, to int64 // its dataset positions
	var ids []uint64
	dead := make(chan error, 1)
	go func() {
		defer close(dead)
		dead <- dying.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
			if err := trainStep(ctx, b); err != nil {
				return err
			}
			held, from, to, ids = b.Position(), b.Shard.Global(b.Start), b.Shard.Global(b.End), slices.Clone(b.IDs)
			runtime.Goexit()
			return nil
		})
	}()
	require.NoError(t, <-dead, "w1 died in its step function")
	require.NotZero(t, held.End, "w1 trained its batch")
	// w0 trains on, and the job commits once w1 is found dead: the batch is in the servers'
	// rows and was not reported.
	require.NoError(t, sess.Step(ctx, trainStep))
	step, err := job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	// The data is trained to its end (the batch again among it).
	for err = nil; err == nil; err = sess.Step(ctx, trainStep) {
	}
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, sess.Close())

	// The server that holds the batch's first row fails and is replaced.
	table, err := job.Coordinator().OwnerTable(ctx, 0)
	require.NoError(t, err)
	victim := table.Owner(embedding.Slot(ids[0], faultSlots)).ID
	i := slices.Index([]string{elastic.ServerID(0), elastic.ServerID(1), elastic.ServerID(2)}, victim)
	require.GreaterOrEqual(t, i, 0)
	failed := table.SlotsOf(victim)
	require.NoError(t, job.KillServer(i))
	require.NoError(t, job.RestartServer(ctx, i))
	var ev elastic.RecoveryEvent
	select {
	case ev = <-recovered:
	case <-ctx.Done():
		t.Fatal("no recovery")
	}
	require.Equal(t, step, ev.Step, "restored from the commit that holds the batch")

	var wantSlots []int
	for _, id := range ids {
		if s := embedding.Slot(id, faultSlots); failed.Has(s) {
			wantSlots = append(wantSlots, s)
		}
	}
	slices.Sort(wantSlots)
	wantSlots = slices.Compact(wantSlots)
	assert.Contains(t, ev.Held, elastic.Span{Epoch: int(held.Epoch), From: from, To: to, Table: "emb", Slots: wantSlots},
		"the batch is held on the restored slots it updated")
	var n int64
	for _, sp := range ev.Lost {
		n += sp.To - sp.From
		assert.False(t, sp.Epoch == int(held.Epoch) && sp.From < to && from < sp.To, "held positions %d-%d counted lost in %+v", from, to, sp)
	}
	assert.Equal(t, ev.LostRecords, n, "LostRecords counts Lost")
	assert.Positive(t, n, "the batches after the commit were lost on the failed slots")

	// The rows: every record once per epoch, but the updates of Lost on the failed slots.
	want := faultExpected()
	withoutLost(want, ev.Lost, failed)
	assert.Equal(t, want, localRows(job), "the held batch's updates are in the restored rows")
	if t.Failed() {
		t.Logf("held %v (positions %d-%d); recovery: lost %v, held %v", held, from, to, ev.Lost, ev.Held)
	}
}
