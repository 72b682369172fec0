package elastic

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// Names of the coordinator's blobs in a commit.
const (
	blobState      = "elastic.coordinator"
	blobDispatcher = "elastic.dispatcher"
	blobJob        = "elastic.job"
	blobLedger     = "elastic.ledger"
	blobProgress   = "elastic.progress"
)

// Coordinator is the job master of one training job: it owns the owner table and its versions,
// the data-shard dispatcher, the fence epochs of the workers, the checkpoint barrier and
// schedule, the commit queue and resume. Workers reach it through a Session. All methods are
// safe for concurrent use.
//
// Its state is grouped by what guards it. The locks are taken in this order, never the other
// way: repMu (a whole change of the server count), tableMu (a snapshot, a recovery's restore,
// a move's handover: held across calls to the servers), mu (never held across a call to a
// server), then svc.mu (the dispatcher with the ledger). repStatus's lock and the clock's are
// innermost: nothing is taken while one is held, and so is the progress queue's. eventMu is held
// around Config.OnCheckpoint alone, and none of the others is held when it is taken.
type Coordinator struct {
	// Set by NewCoordinator and never replaced; clock, disp and holder are safe for
	// concurrent use on their own.
	cfg       Config
	log       *slog.Logger
	clock     *pausableClock
	disp      *shard.Dispatcher
	svc       *ledgerService // the dispatcher as workers reach it, and the ledger (its mu)
	committer *checkpoint.Committer
	holder    ps.TableHolder
	initial   []byte         // the dispatcher's state at the start, for a rollback before any commit
	wake      chan struct{}  // a token when pending grew
	commits   chan commitJob // snapshots to commit, in step order: sent by the executor alone
	done      chan struct{}  // closed by Close
	wg        sync.WaitGroup // the coordinator's goroutines

	repMu   sync.Mutex // one change of the server count, or rebalance, at a time
	tableMu sync.Mutex // orders the owner table's changes and the snapshots: a commit never mixes tables

	mu sync.Mutex // guards the groups below, up to the executor's own fields
	barrierState
	serverState
	workerState
	jobState
	moveState
	execState

	// The executor's alone (execute and what it calls).
	pauseStart time.Time       // when the current barrier went up
	lastSnap   CheckpointEvent // the snapshot of the current barrier

	repStatus struct {
		sync.Mutex
		s      *RepartitionStatus
		target *ps.OwnerTable // the table a move under way aims at
	}
	eventMu sync.Mutex // one OnCheckpoint call at a time
	prog    *progress  // Config.OnProgress's queue

	// beforeDispatcherRestore, if set (tests), runs in a rollback once the servers are restored,
	// just before the dispatcher is: a test schedules workers' calls there.
	beforeDispatcherRestore atomic.Pointer[func()]
}

// barrierState is the protocol's state (guarded by Coordinator.mu).
type barrierState struct {
	core    *core
	changed chan struct{} // closed and replaced at every change: awaits look again
	stats   counters
}

// serverState is how the coordinator reaches its parameter servers; the core judges their
// health (guarded by Coordinator.mu).
type serverState struct {
	servers []ParameterServer       // those the owner table names (replaced by recoveries)
	srvs    map[string]*serverEntry // by node id
	fenced  []uint64                // epochs fenced in this incarnation (for replacements)
	leading uint64                  // the highest incarnation this coordinator has led its servers as
}

// workerState is what Join needs to know of the workers beyond the core (guarded by
// Coordinator.mu).
type workerState struct {
	batch int // the records per batch every worker reads (0: none joined yet)
	// trained holds, per worker, the last epoch under which it began a batch: a membership
	// that trained belongs to a live process until it ends (Join). called holds when each
	// worker last called (Begin, End, the dispatcher): the evidence that a process lives.
	trained map[string]uint64
	called  map[string]time.Time
	steps   map[string]*workerSteps // the workers' batch times, by id (Status)
}

// jobState is the job's standing: resumed, taken over, refused, stopped (guarded by
// Coordinator.mu).
type jobState struct {
	live bool // the servers were found running a job: Resume takes it over
	// existing is the refusal of Join and Checkpoint while storage holds commits of an earlier
	// run that this coordinator neither resumed nor overwrote (Config.Overwrite).
	existing error
	// committedDone is how far the data was done at the newest commit: the servers forget the
	// batches it covers, and no others, so that a coordinator taking over from that commit
	// finds every later batch in their records.
	committedDone Progress
	plan          Plan   // the last plan SetParallelism gave the scaler
	scaler        Scaler // Config.Scaler, or SetScaler's
	// superseded is set once a later coordinator has taken the job over: this one has stopped.
	superseded error
	closed     bool
	halted     chan struct{} // closed once stopped for good: superseded or closed
	haltErr    error         // why
}

