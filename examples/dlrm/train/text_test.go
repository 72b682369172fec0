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
	h := heldOut{seed: cfg.Seed, fraction: DefaultTestFraction}
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
