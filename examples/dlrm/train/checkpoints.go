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

// gate separates applying batches (workers, shared) from taking a checkpoint (exclusive): a
// checkpoint closes the gate, which waits for the batches being applied and holds back new
// ones, so the snapshot sees every batch either wholly applied and reported or not at all.
type gate struct{ mu sync.RWMutex }

func (g *gate) enter() { g.mu.RLock() }
func (g *gate) exit()  { g.mu.RUnlock() }
func (g *gate) close() { g.mu.Lock() }
func (g *gate) open()  { g.mu.Unlock() }

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
// in the background, commits in step order.
type checkpoints struct {
	storage   *checkpoint.FSStorage
	committer *checkpoint.Committer
	nodes     []ckptNode
	shmDir    string
	ownShm    bool // shmDir was chosen here (not configured) and may be removed
	keepShm   bool
	logger    *slog.Logger
	emit      func(kind EventKind, ev CheckpointEvent)

	queue chan pendingCommit
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup

	mu       sync.Mutex
	stats    CheckpointStats
	lastSnap uint64
}

type pendingCommit struct {
	step  uint64
	blobs []checkpoint.Blob
	taken time.Time
	full  bool
}

// openCheckpoints opens storage and one Checkpointer per server over its embedding tables (the
// same set on every server). Without resume, earlier checkpoints of the job are deleted first.
func openCheckpoints(ctx context.Context, cfg *Config, srvs *servers, tables []string, emit func(EventKind, CheckpointEvent)) (*checkpoints, error) {
	st, err := checkpoint.NewFSStorage(cfg.CheckpointDir)
	if err != nil {
		return nil, err
	}
	shmDir := cfg.ShmDir
	if shmDir == "" {
		shmDir = defaultShmDir(cfg.CheckpointDir)
	}
	logger := cfg.Logger
	committer, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: jobName, Storage: st, Logger: logger})
	if err != nil {
		return nil, err
	}
	if !cfg.Resume {
		if err := wipe(ctx, st, shmDir, srvs); err != nil {
			return nil, err
		}
	}
	c := &checkpoints{storage: st, committer: committer, shmDir: shmDir, ownShm: cfg.ShmDir == "", keepShm: cfg.KeepShm, logger: logger, emit: emit,
		queue: make(chan pendingCommit, 64)}
	c.stats.Dir, c.stats.ShmDir = cfg.CheckpointDir, shmDir
	for i, srv := range srvs.list {
		tabs := map[string]checkpoint.Table{}
		for _, name := range tables {
			t, ok := srv.Table(name)
			if !ok {
				c.closeNodes()
				return nil, fmt.Errorf("server %s has no table %s", srv.ID(), name)
			}
			tabs[name] = t
		}
		ck, err := checkpoint.New(checkpoint.Config{Job: jobName, Node: srv.ID(), Tables: tabs, Storage: st,
			Slots: cfg.Slots, ShmDir: shmDir, FullEvery: cfg.FullEvery, Logger: logger})
		if err != nil {
			c.closeNodes()
			return nil, fmt.Errorf("checkpointer of %s: %w", srv.ID(), err)
		}
		c.nodes = append(c.nodes, ckptNode{srv: srv, ck: ck, slots: srvs.owned(i)})
	}
	c.ctx, c.stop = context.WithCancel(context.Background())
	c.wg.Add(1)
	go c.commitLoop()
	return c, nil
}

