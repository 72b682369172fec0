package elastic

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// halves is a model whose every batch writes two halves, one after the other: it is consistent
// when they are equal.
type halves struct{ a, b atomic.Int64 }

// digestServer is a fakeServer whose digest is the model's halves as they are now.
type digestServer struct {
	*fakeServer
	m *halves
}

func (d digestServer) Digest(context.Context, *ps.OwnerTable) (checkpoint.Digest, error) {
	return checkpoint.Digest{Tables: []checkpoint.TableDigest{{Name: "m", Rows: d.m.a.Load(), Sum: [2]uint64{uint64(d.m.b.Load())}}}}, nil
}

// Digest holds training at a barrier: it waits for the batch in hand to end, so it never sees a
// batch half applied, and the workers wait until it is taken.
func TestDigestWaitsForTheBatchInHand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := &halves{}
	var servers []ParameterServer
	for _, id := range []string{"ps-0", "ps-1"} {
		servers = append(servers, digestServer{&fakeServer{node: ps.Node{ID: id, Addr: id + ":1"}}, m})
	}
	c, err := NewCoordinator(ctx, Config{Job: "j", Servers: servers, Slots: 8, Dispatcher: shard.Config{Dataset: shard.IndexedDataset(100)}})
	require.NoError(t, err)
	defer c.Close()
	epoch, err := c.Join(ctx, "w", 1)
	require.NoError(t, err)

	require.NoError(t, c.Begin(ctx, "w", epoch))
	m.a.Add(1) // half of the batch is applied
	type result struct {
		d   checkpoint.Digest
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := c.Digest(ctx)
		done <- result{d, err}
	}()
	require.NoError(t, c.await(ctx, func() (bool, error) { return c.core.holding, nil }), "the barrier goes up")
	select {
	case r := <-done:
		t.Fatalf("digest taken with a batch half applied: %v %v", r.d, r.err)
	default:
	}
	assert.Equal(t, "held", c.Status().Phase)
	m.b.Add(1)
	require.NoError(t, c.End(ctx, "w", epoch, true))
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, int64(2), r.d.Tables[0].Rows, "both servers' halves, added up")
	assert.Equal(t, uint64(2), r.d.Tables[0].Sum[0])
	assert.Equal(t, uint64(1), r.d.Step, "the step the model is at")

	// The barrier came down: the worker trains on.
	require.NoError(t, c.Begin(ctx, "w", epoch))
	require.NoError(t, c.End(ctx, "w", epoch, true))

	// A digest whose caller gives up before the barrier is reached lets the workers go on.
	require.NoError(t, c.Begin(ctx, "w", epoch))
	short, stop := context.WithCancel(ctx)
	go func() {
		_, err := c.Digest(short)
		done <- result{err: err}
	}()
	require.NoError(t, c.await(ctx, func() (bool, error) { return c.core.holding, nil }))
	stop()
	assert.ErrorIs(t, (<-done).err, context.Canceled)
	require.NoError(t, c.End(ctx, "w", epoch, true))
	require.NoError(t, c.await(ctx, func() (bool, error) { return c.core.phase == phaseIdle, nil }), "the barrier comes down")
	require.NoError(t, c.Begin(ctx, "w", epoch))
	require.NoError(t, c.End(ctx, "w", epoch, true))
}
