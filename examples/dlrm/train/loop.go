package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
)

// finalEvalTimeout bounds the last evaluation and the final checkpoint's commit after the run
// was interrupted.
const finalTimeout = 5 * time.Minute

// train runs the workers and coordinates checkpoints, evaluations and progress until the run
// ends, then takes the final checkpoint and builds the summary.
func (r *run) train(ctx context.Context) (*Summary, error) {
	cfg := &r.cfg
	workers := make([]*worker, cfg.Workers)
	for i := range workers {
		w, err := r.newWorker(i)
		if err != nil {
			return nil, err
		}
		workers[i] = w
	}
	r.emit(Event{Kind: EventStart, Message: r.describe()})

	r.start = time.Now()
	r.lastTick, r.lastSamp = r.start, r.samples.Load()
	wctx, stopWorkers := context.WithCancel(context.Background())
	defer stopWorkers()
	done := make(chan error, len(workers))
	for _, w := range workers {
		go func() { done <- w.run(wctx, r, &r.gate, r.ledgerRef()) }()
	}
	running := len(workers)

	var deadline <-chan time.Time
	if cfg.Duration > 0 {
		t := time.NewTimer(cfg.Duration)
		defer t.Stop()
		deadline = t.C
	}
	progress := time.NewTicker(cfg.ProgressEvery)
	defer progress.Stop()
	var evalTick <-chan time.Time
	if cfg.EvalEvery > 0 {
		t := time.NewTicker(cfg.EvalEvery)
		defer t.Stop()
		evalTick = t.C
	}
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	evalDone := make(chan evalResult, 1)
	evaluating := false
	lastCk := r.steps.Load()

	var failure error
	reason := ""
	for running > 0 && reason == "" {
		select {
		case <-ctx.Done():
			reason = "interrupted"
		case <-deadline:
			reason = fmt.Sprintf("%v passed", cfg.Duration)
		case err := <-done:
			running--
			if err != nil {
				failure, reason = err, "a worker failed"
			}
		case <-progress.C:
			r.emit(Event{Kind: EventProgress})
		case <-evalTick:
			if !evaluating {
				evaluating = true
				trained := r.samples.Load()
				go func() {
					ev, err := r.eval.run(wctx)
					ev.Trained = trained
					evalDone <- evalResult{ev, err}
				}()
			}
		case res := <-evalDone:
			evaluating = false
			if res.err != nil {
				if wctx.Err() == nil {
					failure, reason = res.err, "evaluation failed"
				}
				break
			}
			r.setEval(res.ev)
			r.emit(Event{Kind: EventEval, Eval: res.ev})
		case <-poll.C:
			if cfg.CheckpointEvery > 0 && r.steps.Load()-lastCk >= int64(cfg.CheckpointEvery) {
				lastCk = r.steps.Load()
				r.checkpoint(ctx, false)
			}
		}
	}
	if reason == "" {
		reason = "every epoch done"
	}
	stopWorkers()
	for running > 0 {
		if err := <-done; err != nil && failure == nil {
			failure, reason = err, "a worker failed"
		}
		running--
	}
	if evaluating {
		<-evalDone
	}
	trainedFor := time.Since(r.start)
	r.emit(Event{Kind: EventNote, Message: "training stopped: " + reason})

	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalTimeout)
	defer cancel()
	if failure == nil && !cfg.NoFinalCheckpoint {
		r.checkpoint(fctx, true)
	}
	r.ckpts.finish()

	sum := r.summary(reason, trainedFor)
	if failure != nil {
		return sum, failure
	}
	ev, err := r.eval.run(fctx)
	if err != nil {
		return sum, err
	}
	ev.Trained = r.samples.Load()
	r.setEval(ev)
	sum.Eval = ev
	r.emit(Event{Kind: EventEval, Eval: ev})
	if !sum.ExactlyOnce {
		return sum, ErrNotExactlyOnce
	}
	return sum, nil
}

type evalResult struct {
	ev  Eval
	err error
}

// ledgerRef returns the ledger (replaced by a restore before training starts).
func (r *run) ledgerRef() *ledger { return r.ledger }

func (r *run) newWorker(i int) (*worker, error) {
	name := fmt.Sprintf("worker-%d", i)
	cli, err := r.srvs.client(i)
	if err != nil {
		return nil, err
	}
	svc, err := shardnet.NewClient(shardnet.ClientConfig{Addr: r.dispAddr, Secret: r.secret, Logger: r.logger})
	if err != nil {
		cli.Close()
		return nil, err
	}
	reader, err := shard.NewReader(shard.ReaderConfig{
		Service: svc, Worker: name, Source: r.data.source, BatchSize: r.cfg.BatchSize,
		ReportEvery: 1, Seed: r.cfg.Seed, Logger: r.logger,
	})
	if err != nil {
		cli.Close()
		svc.Close()
		return nil, err
	}
	w, err := newWorker(name, r.mcfg, cli, reader, r.tables, r.dense)
	if err != nil {
		cli.Close()
		svc.Close()
		reader.Close()
		return nil, err
	}
	w.svc = svc
	r.workers = append(r.workers, w)
	return w, nil
}

