package train

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKeepBestMarksTheBestCommit scripts evaluations and commits: the best is the committed
// evaluation of the highest AUC (not the last), a snapshot whose commit fails never becomes it,
// and a commit's record counts the evaluations still pending as if they commit.
func TestKeepBestMarksTheBestCommit(t *testing.T) {
	k := keepBest{metric: MetricAUC}
	ev := func(step uint64, auc float64) CommitEval { return CommitEval{Step: step, AUC: auc} }

	b, stale, n := k.evaluated(ev(100, 0.70))
	assert.Equal(t, ev(100, 0.70), b)
	assert.Equal(t, 0, stale)
	assert.Equal(t, 1, n)
	assert.Equal(t, 0, k.committed(100, true))

	b, stale, _ = k.evaluated(ev(200, 0.80))
	assert.Equal(t, uint64(200), b.Step, "a better evaluation is the best of its own commit")
	assert.Equal(t, 0, stale)
	// The snapshot of 300 is taken before 200's commit lands: it names 200, one evaluation since.
	b, stale, n = k.evaluated(ev(300, 0.75))
	assert.Equal(t, uint64(200), b.Step)
	assert.Equal(t, 1, stale)
	assert.Equal(t, 3, n)
	assert.Equal(t, 0, k.committed(200, true))
	assert.Equal(t, 1, k.committed(300, true))

	// A better evaluation whose commit fails is dropped.
	k.evaluated(ev(400, 0.90))
	assert.Equal(t, 1, k.committed(400, false))
	k.evaluated(ev(500, 0.78))
	assert.Equal(t, 2, k.committed(500, true))

	best, stale, evals := k.state()
	require.NotNil(t, best)
	assert.Equal(t, ev(200, 0.80), *best, "the best committed evaluation, not the last")
	assert.Equal(t, 2, stale)
	assert.Equal(t, 4, evals)
	last, ok := k.lastEval(500)
	assert.True(t, ok)
	assert.Equal(t, 0.78, last.AUC)

	// A resume takes the record up and goes on from it.
	r := keepBest{metric: MetricAUC}
	r.restore(runMeta{Best: best, Stale: stale, Evals: evals})
	b, stale, n = r.evaluated(ev(600, 0.79))
	assert.Equal(t, uint64(200), b.Step)
	assert.Equal(t, 3, stale)
	assert.Equal(t, 5, n)
}

// TestBestMetricChooses: given evaluations where AUC and log loss disagree (a model that keeps
// ranking well while its probabilities grow over-confident), log loss, the default, chooses the
// commit of the lowest log loss, and AUC the commit of the highest AUC; a figure that is not a
// number is never the best.
func TestBestMetricChooses(t *testing.T) {
	seq := []CommitEval{
		{Step: 100, AUC: 0.70, LogLoss: 0.60},
		{Step: 200, AUC: 0.76, LogLoss: 0.52}, // the lowest log loss
		{Step: 300, AUC: 0.79, LogLoss: 0.58}, // over-confident: better ranking, worse log loss
		{Step: 400, AUC: 0.80, LogLoss: 0.71}, // the highest AUC
		{Step: 500, AUC: 0.78, LogLoss: math.NaN()},
	}
	for _, c := range []struct {
		metric      Metric
		best, stale int
	}{{MetricLogLoss, 200, 3}, {MetricAUC, 400, 1}} {
		t.Run(c.metric.String(), func(t *testing.T) {
			k := keepBest{metric: c.metric}
			for _, ev := range seq {
				k.evaluated(ev)
				k.committed(ev.Step, true)
			}
			best, stale, evals := k.state()
			require.NotNil(t, best)
			assert.Equal(t, uint64(c.best), best.Step)
			assert.Equal(t, c.stale, stale)
			assert.Equal(t, len(seq), evals)
		})
	}
	var zero Config
	assert.Equal(t, MetricLogLoss, zero.BestMetric, "log loss is the default")
	m, err := ParseMetric("auc")
	require.NoError(t, err)
	assert.Equal(t, MetricAUC, m)
	_, err = ParseMetric("AUC ")
	assert.Error(t, err)
}