// moveState is what a move of slots leaves behind for the next (guarded by Coordinator.mu).
type moveState struct {
	migrator *ps.Migrator // made by the first repartition
	// repIncomplete is set when a repartition failed part of the way: the next plan moves
	// the slots still to move, whatever its server count.
	repIncomplete bool
	repTarget     *ps.OwnerTable // the placement it aimed at
}

// execState is the executor's queue of the core's actions and the snapshots' outcomes
// (guarded by Coordinator.mu).
type execState struct {
	pending  []action        // for the executor, in order
	queued   uint64          // actions handed to the executor
	executed uint64          // actions it carried out
	snapSeq  uint64          // snapshot attempts finished
	snapRes  CheckpointEvent // the last one's outcome
	holdQ    []*holdReq      // hold requests, the oldest first, until an actHold serves them
}

// CheckpointEvent reports one snapshot or commit.
type CheckpointEvent struct {
	// Step is the step of the snapshot (the batches applied and reported when it was taken).
	Step uint64
	// Commit is set for a commit (or its failure), clear for a snapshot.
	Commit bool
	// Snapshot: bytes copied into shared memory by every server, whether any copy was full,
	// and how long training was paused at the barrier.
	Bytes   int64
	Full    bool
	Blocked time.Duration
	// Commit: the time from the snapshot to its commit.
	Persist time.Duration
	// Err is the failure, nil on success.
	Err error
}

// counters are the coordinator's figures a Status reports.
type counters struct {
	Snapshots     int           // snapshots taken
	Committed     int           // commits written
	Failed        int           // snapshots or commits that failed
	LastCommitted uint64        // step of the newest commit
	LastSnapshot  uint64        // step of the newest snapshot taken (committed or not yet)
	TotalBlocked  time.Duration // training paused at barriers, summed
	MaxBlocked    time.Duration // the longest pause
	Fenced        int           // epochs fenced
	Evicted       int           // workers failed and evicted
	LastErr       error         // the newest snapshot or commit error
	// Recoveries counts the recoveries that succeeded, the newest of them LastRecovery.
	Recoveries   int
	LastRecovery RecoveryEvent
	LostRecords  int64 // RecoveryEvent.LostRecords summed over the recoveries
}

type commitJob struct {
	step    uint64
	blobs   []checkpoint.Blob
	taken   time.Time
	servers []ParameterServer // those snapshotted
	done    Progress          // how far the data was done at the snapshot
}

// coordState is the coordinator's own state in a commit.
type coordState struct {
	Version     int    `json:"version"`
	Job         string `json:"job"`
	Step        uint64 `json:"step"`
	Incarnation uint64 `json:"incarnation"`
	Table       []byte `json:"table"` // ps.AppendOwnerTable
	// BatchSize is the job's batch size, which every worker must read with (0: unknown).
	BatchSize int `json:"batch_size,omitempty"`
}

// NewCoordinator starts the coordinator of a job: it builds the dispatcher, places the slots on
// cfg.Servers (owner table version 1) and installs the table on every server. Call Resume
// before the first worker joins to continue from the newest commit.
func NewCoordinator(ctx context.Context, cfg Config) (*Coordinator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Coordinator{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1), commits: make(chan commitJob, cfg.CommitBacklog), done: make(chan struct{}),
		barrierState: barrierState{changed: make(chan struct{})}, serverState: serverState{servers: slices.Clone(cfg.Servers), srvs: map[string]*serverEntry{}},
		jobState: jobState{scaler: cfg.Scaler, halted: make(chan struct{})}, workerState: workerState{trained: map[string]uint64{}, called: map[string]time.Time{}, steps: map[string]*workerSteps{}}}
	c.clock = newPausableClock(cfg.Now)
	c.prog = newProgress(cfg.OnProgress)
	dcfg := cfg.Dispatcher
	dcfg.Clock = c.clock
	if dcfg.Logger == nil {
		dcfg.Logger = c.log
	}
	disp, err := shard.New(dcfg)
	if err != nil {
		return nil, fmt.Errorf("%w: dispatcher: %w", ErrInvalidConfig, err)
	}
	c.disp = disp
	c.initial = disp.Snapshot()
	c.svc = newLedgerService(c)
	if cfg.Storage != nil {
		if c.committer, err = checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: cfg.Job, Storage: cfg.Storage, KeepLast: cfg.KeepLast, Logger: c.log}); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	c.core = newCore(coreConfig{every: uint64(cfg.CheckpointEvery), interval: cfg.CheckpointInterval,
		arriveTimeout: cfg.ArriveTimeout, silence: cfg.WorkerSilence, serverTimeout: cfg.ServerTimeout,
		replaceWait: cfg.ReplaceWait, probeEvery: cfg.HealthEvery, partial: cfg.Recovery == Partial}, c.clock.now())
	nodes := nodesOf(c.servers)
	table, err := ps.NewOwnerTable(1, cfg.Slots, nodes, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	found, err := c.admit(ctx, c.servers)
	if err != nil {
		return nil, err
	}
	for _, h := range found {
		c.live = c.live || h.TableVersion != 0 || h.Leader != 0
	}
	if !c.live && c.committer != nil {
		// A coordinator taking a running job over (live) resumes it: its commits are the job's.
		err := c.committer.PrepareFresh(ctx, cfg.Overwrite)
		switch {
		case errors.Is(err, checkpoint.ErrExistingCommits):
			c.existing = err
		case err != nil:
			return nil, err
		}
	}
	if !c.live {
		// A fresh job: incarnation 1 leads the servers and places the slots.
		if err := c.lead(ctx, c.servers, c.core.incarnation); err != nil {
			return nil, err
		}
		if err := c.install(ctx, c.servers, table); err != nil {
			return nil, err
		}
	}
	c.wg.Add(5)
	go func() {
		defer c.wg.Done()
		c.prog.run(c.done)
	}()
	go c.execute()
	go c.commitLoop()
	go c.timerLoop()
	go c.monitor()
	return c, nil
}

