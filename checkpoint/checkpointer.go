package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// Checkpointer snapshots one parameter server's tables into its shared-memory region, persists the
// snapshots to Storage in the background, and restores them. Create it with New; it is safe for
// concurrent use (Snapshot, Reserve, Verify, Load and Restore run one at a time).
type Checkpointer struct {
	cfg    Config
	log    *slog.Logger
	tables []namedTable // sorted by name
	cs     *codecs
	reg    *region
	nonce  uint64 // random per process: makes persist ids unique across restarts

	snapMu sync.Mutex // serialises Snapshot, Reserve, Verify, Load, Restore
	// reportMu is held by the persister while it hands a result out (waiter and OnPersist), and taken
	// by a Load or Restore after it ends an epoch, so that once the tables change no result of a
	// snapshot taken before is reported any more.
	reportMu sync.Mutex

	mu          sync.Mutex
	closed      bool
	cur         int // generation holding the newest chain, -1 if none
	needFull    bool
	sinceBase   int // deltas since the chain's full snapshot
	haveStep    bool
	lastStep    uint64
	chainOwned  slotSet // the slots of the newest snapshot
	slotDeltas  bool    // every table is a SlotDeltaTable
	idSeq       uint64
	durable     durablePos
	lastFull    int64                   // bytes of the newest full snapshot
	maxDelta    int64                   // bytes of the largest delta snapshot
	results     map[uint64]*persistWait // by step, for WaitPersisted
	resultOrder []uint64                // steps of results, oldest first
	work        int                     // pipeline stages not yet finished
	idle        chan struct{}           // closed when work drops to zero
	stats       Stats

	// epoch counts the Loads and Restores that changed the tables. A snapshot belongs to the epoch it
	// was taken in; once a later epoch starts its stages are abandoned: not sealed, not persisted (or,
	// if running, cancelled through epochCtx), and never reported. Guarded by mu.
	epoch     uint64
	epochCtx  context.Context
	epochStop context.CancelFunc

	hooks testHooks // set only by tests, before the first Snapshot

	sealQ    queue[stageJob]
	persistQ queue[stageJob]
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// testHooks let tests stop the pipeline between phases, to take a crash image of the region.
type testHooks struct {
	beforeSeal func(step uint64)
	afterSeal  func(step uint64)
}

type namedTable struct {
	name string
	t    Table
}

// durablePos is the newest segment whose persist succeeded.
type durablePos struct {
	ok       bool
	gen      int
	chain    uint64
	seg      int
	step     uint64
	baseStep uint64
	manifest string
}

// stageJob is one snapshot passing through the sealer and then the persister. It carries its own
// waiter: the step alone does not identify a snapshot, since a Load or Restore lets later steps be
// taken again.
type stageJob struct {
	gen   *generation
	chain uint64
	idx   int
	step  uint64
	epoch uint64
	wait  *persistWait
}

// persistWait is the outcome of one snapshot's persist: res is written once, under mu, before done is
// closed, and only read after done is closed.
type persistWait struct {
	done chan struct{}
	res  PersistResult
}

// finishLocked reports res unless w already has an outcome. The caller holds mu.
func (w *persistWait) finishLocked(res PersistResult) {
	select {
	case <-w.done:
	default:
		w.res = res
		close(w.done)
	}
}

// abandonedWait returns a finished waiter reporting step's snapshot as abandoned.
func abandonedWait(step uint64) *persistWait {
	w := &persistWait{done: make(chan struct{})}
	w.finishLocked(abandonedResult(step))
	return w
}

func abandonedResult(step uint64) PersistResult {
	return PersistResult{Step: step, Err: &PersistError{Step: step, Err: ErrAbandoned}}
}

// maxResults bounds the persist results remembered for WaitPersisted.
const maxResults = 256

// ManifestRef identifies a node's durable manifest for one step: what the coordinator passes to Commit.
type ManifestRef struct {
	Node string
	Step uint64
	Name string // storage object name
	Size int64
	Sum  uint64 // xxhash64 of the object
}

// PersistResult reports one persist.
type PersistResult struct {
	Step     uint64
	Manifest ManifestRef // valid when Err is nil
	Full     bool
	Segments int // shared-memory snapshots carried: more than one after an earlier persist failed
	Chunks   int
	RawBytes int64 // uncompressed bytes of the chunks
	Stored   int64 // bytes written, compressed
	Duration time.Duration
	Err      error // a *PersistError
}

// SnapshotInfo reports one snapshot.
type SnapshotInfo struct {
	Step       uint64
	Full       bool
	BaseStep   uint64 // step of the chain's full snapshot
	Generation int
	Bytes      int64         // bytes copied into shared memory
	Blocked    time.Duration // time spent copying, the part training waits for
}

// Stats are a Checkpointer's counters.
type Stats struct {
	Snapshots        uint64
	SnapshotErrors   uint64
	LastBlocked      time.Duration
	Seals            uint64
	SealErrors       uint64
	Persists         uint64
	PersistErrors    uint64
	LastPersistError error
	PersistedRaw     uint64 // uncompressed bytes persisted
	PersistedStored  uint64 // bytes written to storage
	Abandoned        uint64 // snapshots whose persist a Load or Restore abandoned before it finished
	ShmBytes         int64  // shared memory mapped
	Pending          int    // pipeline stages (seal, persist) not yet finished
}

// New opens (or reattaches to) the node's shared-memory region and starts the sealer and persister
// goroutines. A region left by an earlier process of the same node is reattached with its sealed
// generations, so Restore can use it without reading table data from storage.
func New(cfg Config) (*Checkpointer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	cfg.Headroom = max(cfg.Headroom, 0)
	c := &Checkpointer{cfg: cfg, log: discardIfNil(cfg.Logger), cur: -1, needFull: true,
		results: map[uint64]*persistWait{}}
	for name, t := range cfg.Tables {
		c.tables = append(c.tables, namedTable{name, t})
	}
	sort.Slice(c.tables, func(i, j int) bool { return c.tables[i].name < c.tables[j].name })
	c.slotDeltas = true
	for _, nt := range c.tables {
		if _, ok := nt.t.(SlotDeltaTable); !ok {
			c.slotDeltas = false
		}
	}
	var nb [8]byte
	if _, err := rand.Read(nb[:]); err != nil {
		return nil, fmt.Errorf("checkpoint: random nonce: %w", err)
	}
	c.nonce = binary.LittleEndian.Uint64(nb[:])
	c.cs = newCodecs(cfg.Workers)
	reg, err := openRegion(filepath.Join(cfg.ShmDir, cfg.Job, cfg.Node), cfg.Job, cfg.Node, cfg.Slots, true, c.log)
	if err != nil {
		return nil, err
	}
	c.reg = reg
	c.cur = newestGen(reg)
	c.sealQ.init()
	c.persistQ.init()
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.epochCtx, c.epochStop = context.WithCancel(c.ctx)
	c.wg.Add(2)
	go c.sealLoop()
	go c.persistLoop()
	return c, nil
}

// newestGen returns the generation whose newest sealed segment has the highest step, or -1.
func newestGen(r *region) int {
	best, step := -1, uint64(0)
	for i, g := range r.gens {
		if g.sealed > 0 {
			if s := g.segs[g.sealed-1].Step; best < 0 || s > step {
				best, step = i, s
			}
		}
	}
	return best
}

// Close stops the background goroutines (a persist in progress is cancelled and removes what it wrote;
// it and the snapshots not yet persisted are reported to WaitPersisted as a *PersistError wrapping
// ErrClosed), unmaps the region and releases its lock. The region's files stay for a later process to
// reattach. Close is idempotent.
func (c *Checkpointer) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	c.snapMu.Lock() // wait for a Snapshot or Restore in progress
	defer c.snapMu.Unlock()
	c.mu.Lock()
	c.epochStop()
	for _, step := range c.resultOrder {
		c.results[step].finishLocked(PersistResult{Step: step, Err: &PersistError{Step: step, Err: ErrClosed}})
	}
	// Stages left in the queues never run.
	c.work = 0
	if c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
	c.mu.Unlock()
	return c.reg.close()
}

