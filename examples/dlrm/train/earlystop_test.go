package train_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// overfitConfig trains a small synthetic data set for many epochs with a validation set and a
// checkpoint about every epoch: the model overfits, and its validation log loss rises.
func overfitConfig(t *testing.T, epochs int) train.Config {
	const records = 3000
	return train.Config{
		Synth:        model.SynthConfig{DenseFeatures: 8, Vocab: []int{3, 10, 50, 200, 1000}, Hotness: []int{1, 1, 1, 3, 1}, ZipfExponent: 1.2},
		TrainRecords: records, TestRecords: 2000, ValidFraction: 0.3, Epochs: epochs, Seed: 7,
		EmbeddingDim: 8, BottomHidden: []int{16}, TopHidden: []int{16}, BatchSize: 128,
		ShardSize: 1024, CheckpointEvery: records / 128, EvalEvery: -1,
		CheckpointDir: t.TempDir(), ShmDir: t.TempDir(),
	}
}

// checkpointEvals collects the evaluation of every checkpoint by its step.
func checkpointEvals(t *testing.T, cfg *train.Config) map[uint64]train.Eval {
	evals := map[uint64]train.Eval{}
	cfg.OnEvent = func(ev train.Event) {
		var step uint64
		if ev.Kind == train.EventEval && ev.Eval.Set == "validation" {
			_, err := fmt.Sscanf(ev.Message, "checkpoint of step %d", &step)
			require.NoError(t, err, "an evaluation outside a checkpoint: %q", ev.Message)
			evals[step] = ev.Eval
		}
	}
	return evals
}

// TestValidationStopsEarlyAndReportsTheBest: with a validation set, keep-best and early
// stopping are on by default: a run of many epochs stops before its last, its best commit is
// the one of the lowest validation log loss, and its test line reports that commit's test
// figures, equal to those of evaluating it alone, beside the final model's; the predictions
// are the best commit's.
func TestValidationStopsEarlyAndReportsTheBest(t *testing.T) {
	const epochs = 40
	cfg := overfitConfig(t, epochs)
	cfg.Predictions = filepath.Join(t.TempDir(), "p.tsv")
	evals := checkpointEvals(t, &cfg)
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	t.Log(s)
	assert.True(t, strings.HasPrefix(s.StopReason, "early stop: 3 evaluations in a row without a lower log loss than the best"), s.StopReason)
	require.Less(t, len(s.Epochs), epochs, "stopped before the last epoch")
	require.NotNil(t, s.Best)
	var bestStep uint64
	for step, ev := range evals {
		if b := evals[bestStep]; bestStep == 0 || ev.LogLoss < b.LogLoss || ev.LogLoss == b.LogLoss && step < bestStep {
			bestStep = step
		}
	}
	assert.Equal(t, bestStep, s.Best.Step, "the commit of the lowest validation log loss")
	assert.GreaterOrEqual(t, s.SinceBest, train.DefaultEarlyStop)
	require.NotNil(t, s.BestTest, "the best commit is not the final model: scored on its own")
	assert.Equal(t, s.Eval.Samples, s.BestTest.Samples)
	assert.Equal(t, *s.BestTest, s.Test())
	assert.Less(t, s.BestTest.LogLoss, s.Eval.LogLoss, "the best commit's test log loss beats the overfit final model's")
	out := s.String()
	assert.Contains(t, out, fmt.Sprintf("test:        AUC %.4f, log loss %.4f on %d held-out records", s.BestTest.AUC, s.BestTest.LogLoss, s.BestTest.Samples))
	assert.Contains(t, out, fmt.Sprintf(": the best commit's (step %d); the final model's: AUC %.4f, log loss %.4f\n", bestStep, s.Eval.AUC, s.Eval.LogLoss))

	_, ps := readPredictions(t, cfg.Predictions)
	assert.InDelta(t, s.BestTest.AUC, rankAUC(t, ps), 1e-9, "the predictions are the best commit's")

	ev := cfg
	ev.Evaluate, ev.OnEvent, ev.Predictions = "best", nil, ""
	se, err := train.Run(context.Background(), ev)
	require.NoError(t, err)
	assert.Equal(t, bestStep, se.Evaluated)
	assert.Equal(t, s.BestTest.AUC, se.Eval.AUC, "the figures of evaluating the best commit alone")
	assert.Equal(t, s.BestTest.LogLoss, se.Eval.LogLoss)
}

// TestBestByAUC: BestMetric AUC chooses the commit of the highest validation AUC.
func TestBestByAUC(t *testing.T) {
	cfg := overfitConfig(t, 40)
	cfg.BestMetric = train.MetricAUC
	evals := checkpointEvals(t, &cfg)
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.NotNil(t, s.Best)
	var bestStep uint64
	for step, ev := range evals {
		if b := evals[bestStep]; bestStep == 0 || ev.AUC > b.AUC || ev.AUC == b.AUC && step < bestStep {
			bestStep = step
		}
	}
	assert.Equal(t, bestStep, s.Best.Step, "the commit of the highest validation AUC")
	assert.Contains(t, s.String(), "chosen by auc")
}

// TestValidationWithoutEarlyStop: a negative EarlyStop (the command's -early-stop 0) runs every
// epoch with a validation set, keeping the best all the same.
func TestValidationWithoutEarlyStop(t *testing.T) {
	const epochs = 12
	cfg := overfitConfig(t, epochs)
	cfg.EarlyStop = -1
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	assert.Equal(t, "every epoch done", s.StopReason)
	assert.Len(t, s.Epochs, epochs)
	require.NotNil(t, s.Best)
	assert.Greater(t, s.SinceBest, train.DefaultEarlyStop, "more evaluations without improvement than the default patience")
}
