package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/examples/dlrm/internal/ctl"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
	"golang.org/x/sync/errgroup"
)

// Timings of the checkpoint barrier of a multi-process job. A worker applies batches only while
// it keeps in touch with the coordinator: it long-polls (Coord.Wait), and when a poll fails or
// outlasts pollTimeout it closes its gate and registers again (Coord.Join) before it applies
// another batch. The coordinator stops waiting for a worker at barriers once it has heard
// nothing from it for workerSilence, longer than pollTimeout, by which time a live worker that
// lost touch has closed its gate itself. So a crashed worker delays a barrier by about
// workerSilence, not barrierTimeout.
const (
	// pollWait is how long the coordinator holds a barrier poll open when nothing changes.
	pollWait = 2 * time.Second
	// pollTimeout bounds a worker's barrier poll and registration.
	pollTimeout = pollWait + 3*time.Second
	// workerSilence is how long after a worker's last call ended the coordinator still counts
	// it at barriers.
	workerSilence = pollTimeout + 2*time.Second
	// barrierTimeout bounds the wait for every counted worker to reach a checkpoint barrier; a
	// checkpoint whose barrier times out is abandoned and training goes on. The dispatcher's
	// clock stands still during a barrier, so waiting costs no worker its leases.
	barrierTimeout = 20 * time.Second
	// arriveTimeout bounds a worker's wait at a barrier for the coordinator's release (the
	// barrier, the servers' snapshots); a worker that gives up keeps its gate closed and
	// registers again.
	arriveTimeout = barrierTimeout + snapshotTimeout + pollTimeout
	// snapshotTimeout bounds the servers' snapshots of one checkpoint.
	snapshotTimeout = 2 * time.Minute
)

// barrierWorker is what the coordinator knows of one registered worker.
type barrierWorker struct {
	id      string
	calls   int       // barrier calls in progress
	seen    time.Time // when its last call began or ended
	arrived uint64    // the barrier generation it has arrived at
}

// coordService is the coordinator's control service: the workers' registration and checkpoint
// barrier. Safe for concurrent use.
type coordService struct {
	now    func() time.Time
	logger *slog.Logger

	mu       sync.Mutex
	gen      uint64 // barrier generation: odd while a barrier is up
	released uint64
	stop     bool
	failure  error // a worker failed while applying a batch
	workers  map[string]*barrierWorker
	changed  chan struct{}
}

func newCoordService(now func() time.Time, logger *slog.Logger) *coordService {
	if now == nil {
		now = time.Now
	}
	if logger == nil {
		logger = discardLogger()
	}
	return &coordService{now: now, logger: logger, workers: map[string]*barrierWorker{}, changed: make(chan struct{})}
}

func (c *coordService) broadcastLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// replyLocked is the barrier state as worker w (nil: not registered) should see it.
func (c *coordService) replyLocked(w *barrierWorker) ctl.BarrierReply {
	if c.stop {
		return ctl.BarrierReply{Gen: c.gen, Stop: true}
	}
	if w == nil {
		return ctl.BarrierReply{Gen: c.gen, Rejoin: true}
	}
	return ctl.BarrierReply{Gen: c.gen, Pause: c.gen%2 == 1 && w.arrived != c.gen}
}

// Join registers a worker (again) and returns at once: from now on barriers wait for it. A
// worker calls it, with its gate closed, before it applies its first batch and after it lost
// touch with the coordinator; if the answer says Pause, it arrives before opening its gate.
func (c *coordService) Join(a ctl.Barrier, r *ctl.BarrierReply) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stop {
		*r = c.replyLocked(nil)
		return nil
	}
	w := c.workers[a.Worker]
	if w == nil {
		w = &barrierWorker{id: a.Worker}
		c.workers[a.Worker] = w
	}
	// A worker registering again lost track of the barrier (its Arrived may have failed): it
	// must arrive again at a barrier that is up, or it would open its gate during the snapshot.
	w.arrived = 0
	w.seen = c.now()
	c.broadcastLocked()
	*r = c.replyLocked(w)
	return nil
}

