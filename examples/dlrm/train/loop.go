package train

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/shard"
)

// finalEvalTimeout bounds the last evaluation and the final checkpoint's commit after the run
// was interrupted.
const finalTimeout = 5 * time.Minute

// train runs the workers, evaluations and progress until the run ends, then takes the final
// checkpoint and builds the summary. Checkpoints are the coordinator's: every
// Config.CheckpointEvery steps or Config.CheckpointInterval it pauses the workers at a barrier.
func (r *run) train(ctx context.Context) (*Summary, error) {
	cfg := &r.cfg
	var err error
	r.scaler, err = local.NewScaler(local.ScalerConfig{
		Job: r.job,
		Reader: func(string) shard.ReaderConfig {
			return shard.ReaderConfig{Source: r.data.source, BatchSize: r.cfg.BatchSize, ReportEvery: 1, Seed: r.cfg.Seed}
		},
		Worker:      r.newWorker,
		MaxRestarts: workerRestarts,
		Logger:      r.logger,
	})
	if err != nil {
		return nil, err
	}
	r.job.SetScaler(r.scaler) // the coordinator's: SetParallelism goes through it
	r.emit(Event{Kind: EventStart, Message: r.describe()})
	r.watch.announce(r.emit, true)
	r.metrics.announce(r.emit)

	r.start = time.Now()
	r.lastTick, r.lastSamp = r.start, r.samples.Load()
	wctx, stopEval := context.WithCancel(context.Background())
	defer stopEval()
	if err := r.job.Coordinator().SetParallelism(ctx, cfg.Workers, len(r.job.Servers)); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- r.scaler.Wait(context.Background()) }()
	running := true

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
	evalDone := make(chan evalResult, 1)
	evaluating := false
	// The cluster changes of ScaleAt, one at a time.
	scales := cfg.ScaleAt
	var scaleTick <-chan time.Time
	nextScale := func() {
		if len(scales) > 0 {
			t := time.NewTimer(time.Until(r.start.Add(scales[0].At)))
			scaleTick = t.C
		} else {
			scaleTick = nil
		}
	}
	nextScale()
	scaleDone := make(chan error, 1)
	scaling := false

	var failure error
	reason := ""
	byDuration := false
	coordDone := r.job.Coordinator().Done()
	for running && reason == "" {
		select {
		case <-ctx.Done():
			reason = "interrupted"
		case <-coordDone:
			failure, reason = r.job.Coordinator().Err(), "another coordinator took the job over"
		case <-deadline:
			reason, byDuration = "stopped by -duration", true
		case err := <-done:
			running = false
			if err != nil {
				failure, reason = err, "a worker failed"
			}
		case <-progress.C:
			r.emit(Event{Kind: EventProgress})
		case <-scaleTick:
			scaleTick = nil
			st := scales[0]
			scales = scales[1:]
			scaling = true
			go func() { scaleDone <- r.scale(ctx, st) }()
		case err := <-scaleDone:
			scaling = false
			if err != nil {
				failure, reason = err, "changing the cluster failed"
				break
			}
			nextScale()
		case <-evalTick:
			if !evaluating {
				evaluating = true
				trained := r.samples.Load()
				go func() {
					if cfg.keepBest() {
						// A checkpoint, evaluated in its snapshot; one that fails is
						// counted with the checkpoints and fails nothing.
						r.job.Coordinator().Checkpoint(wctx)
						evalDone <- evalResult{atCheckpoint: true}
						return
					}
					ev, err := r.eval.run(wctx)
					ev.Trained = trained
					evalDone <- evalResult{ev: ev, err: err}
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
			if !res.atCheckpoint {
				r.setEval(res.ev)
				r.emit(Event{Kind: EventEval, Eval: res.ev})
			}
		case best := <-r.earlyStop:
			reason = fmt.Sprintf("early stop: %d evaluations in a row without %s than the best, the commit of step %d (%s)",
				cfg.EarlyStop, cfg.BestMetric.improvement(), best.Step, cfg.BestMetric.figure(best))
		}
		if p := r.evalErr.Load(); p != nil && failure == nil {
			failure, reason = *p, "evaluation failed"
		}
	}
	if reason == "" {
		reason = "every epoch done"
		if !r.job.Coordinator().Status().Finished {
			reason = "every worker ended before the data was done"
		}
	}
	// Workers finish the batch in hand and leave; the coordinator takes no more checkpoints
	// of its own.
	stopEval()
	r.scaler.Close()
	if running {
		if err := <-done; err != nil && failure == nil {
			failure, reason = err, "a worker failed"
		}
	}
	if evaluating {
		<-evalDone
	}
	if scaling {
		if err := <-scaleDone; err != nil && failure == nil {
			failure, reason = err, "changing the cluster failed"
		}
	}
	trainedFor := time.Since(r.start)
	if byDuration && failure == nil {
		reason = stoppedByDuration(cfg, r.job.Coordinator().Dispatcher().Progress(), r.samples.Load())
	}
	r.emit(Event{Kind: EventNote, Message: "training stopped: " + reason})

	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalTimeout)
	defer cancel()
	ferr := r.job.Coordinator().Finish(fctx, !cfg.NoFinalCheckpoint, 0)
	if !cfg.NoFinalCheckpoint {
		ferr = checkCommitted(r.job.Coordinator().Status(), ferr)
	}
	if ferr != nil && failure == nil {
		failure = ferr
	}

	sum := r.summary(reason, trainedFor)
	if r.data.bad != nil {
		if err := r.data.bad.Err(); err != nil {
			// The input stopped the run: say why in its own words (the workers' errors wrap it).
			sum.StopReason = "too many malformed lines"
			return sum, err
		}
	}
	if failure != nil {
		return sum, failure
	}
	if sum.TotalSamples == 0 {
		return sum, fmt.Errorf("%w: %s", ErrNothingTrained, nothingWhy(sum))
	}
	if p := r.evalErr.Load(); p != nil {
		return sum, *p
	}
	// With keep-best the final checkpoint evaluated what training left: that is the final
	// evaluation (of the validation set, when there is one). Otherwise (or without a final
	// commit) evaluate now. The test set is always scored at the end.
	var ev Eval
	if ce, ok := r.best.lastEval(uint64(sum.Steps)); ok && cfg.keepBest() && !cfg.NoFinalCheckpoint {
		ev = r.lastEvalCopy()
		ev.AUC, ev.LogLoss, ev.Trained = ce.AUC, ce.LogLoss, ce.Trained
	} else {
		var err error
		if ev, err = r.eval.run(fctx); err != nil {
			return sum, err
		}
		ev.Trained = r.samples.Load()
		r.setEval(ev)
		r.emit(Event{Kind: EventEval, Eval: ev})
	}
	if r.eval != r.testEval {
		valid := ev
		sum.Valid = &valid
		var err error
		if ev, err = r.testEval.run(fctx); err != nil {
			return sum, err
		}
		ev.Trained = r.samples.Load()
		r.setEval(ev)
		r.emit(Event{Kind: EventEval, Eval: ev})
	}
	sum.Eval = ev
	sum.Best, sum.SinceBest, sum.Evaluations = r.best.state()
	sum.BestMetric = cfg.BestMetric
	if !r.bestElsewhere(sum) { // else Run scores the best commit and writes its predictions
		if err := r.writePredictions(sum, r.testEval); err != nil {
			return sum, err
		}
	}
	if !sum.ExactlyOnce {
		return sum, ErrNotExactlyOnce
	}
	return sum, nil
}