// TestEarlyStopSignal: the run is told to stop once EarlyStop committed evaluations in a row did
// not improve on the best, and not before.
func TestEarlyStopSignal(t *testing.T) {
	r := &run{cfg: Config{EarlyStop: 2}, earlyStop: make(chan CommitEval, 1)}
	r.best.metric = MetricAUC
	commit := func(step uint64, auc float64) bool {
		r.best.evaluated(CommitEval{Step: step, AUC: auc})
		r.onCheckpoint(elastic.CheckpointEvent{Step: step, Commit: true})
		select {
		case <-r.earlyStop:
			return true
		default:
			return false
		}
	}
	assert.False(t, commit(1, 0.7))
	assert.False(t, commit(2, 0.6))
	assert.False(t, commit(3, 0.8), "an improvement resets the count")
	assert.False(t, commit(4, 0.79))
	assert.True(t, commit(5, 0.78))
}

// TestKeepBestRun trains with keep-best: every commit is evaluated, the summary's best is the
// evaluation of the lowest log loss among them and its final is the last commit's, and a resume reads
// from the newest commit which commit was best.
func TestKeepBestRun(t *testing.T) {
	cfg := Config{
		Synth: model.SynthConfig{DenseFeatures: 8, Vocab: []int{3, 10, 50, 200, 1000}, Hotness: []int{1, 1, 1, 3, 1}, ZipfExponent: 1.2}, TrainRecords: 8000, TestRecords: 2000, Epochs: 3, Seed: 7,
		EmbeddingDim: 8, BottomHidden: []int{16}, TopHidden: []int{16}, BatchSize: 128,
		ShardSize: 1024, CheckpointEvery: 30, EvalEvery: -1, KeepBest: SwitchOn,
		CheckpointDir: t.TempDir(), ShmDir: t.TempDir(),
	}
	evals := map[uint64]Eval{}
	cfg.OnEvent = func(ev Event) {
		var step uint64
		if ev.Kind == EventEval {
			_, err := fmt.Sscanf(ev.Message, "checkpoint of step %d", &step)
			require.NoError(t, err, "an evaluation outside a checkpoint: %q", ev.Message)
			evals[step] = ev.Eval
		}
	}
	s, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.NotNil(t, s.Best)
	require.Greater(t, len(evals), 3)
	var bestStep uint64
	for step, ev := range evals {
		if b := evals[bestStep]; bestStep == 0 || ev.LogLoss < b.LogLoss || ev.LogLoss == b.LogLoss && step < bestStep {
			bestStep = step
		}
	}
	assert.Equal(t, bestStep, s.Best.Step, "the best commit by log loss, the default")
	assert.Equal(t, evals[bestStep].LogLoss, s.Best.LogLoss)
	assert.Equal(t, len(evals), s.Evaluations)
	assert.Equal(t, evals[uint64(s.Steps)].AUC, s.Eval.AUC, "the final evaluation is the final commit's")
	assert.Contains(t, s.String(), fmt.Sprintf("at the commit of step %d", bestStep))

	// Retention keeps the newest three commits, a fallback, and the best: not every commit.
	names, err := filepath.Glob(filepath.Join(cfg.CheckpointDir, jobName, "commits", "*"))
	require.NoError(t, err)
	var kept []uint64
	for _, n := range names {
		step, err := strconv.ParseUint(filepath.Base(n), 10, 64)
		require.NoError(t, err)
		kept = append(kept, step)
	}
	require.Greater(t, len(evals), 6, "more commits than retention keeps")
	assert.LessOrEqual(t, len(kept), 5)
	assert.Contains(t, kept, bestStep, "the best commit is kept")
	assert.Contains(t, kept, uint64(s.Steps), "the newest commit is kept")

	// Evaluate "best" loads exactly the parameters of the best commit: the same figures.
	ev := cfg
	ev.Evaluate, ev.OnEvent = "best", nil
	se, err := Run(context.Background(), ev)
	require.NoError(t, err)
	assert.Equal(t, bestStep, se.Evaluated)
	assert.Equal(t, s.Best.AUC, se.Eval.AUC, "the best commit's test AUC, evaluated again")
	assert.Equal(t, s.Best.LogLoss, se.Eval.LogLoss)
	assert.Contains(t, se.String(), fmt.Sprintf("commit:      step %d", bestStep))
	ev.Evaluate = "newest"
	se, err = Run(context.Background(), ev)
	require.NoError(t, err)
	assert.Equal(t, uint64(s.Steps), se.Evaluated)
	assert.Equal(t, s.Eval.AUC, se.Eval.AUC, "the final commit's")
	ev.Evaluate = "1"
	_, err = Run(context.Background(), ev)
	assert.ErrorIs(t, err, ErrNoCheckpoint, "no commit of step 1")
	kept2, err := filepath.Glob(filepath.Join(cfg.CheckpointDir, jobName, "commits", "*"))
	require.NoError(t, err)
	assert.Equal(t, names, kept2, "evaluating deletes and writes no commit")

	res := cfg
	res.Resume, res.Epochs, res.OnEvent = true, 4, nil
	var restored string
	res.OnEvent = func(ev Event) {
		if ev.Kind == EventRestore {
			restored = ev.Message
		}
	}
	s2, err := Run(context.Background(), res)
	require.NoError(t, err)
	assert.Contains(t, restored, fmt.Sprintf("the best evaluated commit so far is of step %d", bestStep))
	if s2.Best.Step == bestStep {
		_, err = os.Stat(filepath.Join(cfg.CheckpointDir, jobName, "commits", fmt.Sprintf("%020d", bestStep)))
		assert.NoError(t, err, "the best commit survives the resumed run's retention")
	}
	require.NotNil(t, s2.Best)
	assert.LessOrEqual(t, s2.Best.LogLoss, s.Best.LogLoss)
	assert.Greater(t, s2.Evaluations, s.Evaluations)
}

