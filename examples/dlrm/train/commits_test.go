package train

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slowStorage holds every manifest write until release is closed (a storage that fell behind),
// telling blocked about each write it holds.
type slowStorage struct {
	checkpoint.Storage
	release chan struct{}
	blocked chan string
}

func newSlowStorage() *slowStorage {
	return &slowStorage{Storage: checkpoint.NewMemStorage(), release: make(chan struct{}), blocked: make(chan string, 64)}
}

func (s *slowStorage) Create(ctx context.Context, name string) (checkpoint.Writer, error) {
	if strings.HasSuffix(name, "/manifest") {
		select {
		case <-s.release:
		default:
			s.blocked <- name
			select {
			case <-s.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return s.Storage.Create(ctx, name)
}

// testCheckpoints is one server with one table, checkpointed into st with a commit queue of size
// backlog: the embedded trainer's checkpoints without the rest of the run.
func testCheckpoints(t *testing.T, st checkpoint.Storage, backlog, fullEvery int) *checkpoints {
	t.Helper()
	srv, err := ps.NewServer(ps.ServerConfig{ID: "ps-0", Secret: []byte("s"), Slots: 64,
		Tables: []ps.TableSpec{{Name: "emb.a", Config: embedding.Config{Dim: 4}}}})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	tab, _ := srv.Table("emb.a")
	require.NoError(t, tab.Lookup([]uint64{1, 2, 3}, make([]float32, 12)))
	shm := t.TempDir()
	ck, err := checkpoint.New(checkpoint.Config{Job: jobName, Node: "ps-0", Tables: map[string]checkpoint.Table{"emb.a": tab},
		Storage: st, Slots: 64, ShmDir: shm, FullEvery: fullEvery})
	require.NoError(t, err)
	committer, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: jobName, Storage: st})
	require.NoError(t, err)
	slots := make([]int, 64)
	for i := range slots {
		slots[i] = i
	}
	c := &checkpoints{committer: committer, nodes: []ckptNode{{srv: srv, ck: ck, slots: slots}}, shmDir: shm,
		logger: discardLogger(), emit: func(EventKind, CheckpointEvent) {}}
	c.last = make([]uint64, len(c.nodes))
	c.commits = newCommitQueue(committer, backlog, c.persisted, c.committed)
	t.Cleanup(func() { c.Close() })
	return c
}

// take reserves room and snapshots step, as run.checkpoint does.
func take(ctx context.Context, c *checkpoints, step uint64, final bool) (CheckpointEvent, error) {
	if err := c.room(ctx, final); err != nil {
		return CheckpointEvent{Step: step, Skipped: true, Err: err}, err
	}
	ev, _ := c.snapshot(ctx, step, nil, final)
	return ev, ev.Err
}

// With storage so slow that the commit queue is full, a periodic checkpoint is skipped at once
// (it never waits for storage while training is paused, and takes no lock the commit goroutine
// needs), and the final one waits for room and is committed once storage catches up.
func TestCheckpointNeverWaitsForAFullCommitQueue(t *testing.T) {
	st := newSlowStorage()
	c := testCheckpoints(t, st, 1, 5)
	ctx := context.Background()

	_, err := take(ctx, c, 1, false)
	require.NoError(t, err)
	<-st.blocked // the commit goroutine waits for the persist of step 1, which waits for storage

	done := make(chan error)
	go func() {
		_, err := take(ctx, c, 2, false)
		c.Stats() // the commit goroutine's lock is free
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, errCommitsBehind)
	case <-time.After(10 * time.Second):
		t.Fatal("a checkpoint waited for storage with training paused")
	}
	st0 := c.Stats()
	assert.Equal(t, 1, st0.Taken)
	assert.Equal(t, 1, st0.Skipped)

	final := make(chan CheckpointEvent)
	go func() {
		ev, _ := take(ctx, c, 3, true)
		final <- ev
	}()
	close(st.release)
	ev := <-final
	require.NoError(t, ev.Err)
	c.finish()
	s := c.Stats()
	assert.Equal(t, 2, s.Taken)
	assert.Equal(t, 2, s.Committed)
	assert.Equal(t, uint64(3), s.LastCommitted, "the final checkpoint is committed")
	assert.Zero(t, s.Failed)
}

// A periodic checkpoint that finds both generations of a server still being persisted is
// skipped and does not count as taken, so the final checkpoint at the same step is still taken:
// it waits for the persists (Flush) instead of being skipped.
func TestFinalCheckpointWaitsForBusyGenerations(t *testing.T) {
	st := newSlowStorage()
	c := testCheckpoints(t, st, commitBacklog, 1) // every snapshot full: each needs a free generation
	ctx := context.Background()

	_, err := take(ctx, c, 1, false)
	require.NoError(t, err)
	<-st.blocked
	_, err = take(ctx, c, 2, false)
	require.NoError(t, err)
	ev, err := take(ctx, c, 3, false)
	require.ErrorIs(t, err, checkpoint.ErrBusy)
	assert.True(t, ev.Skipped)
	assert.Equal(t, 1, c.Stats().Skipped)

	// While storage stays stuck the final snapshot waits for it (until its context ends) rather
	// than giving up with ErrBusy.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	ev, err = take(short, c, 3, true)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.False(t, ev.Skipped)

	close(st.release)
	_, err = take(ctx, c, 3, true)
	require.NoError(t, err)
	c.finish()
	s := c.Stats()
	assert.Equal(t, uint64(3), s.LastCommitted, "the final checkpoint holds the last step")
	assert.Equal(t, 3, s.Committed)
}

// A step that some servers snapshotted in an attempt that failed on another is not asked of
// them again (the checkpointer refuses a repeated step); the others take it, and it commits.
func TestCheckpointRetryKeepsNodesThatSnapshotted(t *testing.T) {
	c := testCheckpoints(t, checkpoint.NewMemStorage(), commitBacklog, 5)
	ctx := context.Background()
	n := c.nodes[0]
	dense, err := encodeDense(n.srv)
	require.NoError(t, err)
	_, err = n.ck.Snapshot(ctx, 4, checkpoint.SnapshotSlots(n.slots), checkpoint.SnapshotBlob(denseBlobName, dense))
	require.NoError(t, err)
	c.last[0] = 4 // as if step 4 failed elsewhere after this server took it

	_, err = take(ctx, c, 4, true)
	require.NoError(t, err)
	c.finish()
	assert.Equal(t, uint64(4), c.Stats().LastCommitted)
}

// The commit queue commits one snapshot at a time, in the order they were queued.
func TestCommitQueueIsSerial(t *testing.T) {
	committer, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: jobName, Storage: checkpoint.NewMemStorage()})
	require.NoError(t, err)
	var inFlight, most atomic.Int32
	var mu sync.Mutex
	var order []uint64
	hold := make(chan struct{})
	q := newCommitQueue(committer, 8,
		func(ctx context.Context, step uint64) ([]checkpoint.ManifestRef, int64, error) {
			<-hold
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			if n > most.Load() {
				most.Store(n)
			}
			mu.Lock()
			order = append(order, step)
			mu.Unlock()
			return nil, 0, nil
		},
		func(pendingCommit, int64, error) {})
	for s := uint64(1); s <= 8; s++ {
		require.NoError(t, q.reserve(context.Background(), false))
		q.push(pendingCommit{step: s})
	}
	require.ErrorIs(t, q.reserve(context.Background(), false), errCommitsBehind, "eight queued: no room")
	close(hold)
	q.finish()
	assert.Equal(t, int32(1), most.Load())
	assert.Equal(t, []uint64{1, 2, 3, 4, 5, 6, 7, 8}, order)
}
