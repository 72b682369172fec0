package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/examples/dlrm/internal/ctl"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
	"golang.org/x/sync/errgroup"
)

// barrierTimeout bounds the wait for every worker to reach a checkpoint barrier; a checkpoint
// whose barrier times out is abandoned and training goes on.
const barrierTimeout = 30 * time.Second

// coordService is the coordinator's control service: the workers' checkpoint barrier.
type coordService struct {
	mu       sync.Mutex
	gen      uint64 // barrier generation: odd while a barrier is up
	released uint64
	stop     bool
	known    map[string]bool
	arrived  map[string]uint64
	changed  chan struct{}
}

func newCoordService() *coordService {
	return &coordService{known: map[string]bool{}, arrived: map[string]uint64{}, changed: make(chan struct{})}
}

func (c *coordService) broadcastLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Wait is a worker's long poll: it returns when the barrier state differs from what the worker
// saw, or after a while.
func (c *coordService) Wait(a ctl.Barrier, r *ctl.BarrierReply) error {
	deadline := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		if !c.known[a.Worker] {
			c.known[a.Worker] = true
			c.broadcastLocked()
		}
		pause := c.gen%2 == 1
		if c.stop || (pause && c.arrived[a.Worker] != c.gen) || c.gen != a.Gen {
			*r = ctl.BarrierReply{Gen: c.gen, Pause: pause, Stop: c.stop}
			c.mu.Unlock()
			return nil
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			c.mu.Lock()
			*r = ctl.BarrierReply{Gen: c.gen, Pause: c.gen%2 == 1 && c.arrived[a.Worker] != c.gen, Stop: c.stop}
			c.mu.Unlock()
			return nil
		}
	}
}

// Arrived records that a worker closed its gate for barrier a.Gen and returns when the
// barrier is released.
func (c *coordService) Arrived(a ctl.Barrier, r *ctl.BarrierReply) error {
	c.mu.Lock()
	c.known[a.Worker] = true
	c.arrived[a.Worker] = a.Gen
	c.broadcastLocked()
	for c.released < a.Gen && !c.stop {
		ch := c.changed
		c.mu.Unlock()
		<-ch
		c.mu.Lock()
	}
	*r = ctl.BarrierReply{Gen: c.gen, Stop: c.stop}
	c.mu.Unlock()
	return nil
}

// Leave forgets a worker that stopped training: barriers no longer wait for it.
func (c *coordService) Leave(a ctl.Barrier, _ *ctl.Empty) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.known, a.Worker)
	delete(c.arrived, a.Worker)
	c.broadcastLocked()
	return nil
}