// TestL2DefaultsReachTheServers: the L2 a table of the run is created with is the default of
// its data kind, none when asked for none.
func TestL2DefaultsReachTheServers(t *testing.T) {
	c := Config{Data: DataSpec{Kind: MovieLens, Paths: []string{"x"}}}
	c.fill()
	assert.Equal(t, DefaultL2(MovieLens, false), c.embeddingOptimizer().L2)
	assert.NotZero(t, c.embeddingOptimizer().L2)
	assert.Equal(t, DefaultL2(MovieLens, true), c.denseOptimizer().L2)
	c = Config{Data: DataSpec{Kind: MovieLens, Paths: []string{"x"}}, EmbeddingOptimizer: embedding.Optimizer{L2: -1}}
	c.fill()
	assert.Zero(t, c.embeddingOptimizer().L2, "negative is none")
	specs := tableSpecs(&c, []string{"a"})
	assert.Zero(t, specs[0].Config.Optimizer.L2)
}

// TestKeepBestDefaults: with a validation set keep-best and early stopping are on by default;
// without one they stay off (choosing by the test set would leak it) unless asked for; an
// explicit "never" and "off" hold.
func TestKeepBestDefaults(t *testing.T) {
	for _, c := range []struct {
		name      string
		keep      Switch
		valid     float64
		earlyStop int
		wantKeep  bool
		wantStop  int
	}{
		{"valid", SwitchDefault, 0.1, 0, true, DefaultEarlyStop},
		{"valid, never stop", SwitchDefault, 0.1, -1, true, -1},
		{"valid, patience 5", SwitchDefault, 0.1, 5, true, 5},
		{"valid, keep-best off", SwitchOff, 0.1, 0, false, -1},
		{"no valid", SwitchDefault, 0, 0, false, -1},
		{"no valid, keep-best on", SwitchOn, 0, 0, true, -1},
		{"no valid, early stop asked", SwitchDefault, 0, 2, true, 2},
	} {
		cfg := Config{KeepBest: c.keep, ValidFraction: c.valid, EarlyStop: c.earlyStop}
		cfg.resolveBest()
		assert.Equal(t, c.wantKeep, cfg.keepBest(), c.name)
		assert.Equal(t, c.wantStop, cfg.EarlyStop, c.name)
	}
}
