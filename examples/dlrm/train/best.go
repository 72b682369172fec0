package train

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
)

// Metric is the held-out figure keep-best and early stopping choose by (Config.BestMetric).
type Metric uint8

const (
	// MetricLogLoss chooses the lowest log loss, the default: it punishes a model that grows
	// over-confident as it overfits, which AUC, a ranking figure, does not see.
	MetricLogLoss Metric = iota
	// MetricAUC chooses the highest AUC.
	MetricAUC
)

// ParseMetric reads "logloss" or "auc".
func ParseMetric(s string) (Metric, error) {
	switch s {
	case "logloss":
		return MetricLogLoss, nil
	case "auc":
		return MetricAUC, nil
	}
	return 0, fmt.Errorf("metric %q: want logloss or auc", s)
}

// String is the name ParseMetric reads.
func (m Metric) String() string {
	switch m {
	case MetricLogLoss:
		return "logloss"
	case MetricAUC:
		return "auc"
	}
	return fmt.Sprintf("Metric(%d)", uint8(m))
}

// better says whether a is a better evaluation than b by m. A figure that is not a number is
// never better, and any number is better than one.
func (m Metric) better(a, b CommitEval) bool {
	x, y := a.LogLoss, b.LogLoss
	if m == MetricAUC {
		x, y = -a.AUC, -b.AUC
	}
	if math.IsNaN(y) {
		return !math.IsNaN(x)
	}
	return x < y
}

// figure describes ev's figure by m, for messages: "log loss 0.4012" or "AUC 0.7931".
func (m Metric) figure(ev CommitEval) string {
	if m == MetricAUC {
		return fmt.Sprintf("AUC %.4f", ev.AUC)
	}
	return fmt.Sprintf("log loss %.4f", ev.LogLoss)
}

// improvement names a better figure by m, for messages.
func (m Metric) improvement() string {
	if m == MetricAUC {
		return "a higher AUC"
	}
	return "a lower log loss"
}

// CommitEval is the evaluation of the held-out set on the parameters of one commit: with
// Config.KeepBest every checkpoint is evaluated while training is paused for its snapshot, so the
// figures are those of exactly what the commit holds.
type CommitEval struct {
	Step    uint64  `json:"step"`          // the commit's step
	Set     string  `json:"set,omitempty"` // the records scored (Eval.Set; "" in older commits: test)
	AUC     float64 `json:"auc"`           // held-out AUC
	LogLoss float64 `json:"logloss"`       // held-out log loss
	Trained int64   `json:"trained"`       // samples the model had been trained on
}

// keepBest follows the evaluated commits of a run: the best committed one by metric, the
// evaluations since it (for early stopping) and the evaluations whose commit is not known yet.
// The coordinator calls it at every snapshot (jobState) and every commit (onCheckpoint), one call
// at a time, but the train loop reads it too: mu guards everything.
type keepBest struct {
	metric  Metric // set before the first call
	mu      sync.Mutex
	best    *CommitEval           // best committed (or restored) evaluation
	stale   int                   // evaluations of committed checkpoints since best
	evals   int                   // committed evaluations, restored ones included
	pending map[uint64]CommitEval // evaluated snapshots whose commit is not known yet
	last    *CommitEval           // the newest evaluation taken, committed or not
}

// evaluated records the evaluation of the snapshot of ev.Step and returns what the snapshot's
// commit records, as if the commits still pending (this one included) succeed: the best
// evaluation, the evaluations since it and the number of evaluations.
func (k *keepBest) evaluated(ev CommitEval) (best CommitEval, stale, evals int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pending == nil {
		k.pending = map[uint64]CommitEval{}
	}
	k.pending[ev.Step] = ev
	k.last = &ev
	var b *CommitEval
	stale = k.stale
	if k.best != nil {
		c := *k.best
		b = &c
	}
	// Pending evaluations in step order, as their commits will land.
	steps := make([]uint64, 0, len(k.pending))
	for s := range k.pending {
		steps = append(steps, s)
	}
	slices.Sort(steps)
	for _, s := range steps {
		p := k.pending[s]
		if b == nil || k.metric.better(p, *b) {
			b, stale = &p, 0
		} else {
			stale++
		}
	}
	return *b, stale, k.evals + len(k.pending)
}

// committed settles the pending evaluation of step: a commit makes it count (the best, or one
// more evaluation without improvement), a failure drops it. It returns the evaluations without
// improvement since the best.
func (k *keepBest) committed(step uint64, ok bool) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	ev, found := k.pending[step]
	if !found {
		return k.stale
	}
	delete(k.pending, step)
	if !ok {
		return k.stale
	}
	k.evals++
	if k.best == nil || k.metric.better(ev, *k.best) {
		k.best, k.stale = &ev, 0
	} else {
		k.stale++
	}
	return k.stale
}

// restore takes up the record of a resumed commit.
func (k *keepBest) restore(m runMeta) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.best, k.stale, k.evals = m.Best, m.Stale, m.Evals
}

// state returns the best committed evaluation (nil: none), the evaluations since it and the
// number of committed evaluations.
func (k *keepBest) state() (best *CommitEval, stale, evals int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.best != nil {
		b := *k.best
		best = &b
	}
	return best, k.stale, k.evals
}

// lastEval returns the newest evaluation taken at a snapshot, if it is of step.
func (k *keepBest) lastEval(step uint64) (CommitEval, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.last == nil || k.last.Step != step {
		return CommitEval{}, false
	}
	return *k.last, true
}

// evalSnapshot evaluates the parameters of the snapshot of step (training is paused) for
// keep-best and fills in what meta, the commit's job state, says of it: its evaluation, the best
// evaluated commit up to it and the evaluations since. A failed evaluation is kept for the train
// loop to report, and the commit then names none.
func (r *run) evalSnapshot(ctx context.Context, step uint64, meta *runMeta) {
	ctx, cancel := context.WithTimeout(ctx, finalTimeout)
	defer cancel()
	ev, err := r.eval.run(ctx)
	if err != nil {
		r.evalErr.CompareAndSwap(nil, &err)
		return
	}
	ev.Trained = r.samples.Load()
	r.setEval(ev)
	r.emit(Event{Kind: EventEval, Eval: ev, Message: fmt.Sprintf("checkpoint of step %d", step)})
	ce := CommitEval{Step: step, Set: ev.Set, AUC: ev.AUC, LogLoss: ev.LogLoss, Trained: ev.Trained}
	best, stale, evals := r.best.evaluated(ce)
	meta.Eval, meta.Best, meta.Stale, meta.Evals = &ce, &best, stale, evals
	// Stop now rather than when the commit lands: commits trail the snapshots, and training
	// goes on meanwhile.
	r.signalEarlyStop(best, stale)
}

// signalEarlyStop tells the train loop to stop once stale evaluations in a row did not improve
// on best (Config.EarlyStop).
func (r *run) signalEarlyStop(best CommitEval, stale int) {
	if r.cfg.EarlyStop <= 0 || stale < r.cfg.EarlyStop {
		return
	}
	select {
	case r.earlyStop <- best:
	default:
	}
}