// nothingWhy says why a run trained nothing.
func nothingWhy(s *Summary) string {
	var covered int64
	for _, e := range s.Epochs {
		covered += e.Covered
	}
	switch {
	case covered == 0:
		return "the run stopped (" + s.StopReason + ") before its first batch was trained"
	case s.BadLines.Bad > 0:
		return fmt.Sprintf("%d positions covered, every one a held-out or malformed line (%d malformed:%s)", covered, s.BadLines.Bad, exampleLines(s.BadLines.Examples))
	}
	return fmt.Sprintf("%d positions covered, every one a held-out line", covered)
}

// stoppedByDuration says how far the epochs got when Config.Duration ended training, from the
// dispatcher's progress pr once the workers have stopped; samples is what the model was trained
// on (negative: not known). A position of generated and MovieLens data is a record, so the
// figures are samples; a position of text data is a line, held-out and malformed lines
// included, so the figures are lines, and the samples trained are said beside.
func stoppedByDuration(cfg *Config, pr shard.Progress, samples int64) string {
	var done, per int64
	for _, e := range pr.EpochRecords {
		done += e.Done
	}
	if len(pr.EpochRecords) > 0 {
		per = pr.EpochRecords[0].Records
	}
	total := per * int64(cfg.Epochs)
	switch cfg.Data.Kind {
	case Criteo, LibSVM, LibFM:
		trained := ""
		if samples >= 0 {
			trained = fmt.Sprintf("; %d samples trained: held-out and malformed lines are not", samples)
		}
		return fmt.Sprintf("stopped by -duration after %d of %d lines (%d epochs of %d lines, -duration %v%s)", done, total, cfg.Epochs, per, cfg.Duration, trained)
	}
	return fmt.Sprintf("stopped by -duration after %d of %d samples (%d epochs of %d, -duration %v)", done, total, cfg.Epochs, per, cfg.Duration)
}

