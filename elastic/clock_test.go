package elastic

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeNow is a clock that moves only when told.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeNow() *fakeNow { return &fakeNow{t: time.Unix(1_700_000_000, 0)} }

func (f *fakeNow) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t
}

func (f *fakeNow) advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t = f.t.Add(d)
}

func TestPausableClock(t *testing.T) {
	f := newFakeNow()
	c := newPausableClock(f.Now)
	t0 := c.Now()
	f.advance(time.Second)
	assert.Equal(t, time.Second, c.Now().Sub(t0))
	c.pause()
	f.advance(time.Hour)
	assert.Equal(t, time.Second, c.Now().Sub(t0), "stands still while paused")
	c.pause() // nested
	f.advance(time.Hour)
	c.resume()
	assert.Equal(t, time.Second, c.Now().Sub(t0), "still paused")
	c.resume()
	assert.Equal(t, time.Second, c.Now().Sub(t0), "resumes where it stopped")
	f.advance(2 * time.Second)
	assert.Equal(t, 3*time.Second, c.Now().Sub(t0))
	c.resume() // unmatched: ignored
	assert.Equal(t, 3*time.Second, c.Now().Sub(t0))
}

// A lease does not age while training is paused for a checkpoint: the worker holding it cannot
// report then, and the batches it holds at the gate would otherwise be applied for a shard
// already handed to another worker.
func TestLeasesDoNotAgeWhileTrainingIsPaused(t *testing.T) {
	ctx := context.Background()
	f := newFakeNow()
	clock := newPausableClock(f.Now)
	d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 50, LeaseTTL: 10 * time.Second,
		Clock: clock, Incarnation: 1})
	require.NoError(t, err)
	l, err := d.Acquire(ctx, "w")
	require.NoError(t, err)

	f.advance(9 * time.Second)
	clock.pause()
	f.advance(time.Minute) // a long snapshot, or a barrier waiting for a silent worker
	assert.Zero(t, d.Expire())
	clock.resume()
	require.NoError(t, d.Report(ctx, "w", l.ID, 10, false), "the lease outlived the pause")

	f.advance(11 * time.Second)
	assert.Equal(t, 1, d.Expire(), "and expires as usual without reports")
}
