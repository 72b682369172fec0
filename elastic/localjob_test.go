package elastic_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A local job loses a parameter server as a crashed process would, and gets it back as a new
// incarnation at the same address, which the coordinator restores; no coordinator restarts
// while a server is down. The job then trains to the failure-free result, and a new
// coordinator takes it over with the restarted server.
func TestLocalJobKillAndRestartServer(t *testing.T) {
	recovered := make(chan elastic.RecoveryEvent, 4)
	job := localFaultJob(t, 2, checkpoint.NewMemStorage(), func(c *elastic.Config) {
		c.HealthEvery = 20 * time.Millisecond
		c.ServerTimeout = 200 * time.Millisecond
		c.ReplaceWait = time.Minute
		c.OnRecovery = func(ev elastic.RecoveryEvent) {
			if ev.Err == nil {
				recovered <- ev
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitRecovery := func() elastic.RecoveryEvent {
		select {
		case ev := <-recovered:
			return ev
		case <-ctx.Done():
			t.Fatal("no recovery")
			return elastic.RecoveryEvent{}
		}
	}

	old := job.Servers[1]
	require.NoError(t, job.KillServer(1))
	_, err := old.Health(ctx)
	require.ErrorIs(t, err, elastic.ErrClosed, "it stopped answering")
	require.Error(t, job.KillServer(1), "it is down already")
	require.ErrorIs(t, job.KillServer(2), elastic.ErrInvalidConfig)
	_, err = job.RestartCoordinator(ctx)
	require.Error(t, err, "a coordinator starts only when every server answers")

	require.NoError(t, job.RestartServer(ctx, 1))
	now := job.Servers[1]
	assert.NotEqual(t, old.Incarnation(), now.Incarnation())
	assert.Equal(t, old.Node(), now.Node(), "the same node id and address")
	ev := waitRecovery()
	assert.Equal(t, []string{"ps-1"}, ev.Replaced)

	// A server that is up is killed first.
	require.NoError(t, job.RestartServer(ctx, 0))
	ev = waitRecovery()
	assert.Equal(t, []string{"ps-0"}, ev.Replaced)

	sess, err := job.NewSession("w0", shard.ReaderConfig{Source: faultData, BatchSize: 64})
	require.NoError(t, err)
	require.NoError(t, (&faultWorker{name: "w0", sess: sess}).run(ctx, trainStep))
	assert.Equal(t, faultExpected(), localRows(job))
	_, err = job.RestartCoordinator(ctx)
	require.NoError(t, err, "a new coordinator takes the restarted servers over")
	_, err = job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	assert.Equal(t, faultExpected(), localRows(job))
}

// The coordinator dies after a snapshot whose commit was not written (here the commit record
// fails to be stored), so its servers hold a snapshot above the newest commit. The coordinator
// that takes the job over counts its steps on above that snapshot, and a checkpoint asked for
// before any more training takes a new snapshot and commits it (it used to wait for the commit
// of the dead coordinator's snapshot, and fail). Training then ends with every row right.
func TestTakeoverAboveAnUncommittedSnapshot(t *testing.T) {
	store := checkpoint.NewFaultStorage(checkpoint.NewMemStorage())
	job := localFaultJob(t, 2, store, func(c *elastic.Config) { c.CheckpointEvery = 0 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sess, err := job.NewSession("w0", shard.ReaderConfig{Source: faultData, BatchSize: 32})
	require.NoError(t, err)
	train := func(n int) {
		for range n {
			require.NoError(t, sess.Step(ctx, trainStep))
		}
	}

	train(10)
	committed, err := job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	train(5)
	store.Inject(checkpoint.Fault{Op: checkpoint.OpCreate, Match: "/commits/"})
	snapped, err := job.Coordinator().Checkpoint(ctx)
	require.Error(t, err, "the commit record is not written")
	store.Clear()
	require.NoError(t, job.Coordinator().WaitCommits(ctx))
	require.Equal(t, committed, job.Coordinator().Status().LastCommit)

	step, err := job.RestartCoordinator(ctx)
	require.NoError(t, err)
	assert.Equal(t, committed, step, "the takeover restores the newest commit")
	again, err := job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err, "a checkpoint with no batch since the takeover")
	assert.Greater(t, again, snapped, "above the snapshot the servers hold")

	require.NoError(t, (&faultWorker{name: "w0", sess: sess}).run(ctx, trainStep))
	assertEveryEpochOnce(t, job.Coordinator())
	assert.Equal(t, faultExpected(), localRows(job), "every row holds every record once per epoch")
}

// Close removes the shared memory the job's servers made, a restarted server's and a stopped
// one's included, unless KeepShm keeps it for a restart on this host.
func TestLocalJobCloseRemovesItsSharedMemory(t *testing.T) {
	ctx := context.Background()
	for _, keep := range []bool{false, true} {
		shm := t.TempDir()
		job, err := local.Start(ctx, local.Config{Job: "shm", Servers: 2, Slots: faultSlots, Tables: []ps.TableSpec{faultTable},
			Coordinator: elastic.Config{Storage: checkpoint.NewMemStorage(), Dispatcher: shard.Config{Dataset: shard.IndexedDataset(faultRecords), ShardSize: 96}},
			Checkpoint:  checkpoint.Config{ShmDir: shm}, KeepShm: keep})
		require.NoError(t, err)
		_, err = job.StartServers(ctx, 1)
		require.NoError(t, err)
		require.NoError(t, trainSteps(ctx, t, job, 4))
		_, err = job.Coordinator().Checkpoint(ctx)
		require.NoError(t, err)
		require.NoError(t, job.StopServers(ctx, []string{"ps-2"}))
		require.NoError(t, job.RestartServer(ctx, 1))
		nodes, err := os.ReadDir(filepath.Join(shm, "shm"))
		require.NoError(t, err)
		require.Len(t, nodes, 3, "a region per server the job made")
		require.NoError(t, job.Close())
		_, err = os.Stat(filepath.Join(shm, "shm"))
		if keep {
			require.NoError(t, err, "kept")
			nodes, err := os.ReadDir(filepath.Join(shm, "shm"))
			require.NoError(t, err)
			assert.Len(t, nodes, 3, "kept")
		} else {
			assert.ErrorIs(t, err, os.ErrNotExist, "removed")
		}
	}
}