// Wait is a registered worker's long poll: it returns when the barrier state differs from what
// the worker saw (a.Gen), or after pollWait. An unregistered worker is told to Rejoin.
func (c *coordService) Wait(a ctl.Barrier, r *ctl.BarrierReply) error {
	c.mu.Lock()
	w := c.workers[a.Worker]
	if w == nil || c.stop {
		*r = c.replyLocked(w)
		c.mu.Unlock()
		return nil
	}
	w.calls++
	w.seen = c.now()
	c.mu.Unlock()
	timer := time.NewTimer(pollWait)
	defer timer.Stop()
	for {
		c.mu.Lock()
		rep := c.replyLocked(w)
		if rep.Stop || rep.Pause || c.gen != a.Gen {
			c.endCallLocked(w, r, rep)
			return nil
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			c.mu.Lock()
			c.endCallLocked(w, r, c.replyLocked(w))
			return nil
		}
	}
}

// endCallLocked ends a call of w with rep and unlocks.
func (c *coordService) endCallLocked(w *barrierWorker, r *ctl.BarrierReply, rep ctl.BarrierReply) {
	w.calls--
	w.seen = c.now()
	if c.workers[w.id] != w {
		rep = c.replyLocked(nil) // it left or was dropped meanwhile
	}
	*r = rep
	c.mu.Unlock()
}

// Arrived records that a worker closed its gate for barrier a.Gen and returns when the
// barrier is released. An unregistered worker is told to Rejoin at once: the barrier does not
// count it.
func (c *coordService) Arrived(a ctl.Barrier, r *ctl.BarrierReply) error {
	c.mu.Lock()
	w := c.workers[a.Worker]
	if w == nil || c.stop {
		*r = c.replyLocked(w)
		c.mu.Unlock()
		return nil
	}
	w.calls++
	w.seen = c.now()
	w.arrived = a.Gen
	c.broadcastLocked()
	for c.released < a.Gen && !c.stop && c.workers[a.Worker] == w {
		ch := c.changed
		c.mu.Unlock()
		<-ch
		c.mu.Lock()
	}
	c.endCallLocked(w, r, c.replyLocked(w))
	return nil
}

// Leave forgets a worker that stopped training cleanly: barriers no longer wait for it.
func (c *coordService) Leave(a ctl.Barrier, _ *ctl.Empty) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.workers, a.Worker)
	c.broadcastLocked()
	return nil
}

// Failed records that a worker failed while applying a batch (and forgets it): no checkpoint
// is taken from now on, and the coordinator stops the job.
func (c *coordService) Failed(a ctl.Failure, _ *ctl.Empty) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failure == nil {
		c.failure = fmt.Errorf("%w: worker %s: %s", ErrPartialApply, a.Worker, a.Err)
	}
	delete(c.workers, a.Worker)
	c.broadcastLocked()
	return nil
}

// failed returns the first failure a worker reported, or nil.
func (c *coordService) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failure
}

// raise puts up a barrier and waits until every registered worker has arrived; it returns the
// generation to release. A worker not heard from for workerSilence is dropped (it has to
// register again), so a crashed worker does not hold the barrier up. On failure the barrier
// is released.
func (c *coordService) raise(ctx context.Context) (uint64, error) {
	c.mu.Lock()
	c.gen++
	gen := c.gen
	c.broadcastLocked()
	c.mu.Unlock()
	timeout := time.NewTimer(barrierTimeout)
	defer timeout.Stop()
	tick := time.NewTicker(workerSilence / 8)
	defer tick.Stop()
	for {
		c.mu.Lock()
		now := c.now()
		var waiting []string
		for id, w := range c.workers {
			switch {
			case w.arrived == gen:
			case w.calls == 0 && now.Sub(w.seen) >= workerSilence:
				delete(c.workers, id)
				c.logger.Warn("worker silent: no longer waited for at checkpoint barriers", "worker", id, "silent", now.Sub(w.seen).Round(time.Millisecond))
			default:
				waiting = append(waiting, id)
			}
		}
		failure := c.failure
		ch := c.changed
		c.mu.Unlock()
		if failure != nil {
			c.release(gen)
			return 0, failure
		}
		if len(waiting) == 0 {
			return gen, nil
		}
		select {
		case <-ch:
		case <-tick.C:
		case <-ctx.Done():
			c.release(gen)
			return 0, ctx.Err()
		case <-timeout.C:
			c.release(gen)
			sort.Strings(waiting)
			return 0, fmt.Errorf("checkpoint barrier: workers %v did not arrive within %v", waiting, barrierTimeout)
		}
	}
}

func (c *coordService) release(gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = gen
	c.gen = gen + 1 // even: no barrier
	c.broadcastLocked()
}

func (c *coordService) shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stop = true
	c.broadcastLocked()
}