// describe says what is trained where, for the start event.
func (r *run) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "data: %s\nheld out: %s\n", r.data.desc, r.data.heldOut)
	if r.data.ceiling != nil {
		fmt.Fprintf(&b, "the generator's hidden model reaches AUC %.4f (log loss %.4f) on the held-out records: the ceiling\n", r.data.ceiling.AUC, r.data.ceiling.LogLoss)
	}
	m := r.mcfg
	nparams := 0
	for _, t := range r.dense {
		nparams += t.len
	}
	fmt.Fprintf(&b, "model: DLRM, %d dense -> bottom MLP %v -> %d; %d embedding tables of dim %d; %d interactions -> top MLP %v -> 1; %d MLP parameters in %d tensors\n",
		m.DenseFeatures, m.BottomHidden, m.EmbeddingDim, m.Fields, m.EmbeddingDim, m.Fields*(m.Fields+1)/2, m.TopHidden, nparams, len(r.dense))
	fmt.Fprintf(&b, "cluster: %d parameter servers on", len(r.srvs.nodes))
	for _, n := range r.srvs.nodes {
		fmt.Fprintf(&b, " %s=%s", n.ID, n.Addr)
	}
	fmt.Fprintf(&b, ", dispatcher on %s, %d workers; batch %d\n", r.dispAddr, r.cfg.Workers, r.cfg.BatchSize)
	st := r.ckpts.Stats()
	every := "only at the end"
	if r.cfg.CheckpointEvery > 0 {
		every = fmt.Sprintf("every %d steps", r.cfg.CheckpointEvery)
	}
	fmt.Fprintf(&b, "checkpoints: %s to %s (shared memory %s)", every, st.Dir, st.ShmDir)
	return b.String()
}

// checkpoint closes the gate, snapshots every server, the dispatcher and the ledger, reopens
// the gate and queues the commit. The dispatcher's clock stands still meanwhile, so the pause
// costs no live worker its lease. final is the run's last checkpoint, taken after the workers
// stopped: it waits for room in the commit queue and for busy generations to be persisted
// rather than being skipped. A broken gate (a batch failed while being applied) refuses it.
func (r *run) checkpoint(ctx context.Context, final bool) {
	if err := r.gate.broken(); err != nil {
		return // the run is failing: the worker's error says why
	}
	if err := r.ckpts.room(ctx, final); err != nil {
		r.emit(Event{Kind: EventCheckpoint, Checkpoint: CheckpointEvent{Step: uint64(r.steps.Load()), Skipped: true, Err: err}})
		return
	}
	t0 := time.Now()
	r.clock.pause()
	r.gate.close()
	step := r.steps.Load()
	if err := r.gate.broken(); err != nil {
		r.gate.open()
		r.clock.resume()
		ev := r.ckpts.refuse(uint64(step), fmt.Errorf("checkpoint not taken: %w", err))
		r.emit(Event{Kind: EventCheckpoint, Checkpoint: ev})
		return
	}
	meta, _ := json.Marshal(runMeta{Version: 1, Fingerprint: r.fingerprint(), Step: step, Samples: r.samples.Load()})
	blobs := []checkpoint.Blob{
		{Name: blobDispatcher, Data: r.disp.Snapshot()},
		{Name: blobLedger, Data: r.ledger.encode()},
		{Name: blobMeta, Data: meta},
	}
	ev, took := r.ckpts.snapshot(ctx, uint64(step), blobs, final)
	blocked := time.Since(t0)
	r.gate.open()
	r.clock.resume()
	if !took {
		return
	}
	ev.Blocked = blocked
	if ev.Err == nil {
		r.ckpts.blocked(blocked)
		r.emitMu.Lock()
		r.lastBlk = blocked
		r.emitMu.Unlock()
	}
	r.emit(Event{Kind: EventCheckpoint, Checkpoint: ev})
}

func (r *run) emitCheckpoint(kind EventKind, ev CheckpointEvent) {
	r.emit(Event{Kind: kind, Checkpoint: ev})
}

func (r *run) setEval(ev Eval) {
	r.emitMu.Lock()
	defer r.emitMu.Unlock()
	r.lastEval, r.haveEval = ev, true
}

// emit fills in the progress and hands the event to OnEvent, one call at a time.
func (r *run) emit(ev Event) {
	if r.cfg.OnEvent == nil {
		return
	}
	ev.Progress = r.progress(ev.Kind == EventProgress)
	r.emitMu.Lock()
	defer r.emitMu.Unlock()
	ev.Progress.LastEval, ev.Progress.HaveEval, ev.Progress.LastBlocked = r.lastEval, r.haveEval, r.lastBlk
	r.cfg.OnEvent(ev)
}