// wipe deletes the job's earlier checkpoints and shared-memory regions.
func wipe(ctx context.Context, st *checkpoint.FSStorage, shmDir string, srvs *servers) error {
	names, err := st.List(ctx, jobName+"/")
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := st.Delete(ctx, n); err != nil {
			return err
		}
	}
	for _, srv := range srvs.list {
		if err := checkpoint.DeleteRegion(shmDir, jobName, srv.ID()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("clear shared memory of %s: %w", srv.ID(), err)
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

// snapshot takes a checkpoint of step. The caller has closed the gate. blobs returns the
// coordinator's blobs (dispatcher, ledger, meta) at this instant. It returns false when there
// was nothing new to save.
func (c *checkpoints) snapshot(ctx context.Context, step uint64, blobs []checkpoint.Blob) (CheckpointEvent, bool) {
	c.mu.Lock()
	last := c.lastSnap
	c.mu.Unlock()
	ev := CheckpointEvent{Step: step}
	if step <= last {
		return ev, false
	}
	infos := make([]checkpoint.SnapshotInfo, len(c.nodes))
	g, gctx := errgroup.WithContext(ctx)
	for i, n := range c.nodes {
		g.Go(func() error {
			dense, err := encodeDense(n.srv)
			if err != nil {
				return err
			}
			infos[i], err = n.ck.Snapshot(gctx, step, checkpoint.SnapshotSlots(n.slots), checkpoint.SnapshotBlob(denseBlobName, dense))
			if err != nil {
				return fmt.Errorf("%s: %w", n.srv.ID(), err)
			}
			return nil
		})
	}
	err := g.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastSnap = step
	for _, in := range infos {
		ev.Bytes += in.Bytes
		ev.Full = ev.Full || in.Full
	}
	switch {
	case errors.Is(err, checkpoint.ErrBusy):
		c.stats.Skipped++
		ev.Skipped, ev.Err = true, err
		return ev, true
	case err != nil:
		c.stats.Failed++
		ev.Err = err
		return ev, true
	}
	c.stats.Taken++
	if ev.Full {
		c.stats.Full++
	}
	c.stats.Copied += ev.Bytes
	c.queue <- pendingCommit{step: step, blobs: blobs, taken: time.Now(), full: ev.Full}
	return ev, true
}

// blocked adds a snapshot's blocking time to the figures.
func (c *checkpoints) blocked(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.TotalBlocked += d
	c.stats.MaxBlocked = max(c.stats.MaxBlocked, d)
}

// commitLoop waits for each snapshot's persist on every server and commits it, in step order.
func (c *checkpoints) commitLoop() {
	defer c.wg.Done()
	for p := range c.queue {
		ev := CheckpointEvent{Step: p.step, Full: p.full}
		stored, err := c.commit(p)
		ev.Persist, ev.Stored, ev.Err = time.Since(p.taken), stored, err
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
}

func (c *checkpoints) commit(p pendingCommit) (int64, error) {
	ctx, cancel := context.WithTimeout(c.ctx, persistTimeout)
	defer cancel()
	refs := make([]checkpoint.ManifestRef, len(c.nodes))
	var before int64
	for _, n := range c.nodes {
		before += int64(n.ck.Stats().PersistedStored)
	}
	for i, n := range c.nodes {
		ref, err := n.ck.WaitPersisted(ctx, p.step)
		if err != nil {
			return 0, fmt.Errorf("persist of step %d on %s: %w", p.step, n.srv.ID(), err)
		}
		refs[i] = ref
	}
	var after int64
	for _, n := range c.nodes {
		after += int64(n.ck.Stats().PersistedStored)
	}
	if _, err := c.committer.Commit(ctx, p.step, refs, p.blobs...); err != nil {
		return 0, fmt.Errorf("commit of step %d: %w", p.step, err)
	}
	return after - before, nil
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
	if c.queue != nil {
		close(c.queue)
		c.wg.Wait()
		c.queue = nil
	}
}

func (c *checkpoints) closeNodes() error {
	var errs []error
	for _, n := range c.nodes {
		errs = append(errs, n.ck.Close())
	}
	return errors.Join(errs...)
}

// Close abandons queued commits, closes every checkpointer and, unless kept, deletes the
// shared-memory regions (storage keeps the committed checkpoints).
func (c *checkpoints) Close() error {
	if c.stop != nil {
		c.stop()
	}
	c.finish()
	err := c.closeNodes()
	if !c.keepShm {
		for _, n := range c.nodes {
			if e := checkpoint.DeleteRegion(c.shmDir, jobName, n.srv.ID()); e != nil && !errors.Is(e, os.ErrNotExist) {
				err = errors.Join(err, e)
			}
		}
		// Remove the directories the regions lived in if nothing else is there.
		os.Remove(filepath.Join(c.shmDir, jobName))
		if c.ownShm {
			os.Remove(c.shmDir)
		}
	}
	c.nodes = nil
	return err
}