// RunCoordinator runs the coordinator of a multi-process job until the data is done or ctx
// ends: it serves the data-shard dispatcher on rc.Listen (with the cluster secret), raises a
// checkpoint barrier every CheckpointEvery steps' worth of records and once at the end, has
// every parameter server snapshot and persist its part, and commits the checkpoint with the
// dispatcher's snapshot; commits are made one at a time, in step order. With Resume it first
// has every server restore the newest commit (the servers must be freshly started) and
// restores the dispatcher. The returned summary holds the data, progress and checkpoint
// figures (the exactly-once ledger and the evaluation belong to the embedded mode). When a
// worker reports that a batch failed while being applied, the coordinator takes no further
// checkpoint, stops the job and returns an error wrapping ErrPartialApply with the summary.
func RunCoordinator(ctx context.Context, rc RoleConfig) (*Summary, error) {
	if err := rc.prepare(); err != nil {
		return nil, err
	}
	cfg := &rc.Config
	data, err := loadData(ctx, cfg)
	if err != nil {
		return nil, err
	}
	r := &run{cfg: *cfg, logger: rc.Logger, data: data, ledger: newLedger(), secret: rc.Secret, clock: newPausableClock(nil)}
	r.mcfg = model.Config{DenseFeatures: data.dense, Fields: len(data.fields), EmbeddingDim: cfg.EmbeddingDim,
		BottomHidden: cfg.BottomHidden, TopHidden: cfg.TopHidden, FieldPooling: data.pooling, Seed: cfg.Seed}
	m0, err := model.New(r.mcfg)
	if err != nil {
		return nil, err
	}
	r.mcfg = m0.Config()
	if r.disp, err = shard.New(shard.Config{Dataset: data.dataset, ShardSize: cfg.ShardSize, Epochs: cfg.Epochs, Seed: cfg.Seed,
		Shuffle: true, ShuffleRecords: data.shuffle, LeaseTTL: cfg.LeaseTTL, Clock: r.clock, Logger: rc.Logger}); err != nil {
		return nil, err
	}
	st, err := checkpoint.NewFSStorage(cfg.CheckpointDir)
	if err != nil {
		return nil, err
	}
	committer, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: jobName, Storage: st, Logger: rc.Logger})
	if err != nil {
		return nil, err
	}
	servers := make([]*ctl.Client, len(rc.PS))
	for i, n := range rc.PS {
		addr, err := ControlAddr(n.Addr)
		if err != nil {
			return nil, err
		}
		servers[i] = ctl.NewClient(addr, rc.Secret)
		defer servers[i].Close()
	}
	each := func(ctx context.Context, fn func(i int, c *ctl.Client) error) error {
		g, gctx := errgroup.WithContext(ctx)
		for i, c := range servers {
			g.Go(func() error {
				// Servers may still be starting: retry until they answer or ctx ends.
				for {
					err := fn(i, c)
					var op *net.OpError
					if err == nil || !errors.As(err, &op) || gctx.Err() != nil {
						return err
					}
					select {
					case <-time.After(500 * time.Millisecond):
					case <-gctx.Done():
						return gctx.Err()
					}
				}
			})
		}
		return g.Wait()
	}
	var step uint64
	sum := &Summary{Data: data.desc, HeldOut: data.heldOut, Servers: len(rc.PS), Workers: rc.Workers}
	if cfg.Resume {
		var meta runMeta
		info, err := committer.Choose(ctx, func(ctx context.Context, s uint64) error {
			return each(ctx, func(_ int, c *ctl.Client) error { return c.Call(ctx, "PS.Verify", ctl.Step{Step: s}, &ctl.Empty{}) })
		})
		if errors.Is(err, checkpoint.ErrNoCheckpoint) {
			return nil, fmt.Errorf("%w in %s", ErrNoCheckpoint, cfg.CheckpointDir)
		}
		if err != nil {
			return nil, err
		}
		mb, err := committer.Blob(ctx, info.Step, blobMeta)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(mb, &meta); err != nil {
			return nil, err
		}
		if fp := r.fingerprint(); meta.Fingerprint != fp {
			return nil, fmt.Errorf("%w: the checkpoint was taken with\n  %s\nthis run has\n  %s", ErrMismatch, meta.Fingerprint, fp)
		}
		if err := each(ctx, func(_ int, c *ctl.Client) error {
			return c.Call(ctx, "PS.Load", ctl.Step{Step: info.Step}, &ctl.LoadReply{})
		}); err != nil {
			return nil, fmt.Errorf("restore step %d: %w", info.Step, err)
		}
		db, err := committer.Blob(ctx, info.Step, blobDispatcher)
		if err != nil {
			return nil, err
		}
		if err := r.disp.Restore(db); err != nil {
			return nil, err
		}
		if err := committer.DropAfter(ctx, info.Step); err != nil {
			return nil, err
		}
		step = info.Step
		sum.Resumed, sum.ResumedStep, sum.ResumedSamples = true, info.Step, meta.Samples
		r.samples.Store(meta.Samples)
		r.baseSamp = meta.Samples
		r.emit(Event{Kind: EventRestore, Message: fmt.Sprintf("restored checkpoint of step %d on %d servers and the dispatcher", info.Step, len(rc.PS))})
	} else if err := wipeStorage(ctx, st); err != nil {
		return nil, err
	}

	// Serve the dispatcher and the barrier.
	var wg sync.WaitGroup
	defer wg.Wait()
	dsrv, err := shardnet.NewServer(shardnet.ServerConfig{Service: r.disp, Secret: rc.Secret, Logger: rc.Logger})
	if err != nil {
		return nil, err
	}
	defer dsrv.Close()
	l, err := net.Listen("tcp", rc.Listen)
	if err != nil {
		return nil, err
	}
	wg.Add(1)
	go func() { defer wg.Done(); dsrv.Serve(l) }()
	coord := newCoordService(nil, rc.Logger)
	cs, err := ctl.NewServer(rc.Secret, "Coord", coord)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	defer coord.shutdown() // first: the calls cs.Close waits for return at once
	caddr, err := ControlAddr(l.Addr().String())
	if err != nil {
		return nil, err
	}
	cl, err := net.Listen("tcp", caddr)
	if err != nil {
		return nil, err
	}
	wg.Add(1)
	go func() { defer wg.Done(); cs.Serve(cl) }()
	r.emit(Event{Kind: EventStart, Message: fmt.Sprintf("coordinator: dispatcher on %s (control %s), %d servers; %s", l.Addr(), caddr, len(rc.PS), data.desc)})

	var statsMu sync.Mutex
	stats := CheckpointStats{Dir: cfg.CheckpointDir}
	commits := newCommitQueue(committer, commitBacklog,
		func(ctx context.Context, s uint64) ([]checkpoint.ManifestRef, int64, error) {
			refs := make([]checkpoint.ManifestRef, len(servers))
			err := each(ctx, func(i int, c *ctl.Client) error {
				var rep ctl.ManifestReply
				err := c.Call(ctx, "PS.WaitPersisted", ctl.Step{Step: s}, &rep)
				refs[i] = rep.Ref
				return err
			})
			return refs, 0, err
		},
		func(p pendingCommit, _ int64, err error) {
			ev := CheckpointEvent{Step: p.step, Full: p.full, Persist: time.Since(p.taken), Err: err}
			statsMu.Lock()
			if err == nil {
				stats.Committed++
				stats.LastCommitted = p.step
				stats.MaxPersist = max(stats.MaxPersist, ev.Persist)
			} else {
				stats.Failed++
			}
			statsMu.Unlock()
			r.emit(Event{Kind: EventCommit, Checkpoint: ev})
		})
	defer commits.abort()
	count := func(f func(*CheckpointStats)) {
		statsMu.Lock()
		f(&stats)
		statsMu.Unlock()
	}
	// checkpointNow takes a checkpoint; with barrier it first pauses every worker at a step
	// boundary (not needed once the data is done: every batch was applied and reported). The
	// commit follows in the background, after the earlier ones.
	checkpointNow := func(ctx context.Context, barrier, final bool) {
		if coord.failed() != nil {
			return
		}
		step++
		s := step
		if err := commits.reserve(ctx, final); err != nil {
			count(func(st *CheckpointStats) { st.Skipped++ })
			r.emit(Event{Kind: EventCheckpoint, Checkpoint: CheckpointEvent{Step: s, Skipped: true, Err: err}})
			return
		}
		t0 := time.Now()
		r.clock.pause()
		ev, blobs := r.snapshotRoles(ctx, coord, each, s, barrier, final)
		r.clock.resume()
		ev.Blocked = time.Since(t0)
		count(func(st *CheckpointStats) {
			switch {
			case ev.Skipped:
				st.Skipped++
			case ev.Err != nil:
				st.Failed++
			default:
				st.Taken++
				if ev.Full {
					st.Full++
				}
				st.TotalBlocked += ev.Blocked
				st.MaxBlocked = max(st.MaxBlocked, ev.Blocked)
				st.Copied += ev.Bytes
			}
		})
		r.emit(Event{Kind: EventCheckpoint, Checkpoint: ev})
		if ev.Err != nil {
			commits.release()
			return
		}
		commits.push(pendingCommit{step: s, blobs: blobs, taken: t0, full: ev.Full})
	}

	r.start = time.Now()
	tick := time.NewTicker(cfg.ProgressEvery)
	defer tick.Stop()
	var deadline <-chan time.Time
	if cfg.Duration > 0 {
		t := time.NewTimer(cfg.Duration)
		defer t.Stop()
		deadline = t.C
	}
	lastCk := r.accepted()
	reason := ""
	var failure error
	for reason == "" {
		select {
		case <-ctx.Done():
			reason = "interrupted"
		case <-deadline:
			reason = fmt.Sprintf("%v passed", cfg.Duration)
		case <-tick.C:
			r.disp.Expire()
			if failure = coord.failed(); failure != nil {
				reason = "a worker failed"
				break
			}
			if r.disp.Progress().Finished {
				reason = "every epoch done"
				break
			}
			acc := r.accepted()
			r.samples.Store(acc)
			r.emit(Event{Kind: EventProgress})
			if cfg.CheckpointEvery > 0 && acc-lastCk >= int64(cfg.CheckpointEvery*cfg.BatchSize) {
				lastCk = acc
				checkpointNow(ctx, true, false)
			}
		}
	}
	r.emit(Event{Kind: EventNote, Message: "stopping: " + reason})
	if failure == nil && !cfg.NoFinalCheckpoint {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalTimeout)
		checkpointNow(fctx, !r.disp.Progress().Finished, true)
		cancel()
	}
	coord.shutdown()
	commits.finish()
	if failure == nil {
		failure = coord.failed()
	}
	statsMu.Lock()
	sum.Checkpoints = stats
	statsMu.Unlock()
	sum.StopReason = reason
	sum.Elapsed = time.Since(r.start)
	sum.TotalSamples = r.accepted()
	sum.Samples = sum.TotalSamples - r.baseSamp
	if sec := sum.Elapsed.Seconds(); sec > 0 {
		sum.SamplesPerSec = float64(sum.Samples) / sec
	}
	return sum, failure
}