// progress takes the current figures; tick starts a new interval for the rate and the loss.
func (r *run) progress(tick bool) Progress {
	now := time.Now()
	p := Progress{Samples: r.samples.Load(), Steps: r.steps.Load(), Epochs: r.cfg.Epochs}
	if !r.start.IsZero() {
		p.Elapsed = now.Sub(r.start)
	}
	r.mu.Lock()
	if dt := now.Sub(r.lastTick).Seconds(); dt > 0 {
		p.SamplesPerSec = float64(p.Samples-r.lastSamp) / dt
	}
	if r.lossN > 0 {
		p.Loss = r.lossSum / float64(r.lossN)
	}
	if tick {
		r.lastTick, r.lastSamp, r.lossSum, r.lossN = now, p.Samples, 0, 0
	}
	r.mu.Unlock()
	if r.disp != nil {
		pr := r.disp.Progress()
		p.Epoch = pr.Epoch
		var done, total int64
		for _, e := range pr.EpochRecords {
			done += e.Done
			if e.Epoch == pr.Epoch {
				p.EpochDone, p.EpochRecords = e.Done, e.Records
			}
		}
		if len(pr.EpochRecords) > 0 {
			total = pr.EpochRecords[0].Records * int64(r.cfg.Epochs)
		}
		if total > 0 {
			p.Fraction = float64(done) / float64(total)
		}
		if pr.Finished {
			p.Fraction = 1
		}
	}
	if r.cfg.Duration > 0 {
		p.Fraction = max(p.Fraction, min(1, float64(p.Elapsed)/float64(r.cfg.Duration)))
	}
	if r.ckpts != nil {
		st := r.ckpts.Stats()
		p.Checkpoints, p.Committed = st.Taken, st.Committed
	}
	return p
}

// summary builds the run's summary (the final evaluation is added by the caller).
func (r *run) summary(reason string, trainedFor time.Duration) *Summary {
	s := &Summary{
		Data: r.data.desc, HeldOut: r.data.heldOut, Servers: r.cfg.Servers, Workers: r.cfg.Workers,
		StopReason: reason, Resumed: r.cfg.Resume, ResumedStep: r.restoredStep, ResumedSamples: r.baseSamp,
		ResumedFrom: r.restoredFrom, TotalSamples: r.samples.Load(), Steps: r.steps.Load(),
		Elapsed: trainedFor, Ceiling: r.data.ceiling, Checkpoints: r.ckpts.Stats(),
	}
	s.Samples = s.TotalSamples - r.baseSamp
	if sec := trainedFor.Seconds(); sec > 0 {
		s.SamplesPerSec = float64(s.Samples) / sec
	}
	pr := r.disp.Progress()
	var totals []epochTotals
	for _, e := range pr.EpochRecords {
		totals = append(totals, epochTotals{epoch: e.Epoch, records: e.Records, done: e.Done, failed: e.Failed})
	}
	s.Epochs = r.ledger.check(totals, pr.Epoch, pr.Finished)
	s.ExactlyOnce = len(s.Epochs) > 0
	for _, e := range s.Epochs {
		s.ExactlyOnce = s.ExactlyOnce && e.OK()
	}
	byName := map[string]*TableRows{}
	for _, srv := range r.srvs.list {
		for _, t := range srv.Stats(false).Tables {
			tr := byName[t.Name]
			if tr == nil {
				tr = &TableRows{Name: t.Name, Dense: t.Dense}
				byName[t.Name] = tr
			}
			tr.Rows += t.Rows
			tr.Bytes += t.MemoryBytes
		}
	}
	for _, name := range r.tables {
		if t := byName[name]; t != nil {
			s.Tables = append(s.Tables, *t)
		}
	}
	for _, d := range r.dense {
		if t := byName[d.name]; t != nil {
			s.Tables = append(s.Tables, *t)
		}
	}
	return s
}

// close stops and joins everything the run started, in reverse order.
func (r *run) close() error {
	var errs []error
	for _, w := range r.workers {
		errs = append(errs, w.reader.Close(), w.svc.Close(), w.cli.Close())
	}
	if r.dispSrv != nil {
		errs = append(errs, r.dispSrv.Close())
		r.dispWG.Wait()
	}
	if r.eval != nil {
		errs = append(errs, r.eval.cli.Close())
	}
	if r.ckpts != nil {
		errs = append(errs, r.ckpts.Close())
	}
	if r.admin != nil {
		errs = append(errs, r.admin.Close())
	}
	if r.srvs != nil {
		errs = append(errs, r.srvs.Close())
	}
	return errors.Join(errs...)
}
