package elastic_test

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
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
		require.Empty(t, s.UsageError)
		assert.Zero(t, s.Busy, "%s before any batch", s.ID)
	}

	// Both workers train, then each holds its batch once 40 have begun: the reading is of
	// two members, with no batch ending meanwhile.
	var begun, holding atomic.Int64
	held, release := make(chan struct{}), make(chan struct{})
	releaseAll := sync.OnceFunc(func() { close(release) })
	defer releaseAll() // before the scaler's cleanup waits for the workers
	scaler, _ := trainers(t, job, func(ctx context.Context, b *elastic.Batch) error {
		if begun.Add(1) > 40 {
			if holding.Add(1) == 2 {
				close(held)
			}
			<-release
			return trainStep(ctx, b)
		}
		return trainStep(ctx, b)
	})
	require.NoError(t, c.SetParallelism(ctx, 2, 2))
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the workers did not both reach their held batch")
	}
	u, err = c.Usage(ctx)
	require.NoError(t, err)
	require.Len(t, u.Workers, 2)
	var steps uint64
	for _, w := range u.Workers {
		assert.Positive(t, w.Steps, w.ID)
		assert.Positive(t, w.Busy, w.ID)
		assert.True(t, w.InBatch, w.ID)
		steps += w.Steps
	}
	assert.Equal(t, u.Step, steps, "every step applied and reported is a worker's")
	for _, s := range u.Servers {
		require.Empty(t, s.UsageError)
		assert.Positive(t, s.Busy, s.ID)
		assert.Positive(t, s.MemoryBytes, s.ID)
		assert.Greater(t, s.Uptime, s.Busy, s.ID)
		tab, ok := job.Servers[map[string]int{"ps-0": 0, "ps-1": 1}[s.ID]].Server().Table("emb")
		require.True(t, ok)
		assert.Equal(t, tab.MemoryBytes(), s.MemoryBytes, s.ID)
		assert.Equal(t, os.Getpid(), s.Pid, "an in-process server's process is the test's")
		assert.NotEmpty(t, s.Host)
		assert.Positive(t, s.CPU, s.ID)
		assert.Positive(t, s.ResidentBytes, s.ID)
		assert.True(t, s.SharedProcess, "%s runs in the coordinator's process", s.ID)
	}
	releaseAll()
	require.NoError(t, scaler.Wait(ctx))
}

// TestServerStatusUse: a server's memory is its cgroup's charge where its process has a memory
// cgroup with a limit (the kernel holds the charge, not the resident memory, against it), else
// its resident memory, and its tables' memory where the process is not its own.
func TestServerStatusUse(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name string
		s    elastic.ServerStatus
		mem  int64
		own  bool
	}{
		{"cgroup", elastic.ServerStatus{Pid: 7, MemoryBytes: 40 * mib, ResidentBytes: 160 * mib, CgroupBytes: 90 * mib, CgroupLimitBytes: 112 * mib}, 90 * mib, true},
		{"no limit", elastic.ServerStatus{Pid: 7, MemoryBytes: 40 * mib, ResidentBytes: 160 * mib}, 160 * mib, true},
		{"no resident", elastic.ServerStatus{Pid: 7, MemoryBytes: 40 * mib}, 40 * mib, true},
		{"shared", elastic.ServerStatus{Pid: 7, SharedProcess: true, MemoryBytes: 40 * mib, ResidentBytes: 160 * mib, CgroupBytes: 90 * mib, CgroupLimitBytes: 112 * mib}, 40 * mib, false},
		{"unread", elastic.ServerStatus{MemoryBytes: 40 * mib}, 40 * mib, false},
	} {
		mem, own := tc.s.Use()
		assert.Equal(t, tc.mem, mem, tc.name)
		assert.Equal(t, tc.own, own, tc.name)
	}
}