// snapshotRoles takes checkpoint s of a multi-process job: with barrier, every registered
// worker pauses at a step boundary first and is released after; every server snapshots its
// part; the dispatcher's snapshot and the run's description are the coordinator's blobs. A
// server answering Busy makes the checkpoint skipped (ev.Skipped).
func (r *run) snapshotRoles(ctx context.Context, coord *coordService, each func(context.Context, func(int, *ctl.Client) error) error,
	s uint64, barrier, final bool) (CheckpointEvent, []checkpoint.Blob) {
	ev := CheckpointEvent{Step: s}
	if barrier {
		gen, err := coord.raise(ctx)
		if err != nil {
			ev.Err = err
			return ev, nil
		}
		defer coord.release(gen)
	} else if err := coord.failed(); err != nil {
		ev.Err = err
		return ev, nil
	}
	sctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	var mu sync.Mutex
	busy := false
	err := each(sctx, func(_ int, c *ctl.Client) error {
		var rep ctl.SnapshotReply
		if err := c.Call(sctx, "PS.Snapshot", ctl.SnapshotArgs{Step: s, Final: final}, &rep); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		ev.Bytes += rep.Bytes
		ev.Full = ev.Full || rep.Full
		busy = busy || rep.Busy
		return nil
	})
	switch {
	case err != nil:
		ev.Err = err
		return ev, nil
	case busy:
		ev.Skipped, ev.Err = true, fmt.Errorf("a server's %w", checkpoint.ErrBusy)
		return ev, nil
	}
	var done int64
	for _, e := range r.disp.Progress().EpochRecords {
		done += e.Done
	}
	meta, _ := json.Marshal(runMeta{Version: 1, Fingerprint: r.fingerprint(), Step: int64(s), Samples: done})
	return ev, []checkpoint.Blob{{Name: blobDispatcher, Data: r.disp.Snapshot()}, {Name: blobLedger, Data: newLedger().encode()}, {Name: blobMeta, Data: meta}}
}

// accepted returns the positions the dispatcher counted as trained, over every epoch.
func (r *run) accepted() int64 {
	var n int64
	for _, e := range r.disp.Progress().EpochRecords {
		n += e.Done
	}
	return n
}
