package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// runElastic measures how long training stands still when the job's membership changes, all
// in one run on one in-process job shape (3 parameter servers, 2 workers, a table of elRows
// rows filled before training, a commit, then elSinceCommit more steps before each event):
//
//   - a worker joins a running job: from the scale-up to its first step (the others go on);
//   - a parameter server dies and a new incarnation replaces it, under Rollback and Partial,
//     restoring from its shared memory (same host) and from storage (its shared memory gone):
//     from the kill to the first step after the recovery, with the failure detection apart;
//   - a parameter server dies and nobody replaces it (Partial: the survivors take its slots):
//     the same, with detection by the health check's timeout;
//   - the DLRover way in the same run: stop every process, start them again and restore the
//     whole job from the commit (from storage), to the first step: the baseline of the ratios;
//   - the coordinator restarts and takes the running job over.
//
// Every time is the median of elRepeats events.
func runElastic(ctx context.Context, opt options, r *report) error {
	p := elParams{rows: 1 << 21, records: 1 << 20, repeats: 3}
	if opt.quick {
		p = elParams{rows: 1 << 16, records: 1 << 16, repeats: 1}
	}
	dir, err := os.MkdirTemp(opt.dir, "bench-elastic-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	shm, release, err := shmScratch(shmRoot, "bench-elastic-", dir)
	if err != nil {
		return err
	}
	defer release()
	p.dir, p.shm = dir, shm
	fmt.Printf("elastic: %d rows of dim %d on 3 servers, 2 workers, %d repeats\n", p.rows, elDim, p.repeats)

	var join, step, others []float64
	for i := range p.repeats {
		j, s, o, err := p.join(ctx, i)
		if err != nil {
			return fmt.Errorf("worker join: %w", err)
		}
		join, step, others = append(join, j), append(step, s), append(others, o)
	}
	r.add("worker_join_to_first_step_ms", ckMedian(join), "ms from the scale-up to the new worker's first step; the others train on")
	r.add("step_ms", ckMedian(step), "ms, the median step of a worker in steady state (for scale)")
	r.add("others_steps_during_join_vs_before", ckMedian(others), "steps the two other workers ended while it joined over those in as long a time before (1: not paused)")

	type outcome struct{ resumed, detect, recovery, lost, lostRecs, trained []float64 }
	measure := func(name string, policy elastic.RecoveryPolicy, ev elEvent) (outcome, error) {
		var o outcome
		for i := range p.repeats {
			res, err := p.failure(ctx, fmt.Sprintf("%s-%d", name, i), policy, ev)
			if err != nil {
				return o, fmt.Errorf("%s: %w", name, err)
			}
			o.resumed = append(o.resumed, ckMillis(res.resumed))
			o.detect = append(o.detect, ckMillis(res.detect))
			o.recovery = append(o.recovery, ckMillis(res.recovery))
			o.lost = append(o.lost, res.lost)
			o.lostRecs = append(o.lostRecs, float64(res.lostRecords))
			o.trained = append(o.trained, float64(res.trained))
		}
		return o, nil
	}
	cases := []struct {
		name   string
		policy elastic.RecoveryPolicy
		ev     elEvent
		note   string
	}{
		{"rollback_shm", elastic.Rollback, elReplaceShm, "Rollback, the replacement restores from its shared memory, the others from theirs"},
		{"rollback_storage", elastic.Rollback, elReplaceStorage, "Rollback, the replacement's shared memory gone: it reads storage"},
		{"partial_shm", elastic.Partial, elReplaceShm, "Partial, the replacement restores its slots from its shared memory; the others go on"},
		{"partial_storage", elastic.Partial, elReplaceStorage, "Partial, the replacement reads storage"},
		{"partial_survivors", elastic.Partial, elNoReplacement, "Partial, no replacement: the survivors take the slots from storage"},
	}
	resumed := map[string]float64{}
	for _, c := range cases {
		o, err := measure(c.name, c.policy, c.ev)
		if err != nil {
			return err
		}
		resumed[c.name] = ckMedian(o.resumed)
		r.add("ps_failure_to_resumed_ms_"+c.name, resumed[c.name], "ms from the kill to the first step after the recovery; "+c.note)
		r.add("ps_failure_detect_ms_"+c.name, ckMedian(o.detect), "ms of it until the failure was known")
		r.add("ps_recovery_ms_"+c.name, ckMedian(o.recovery), "ms of it in the recovery proper (detected to training may go on)")
		if c.policy == elastic.Partial {
			r.add("lost_sample_share_"+c.name, ckMedian(o.lost), fmt.Sprintf("share of the %.0f samples trained whose updates to the failed slots were lost (%.0f: those since the commit)", ckMedian(o.trained), ckMedian(o.lostRecs)))
		}
	}

	var stop []float64
	for i := range p.repeats {
		d, err := p.stopRestart(ctx, i)
		if err != nil {
			return fmt.Errorf("stop and restart: %w", err)
		}
		stop = append(stop, ckMillis(d))
	}
	stopMs := ckMedian(stop)
	r.add("stop_restart_s", stopMs/1000, "s: stop every process, start them again, restore the whole job from storage, first step (in process: no process start-up is counted)")
	for _, c := range cases {
		r.add("stop_restart_vs_recovery_"+c.name, stopMs/resumed[c.name], "stop-and-restart time over the recovery's ("+c.name+")")
	}

	var coord []float64
	for i := range p.repeats {
		d, err := p.coordinatorRestart(ctx, i)
		if err != nil {
			return fmt.Errorf("coordinator restart: %w", err)
		}
		coord = append(coord, ckMillis(d))
	}
	r.add("coordinator_restart_to_resumed_ms", ckMedian(coord), "ms from the restart to the first step; detection 0 (restarted at once by the caller)")
	return nil
}

const (
	elDim         = 16
	elBatch       = 256
	elIDsPerRec   = 8
	elSinceCommit = 30 // steps trained after the commit before each event
	elFillChunk   = 1 << 15
)

// elParams are the job's sizes and where it keeps its files.
type elParams struct {
	rows, records int64
	repeats       int
	dir, shm      string
}

// elEvent is the way a server is lost.
type elEvent uint8

const (
	elReplaceShm     elEvent = iota // killed, and a new incarnation starts on the same host
	elReplaceStorage                // killed, its shared memory lost, a new incarnation starts
	elNoReplacement                 // killed for good
)

// elRig is one running job with its workers and what they report.
type elRig struct {
	p       elParams
	name    string
	store   checkpoint.Storage
	job     *local.Job
	scaler  *local.Scaler
	recover chan elastic.RecoveryEvent

	mu      sync.Mutex
	steps   int64
	last    time.Time       // when the latest step ended
	began   map[string]bool // the workers that ended a step
	stepped chan struct{}   // closed and replaced at every step
	durs    []time.Duration // step durations of worker-0
	ends    []time.Time     // when the steps of worker-0 and worker-1 ended
}

// start starts a job named name on storage store (nil: a new one in the scratch directory),
// with recovery policy, and resumes it from storage when resume is set.
// A failed server's slots wait replaceWait for a replacement.
func (p elParams) start(ctx context.Context, name string, store checkpoint.Storage, policy elastic.RecoveryPolicy, replaceWait time.Duration, resume bool) (*elRig, error) {
	if store == nil {
		s, err := checkpoint.NewFSStorage(filepath.Join(p.dir, name))
		if err != nil {
			return nil, err
		}
		store = s
	}
	g := &elRig{p: p, name: name, store: store, recover: make(chan elastic.RecoveryEvent, 16), began: map[string]bool{}, stepped: make(chan struct{})}
	job, err := local.Start(ctx, local.Config{
		Job: name, Servers: 3,
		Tables: []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: elDim, Seed: 1,
			Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.01}}}},
		Coordinator: elastic.Config{
			Storage: store, Recovery: policy,
			HealthEvery: 50 * time.Millisecond, ServerTimeout: 500 * time.Millisecond, ReplaceWait: replaceWait,
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(p.records), ShardSize: 16 * elBatch, Epochs: 1000,
				LeaseTTL: 10 * time.Second},
			OnRecovery: func(ev elastic.RecoveryEvent) {
				if ev.Err == nil {
					g.recover <- ev
				}
			},
		},
		Checkpoint: checkpoint.Config{ShmDir: p.shm},
		// Each scenario decides what becomes of the shared memory (a restart on new hosts
		// removes it), so closing a job leaves it.
		KeepShm: true,
	})
	if err != nil {
		return nil, err
	}
	g.job = job
	if resume {
		if _, _, err := job.Coordinator().Resume(ctx); err != nil {
			job.Close()
			return nil, err
		}
	} else if err := g.fill(ctx); err != nil {
		job.Close()
		return nil, err
	}
	g.scaler, err = local.NewScaler(local.ScalerConfig{Job: job, Worker: g.worker,
		Reader: func(string) shard.ReaderConfig {
			return shard.ReaderConfig{Source: elData(p.rows, p.records), BatchSize: elBatch, ReportEvery: 1}
		}})
	if err != nil {
		job.Close()
		return nil, err
	}
	return g, nil
}

