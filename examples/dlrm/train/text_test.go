package train

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTextDataWithHeldOutSplit trains a libSVM file with a seeded held-out split, is interrupted
// and resumed, and checks exactly once. Held-out lines are gaps in the positions the workers
// train; a shard whose last lines are all held out after a full batch reaches its worker as a
// batch without records, which the worker reports and marks in the ledger like any other, so
// the ledger and the dispatcher agree.
func TestTextDataWithHeldOutSplit(t *testing.T) {
	const lines, shardSize, batch = 1200, 20, 2
	var b strings.Builder
	for i := range lines {
		fmt.Fprintf(&b, "%d %d:1 %d:1 %d:0.5\n", i%2, i%7, 100+i%13, 200+i%5)
	}
	path := filepath.Join(t.TempDir(), "train.svm")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	spec, err := ParseDataSpec("libsvm:" + path)
	require.NoError(t, err)
	cfg := Config{Data: spec, Seed: 1, Epochs: 2, EvalEvery: -1, BatchSize: batch, ShardSize: shardSize,
		EmbeddingDim: 4, BottomHidden: []int{4}, TopHidden: []int{4}, TestRecords: 20, Workers: 2,
		CheckpointEvery: 50, ProgressEvery: 10 * time.Millisecond, CheckpointDir: t.TempDir(), ShmDir: t.TempDir()}

	// The case this is about: shards whose trained records fill whole batches and whose last
	// lines are held out.
	h := heldOut{seed: cfg.Seed, hi: DefaultTestFraction}
	tails := 0
	for s := 0; s < lines/shardSize; s++ {
		trained, last := 0, -1
		for p := range shardSize {
			if !h.is(int64(s*shardSize + p)) {
				trained, last = trained+1, p
			}
		}
		if trained%batch == 0 && last < shardSize-1 {
			tails++
		}
	}
	require.Positive(t, tails, "the data must have shards ending in held-out lines after a full batch")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopAt := int64(lines * 0.8 / batch) // in the first epoch
	cfg.OnEvent = func(ev Event) {
		if ev.Progress.Steps >= stopAt {
			cancel()
		}
	}
	first, err := Run(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, "interrupted", first.StopReason)
	for _, e := range first.Epochs {
		assert.True(t, e.OK(), "first run: %s", e)
	}

	cfg.Resume, cfg.OnEvent = true, nil
	second, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.True(t, second.Resumed)
	require.Len(t, second.Epochs, 2)
	for _, e := range second.Epochs {
		assert.True(t, e.OK(), "%s", e)
		assert.True(t, e.Complete, "%s", e)
		assert.Equal(t, int64(lines), e.Covered, "every position, held-out lines included, covered once: %s", e)
	}
	assert.True(t, second.ExactlyOnce)
}

// TestValidationSplitIsNeitherTrainedNorTested carves a validation set out of text data with a
// held-out test split: the validation lines are not trained, not among the test lines, and the
// evaluations during training score them while the summary's final Eval scores the test set.
func TestValidationSplitIsNeitherTrainedNorTested(t *testing.T) {
	const lines = 2000
	var b strings.Builder
	for i := range lines {
		fmt.Fprintf(&b, "%d %d:1 %d:1\n", i%2, 1000+i, 3000+i%11) // feature 1000+i names line i
	}
	path := filepath.Join(t.TempDir(), "train.svm")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	spec, err := ParseDataSpec("libsvm:" + path)
	require.NoError(t, err)
	cfg := Config{Data: spec, Seed: 3, Epochs: 1, EvalEvery: -1, BatchSize: 16, ShardSize: 100, ValidFraction: 0.25,
		EmbeddingDim: 4, BottomHidden: []int{4}, TopHidden: []int{4}, TestRecords: lines, Workers: 1,
		CheckpointEvery: -1, CheckpointDir: t.TempDir(), ShmDir: t.TempDir(),
		EarlyStop: -1} // every line trained: no early stop, which a validation set turns on
	cfg.fill()
	d, err := loadData(context.Background(), &cfg)
	require.NoError(t, err)
	line := func(s []float32, ids []uint64) int {
		for _, id := range ids {
			if id >= 1000 && id < 1000+lines {
				return int(id - 1000)
			}
		}
		t.Fatalf("a sample without its line's feature: %v", ids)
		return -1
	}
	test, valid := map[int]bool{}, map[int]bool{}
	for _, s := range d.test {
		test[line(s.Dense, s.IDs)] = true
	}
	for _, s := range d.valid {
		valid[line(s.Dense, s.IDs)] = true
	}
	// About 20 % test and 25 % of the remaining 80 % validation.
	assert.InDelta(t, 0.2*lines, len(test), 0.05*lines)
	assert.InDelta(t, 0.2*lines, len(valid), 0.05*lines)
	for l := range valid {
		assert.False(t, test[l], "line %d is in both the test and the validation set", l)
	}

	var sets []string
	cfg.OnEvent = func(ev Event) {
		if ev.Kind == EventEval {
			sets = append(sets, ev.Eval.Set)
		}
	}
	cfg.EvalEvery = 5 * time.Millisecond
	s, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	assert.Equal(t, int64(lines-len(test)-len(valid)), s.TotalSamples, "neither test nor validation lines trained")
	require.NotNil(t, s.Valid)
	assert.Equal(t, "validation", s.Valid.Set)
	assert.Equal(t, len(valid), s.Valid.Samples)
	assert.Equal(t, "test", s.Eval.Set)
	assert.Equal(t, len(test), s.Eval.Samples)
	require.NotEmpty(t, sets)
	assert.Equal(t, "test", sets[len(sets)-1], "the test set is scored once, at the end")
	for _, set := range sets[:len(sets)-1] {
		assert.Equal(t, "validation", set, "evaluations while training score the validation set")
	}
	assert.Contains(t, s.String(), "validation:  AUC")
}