func (c *Checkpointer) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Stats returns a copy of the counters.
func (c *Checkpointer) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.ShmBytes = c.reg.mapped()
	s.Pending = c.work
	return s
}

// Flush waits until every snapshot taken so far has been sealed and persisted (successfully or not),
// or dropped because a Load or Restore abandoned it, and background provisioning of shared memory is
// done. After Close it returns ErrClosed.
func (c *Checkpointer) Flush(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if c.work == 0 {
		c.mu.Unlock()
		return nil
	}
	idle := c.idle
	c.mu.Unlock()
	select {
	case <-idle:
		if c.isClosed() {
			return ErrClosed
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// WaitPersisted waits for the persist of step's snapshot and returns its manifest, which the
// coordinator needs for Commit. A failed persist returns its *PersistError; so does a snapshot that
// a later Load or Restore abandoned (wrapping ErrAbandoned), and, once the tables have been loaded
// with a step before it, any earlier snapshot of step, finished or not: the manifest returned is
// always of the newest snapshot of step since the tables were last loaded.
func (c *Checkpointer) WaitPersisted(ctx context.Context, step uint64) (ManifestRef, error) {
	c.mu.Lock()
	w, ok := c.results[step]
	c.mu.Unlock()
	if !ok {
		return ManifestRef{}, fmt.Errorf("%w: %d", ErrUnknownStep, step)
	}
	select {
	case <-w.done:
		return w.res.Manifest, w.res.Err
	case <-ctx.Done():
		return ManifestRef{}, ctx.Err()
	}
}

// addWorkLocked registers n pipeline stages.
func (c *Checkpointer) addWorkLocked(n int) {
	if c.work == 0 {
		c.idle = make(chan struct{})
	}
	c.work += n
}

func (c *Checkpointer) doneWork(g *generation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g.pending--
	c.work--
	if c.work == 0 && c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
}

// abandonPipeline starts a new epoch because the tables are being loaded with step: every snapshot
// taken so far whose persist has not been reported is abandoned (WaitPersisted reports ErrAbandoned,
// OnPersist is not called, a persist in progress is cancelled and removes what it wrote), and results
// of snapshots after step are forgotten, since those steps will be taken again. It returns once no
// result of the old epoch is being reported.
func (c *Checkpointer) abandonPipeline(step uint64) {
	c.mu.Lock()
	c.epoch++
	c.epochStop()
	c.epochCtx, c.epochStop = context.WithCancel(c.ctx)
	for s, w := range c.results {
		select {
		case <-w.done:
			if s > step {
				c.results[s] = abandonedWait(s)
			}
		default:
			w.finishLocked(abandonedResult(s))
			c.stats.Abandoned++
		}
	}
	c.durable = durablePos{}
	// The next snapshot is full and starts a new chain in a generation with no stage pending, so no
	// segment of the new epoch ever follows an abandoned (unsealed) one in a chain.
	c.needFull = true
	c.mu.Unlock()
	// The persister checks the epoch and reports under reportMu: once this returns, whatever it
	// reports next belongs to the new epoch.
	c.reportMu.Lock()
	c.reportMu.Unlock()
}

// liveLocked reports whether job belongs to the current epoch. The caller holds mu.
func (c *Checkpointer) liveLocked(job stageJob) bool { return job.epoch == c.epoch }

// newID returns an id unique to this process and call.
func (c *Checkpointer) newIDLocked() uint64 {
	c.idSeq++
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], c.nonce)
	binary.LittleEndian.PutUint64(b[8:], c.idSeq)
	return xxhashSum(b[:])
}

// queue is an unbounded FIFO drained by one goroutine.
type queue[T any] struct {
	mu    sync.Mutex
	items []T
	wake  chan struct{}
}

func (q *queue[T]) init() { q.wake = make(chan struct{}, 1) }

func (q *queue[T]) push(v T) {
	q.mu.Lock()
	q.items = append(q.items, v)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// pop returns the next item, waiting for one; it returns false once ctx is done, even if items are left.
func (q *queue[T]) pop(ctx context.Context) (T, bool) {
	for {
		if ctx.Err() != nil {
			var zero T
			return zero, false
		}
		q.mu.Lock()
		if len(q.items) > 0 {
			v := q.items[0]
			q.items = q.items[1:]
			q.mu.Unlock()
			return v, true
		}
		q.mu.Unlock()
		select {
		case <-q.wake:
		case <-ctx.Done():
			var zero T
			return zero, false
		}
	}
}