// elData is the records: each has elIDsPerRec ids drawn from the table's rows by its index.
func elData(rows, records int64) shard.IndexedSource {
	return shard.IndexedSource{Data: shard.IndexedFunc(records, func(i int64, rec *shard.Record) error {
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		for range elIDsPerRec {
			rec.IDs = append(rec.IDs, rng.Uint64N(uint64(rows)))
		}
		rec.EndField()
		rec.Label = float32(i & 1)
		return nil
	})}
}

// fill writes every row of the table once, so that snapshots and restores move the whole table.
func (g *elRig) fill(ctx context.Context) error {
	cli, err := g.job.Client()
	if err != nil {
		return err
	}
	ids := make([]uint64, 0, elFillChunk)
	grads := make([]float32, elFillChunk*elDim)
	for i := range grads {
		grads[i] = 0.001
	}
	for lo := int64(0); lo < g.p.rows; lo += elFillChunk {
		ids = ids[:0]
		for id := lo; id < min(lo+elFillChunk, g.p.rows); id++ {
			ids = append(ids, uint64(id))
		}
		if err := cli.Push(ctx, "emb", ids, grads[:len(ids)*elDim], 1); err != nil {
			return err
		}
	}
	return nil
}

// worker is every worker's step: pull the batch's rows, push a gradient of each.
func (g *elRig) worker(id string) (local.StepFunc, error) {
	var rows, grads []float32
	return func(ctx context.Context, b *elastic.Batch) error {
		start := time.Now()
		n := len(b.IDs)
		if cap(rows) < n*elDim {
			rows = make([]float32, n*elDim)
		}
		rows = rows[:n*elDim]
		if err := b.Pull(ctx, "emb", b.IDs, rows); err != nil {
			return err
		}
		grads = grads[:0]
		for k := range n * elDim {
			grads = append(grads, 0.01*rows[k]+0.001)
		}
		if err := b.Push(ctx, "emb", b.IDs, grads); err != nil {
			return err
		}
		end := time.Now()
		g.mu.Lock()
		defer g.mu.Unlock()
		g.steps++
		g.last = end
		g.began[id] = true
		if id == elastic.WorkerID(0) {
			g.durs = append(g.durs, end.Sub(start))
		}
		if id == elastic.WorkerID(0) || id == elastic.WorkerID(1) {
			g.ends = append(g.ends, end)
		}
		close(g.stepped)
		g.stepped = make(chan struct{})
		return nil
	}, nil
}