// raise puts up a barrier and waits until every known worker (and at least want of them) has
// arrived; it returns the generation to release.
func (c *coordService) raise(ctx context.Context, want int) (uint64, error) {
	c.mu.Lock()
	c.gen++
	gen := c.gen
	c.broadcastLocked()
	c.mu.Unlock()
	timeout := time.After(barrierTimeout)
	for {
		c.mu.Lock()
		n, all := 0, true
		for w := range c.known {
			if c.arrived[w] == gen {
				n++
			} else {
				all = false
			}
		}
		ch := c.changed
		c.mu.Unlock()
		if all && n >= want {
			return gen, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			c.release(gen)
			return 0, ctx.Err()
		case <-timeout:
			c.release(gen)
			return 0, fmt.Errorf("checkpoint barrier: %d of %d workers arrived within %v", n, max(want, len(c.known)), barrierTimeout)
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
// dispatcher's snapshot. With Resume it first has every server restore the newest commit and
// restores the dispatcher. The returned summary holds the data, progress and checkpoint
// figures (the exactly-once ledger and the evaluation belong to the embedded mode).
func RunCoordinator(ctx context.Context, rc RoleConfig) (*Summary, error) {
	if err := rc.prepare(); err != nil {
		return nil, err
	}
	cfg := &rc.Config
	data, err := loadData(ctx, cfg)
	if err != nil {
		return nil, err
	}
	r := &run{cfg: *cfg, logger: rc.Logger, data: data, ledger: newLedger(), secret: rc.Secret}
	r.mcfg = model.Config{DenseFeatures: data.dense, Fields: len(data.fields), EmbeddingDim: cfg.EmbeddingDim,
		BottomHidden: cfg.BottomHidden, TopHidden: cfg.TopHidden, FieldPooling: data.pooling, Seed: cfg.Seed}
	m0, err := model.New(r.mcfg)
	if err != nil {
		return nil, err
	}
	r.mcfg = m0.Config()
	if r.disp, err = shard.New(shard.Config{Dataset: data.dataset, ShardSize: cfg.ShardSize, Epochs: cfg.Epochs, Seed: cfg.Seed,
		Shuffle: true, ShuffleRecords: data.shuffle, LeaseTTL: cfg.LeaseTTL, Logger: rc.Logger}); err != nil {
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
	coord := newCoordService()
	defer coord.shutdown()
	cs, err := ctl.NewServer(rc.Secret, "Coord", coord)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
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

	var commits sync.WaitGroup
	defer commits.Wait()
	var statsMu sync.Mutex
	stats := CheckpointStats{Dir: cfg.CheckpointDir}
	// checkpointNow takes a checkpoint; with barrier it first pauses every worker at a step
	// boundary (not needed once the data is done: every batch was applied and reported).
	checkpointNow := func(ctx context.Context, barrier bool) {
		statsMu.Lock()
		step++
		s := step
		statsMu.Unlock()
		t0 := time.Now()
		var gen uint64
		if barrier {
			var err error
			if gen, err = coord.raise(ctx, rc.Workers); err != nil {
				statsMu.Lock()
				stats.Failed++
				statsMu.Unlock()
				r.emit(Event{Kind: EventCheckpoint, Checkpoint: CheckpointEvent{Step: s, Err: err}})
				return
			}
		}
		var bytes int64
		var full bool
		var mu sync.Mutex
		err = each(ctx, func(_ int, c *ctl.Client) error {
			var rep ctl.SnapshotReply
			if err := c.Call(ctx, "PS.Snapshot", ctl.Step{Step: s}, &rep); err != nil {
				return err
			}
			mu.Lock()
			bytes += rep.Bytes
			full = full || rep.Full
			mu.Unlock()
			return nil
		})
		samples := r.disp.Progress()
		var done int64
		for _, e := range samples.EpochRecords {
			done += e.Done
		}
		meta, _ := json.Marshal(runMeta{Version: 1, Fingerprint: r.fingerprint(), Step: int64(s), Samples: done})
		blobs := []checkpoint.Blob{{Name: blobDispatcher, Data: r.disp.Snapshot()}, {Name: blobLedger, Data: newLedger().encode()}, {Name: blobMeta, Data: meta}}
		if barrier {
			coord.release(gen)
		}
		blocked := time.Since(t0)
		ev := CheckpointEvent{Step: s, Full: full, Bytes: bytes, Blocked: blocked, Err: err}
		statsMu.Lock()
		if err != nil {
			stats.Failed++
		} else {
			stats.Taken++
			stats.TotalBlocked += blocked
			stats.MaxBlocked = max(stats.MaxBlocked, blocked)
			stats.Copied += bytes
		}
		statsMu.Unlock()
		r.emit(Event{Kind: EventCheckpoint, Checkpoint: ev})
		if err != nil {
			return
		}
		commits.Add(1)
		go func() {
			defer commits.Done()
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), persistTimeout)
			defer cancel()
			refs := make([]checkpoint.ManifestRef, len(servers))
			err := each(cctx, func(i int, c *ctl.Client) error {
				var rep ctl.ManifestReply
				err := c.Call(cctx, "PS.WaitPersisted", ctl.Step{Step: s}, &rep)
				refs[i] = rep.Ref
				return err
			})
			if err == nil {
				_, err = committer.Commit(cctx, s, refs, blobs...)
			}
			statsMu.Lock()
			if err == nil {
				stats.Committed++
				stats.LastCommitted = max(stats.LastCommitted, s)
			} else {
				stats.Failed++
			}
			statsMu.Unlock()
			r.emit(Event{Kind: EventCommit, Checkpoint: CheckpointEvent{Step: s, Persist: time.Since(t0), Err: err}})
		}()
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
	for reason == "" {
		select {
		case <-ctx.Done():
			reason = "interrupted"
		case <-deadline:
			reason = fmt.Sprintf("%v passed", cfg.Duration)
		case <-tick.C:
			r.disp.Expire()
			if r.disp.Progress().Finished {
				reason = "every epoch done"
				break
			}
			acc := r.accepted()
			r.samples.Store(acc)
			r.emit(Event{Kind: EventProgress})
			if cfg.CheckpointEvery > 0 && acc-lastCk >= int64(cfg.CheckpointEvery*cfg.BatchSize) {
				lastCk = acc
				checkpointNow(ctx, true)
			}
		}
	}
	r.emit(Event{Kind: EventNote, Message: "stopping: " + reason})
	if !cfg.NoFinalCheckpoint {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalTimeout)
		checkpointNow(fctx, !r.disp.Progress().Finished)
		cancel()
	}
	coord.shutdown()
	commits.Wait()
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
	return sum, nil
}

// accepted returns the positions the dispatcher counted as trained, over every epoch.
func (r *run) accepted() int64 {
	var n int64
	for _, e := range r.disp.Progress().EpochRecords {
		n += e.Done
	}
	return n
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
