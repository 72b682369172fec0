package train

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/ps"
	"golang.org/x/sync/errgroup"
)

// jobName names the training job in checkpoint storage and shared memory.
const jobName = "dlrm"

// Names of the coordinator's blobs in a commit.
const (
	blobDispatcher = "dispatcher"
	blobLedger     = "ledger"
	blobMeta       = "meta"
)

// persistTimeout bounds the wait for a checkpoint's persist before its commit is abandoned.
const persistTimeout = 10 * time.Minute

// CheckpointStats are the checkpoint figures of a run.
type CheckpointStats struct {
	Dir    string // storage directory
	ShmDir string // shared-memory tier
	// Taken counts snapshots (Full of them full), Committed those committed, Skipped those not
	// taken because the previous one was still being persisted, Failed those that failed.
	Taken, Full, Committed, Skipped, Failed int
	LastCommitted                           uint64 // step of the newest commit
	// TotalBlocked and MaxBlocked are the time training waited for snapshots: closing the
	// gate (finishing the batches being applied), copying every server's rows into shared
	// memory and taking the dispatcher's and ledger's state.
	TotalBlocked, MaxBlocked time.Duration
	Copied                   int64 // bytes copied into shared memory
	Stored                   int64 // bytes written to storage (compressed)
	// MaxPersist is the longest time from a snapshot to its commit.
	MaxPersist time.Duration
}

// MeanBlocked returns the mean blocking time of a snapshot.
func (s CheckpointStats) MeanBlocked() time.Duration {
	if s.Taken == 0 {
		return 0
	}
	return s.TotalBlocked / time.Duration(s.Taken)
}

// CheckpointEvent describes one snapshot or one commit.
type CheckpointEvent struct {
	Step    uint64
	Full    bool
	Bytes   int64         // copied into shared memory (snapshot)
	Blocked time.Duration // training paused (snapshot)
	Persist time.Duration // from snapshot to commit (commit)
	Stored  int64         // written to storage by this persist (commit)
	Err     error         // a failed snapshot or commit; Skipped when the previous one was busy
	Skipped bool
}

// ckptNode is one parameter server's checkpointer.
type ckptNode struct {
	srv   *ps.Server
	ck    *checkpoint.Checkpointer
	slots []int
}

// checkpoints drives the checkpoints of the embedded cluster: snapshots at the gate, persists
// in the background, commits in step order (commitQueue).
type checkpoints struct {
	storage   *checkpoint.FSStorage
	committer *checkpoint.Committer
	nodes     []ckptNode
	shmDir    string
	ownShm    bool // shmDir was chosen here (not configured) and may be removed
	keepShm   bool
	logger    *slog.Logger
	emit      func(kind EventKind, ev CheckpointEvent)
	commits   *commitQueue
	// last holds, per node, the newest step it snapshotted, in a checkpoint that may have failed
	// on another node. Used only by snapshot (one at a time).
	last []uint64

	mu       sync.Mutex
	stats    CheckpointStats
	lastSnap uint64 // step of the newest snapshot taken on every node (or restored)
}