// waitStep waits until a step (by worker, if not "") ends after t and returns when it ended.
func (g *elRig) waitStep(ctx context.Context, t time.Time, worker string) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		g.mu.Lock()
		began := g.began[worker]
		ok := g.last.After(t) && (worker == "" || began)
		last, ch := g.last, g.stepped
		g.mu.Unlock()
		if ok {
			return last, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("no step after %v: %w", t.Format(time.StampMilli), ctx.Err())
		}
	}
}

// waitSteps waits until n more steps have ended.
func (g *elRig) waitSteps(ctx context.Context, n int64) error {
	g.mu.Lock()
	target := g.steps + n
	g.mu.Unlock()
	for {
		g.mu.Lock()
		ok, ch := g.steps >= target, g.stepped
		g.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// warm trains 2 workers to a commit and elSinceCommit steps past it.
func (g *elRig) warm(ctx context.Context) error {
	if err := g.scaler.Scale(ctx, elastic.Plan{Servers: 3, Workers: 2}); err != nil {
		return err
	}
	if err := g.waitSteps(ctx, 20); err != nil {
		return err
	}
	if _, err := g.job.Coordinator().Checkpoint(ctx); err != nil {
		return err
	}
	return g.waitSteps(ctx, elSinceCommit)
}

func (g *elRig) close() {
	g.scaler.Close()
	g.job.Close()
}

// join measures a third worker's start on a running job, the steady step time, and the steps
// the two others ended while it joined over those they ended in as long a time just before.
func (p elParams) join(ctx context.Context, i int) (joinMs, stepMs, others float64, err error) {
	g, err := p.start(ctx, fmt.Sprintf("join-%d", i), nil, elastic.Rollback, time.Minute, false)
	if err != nil {
		return 0, 0, 0, err
	}
	defer g.close()
	if err := g.warm(ctx); err != nil {
		return 0, 0, 0, err
	}
	t0 := time.Now()
	if err := g.scaler.Scale(ctx, elastic.Plan{Servers: 3, Workers: 3}); err != nil {
		return 0, 0, 0, err
	}
	t1, err := g.waitStep(ctx, t0, elastic.WorkerID(2))
	if err != nil {
		return 0, 0, 0, err
	}
	g.mu.Lock()
	durs := make([]float64, len(g.durs))
	for k, d := range g.durs {
		durs[k] = ckMillis(d)
	}
	var during, before float64
	for _, e := range g.ends {
		switch {
		case !e.Before(t0) && !e.After(t1):
			during++
		case !e.Before(t0.Add(-t1.Sub(t0))) && e.Before(t0):
			before++
		}
	}
	g.mu.Unlock()
	sort.Float64s(durs)
	return ckMillis(t1.Sub(t0)), ckMedian(durs), during / max(before, 1), nil
}

// elOutcome is one server failure's figures.
type elOutcome struct {
	resumed, detect, recovery time.Duration
	lost                      float64
	lostRecords, trained      int64
}

// failure kills ps-1 of a warm job as ev says and measures until training goes on.
func (p elParams) failure(ctx context.Context, name string, policy elastic.RecoveryPolicy, ev elEvent) (elOutcome, error) {
	wait := time.Minute // the replacement is coming
	if ev == elNoReplacement {
		wait = 200 * time.Millisecond
	}
	g, err := p.start(ctx, name, nil, policy, wait, false)
	if err != nil {
		return elOutcome{}, err
	}
	defer g.close()
	if err := g.warm(ctx); err != nil {
		return elOutcome{}, err
	}
	t0 := time.Now()
	if err := g.job.KillServer(1); err != nil {
		return elOutcome{}, err
	}
	switch ev {
	case elReplaceStorage:
		if err := os.RemoveAll(filepath.Join(p.shm, name, "ps-1")); err != nil {
			return elOutcome{}, err
		}
		fallthrough
	case elReplaceShm:
		if err := g.job.RestartServer(ctx, 1); err != nil {
			return elOutcome{}, err
		}
	}
	var rec elastic.RecoveryEvent
	select {
	case rec = <-g.recover:
	case <-time.After(2 * time.Minute):
		return elOutcome{}, errors.New("no recovery within 2 minutes")
	case <-ctx.Done():
		return elOutcome{}, ctx.Err()
	}
	t1, err := g.waitStep(ctx, rec.Detected.Add(rec.Duration), "")
	if err != nil {
		return elOutcome{}, err
	}
	if ev == elNoReplacement && len(rec.Replaced) != 0 || ev != elNoReplacement && len(rec.Replaced) != 1 {
		return elOutcome{}, fmt.Errorf("recovery replaced %v, not what the event should give", rec.Replaced)
	}
	return elOutcome{resumed: t1.Sub(t0), detect: rec.Detected.Sub(t0), recovery: rec.Duration, lost: rec.LostShare(),
		lostRecords: rec.LostRecords, trained: rec.TrainedRecords}, nil
}

// stopRestart is the DLRover way: stop the whole warm job, start it again, restore it from
// storage, and train to the first step.
func (p elParams) stopRestart(ctx context.Context, i int) (time.Duration, error) {
	name := fmt.Sprintf("stop-%d", i)
	g, err := p.start(ctx, name, nil, elastic.Rollback, time.Minute, false)
	if err != nil {
		return 0, err
	}
	if err := g.warm(ctx); err != nil {
		g.close()
		return 0, err
	}
	t0 := time.Now()
	g.close()
	// New processes on new hosts: the shared memory is gone.
	if err := os.RemoveAll(filepath.Join(p.shm, name)); err != nil {
		return 0, err
	}
	h, err := p.start(ctx, name, g.store, elastic.Rollback, time.Minute, true)
	if err != nil {
		return 0, err
	}
	defer h.close()
	if err := h.scaler.Scale(ctx, elastic.Plan{Servers: 3, Workers: 2}); err != nil {
		return 0, err
	}
	t1, err := h.waitStep(ctx, t0, "")
	return t1.Sub(t0), err
}

// coordinatorRestart restarts the coordinator of a warm job and trains to the first step.
func (p elParams) coordinatorRestart(ctx context.Context, i int) (time.Duration, error) {
	g, err := p.start(ctx, fmt.Sprintf("coord-%d", i), nil, elastic.Rollback, time.Minute, false)
	if err != nil {
		return 0, err
	}
	defer g.close()
	if err := g.warm(ctx); err != nil {
		return 0, err
	}
	t0 := time.Now()
	if _, err := g.job.RestartCoordinator(ctx); err != nil {
		return 0, err
	}
	t1, err := g.waitStep(ctx, time.Now(), "")
	return t1.Sub(t0), err
}
