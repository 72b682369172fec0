package elastic_test

import (
	"context"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A coordinator that another one takes the job over from learns it by itself (its health
// checks find the servers following the later incarnation) and says so on Done, with Err
// wrapping ErrSuperseded, without anyone calling it: a program's run loop ends at once instead
// of serving a job that is no longer its own. Close closes Done too.
func TestSupersededCoordinatorIsDone(t *testing.T) {
	store := checkpoint.NewMemStorage()
	j := startRemoteJob(t, 2, store, func(c *elastic.Config) { c.HealthEvery = 20 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, _, stop1, err := j.coordinator(ctx, "coord", false)
	require.NoError(t, err)
	j.stopC = stop1
	w := j.remoteWorker("w0")
	for range 10 {
		require.NoError(t, w.sess.Step(ctx, trainStep))
	}
	_, err = first.Checkpoint(ctx)
	require.NoError(t, err)
	select {
	case <-first.Done():
		t.Fatalf("Done before any takeover: %v", first.Err())
	default:
	}
	require.NoError(t, first.Err())

	second, _, stop2, err := j.coordinator(ctx, "coord2", true)
	require.NoError(t, err)
	j.stopC = func() { stop2(); stop1() }
	select {
	case <-first.Done():
	case <-ctx.Done():
		t.Fatal("the coordinator taken over never said it stopped")
	}
	assert.ErrorIs(t, first.Err(), elastic.ErrSuperseded)
	require.NoError(t, first.Close())
	assert.ErrorIs(t, first.Err(), elastic.ErrSuperseded, "Close keeps the reason it stopped")

	select {
	case <-second.Done():
		t.Fatalf("the coordinator that took over is done: %v", second.Err())
	default:
	}
	require.NoError(t, second.Close())
	<-second.Done()
	assert.ErrorIs(t, second.Err(), elastic.ErrClosed)
}