// openCheckpoints opens storage and one Checkpointer per server over its embedding tables (the
// same set on every server). Without resume, earlier checkpoints of the job and every
// shared-memory region of the job (those of servers an earlier run had and this one has not
// included) are deleted first. If it fails, it leaves no region it created behind.
func openCheckpoints(ctx context.Context, cfg *Config, srvs *servers, tables []string, emit func(EventKind, CheckpointEvent)) (*checkpoints, error) {
	st, err := checkpoint.NewFSStorage(cfg.CheckpointDir)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = discardLogger()
	}
	committer, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: jobName, Storage: st, Logger: logger})
	if err != nil {
		return nil, err
	}
	shmDir, prev, err := placeShm(cfg, "")
	if err != nil {
		return nil, err
	}
	if prev != "" {
		// Regions an earlier run kept elsewhere: no run would find them again.
		if err := deleteRegions(prev, nil, false); err != nil {
			logger.Warn("shared memory of an earlier run left behind", "dir", prev, "err", err)
		}
	}
	if !cfg.Resume {
		if err := wipeStorage(ctx, st); err != nil {
			return nil, err
		}
		if err := deleteRegions(shmDir, nil, false); err != nil {
			return nil, err
		}
	}
	c := &checkpoints{storage: st, committer: committer, shmDir: shmDir, ownShm: cfg.ShmDir == "", keepShm: cfg.KeepShm, logger: logger, emit: emit}
	c.stats.Dir, c.stats.ShmDir = cfg.CheckpointDir, shmDir
	for i, srv := range srvs.list {
		tabs := map[string]checkpoint.Table{}
		for _, name := range tables {
			t, ok := srv.Table(name)
			if !ok {
				c.abandon(cfg.Resume && cfg.KeepShm)
				return nil, fmt.Errorf("server %s has no table %s", srv.ID(), name)
			}
			tabs[name] = t
		}
		ck, err := checkpoint.New(checkpoint.Config{Job: jobName, Node: srv.ID(), Tables: tabs, Storage: st,
			Slots: cfg.Slots, ShmDir: shmDir, FullEvery: cfg.FullEvery, Logger: logger})
		if err != nil {
			c.abandon(cfg.Resume && cfg.KeepShm)
			return nil, fmt.Errorf("checkpointer of %s: %w", srv.ID(), err)
		}
		c.nodes = append(c.nodes, ckptNode{srv: srv, ck: ck, slots: srvs.owned(i)})
	}
	c.last = make([]uint64, len(c.nodes))
	c.commits = newCommitQueue(committer, commitBacklog, c.persisted, c.committed)
	return c, nil
}

// abandon closes the checkpointers opened so far and, unless keep, deletes their regions.
func (c *checkpoints) abandon(keep bool) {
	c.closeNodes()
	if !keep {
		for _, n := range c.nodes {
			if err := checkpoint.DeleteRegion(c.shmDir, jobName, n.srv.ID()); err != nil {
				c.logger.Warn("shared memory left behind", "node", n.srv.ID(), "err", err)
			}
		}
		c.removeShmDirs()
	}
	c.nodes = nil
}

// wipeStorage deletes the job's earlier checkpoints.
func wipeStorage(ctx context.Context, st *checkpoint.FSStorage) error {
	names, err := st.List(ctx, jobName+"/")
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := st.Delete(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// reserve pre-faults shared memory for snapshots of about bytes per server.
func (c *checkpoints) reserve(ctx context.Context, bytes int64) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, n := range c.nodes {
		g.Go(func() error { return n.ck.Reserve(gctx, bytes) })
	}
	return g.Wait()
}

// room reserves a place in the commit queue for the next snapshot (see commitQueue); the final
// checkpoint waits for one, a periodic one is skipped without. Call it before closing the
// gate: it may wait for storage. snapshot uses or gives back the place.
func (c *checkpoints) room(ctx context.Context, final bool) error {
	err := c.commits.reserve(ctx, final)
	if err != nil {
		c.mu.Lock()
		c.stats.Skipped++
		c.mu.Unlock()
	}
	return err
}

// refuse gives back the place reserved by room for a checkpoint that is not taken because err
// (the gate is broken), and counts it as failed.
func (c *checkpoints) refuse(step uint64, err error) CheckpointEvent {
	c.commits.release()
	c.mu.Lock()
	c.stats.Failed++
	c.mu.Unlock()
	return CheckpointEvent{Step: step, Err: err}
}

// snapshot takes a checkpoint of step, using the place room reserved. The caller has closed
// the gate. blobs are the coordinator's blobs (dispatcher, ledger, meta) at this instant. It
// returns false when there was nothing new to save.
//
// A node that cannot snapshot because both its generations are still being persisted
// (checkpoint.ErrBusy) makes a periodic checkpoint skipped; for the final one (final), it waits
// for the node's persists (Flush) and tries again. Every snapshot a node took is kept: a node
// that took step in an earlier attempt whose other nodes failed still holds the state of step
// (no batch was applied since, or the step would be higher), so it is not asked again.
func (c *checkpoints) snapshot(ctx context.Context, step uint64, blobs []checkpoint.Blob, final bool) (CheckpointEvent, bool) {
	ev := CheckpointEvent{Step: step}
	c.mu.Lock()
	last := c.lastSnap
	c.mu.Unlock()
	if step <= last {
		c.commits.release()
		return ev, false
	}
	infos := make([]checkpoint.SnapshotInfo, len(c.nodes))
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		if c.last[i] >= step {
			continue
		}
		wg.Go(func() {
			infos[i], errs[i] = c.snapshotNode(ctx, n, step, final)
			if errs[i] == nil {
				c.last[i] = step
			}
		})
	}
	wg.Wait()
	busy, failed := false, false
	for _, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, checkpoint.ErrBusy):
			busy = true
		default:
			failed = true
		}
	}
	err := errors.Join(errs...)
	for _, in := range infos {
		ev.Bytes += in.Bytes
		ev.Full = ev.Full || in.Full
	}
	c.mu.Lock()
	switch {
	case failed:
		c.stats.Failed++
		ev.Err = err
	case busy:
		c.stats.Skipped++
		ev.Skipped, ev.Err = true, err
	default:
		c.lastSnap = step
		c.stats.Taken++
		if ev.Full {
			c.stats.Full++
		}
		c.stats.Copied += ev.Bytes
	}
	c.mu.Unlock()
	// The place was reserved (room): neither call waits. Neither is made under c.mu, which
	// the commit goroutine takes after each commit.
	if err != nil {
		c.commits.release()
		return ev, true
	}
	c.commits.push(pendingCommit{step: step, blobs: blobs, taken: time.Now(), full: ev.Full})
	return ev, true
}

