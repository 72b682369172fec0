package elastic_test

import (
	"context"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Usage reports every server's serving time and table memory and every worker's batches: the
// workers' steps add up to the coordinator's, and the servers that hold rows served them.
func TestUsage(t *testing.T) {
	job := localFaultJob(t, 2, checkpoint.NewMemStorage(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := job.Coordinator()
	u, err := c.Usage(ctx)
	require.NoError(t, err)
	require.Len(t, u.Servers, 2)
	assert.Empty(t, u.Workers)
	for _, s := range u.Servers {
		require.NoError(t, s.Err)
		assert.Zero(t, s.Busy, "%s before any batch", s.ID)
	}

	scaler, _ := trainers(t, job, nil)
	require.NoError(t, c.SetParallelism(ctx, 2, 2))
	require.NoError(t, scaler.Wait(ctx))
	u, err = c.Usage(ctx)
	require.NoError(t, err)
	require.Len(t, u.Workers, 2)
	var steps uint64
	for _, w := range u.Workers {
		assert.Positive(t, w.Steps, w.ID)
		assert.Positive(t, w.Busy, w.ID)
		steps += w.Steps
	}
	assert.Equal(t, c.Status().Step, steps)
	for _, s := range u.Servers {
		require.NoError(t, s.Err)
		assert.Positive(t, s.Busy, s.ID)
		assert.Positive(t, s.MemoryBytes, s.ID)
		assert.Greater(t, s.Uptime, s.Busy, s.ID)
		tab, ok := job.Servers[map[string]int{"ps-0": 0, "ps-1": 1}[s.ID]].Server().Table("emb")
		require.True(t, ok)
		assert.Equal(t, tab.MemoryBytes(), s.MemoryBytes, s.ID)
	}
}