type evalResult struct {
	ev           Eval
	err          error
	atCheckpoint bool // keep-best: a checkpoint was taken, evaluated in its snapshot
}

// workerRestarts is how many times a worker whose batch failed on every try is started again
// before the run fails.
const workerRestarts = 2

// newWorker makes the step function of worker name, with its own model replica, each time the
// scaler starts it.
func (r *run) newWorker(name string) (local.StepFunc, error) {
	w, err := newWorker(name, r.mcfg, nil, r.tables, r.dense)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, b *elastic.Batch) error { return w.step(ctx, b, r) }, nil
}

// describe says what is trained where, for the start event.
func (r *run) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "data: %s\nheld out: %s\n", r.data.desc, r.data.heldOut)
	if r.data.validOut != "" {
		fmt.Fprintf(&b, "validation (scored by the evaluations while training, keep-best and early stopping): %s\n", r.data.validOut)
	}
	for _, n := range r.data.notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	if o := r.data.overlap; o != nil && o.Records > 0 {
		fmt.Fprintf(&b, "overlap: %s\n", o)
	}
	if r.data.ceiling != nil {
		fmt.Fprintf(&b, "the generator's hidden model reaches AUC %.4f (log loss %.4f) on the held-out records: the ceiling\n", r.data.ceiling.AUC, r.data.ceiling.LogLoss)
	}
	m := r.mcfg
	nparams := 0
	for _, t := range r.dense {
		nparams += t.len
	}
	first := ""
	if m.FirstOrder {
		first = fmt.Sprintf(" + first-order terms (%d tables of dim 1)", m.Fields)
	}
	inter := fmt.Sprintf("%d interactions", m.Fields*(m.Fields+1)/2)
	if m.ConcatEmbeddings {
		inter = fmt.Sprintf("the %d vectors and their %d interactions", m.Fields+1, m.Fields*(m.Fields+1)/2)
	}
	fmt.Fprintf(&b, "model: DLRM, %d dense -> bottom MLP %v -> %d; %d embedding tables of dim %d; %s -> top MLP %v -> 1%s; %d MLP parameters in %d tensors\n",
		m.DenseFeatures, m.BottomHidden, m.EmbeddingDim, m.Fields, m.EmbeddingDim, inter, m.TopHidden, first, nparams, len(r.dense))
	fmt.Fprintf(&b, "cluster: coordinator and dispatcher in process, %d parameter servers on", len(r.job.Servers))
	for _, s := range r.job.Servers {
		n := s.Node()
		fmt.Fprintf(&b, " %s=%s", n.ID, n.Addr)
	}
	fmt.Fprintf(&b, ", %d workers; batch %d\n", r.cfg.Workers, r.cfg.BatchSize)
	every := "only at the end"
	switch steps, interval := r.cfg.CheckpointEvery, r.cfg.CheckpointInterval; {
	case steps > 0 && interval > 0:
		every = fmt.Sprintf("every %d steps or %v, whichever comes first,", steps, interval)
	case steps > 0:
		every = fmt.Sprintf("every %d steps", steps)
	case interval > 0:
		every = fmt.Sprintf("every %v", interval)
	}
	fmt.Fprintf(&b, "checkpoints: %s to %s (shared memory %s)", every, r.cfg.CheckpointDir, r.shm.dir)
	return b.String()
}

func (r *run) lastEvalCopy() Eval {
	r.emitMu.Lock()
	defer r.emitMu.Unlock()
	return r.lastEval
}

func (r *run) setEval(ev Eval) {
	r.emitMu.Lock()
	defer r.emitMu.Unlock()
	r.lastEval, r.haveEval = ev, true
}