// finalBusyRetries bounds the flush-and-retry rounds of a final snapshot that finds its node busy.
const finalBusyRetries = 3

// snapshotNode snapshots one server's rows and MLP tensors.
func (c *checkpoints) snapshotNode(ctx context.Context, n ckptNode, step uint64, final bool) (checkpoint.SnapshotInfo, error) {
	dense, err := encodeDense(n.srv)
	if err != nil {
		return checkpoint.SnapshotInfo{}, fmt.Errorf("%s: %w", n.srv.ID(), err)
	}
	for attempt := 0; ; attempt++ {
		info, err := n.ck.Snapshot(ctx, step, checkpoint.SnapshotSlots(n.slots), checkpoint.SnapshotBlob(denseBlobName, dense))
		if err == nil {
			return info, nil
		}
		if !final || !errors.Is(err, checkpoint.ErrBusy) || attempt == finalBusyRetries {
			return info, fmt.Errorf("%s: %w", n.srv.ID(), err)
		}
		if err := n.ck.Flush(ctx); err != nil {
			return info, fmt.Errorf("%s: wait for earlier persists: %w", n.srv.ID(), err)
		}
	}
}

// blocked adds a snapshot's blocking time to the figures.
func (c *checkpoints) blocked(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.TotalBlocked += d
	c.stats.MaxBlocked = max(c.stats.MaxBlocked, d)
}

// persisted waits for every server's persist of step and returns their manifests and the bytes
// stored meanwhile (the commit goroutine's figure).
func (c *checkpoints) persisted(ctx context.Context, step uint64) ([]checkpoint.ManifestRef, int64, error) {
	refs := make([]checkpoint.ManifestRef, len(c.nodes))
	var before, after int64
	for _, n := range c.nodes {
		before += int64(n.ck.Stats().PersistedStored)
	}
	for i, n := range c.nodes {
		ref, err := n.ck.WaitPersisted(ctx, step)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", n.srv.ID(), err)
		}
		refs[i] = ref
	}
	for _, n := range c.nodes {
		after += int64(n.ck.Stats().PersistedStored)
	}
	return refs, after - before, nil
}

// committed records a commit's outcome.
func (c *checkpoints) committed(p pendingCommit, stored int64, err error) {
	ev := CheckpointEvent{Step: p.step, Full: p.full, Persist: time.Since(p.taken), Stored: stored, Err: err}
	c.mu.Lock()
	if err != nil {
		c.stats.Failed++
	} else {
		c.stats.Committed++
		c.stats.LastCommitted = p.step
		c.stats.Stored += stored
		c.stats.MaxPersist = max(c.stats.MaxPersist, ev.Persist)
	}
	c.mu.Unlock()
	c.emit(EventCommit, ev)
}

// restored is what a restore brought back besides the tables.
type restored struct {
	step       uint64
	dense      []denseEntry
	dispatcher []byte
	ledger     []byte
	meta       []byte
	sources    map[string]checkpoint.Source
	records    int64
}

