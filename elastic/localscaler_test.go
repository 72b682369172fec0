package elastic_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The in-process scaler runs the workers of a plan: SetParallelism grows the job from one
// worker to three while it trains and shrinks it to two, a worker whose function fails is
// started again (its pushes had landed: the replay lands nowhere), and the job ends with every position trained exactly once per epoch and
// every row equal to the failure-free result.
func TestLocalScalerFollowsThePlan(t *testing.T) {
	store := checkpoint.NewMemStorage()
	job := localFaultJob(t, 2, store, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var batches, crashes, failedTries atomic.Int64
	// reached[n] is closed at the n-th batch; crashing is the worker whose batch fails on every
	// try ("" if none).
	reached := map[int64]chan struct{}{10: make(chan struct{}), 80: make(chan struct{})}
	var crashing atomic.Value
	crashing.Store("")
	step := func(ctx context.Context, b *elastic.Batch) error {
		n := batches.Add(1)
		if ch, ok := reached[n]; ok {
			close(ch)
		}
		if (n == 20 || n == 60) && crashing.CompareAndSwap("", b.Worker()) {
			crashes.Add(1)
		}
		if crashing.Load() != b.Worker() {
			return trainStep(ctx, b)
		}
		// Its pushes land, then the function fails on every try: the session gives the
		// batch up (ErrBatchFailed) and the scaler starts the worker again.
		if err := trainStep(ctx, b); err != nil {
			return err
		}
		if failedTries.Add(1)%3 == 0 { // the first try and the session's 2 retries
			crashing.Store("")
		}
		return errors.New("worker crashed")
	}
	scaler, err := local.NewScaler(local.ScalerConfig{
		Job:         job,
		Reader:      func(string) shard.ReaderConfig { return shard.ReaderConfig{Source: faultData, BatchSize: 32} },
		MaxRestarts: 2,
		Worker:      func(string) (local.StepFunc, error) { return step, nil },
	})
	require.NoError(t, err)
	defer scaler.Close()
	job.SetScaler(scaler)
	c := job.Coordinator()

	require.NoError(t, c.SetParallelism(ctx, 1, 2))
	<-reached[10]
	require.NoError(t, c.SetParallelism(ctx, 3, 2))
	<-reached[80]
	require.NoError(t, c.SetParallelism(ctx, 2, 2))
	require.NoError(t, scaler.Wait(ctx))

	ws := scaler.Workers()
	require.Len(t, ws, 3)
	restarts := 0
	var steps uint64
	for _, w := range ws {
		assert.False(t, w.Running)
		assert.NoError(t, w.Err)
		restarts += w.Restarts
		steps += w.Steps
	}
	assert.Equal(t, 2, restarts, "each crash restarted its worker")
	assert.Equal(t, int64(2), crashes.Load())
	assert.Positive(t, ws[2].Steps, "worker-2, stopped by the last plan, trained before")
	assert.Equal(t, elastic.Plan{Servers: 2, Workers: 2}, c.Status().Plan)

	_, err = c.Checkpoint(ctx)
	require.NoError(t, err)
	assertEveryEpochOnce(t, c)
	assert.Equal(t, faultExpected(), localRows(job), "every row holds every record once per epoch")
}

// A step function that pushes a table twice for one batch is refused: the second push's rows on
// the slots the first reached would be dropped as already applied.
func TestPushingATableTwiceInOneBatchIsRefused(t *testing.T) {
	job := localFaultJob(t, 1, nil, nil)
	sess, err := job.NewSession("w", shard.ReaderConfig{Source: faultData, BatchSize: 8})
	require.NoError(t, err)
	defer sess.Close()
	ctx := context.Background()
	err = sess.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
		if err := b.Push(ctx, "emb", b.IDs[:1], make([]float32, faultDim)); err != nil {
			return err
		}
		return b.Push(ctx, "emb", b.IDs[1:], make([]float32, faultDim*(len(b.IDs)-1)))
	})
	require.ErrorIs(t, err, elastic.ErrPushedTwice)
	require.ErrorIs(t, err, elastic.ErrBatchFailed)
}

// Every worker of a job reads with one batch size, the first joiner's, kept in every commit: a
// worker with another is refused, also by a coordinator resumed from a commit.
func TestWorkersMustShareTheBatchSize(t *testing.T) {
	ctx := context.Background()
	store := checkpoint.NewMemStorage()
	job := localFaultJob(t, 2, store, nil)
	step := func(s *elastic.Session) error { return s.Step(ctx, trainStep) }
	a, err := job.NewSession("a", shard.ReaderConfig{Source: faultData, BatchSize: 32})
	require.NoError(t, err)
	defer a.Close()
	require.NoError(t, step(a))
	b, err := job.NewSession("b", shard.ReaderConfig{Source: faultData, BatchSize: 24})
	require.NoError(t, err)
	defer b.Close()
	require.ErrorIs(t, step(b), elastic.ErrInvalidConfig)
	_, err = job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, a.Close())
	require.NoError(t, job.Close())

	again := localFaultJob(t, 2, store, nil)
	_, _, err = again.Coordinator().Resume(ctx)
	require.NoError(t, err)
	c, err := again.NewSession("c", shard.ReaderConfig{Source: faultData}) // the default, 512
	require.NoError(t, err)
	defer c.Close()
	require.ErrorIs(t, step(c), elastic.ErrInvalidConfig, "the commit holds the job's batch size")
}
