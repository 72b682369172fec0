package elastic_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
)

// OnProgress hears every kind of progress in order, and WaitStep waits for a step without
// polling, and ends once the data is done.
func TestProgressEventsAndWaitStep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := twinConfig(t.TempDir(), 400)
	var mu sync.Mutex
	var events []elastic.ProgressEvent
	commits := make(chan uint64, 100)
	cfg.Coordinator.OnProgress = func(ev elastic.ProgressEvent) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
		if ev.Kind == elastic.EventCheckpoint && ev.Checkpoint.Commit {
			commits <- ev.Checkpoint.Step
		}
	}
	job, err := local.Start(ctx, cfg)
	require.NoError(t, err)
	defer job.Close()
	c := job.Coordinator()

	reached := make(chan uint64, 1)
	go func() {
		step, err := c.WaitStep(ctx, 30)
		assert.NoError(t, err)
		reached <- step
	}()
	trained := twinWorkers(ctx, t, job, 400)
	assert.GreaterOrEqual(t, <-reached, uint64(30))
	<-trained
	last, err := c.WaitStep(ctx, 1<<40)
	require.ErrorIs(t, err, elastic.ErrStopped, "the data is done: step %d is the last", last)
	require.EqualValues(t, 160, last, "two epochs of 80 batches")
	added, err := job.StartServers(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, c.AddServers(ctx, added...))
	require.NoError(t, c.WaitCommits(ctx)) // a loaded machine's backlog first
	_, err = c.Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, c.WaitCommits(ctx))

	// The events arrive on their own goroutine: wait for the last one, the commit above.
	st := c.Status()
	for step := uint64(0); step != last; {
		select {
		case step = <-commits:
		case <-ctx.Done():
			t.Fatal("the last commit's event never came")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var step uint64
	kinds := map[elastic.EventKind]int{}
	for _, ev := range events {
		kinds[ev.Kind]++
		require.GreaterOrEqual(t, ev.Step, step, "%v after step %d", ev.Kind, step)
		step = ev.Step
		switch ev.Kind {
		case elastic.EventCheckpoint: // a scheduled one may fail on a loaded machine (checkpoint.ErrBusy)
			assert.LessOrEqual(t, ev.Checkpoint.Step, ev.Step)
		case elastic.EventMove:
			assert.Equal(t, 2, ev.Move.From)
			assert.Equal(t, 3, ev.Move.To)
			assert.Empty(t, ev.Move.Err)
			assert.Equal(t, last, ev.Step)
		}
	}
	assert.Equal(t, last, step)
	assert.Equal(t, 1, kinds[elastic.EventMove])
	assert.Equal(t, st.Snapshots+st.Commits+st.CheckpointFailures, kinds[elastic.EventCheckpoint], "one per snapshot and per commit, or their failure")
	assert.Positive(t, kinds[elastic.EventStep])
	assert.LessOrEqual(t, kinds[elastic.EventStep], int(last), "steps fold while the callback is busy, never repeat")
	assert.Zero(t, kinds[elastic.EventRecovery])
}
