package elastic

import (
	"context"
	"testing"
	"time"

	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPausableClock(t *testing.T) {
	f := shardtest.NewClock(time.Unix(1_700_000_000, 0))
	c := newPausableClock(f.Now)
	t0 := c.Now()
	f.Advance(time.Second)
	assert.Equal(t, time.Second, c.Now().Sub(t0))
	c.pause()
	f.Advance(time.Hour)
	assert.Equal(t, time.Second, c.Now().Sub(t0), "stands still while paused")
	c.pause() // nested
	f.Advance(time.Hour)
	c.resume()
	assert.Equal(t, time.Second, c.Now().Sub(t0), "still paused")
	c.resume()
	assert.Equal(t, time.Second, c.Now().Sub(t0), "resumes where it stopped")
	f.Advance(2 * time.Second)
	assert.Equal(t, 3*time.Second, c.Now().Sub(t0))
	c.resume() // unmatched: ignored
	assert.Equal(t, 3*time.Second, c.Now().Sub(t0))
}

// A lease does not age while training is paused for a checkpoint: the worker holding it cannot
// report then, and the batches it holds at the gate would otherwise be applied for a shard
// already handed to another worker.
func TestLeasesDoNotAgeWhileTrainingIsPaused(t *testing.T) {
	ctx := context.Background()
	f := shardtest.NewClock(time.Unix(1_700_000_000, 0))
	clock := newPausableClock(f.Now)
	d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 50, LeaseTTL: 10 * time.Second,
		Clock: clock, Incarnation: 1})
	require.NoError(t, err)
	l, err := d.Acquire(ctx, "w")
	require.NoError(t, err)

	f.Advance(9 * time.Second)
	clock.pause()
	f.Advance(time.Minute) // a long snapshot, or a barrier waiting for a silent worker
	assert.Zero(t, d.Expire())
	clock.resume()
	require.NoError(t, d.Report(ctx, "w", l.ID, 10, false), "the lease outlived the pause")

	f.Advance(11 * time.Second)
	assert.Equal(t, 1, d.Expire(), "and expires as usual without reports")
}