// install gives t to servers, then to clients (the holder).
func (c *Coordinator) install(ctx context.Context, servers []ParameterServer, t *ps.OwnerTable) error {
	err := onEach(ctx, servers, func(ctx context.Context, _ int, s ParameterServer) error {
		if err := s.InstallTable(ctx, t); err != nil {
			return fmt.Errorf("install owner table %d on %s: %w", t.Version, s.Node().ID, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.holder.Set(t)
	return nil
}

// Dispatcher returns the job's data-shard dispatcher, for its progress and figures. Never give
// it to workers (a ReaderConfig or a shardnet server): their reports would bypass the
// exactly-once ledger. Workers reach it through Service.
func (c *Coordinator) Dispatcher() *shard.Dispatcher { return c.disp }

// Service returns the dispatcher as workers must reach it: in process (shard.ReaderConfig's
// Service) or served with shardnet. Every report it accepts marks the positions it covers in
// the exactly-once ledger, in the same step.
func (c *Coordinator) Service() shard.Service { return c.svc }

// OwnerTable answers clients' owner-table requests (ps.Resolver).
func (c *Coordinator) OwnerTable(ctx context.Context, minVersion uint64) (*ps.OwnerTable, error) {
	return c.holder.OwnerTable(ctx, minVersion)
}

var _ ps.Resolver = (*Coordinator)(nil)

// applyLocked hands actions to the executor and wakes the waiting workers. Call with c.mu
// held; it never blocks.
func (c *Coordinator) applyLocked(acts []action) {
	close(c.changed)
	c.changed = make(chan struct{})
	for i := range acts {
		if acts[i].kind == actEvict {
			// The worker learns it was failed only after this critical section: every
			// lease it holds now is at most this one, every lease it takes after joining
			// again is newer.
			acts[i].granted = c.disp.Granted()
		}
	}
	if len(acts) > 0 && !c.closed {
		c.pending = append(c.pending, acts...)
		c.queued += uint64(len(acts))
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// Join registers worker (again), which reads batches of batchSize records, and returns its
// fence epoch; every push it makes carries it. Every worker of a job must read with one batch
// size, the first one that joined with a batchSize above 0 (a batch's position is its exact
// record range: one replayed with other boundaries would land twice); another is refused with
// ErrInvalidConfig. The batch size is kept in every commit. Over the commits of an earlier run
// that this coordinator neither resumed nor overwrote, Join returns a *checkpoint.ExistingCommitsError.
//
// A worker name belongs to one process at a time. When worker is a member that has begun a
// batch under its epoch, Join waits until that membership ends (the worker leaves, or is
// failed: silent for WorkerSilence, declared dead by gossip) and then joins, its old epoch
// fenced: a worker that crashed and restarted gets its name back once the old process is known
// dead. If the old membership is heard from meanwhile (later than HealthEvery after Join
// began: calls a dead process made may still arrive before that), two live processes share
// the name, and Join refuses the newcomer with ErrDuplicateWorker. A membership that has begun
// no batch (a Join whose answer was lost and is sent again, say) is replaced at once, its
// epoch fenced.
func (c *Coordinator) Join(ctx context.Context, worker string, batchSize int) (uint64, error) {
	if worker == "" || batchSize < 0 {
		return 0, fmt.Errorf("%w: worker %q, batch size %d", ErrInvalidConfig, worker, batchSize)
	}
	var epoch uint64
	var asked time.Time // when Join found a live membership of worker; zero until then
	err := c.await(ctx, func() (bool, error) {
		if c.closed {
			return true, ErrClosed
		}
		if c.live {
			return true, ErrNeedsResume
		}
		if c.superseded != nil {
			return true, c.superseded
		}
		if c.existing != nil {
			return true, c.existing
		}
		if batchSize > 0 && c.batch > 0 && batchSize != c.batch {
			return true, fmt.Errorf("%w: worker %s reads batches of %d records, the job's are %d: every worker must use the same batch size", ErrInvalidConfig, worker, batchSize, c.batch)
		}
		if m := c.core.members[worker]; m != nil && c.trained[worker] == m.epoch {
			now := c.clock.now()
			if asked.IsZero() {
				asked = now
				c.log.Info("a worker joins under the name of a member that trains: waiting for that one to end", "worker", worker, "epoch", epochString(m.epoch))
			}
			// Calls the old process made before it died may still arrive: only one made
			// HealthEvery after the newcomer asked shows that it lives.
			if last := c.called[worker]; last.After(asked.Add(c.cfg.HealthEvery)) {
				return true, fmt.Errorf("%w: worker %s trains under epoch %s (it called %v ago); a process that died is failed after WorkerSilence (%v) of silence, and its name is free then", ErrDuplicateWorker, worker, epochString(m.epoch), now.Sub(last).Round(time.Millisecond), c.cfg.WorkerSilence)
			}
			return false, nil
		}
		if c.batch == 0 {
			c.batch = batchSize
		}
		var acts []action
		epoch, acts = c.core.join(c.clock.now(), worker)
		c.log.Debug("worker joined", "worker", worker, "epoch", epochString(epoch))
		c.applyLocked(acts)
		return true, nil
	})
	if err != nil {
		return 0, err
	}
	return epoch, nil
}

// Begin waits until worker may apply a batch: it returns at once unless a checkpoint barrier
// is up, then when it is released. ErrNotMember means the worker was failed or replaced and must
// Join again (its epoch is fenced); ErrStopped that training is over.
func (c *Coordinator) Begin(ctx context.Context, worker string, epoch uint64) error {
	first := true
	return c.await(ctx, func() (bool, error) {
		if first {
			c.calledLocked(worker)
			first = false
		}
		if c.closed {
			return true, ErrClosed
		}
		if c.superseded != nil {
			return true, c.superseded
		}
		ok := c.core.begin(c.clock.now(), worker, epoch)
		m := c.core.members[worker]
		switch {
		case ok:
			w := c.steps[worker]
			if w == nil {
				w = &workerSteps{}
				c.steps[worker] = w
			}
			w.began = c.clock.now()
			c.trained[worker] = epoch
			return true, nil
		case m == nil || m.epoch != epoch:
			return true, ErrNotMember
		case c.core.stopped:
			return true, ErrStopped
		}
		// Held at the barrier: the core counts it as arrived, which may start the snapshot.
		c.applyLocked(c.core.advance())
		return false, nil
	})
}

// End records that worker finished the batch it began: ok when it was applied and reported
// (one step), false when it gave it up (nothing counted; the dispatcher replays it, and the
// servers skip what they already applied).
func (c *Coordinator) End(ctx context.Context, worker string, epoch uint64, ok bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calledLocked(worker)
	counted, acts := c.core.end(c.clock.now(), worker, epoch, ok)
	if counted {
		c.prog.emit(ProgressEvent{Kind: EventStep, Step: c.core.step})
	}
	if w := c.steps[worker]; w != nil && !w.began.IsZero() {
		if ok {
			w.steps++
			w.busy += c.clock.now().Sub(w.began)
		}
		w.began = time.Time{}
	}
	c.applyLocked(acts)
	return nil
}

// ExactlyOnce compares the ledger of trained positions with the dispatcher's progress, per
// epoch: every position of a finished epoch trained exactly once, and in the current epoch at
// most once and exactly those the dispatcher counted (EpochCheck.OK).
func (c *Coordinator) ExactlyOnce() []EpochCheck {
	c.svc.mu.Lock() // the dispatcher and the ledger at one moment
	defer c.svc.mu.Unlock()
	return c.exactlyOnceLocked(c.disp.Progress())
}

// exactlyOnceLocked is ExactlyOnce with c.svc.mu held and the dispatcher's progress read.
func (c *Coordinator) exactlyOnceLocked(pr shard.Progress) []EpochCheck {
	totals := make([]epochTotals, 0, len(pr.EpochRecords))
	for _, e := range pr.EpochRecords {
		totals = append(totals, epochTotals{epoch: e.Epoch, records: e.Records, done: e.Done, failed: e.Failed})
	}
	return c.svc.ledger.check(totals, pr.Epoch, pr.Finished)
}

// Leave forgets a worker that stopped cleanly; its epoch is fenced.
func (c *Coordinator) Leave(ctx context.Context, worker string, epoch uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.applyLocked(c.core.leave(c.clock.now(), worker, epoch))
	return nil
}

// Fail removes a worker known to be dead or cut off: its epoch is fenced on every server and
// its leases go back to the dispatcher at their reported offsets.
func (c *Coordinator) Fail(worker, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.applyLocked(c.core.fail(c.clock.now(), worker, reason))
}

// checkpointBusyWait bounds how long Checkpoint takes a snapshot again while a server has both
// its shared-memory generations still being persisted.
const checkpointBusyWait = 30 * time.Second

// Checkpoint takes a checkpoint at the next barrier and waits for its commit. It returns the
// committed step; with nothing new since the last snapshot, that snapshot's step. A snapshot
// refused because a server's generations are both still being persisted (checkpoint.ErrBusy), or
// because Config.CommitBacklog snapshots wait for their commit (ErrCommitsBehind), is taken
// again once the commits before it are written, and after a pause that grows, for up to
// checkpointBusyWait: the persists in the way may be an earlier coordinator's, which no commit
// here waits for. Over the commits of an earlier run that this coordinator neither resumed nor
// overwrote, it returns a *checkpoint.ExistingCommitsError and writes nothing; on a coordinator another
// one took the job over from, its Err, at once.
func (c *Coordinator) Checkpoint(ctx context.Context) (uint64, error) {
	return c.checkpointTries(ctx, false)
}

func (c *Coordinator) checkpointTries(ctx context.Context, final bool) (uint64, error) {
	pause, deadline := 10*time.Millisecond, time.Now().Add(checkpointBusyWait)
	for {
		step, err := c.checkpoint(ctx, final)
		if !(errors.Is(err, checkpoint.ErrBusy) || errors.Is(err, ErrCommitsBehind)) || time.Now().After(deadline) {
			return step, err
		}
		// The commits in the way are waited for until the deadline at most: the next try then
		// returns what the storage still refuses.
		wctx, cancel := context.WithDeadline(ctx, deadline)
		err = c.WaitCommits(wctx)
		cancel()
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return 0, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}

// WaitCommits waits until no checkpoint is under way: no barrier up, and every snapshot taken
// so far committed or failed.
func (c *Coordinator) WaitCommits(ctx context.Context) error {
	return c.await(ctx, func() (bool, error) {
		return len(c.core.snapshots) == 0 && c.core.phase == phaseIdle, nil
	})
}

// checkpoint takes a checkpoint of every step counted now; with final, training stops as the
// snapshot ends, so no batch trains after it.
func (c *Coordinator) checkpoint(ctx context.Context, final bool) (uint64, error) {
	if c.committer == nil {
		return 0, fmt.Errorf("%w: no checkpoint storage", ErrInvalidConfig)
	}
	c.mu.Lock()
	if err := cmp.Or(c.superseded, c.existing); err != nil {
		c.mu.Unlock()
		return 0, err
	}
	if final && c.core.step == c.core.snapStep && c.core.phase == phaseIdle && c.core.inFlight() {
		// Nothing ended since the last snapshot, but batches begun before may end yet and
		// count: none begins from now on, and the final snapshot waits for those to end.
		c.core.stop()
		c.applyLocked(nil)
		c.mu.Unlock()
		if err := c.await(ctx, func() (bool, error) { return !c.core.inFlight(), nil }); err != nil {
			return 0, err
		}
		c.mu.Lock()
	}
	if c.core.step == c.core.snapStep && (!final || c.core.phase == phaseIdle) {
		step := c.core.snapStep
		if final {
			c.core.stop()
			c.applyLocked(nil)
		}
		c.mu.Unlock()
		return step, c.waitCommitted(ctx, step)
	}
	// Every snapshot attempt that ends after this request covers every step counted now: the
	// step only grows, and no batch runs during a snapshot.
	after := c.snapSeq
	c.applyLocked(c.core.request(c.clock.now(), final))
	c.mu.Unlock()
	var res CheckpointEvent
	err := c.await(ctx, func() (bool, error) {
		res = c.snapRes
		return c.snapSeq > after, res.Err
	})
	if err != nil {
		return 0, err
	}
	return res.Step, c.waitCommitted(ctx, res.Step)
}

// waitCommitted waits until the commit of step is written or has failed.
func (c *Coordinator) waitCommitted(ctx context.Context, step uint64) error {
	return c.await(ctx, func() (bool, error) {
		if c.core.committed >= step {
			return true, nil
		}
		if slices.Contains(c.core.snapshots, step) {
			return false, nil
		}
		if err := c.stats.LastErr; err != nil {
			return true, err
		}
		return true, fmt.Errorf("elastic: step %d was not committed", step)
	})
}

// await waits until done (called with c.mu held, at every change of the coordinator's state)
// reports true, then returns its error; or until ctx ends or the coordinator closes.
func (c *Coordinator) await(ctx context.Context, done func() (bool, error)) error {
	for {
		c.mu.Lock()
		ok, err := done()
		ch := c.changed
		c.mu.Unlock()
		if ok {
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-c.done:
			return ErrClosed
		}
	}
}

// heardFrom records that worker called the dispatcher: a worker waiting for shards is alive.
func (c *Coordinator) heardFrom(worker string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calledLocked(worker)
	c.core.alive(c.clock.now(), worker)
}

// calledLocked records that worker called now (see Join).
func (c *Coordinator) calledLocked(worker string) {
	c.called[worker] = c.clock.now()
}

// Settle waits until the coordinator has carried out everything it decided before the call:
// the fences, evictions and snapshots of the workers failed, left or joined so far.
func (c *Coordinator) Settle(ctx context.Context) error {
	c.mu.Lock()
	target := c.queued
	c.mu.Unlock()
	return c.await(ctx, func() (bool, error) { return c.executed >= target, nil })
}

// Members returns the workers that joined and have not left or been failed.
func (c *Coordinator) Members() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.sortedMembers()
}

// WaitMembers waits until every worker has left (or was failed), or ctx ends.
func (c *Coordinator) WaitMembers(ctx context.Context) error {
	return c.await(ctx, func() (bool, error) { return len(c.core.members) == 0, nil })
}

// Finish ends training the way a job ends: with final set, a last checkpoint of everything
// trained, at whose end training stops (no batch trains after it); then no more barriers and every worker's next batch refused (Stop); it
// waits for the commits under way and, for at most linger, for the workers to leave (remote ones
// learn that the job is over only while the coordinator still answers). It returns the final
// checkpoint's error, or the commits'.
func (c *Coordinator) Finish(ctx context.Context, final bool, linger time.Duration) error {
	var err error
	if final {
		// Training stops as the final snapshot ends: workers of other processes would
		// otherwise train on between it and Stop, and the commit would miss their batches.
		if _, cerr := c.checkpointTries(ctx, true); cerr != nil {
			err = fmt.Errorf("final checkpoint: %w", cerr)
		}
	}
	c.Stop()
	if werr := c.WaitCommits(ctx); werr != nil && err == nil {
		err = fmt.Errorf("waiting for commits: %w", werr)
	}
	if linger > 0 {
		lctx, cancel := context.WithTimeout(ctx, linger)
		defer cancel()
		if c.WaitMembers(lctx) != nil {
			c.log.Warn("workers still joined at the end", "workers", c.Members())
		}
	}
	return err
}

// supersededLocked stops this coordinator for good: a later one has taken the job over (the
// servers refuse this one's calls, or storage its commits). Its workers' next Begin or Join
// returns ErrSuperseded; nothing more is snapshotted or recovered.
func (c *Coordinator) supersededLocked(err error) {
	if c.superseded != nil {
		return
	}
	c.superseded = fmt.Errorf("%w: %w", ErrSuperseded, err)
	if errors.Is(err, ErrSuperseded) {
		c.superseded = err
	}
	c.log.Error("another coordinator has taken the job over; this one stops", "err", err)
	c.core.stop()
	c.applyLocked(nil)
	c.haltLocked(c.superseded)
}

// haltLocked records that the coordinator has stopped for good, for err, and closes Done.
func (c *Coordinator) haltLocked(err error) {
	if c.haltErr != nil {
		return
	}
	c.haltErr = err
	close(c.halted)
}

// Done returns a channel closed once the coordinator has stopped for good: another coordinator
// took the job over (Err then wraps ErrSuperseded), or Close was called (ErrClosed). A program's
// run loop selects on it, so that a coordinator taken over ends at once (its training stopped,
// nothing more of it is committed) instead of serving a job that is no longer its own.
func (c *Coordinator) Done() <-chan struct{} { return c.halted }

// Err returns nil while Done is open, and then why the coordinator stopped: an error wrapping
// ErrSuperseded, or ErrClosed.
func (c *Coordinator) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.haltErr
}

// Stop ends training: no barrier goes up after those in progress, and workers' next Begin
// returns ErrStopped. Call Checkpoint before it for a final checkpoint.
func (c *Coordinator) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.core.stop()
	c.applyLocked(nil)
}

// execute carries out the core's actions in order.
func (c *Coordinator) execute() {
	defer c.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case <-c.wake:
			c.mu.Lock()
			acts := c.pending
			c.pending = nil
			c.mu.Unlock()
			for _, a := range acts {
				c.do(a)
				c.mu.Lock()
				c.executed++
				c.applyLocked(nil)
				c.mu.Unlock()
			}
		}
	}
}

// actionTimeout bounds one action's calls to the servers.
const actionTimeout = 2 * time.Minute

func (c *Coordinator) do(a action) {
	ctx, cancel := context.WithTimeout(context.Background(), actionTimeout)
	defer cancel()
	switch a.kind {
	case actFence:
		c.log.Info("fencing", "epochs", epochsString(a.epochs), "reason", a.reason)
		c.mu.Lock()
		c.fenced = append(c.fenced, a.epochs...)
		servers := slices.Clone(c.servers)
		c.mu.Unlock()
		errs := c.fenceEach(ctx, servers, 0, a.epochs)
		c.mu.Lock()
		c.stats.Fenced += len(a.epochs)
		for id, err := range errs {
			if errors.Is(err, ErrSuperseded) {
				c.supersededLocked(err)
				continue
			}
			// A server that cannot be fenced may still take the fenced worker's pushes: it is
			// failed, and recovered (fenced again) before the next checkpoint.
			c.serverFailedLocked(id, fmt.Sprintf("fence failed: %v", err))
		}
		c.mu.Unlock()
	case actRecover:
		c.recover()
	case actEvict:
		c.log.Warn("worker failed", "worker", a.worker, "reason", a.reason)
		c.svc.evict(a.worker, a.granted, true)
		c.mu.Lock()
		c.stats.Evicted++
		c.mu.Unlock()
	case actPause:
		c.clock.pause()
		c.pauseStart = c.clock.now()
	case actSnapshot:
		c.mu.Lock()
		if c.core.phase != phaseSnapshot || c.core.gen != a.gen {
			// A rollback ended the barrier it was for.
			c.snapSeq++
			c.snapRes = CheckpointEvent{Step: a.step, Err: errors.New("elastic: snapshot abandoned: the job was rolled back")}
			c.applyLocked(nil)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		job, err := c.snapshot(ctx, a.step)
		c.mu.Lock()
		c.snapSeq++
		c.snapRes = c.lastSnap
		c.applyLocked(c.core.snapshotDone(c.clock.now(), a.gen, err))
		if err == nil {
			// Queued only once the core counts the snapshot as awaiting its commit: a commit
			// done before would be ignored by the core, and the snapshot await it forever.
			c.commits <- job // room checked in snapshot; only this goroutine sends
		}
		c.mu.Unlock()
	case actRelease:
		c.clock.resume()
		if a.held {
			return // a hold's barrier: no checkpoint to report
		}
		d := c.clock.now().Sub(c.pauseStart)
		c.mu.Lock()
		c.stats.TotalBlocked += d
		c.stats.MaxBlocked = max(c.stats.MaxBlocked, d)
		c.mu.Unlock()
		ev := c.lastSnap
		ev.Blocked = d
		c.event(ev)
	case actCommit:
		// queued by snapshot with its blobs
	case actHold:
		c.serveHolds(a)
	}
}

// fence fences epochs (and the floor) on servers.
func (c *Coordinator) fence(ctx context.Context, servers []ParameterServer, floor uint64, epochs []uint64) error {
	var errs []error
	for id, err := range c.fenceEach(ctx, servers, floor, epochs) {
		errs = append(errs, fmt.Errorf("fence on %s: %w", id, err))
	}
	return errors.Join(errs...)
}

// fenceEach fences epochs (and the floor) on servers, and returns the failures by server.
func (c *Coordinator) fenceEach(ctx context.Context, servers []ParameterServer, floor uint64, epochs []uint64) map[string]error {
	var mu sync.Mutex
	errs := map[string]error{}
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Go(func() {
			if err := s.Fence(ctx, floor, epochs); err != nil {
				mu.Lock()
				errs[s.Node().ID] = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errs
}

// snapshot takes the checkpoint of step at a barrier: the job state, the dispatcher, every
// server; it returns the job that commits it in the background.
func (c *Coordinator) snapshot(ctx context.Context, step uint64) (commitJob, error) {
	c.tableMu.Lock() // every server snapshots under the one owner table
	defer c.tableMu.Unlock()
	c.mu.Lock()
	var err error
	if ids := c.core.failedServers(); len(ids) > 0 {
		err = fmt.Errorf("parameter servers %v failed and are not recovered", ids)
	}
	st := coordState{Version: 1, Job: c.cfg.Job, Step: step, Incarnation: c.core.incarnation, BatchSize: c.batch}
	servers := slices.Clone(c.servers)
	committed := c.committedDone
	c.mu.Unlock()
	if err == nil && c.committer == nil {
		err = errors.New("no checkpoint storage")
	}
	if err == nil && len(c.commits) == cap(c.commits) {
		err = fmt.Errorf("%w (%d)", ErrCommitsBehind, cap(c.commits))
	}
	var job commitJob
	c.lastSnap = CheckpointEvent{}
	if err == nil {
		st.Table = ps.AppendOwnerTable(nil, c.holder.Get())
		state, _ := json.Marshal(st)
		dispState, ledgerState, done := c.svc.snapshot()
		job = commitJob{step: step, taken: c.clock.now(), servers: servers, done: done, blobs: []checkpoint.Blob{
			{Name: blobState, Data: state},
			{Name: blobDispatcher, Data: dispState},
			{Name: blobLedger, Data: ledgerState},
			{Name: blobProgress, Data: progressBytes(done)},
		}}
		if c.cfg.JobState != nil {
			job.blobs = append(job.blobs, checkpoint.Blob{Name: blobJob, Data: c.cfg.JobState(step)})
		}
		err = c.syncTables(ctx, servers, c.holder.Get())
	}
	if err == nil {
		infos := make([]checkpoint.SnapshotInfo, len(servers))
		err = onEach(ctx, servers, func(ctx context.Context, i int, s ParameterServer) error {
			info, err := s.Snapshot(ctx, step, committed, job.done)
			if err != nil {
				return fmt.Errorf("snapshot on %s: %w", s.Node().ID, err)
			}
			infos[i] = info
			return nil
		})
		for _, in := range infos {
			c.lastSnap.Bytes += in.Bytes
			c.lastSnap.Full = c.lastSnap.Full || in.Full
		}
	}
	c.lastSnap.Step, c.lastSnap.Err = step, err
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("elastic: snapshot of step %d: %w", step, err)
		if errors.Is(err, ErrSuperseded) {
			c.supersededLocked(err)
		}
		c.lastSnap.Err = err
		c.stats.Failed++
		c.stats.LastErr = err
		c.log.Warn("snapshot failed", "step", step, "err", err)
		return commitJob{}, err
	}
	c.stats.Snapshots++
	c.stats.LastSnapshot = step // before the barrier comes down
	return job, nil
}

// commitLoop commits snapshots one at a time, in step order, once every server persisted.
func (c *Coordinator) commitLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case job := <-c.commits:
			err := c.commit(job)
			c.event(CheckpointEvent{Step: job.step, Commit: true, Persist: c.clock.now().Sub(job.taken), Err: err})
			c.mu.Lock()
			c.core.commitDone(job.step, err)
			if err != nil {
				c.stats.Failed++
				c.stats.LastErr = err
				c.log.Warn("commit failed", "step", job.step, "err", err)
				if errors.Is(err, checkpoint.ErrSuperseded) || errors.Is(err, ErrSuperseded) {
					c.supersededLocked(err)
				}
			} else {
				c.stats.Committed++
				c.stats.LastCommitted = job.step
				c.committedDone = job.done
			}
			c.applyLocked(nil)
			c.mu.Unlock()
		}
	}
}

func (c *Coordinator) commit(job commitJob) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.PersistTimeout)
	defer cancel()
	ctx, cancel = c.untilClosed(ctx)
	defer cancel()
	refs := make([]checkpoint.ManifestRef, len(job.servers))
	err := onEach(ctx, job.servers, func(ctx context.Context, i int, s ParameterServer) error {
		ref, err := s.WaitPersisted(ctx, job.step)
		if err != nil {
			return fmt.Errorf("persist on %s: %w", s.Node().ID, err)
		}
		refs[i] = ref
		return nil
	})
	if err != nil {
		return fmt.Errorf("elastic: commit of step %d: %w", job.step, err)
	}
	c.mu.Lock()
	abandoned := c.core.commitAbandoned(job.step)
	c.mu.Unlock()
	if abandoned {
		// A server failed since the snapshot and the job was restored: committing it now would
		// put a state the job has left behind on top of the commits.
		return fmt.Errorf("elastic: commit of step %d: abandoned (a server failed and was recovered since the snapshot)", job.step)
	}
	if _, err := c.committer.Commit(ctx, job.step, refs, job.blobs...); err != nil {
		return fmt.Errorf("elastic: commit of step %d: %w", job.step, err)
	}
	return nil
}