// restore loads the newest commit every server can read into the tables and returns the rest.
// check vets the commit's meta blob before any table is changed.
func (c *checkpoints) restore(ctx context.Context, check func(meta []byte) error) (*restored, error) {
	// Vet the newest commit first: tables of another shape would fail verification and hide the
	// reason behind a schema error.
	commits, err := c.committer.Commits(ctx)
	if err != nil {
		return nil, err
	}
	if len(commits) == 0 {
		return nil, checkpoint.ErrNoCheckpoint
	}
	if meta, err := c.committer.Blob(ctx, commits[0].Step, blobMeta); err == nil {
		if err := check(meta); err != nil {
			return nil, err
		}
	}
	info, err := c.committer.Choose(ctx, func(ctx context.Context, step uint64) error {
		g, gctx := errgroup.WithContext(ctx)
		for _, n := range c.nodes {
			g.Go(func() error { return n.ck.Verify(gctx, step, checkpoint.RestoreSlots(n.slots)) })
		}
		return g.Wait()
	})
	if err != nil {
		return nil, err
	}
	r := &restored{step: info.Step, sources: map[string]checkpoint.Source{}}
	if r.meta, err = c.committer.Blob(ctx, info.Step, blobMeta); err != nil {
		return nil, fmt.Errorf("blob %s of step %d: %w", blobMeta, info.Step, err)
	}
	if err := check(r.meta); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, n := range c.nodes {
		res, err := n.ck.Load(ctx, info.Step, checkpoint.RestoreSlots(n.slots),
			checkpoint.RestoreBlobs(func(_, name string) bool { return name == denseBlobName }))
		if err != nil {
			return nil, fmt.Errorf("load step %d on %s: %w", info.Step, n.srv.ID(), err)
		}
		for node, src := range res.Sources {
			r.sources[node] = src
		}
		for _, rec := range res.Records {
			r.records += rec
		}
		for _, b := range res.Blobs {
			if b.Name != denseBlobName || seen[b.Node] {
				continue
			}
			seen[b.Node] = true
			entries, err := decodeDense(b.Data)
			if err != nil {
				return nil, fmt.Errorf("dense blob of %s: %w", b.Node, err)
			}
			r.dense = append(r.dense, entries...)
		}
	}
	for name, dst := range map[string]*[]byte{blobDispatcher: &r.dispatcher, blobLedger: &r.ledger} {
		if *dst, err = c.committer.Blob(ctx, info.Step, name); err != nil {
			return nil, fmt.Errorf("blob %s of step %d: %w", name, info.Step, err)
		}
	}
	if err := c.committer.DropAfter(ctx, info.Step); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.lastSnap = info.Step
	c.mu.Unlock()
	return r, nil
}

// Stats returns the figures so far.
func (c *checkpoints) Stats() CheckpointStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// finish waits for every queued commit.
func (c *checkpoints) finish() {
	if c.commits != nil {
		c.commits.finish()
	}
}

func (c *checkpoints) closeNodes() error {
	var errs []error
	for _, n := range c.nodes {
		errs = append(errs, n.ck.Close())
	}
	return errors.Join(errs...)
}

// removeShmDirs removes the directories the regions lived in if nothing else is there.
func (c *checkpoints) removeShmDirs() {
	os.Remove(filepath.Join(c.shmDir, jobName))
	if c.ownShm {
		os.Remove(c.shmDir)
	}
}

// Close abandons queued commits, closes every checkpointer and, unless kept, deletes the job's
// shared-memory regions (storage keeps the committed checkpoints). Kept or not, the regions of
// servers this run does not have (left by an earlier run with more servers, and read by a
// restore at most) are deleted once this run has committed a checkpoint of its own.
func (c *checkpoints) Close() error {
	if c.commits != nil {
		c.commits.abort()
	}
	err := c.closeNodes()
	ours := map[string]bool{}
	for _, n := range c.nodes {
		ours[n.srv.ID()] = true
	}
	switch {
	case !c.keepShm:
		err = errors.Join(err, deleteRegions(c.shmDir, nil, false))
	case c.Stats().Committed > 0:
		err = errors.Join(err, deleteRegions(c.shmDir, func(node string) bool { return ours[node] }, false))
	}
	if !c.keepShm {
		c.removeShmDirs()
	}
	c.nodes = nil
	return err
}
