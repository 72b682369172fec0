package train

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
)

// commitBacklog is how many snapshots may wait for their commit. A periodic checkpoint finding
// no room is skipped (persisting is that far behind); the final one waits for room.
const commitBacklog = 64

// errCommitsBehind is the reason given for a checkpoint skipped because commitBacklog
// snapshots are waiting for their commit.
var errCommitsBehind = errors.New("train: checkpoint skipped: too many snapshots waiting to be committed")

// pendingCommit is a snapshot waiting for its commit.
type pendingCommit struct {
	step  uint64
	blobs []checkpoint.Blob
	taken time.Time
	full  bool
}

// commitQueue commits snapshots in the background, one at a time and in the order they were
// taken: for each, it waits until every node has persisted its part (persisted), writes the
// job-level commit (after which the Committer applies retention) and hands the outcome to done.
// One goroutine does all of it, so commits never overlap each other or retention.
//
// A snapshot's place in the queue is reserved before it is taken (reserve), and given back if it
// is not taken (release), so adding it (push) never blocks: whoever takes a snapshot holds
// training paused and must not wait for storage.
type commitQueue struct {
	committer *checkpoint.Committer
	persisted func(ctx context.Context, step uint64) ([]checkpoint.ManifestRef, int64, error)
	done      func(p pendingCommit, stored int64, err error)

	room   chan struct{} // one token per reserved or queued snapshot
	queue  chan pendingCommit
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
	wg     sync.WaitGroup
}

// newCommitQueue starts the commit goroutine. persisted returns every node's manifest of a step
// and the bytes stored for it; done is called from the commit goroutine after each commit.
func newCommitQueue(committer *checkpoint.Committer, size int,
	persisted func(ctx context.Context, step uint64) ([]checkpoint.ManifestRef, int64, error),
	done func(p pendingCommit, stored int64, err error)) *commitQueue {
	q := &commitQueue{committer: committer, persisted: persisted, done: done,
		room: make(chan struct{}, size), queue: make(chan pendingCommit, size)}
	q.ctx, q.cancel = context.WithCancel(context.Background())
	q.wg.Add(1)
	go q.loop()
	return q
}

// reserve takes a place for the next snapshot. Without wait it fails at once with
// errCommitsBehind when the queue is full; with wait it waits for a place until ctx ends.
func (q *commitQueue) reserve(ctx context.Context, wait bool) error {
	select {
	case q.room <- struct{}{}:
		return nil
	default:
	}
	if !wait {
		return errCommitsBehind
	}
	select {
	case q.room <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for earlier commits: %w", ctx.Err())
	}
}

// release gives back a place reserved for a snapshot that was not taken.
func (q *commitQueue) release() { <-q.room }

// push queues a snapshot for its commit, using the place reserved for it.
func (q *commitQueue) push(p pendingCommit) { q.queue <- p }

func (q *commitQueue) loop() {
	defer q.wg.Done()
	for p := range q.queue {
		stored, err := q.commit(p)
		<-q.room
		q.done(p, stored, err)
	}
}

func (q *commitQueue) commit(p pendingCommit) (int64, error) {
	ctx, cancel := context.WithTimeout(q.ctx, persistTimeout)
	defer cancel()
	refs, stored, err := q.persisted(ctx, p.step)
	if err != nil {
		return 0, fmt.Errorf("persist of step %d: %w", p.step, err)
	}
	if _, err := q.committer.Commit(ctx, p.step, refs, p.blobs...); err != nil {
		return 0, fmt.Errorf("commit of step %d: %w", p.step, err)
	}
	return stored, nil
}

// finish waits for every queued commit; nothing may be reserved or pushed afterwards.
// Idempotent.
func (q *commitQueue) finish() {
	q.once.Do(func() { close(q.queue) })
	q.wg.Wait()
}

// abort abandons the queued commits (they fail at once) and waits for the goroutine.
func (q *commitQueue) abort() {
	q.cancel()
	q.finish()
}