// untilClosed returns a context that ends with parent or when the coordinator closes.
func (c *Coordinator) untilClosed(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// event hands ev to Config.OnCheckpoint and OnProgress.
func (c *Coordinator) event(ev CheckpointEvent) {
	c.prog.emit(ProgressEvent{Kind: EventCheckpoint, Step: c.stepNow(), Checkpoint: ev})
	if c.cfg.OnCheckpoint == nil {
		return
	}
	c.eventMu.Lock()
	defer c.eventMu.Unlock()
	c.cfg.OnCheckpoint(ev)
}

// timerLoop runs the core's timers (silent workers, barrier timeouts, a checkpoint due by time
// while no batch ends).
func (c *Coordinator) timerLoop() {
	defer c.wg.Done()
	every := time.Second
	for _, d := range []time.Duration{c.cfg.ArriveTimeout, c.cfg.WorkerSilence, c.cfg.CheckpointInterval} { // negative: none
		if d > 0 {
			every = min(every, d/4)
		}
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			c.mu.Lock()
			if acts := c.core.timers(c.clock.now()); len(acts) > 0 {
				c.applyLocked(acts)
			}
			c.mu.Unlock()
		}
	}
}

// Close stops the coordinator's goroutines; commits not yet written are abandoned. It does not
// close the servers. Idempotent.
func (c *Coordinator) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	c.applyLocked(nil)
	c.haltLocked(ErrClosed)
	c.mu.Unlock()
	c.wg.Wait()
	c.clock.resume()
	c.mu.Lock()
	m := c.migrator
	c.mu.Unlock()
	if m != nil {
		m.Close()
	}
	return nil
}
