package elastic_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/shard"
)

// The coordinator's dispatcher, as workers reach it in process, wakes a worker waiting for a
// shard when one comes back, and ends the wait when the coordinator closes.
func TestServiceWakesAWaitingWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job, err := local.Start(ctx, local.Config{Job: "await", Slots: 16,
		Coordinator: elastic.Config{Dispatcher: shard.Config{Dataset: shard.IndexedDataset(10), ShardSize: 10, RetryAfter: time.Hour}}})
	require.NoError(t, err)
	defer job.Close()
	c := job.Coordinator()
	svc := c.Service()
	_, err = svc.Acquire(ctx, "a")
	require.NoError(t, err)
	_, err = svc.Acquire(ctx, "b")
	require.ErrorIs(t, err, shard.ErrWait)

	woke := make(chan error, 1)
	go func() { woke <- shard.AwaitShard(ctx, svc) }()
	require.NoError(t, svc.Leave(ctx, "a"))
	require.NoError(t, <-woke, "the shard came back")
	_, err = svc.Acquire(ctx, "b")
	require.NoError(t, err)

	go func() { woke <- shard.AwaitShard(ctx, svc) }()
	require.NoError(t, c.Close())
	assert.ErrorIs(t, <-woke, elastic.ErrClosed)
}