// emit fills in the progress and hands the event to OnEvent, one call at a time.
func (r *run) emit(ev Event) {
	if ev.Kind == EventEval {
		r.watch.eval(ev.Eval)
	}
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
	p := Progress{Samples: r.samples.Load(), Steps: r.steps(), Epochs: r.cfg.Epochs}
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
	if r.job != nil {
		if rp := r.job.Coordinator().Repartition(); rp != nil && rp.Running {
			p.Moving = rp
		}
		pr := r.job.Coordinator().Dispatcher().Progress()
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
	st := r.ck.get()
	p.Checkpoints, p.Committed = st.Taken, st.Committed
	return p
}

// summary builds the run's summary (the final evaluation is added by the caller).
// scale asks the coordinator for the cluster of st, and reports the move of slots a new server
// count made.
func (r *run) scale(ctx context.Context, st ScaleStep) error {
	c := r.job.Coordinator()
	plan := r.scaler.Plan()
	if st.Servers > 0 {
		plan.Servers = st.Servers
	}
	if st.Workers > 0 {
		plan.Workers = st.Workers
	}
	r.emit(Event{Kind: EventNote, Message: fmt.Sprintf("scaling to %s", plan)})
	before := c.Repartition()
	if err := c.SetParallelism(ctx, plan.Workers, plan.Servers); err != nil {
		return fmt.Errorf("scale to %s: %w", plan, err)
	}
	if rp := c.Repartition(); rp != nil && (before == nil || *rp != *before) {
		r.mu.Lock()
		r.repartitions = append(r.repartitions, *rp)
		r.mu.Unlock()
		r.emit(Event{Kind: EventNote, Message: repartitionLine(*rp)})
	}
	return nil
}

// repartitionLine describes a change of the server count.
func repartitionLine(rp elastic.RepartitionStatus) string {
	return fmt.Sprintf("%d -> %d parameter servers in %v, training on: %d of %d slots moved (%d rows, %.1f MiB copied), longest fence %v",
		rp.From, rp.To, rp.Duration.Round(time.Millisecond), rp.SlotsDone, rp.SlotsTotal, rp.MovedRows, float64(rp.Bytes)/(1<<20), rp.MaxFenced.Round(time.Microsecond))
}

func (r *run) summary(reason string, trainedFor time.Duration) *Summary {
	ck := r.ck.get()
	ck.Dir, ck.ShmDir = r.cfg.CheckpointDir, r.shm.dir
	for _, srv := range r.job.Servers {
		ck.Stored += int64(srv.CheckpointStats().PersistedStored)
	}
	s := &Summary{
		Data: r.data.desc, HeldOut: r.data.heldOut, Servers: len(r.job.Servers), Workers: r.scaler.Plan().Workers,
		StopReason: reason, Resumed: r.cfg.Resume, ResumedStep: r.restoredStep, ResumedSamples: r.baseSamp,
		ResumedFrom: r.restoredFrom, TotalSamples: r.samples.Load(), Steps: r.steps(),
		Elapsed: trainedFor, Ceiling: r.data.ceiling, Checkpoints: ck,
	}
	r.mu.Lock()
	s.Repartitions = slices.Clone(r.repartitions)
	r.mu.Unlock()
	s.Samples = s.TotalSamples - r.baseSamp
	if sec := trainedFor.Seconds(); sec > 0 {
		s.SamplesPerSec = float64(s.Samples) / sec
	}
	if r.data.bad != nil {
		s.BadLines = r.data.bad.Report()
	}
	s.Notes = r.data.notes
	s.Overlap = r.data.overlap
	s.AppliedBytes = r.appliedBytes()
	s.checkTraining(r.job.Coordinator())
	byName := map[string]*TableRows{}
	for _, srv := range r.job.Servers {
		for _, t := range srv.Server().Stats(false).Tables {
			tr := byName[t.Name]
			if tr == nil {
				tr = &TableRows{Name: t.Name, Dense: t.Dense}
				byName[t.Name] = tr
			}
			tr.Rows += t.Rows
			tr.Bytes += t.MemoryBytes
		}
	}
	for _, name := range append(append([]string(nil), r.tables.emb...), r.tables.bias...) {
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

// close stops and joins everything the run started, in reverse order. The shared-memory regions
// are deleted unless Config.KeepShm; kept or not, those of servers the run does not have (left
// by an earlier run with more servers, read by a restore at most) go once it has committed.
func (r *run) close() error {
	r.watch.close()
	r.metrics.close()
	var errs []error
	if r.scaler != nil {
		errs = append(errs, r.scaler.Close())
	}
	ours := map[string]bool{}
	if r.job != nil {
		for _, s := range r.job.Servers {
			ours[s.Node().ID] = true
		}
		errs = append(errs, r.job.Close())
	}
	switch {
	case r.shm.dir == "":
	case !r.cfg.KeepShm || r.job == nil && !r.cfg.Resume:
		// A run that failed to start deletes what it created, unless it may have been
		// the regions a resume meant to read.
		errs = append(errs, removeShm(r.shm, nil))
	case r.ck.get().Committed > 0:
		errs = append(errs, deleteRegions(r.shm.dir, func(node string) bool { return ours[node] }, false))
	}
	return errors.Join(errs...)
}
