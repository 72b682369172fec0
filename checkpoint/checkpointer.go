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

	mu          sync.Mutex
	closed      bool
	cur         int // generation holding the newest chain, -1 if none
	needFull    bool
	sinceBase   int // deltas since the chain's full snapshot
	haveStep    bool
	lastStep    uint64
	chainOwned  slotSet
	idSeq       uint64
	durable     durablePos
	lastFull    int64 // bytes of the newest full snapshot
	maxDelta    int64 // bytes of the largest delta snapshot
	results     map[uint64]*persistWait
	resultOrder []uint64
	work        int           // pipeline stages not yet finished
	idle        chan struct{} // closed when work drops to zero
	stats       Stats

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

// stageJob is one snapshot passing through the sealer and then the persister.
type stageJob struct {
	gen   *generation
	chain uint64
	idx   int
	step  uint64
}

type persistWait struct {
	done chan struct{}
	res  PersistResult
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

// Close stops the background goroutines (a persist in progress is abandoned; its step is reported as
// failed), unmaps the region and releases its lock. The region's files stay for a later process to
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
	for _, step := range c.resultOrder {
		w := c.results[step]
		select {
		case <-w.done:
		default:
			w.res.Err = &PersistError{Step: step, Err: ErrClosed}
			close(w.done)
		}
	}
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

// Flush waits until every snapshot taken so far has been sealed and persisted (successfully or not)
// and background provisioning of shared memory is done.
func (c *Checkpointer) Flush(ctx context.Context) error {
	c.mu.Lock()
	if c.work == 0 {
		c.mu.Unlock()
		return nil
	}
	idle := c.idle
	c.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// WaitPersisted waits for the persist of step's snapshot and returns its manifest, which the
// coordinator needs for Commit. A failed persist returns its *PersistError.
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

func (q *queue[T]) pop(ctx context.Context) (T, bool) {
	for {
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
