package train_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/stretchr/testify/require"
)

// Evaluating the newest commit while a byte of one server's chunk is flipped fails, naming the
// damage, and returns: the other servers' loads, cancelled by the failure, end too. (The loader
// once left a goroutine waiting on a slot after a cancellation, and the program then hung,
// deaf to signals, in some runs; each try here is one such run.)
func TestEvaluateOfADamagedCommitFailsAndReturns(t *testing.T) {
	cfg := smallConfig(t, 6000, 1)
	cfg.Servers, cfg.CheckpointEvery = 4, 10
	_, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	commits, err := filepath.Glob(filepath.Join(cfg.CheckpointDir, "dlrm", "commits", "*"))
	require.NoError(t, err)
	require.NotEmpty(t, commits)
	newest := filepath.Base(commits[len(commits)-1])
	chunks, err := filepath.Glob(filepath.Join(cfg.CheckpointDir, "dlrm", "data", newest, "ps-0", "*", "t*"))
	require.NoError(t, err)
	require.NotEmpty(t, chunks)
	b, err := os.ReadFile(chunks[0])
	require.NoError(t, err)
	b[len(b)/2] ^= 0x02
	require.NoError(t, os.WriteFile(chunks[0], b, 0o644))

	ev := cfg
	ev.Evaluate = "newest"
	for try := range 8 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		done := make(chan error, 1)
		go func() {
			_, err := train.Run(ctx, ev)
			done <- err
		}()
		select {
		case err := <-done:
			require.ErrorIs(t, err, checkpoint.ErrCorrupt, "try %d", try)
			require.NotErrorIs(t, err, context.DeadlineExceeded, "try %d: it failed on its own, not at the deadline", try)
		case <-time.After(time.Minute):
			buf := make([]byte, 1<<20)
			stacks := string(buf[:runtime.Stack(buf, true)])
			t.Fatalf("try %d: the evaluation has not returned, 30s after its context ended:\n%s", try, stacks[:min(len(stacks), 1<<16)])
		}
		cancel()
	}
}
