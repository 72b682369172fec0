package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/elasticps/elasticps/examples/dlrm/train"
)

// runDLRM measures synthetic-data training throughput of the embedded DLRM cluster (two
// parameter servers and the dispatcher on loopback TCP) with one worker and with two, in one
// run, each for the same wall time with flash checkpoints on; the one-worker figure is the
// baseline of the ratio. It also reports the checkpoints' blocking time and the held-out AUC of
// the two-worker run next to the generator's ceiling, and then the pauses of the main command's
// checkpoints against a memcpy and a batch (runDLRMPauses).
func runDLRM(ctx context.Context, opt options, r *report) error {
	dur := 30 * time.Second
	if opt.quick {
		dur = 6 * time.Second
	}
	var rates [2]float64
	for i, workers := range []int{1, 2} {
		dir, err := os.MkdirTemp(opt.dir, "bench-dlrm-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		fmt.Printf("dlrm: %d worker(s), %v of synthetic Criteo-like data...\n", workers, dur)
		s, err := train.Run(ctx, train.Config{
			Workers: workers, Duration: dur, Seed: 1, CheckpointDir: dir,
			CheckpointEvery: 500, EvalEvery: -1,
		})
		if err != nil {
			return fmt.Errorf("%d workers: %w", workers, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rates[i] = s.SamplesPerSec
		r.add(fmt.Sprintf("samples_per_s_%dw", workers), s.SamplesPerSec, fmt.Sprintf("samples/s, %d worker(s), 2 PS, checkpoints every 500 steps", workers))
		if workers == 2 {
			c := s.Checkpoints
			r.add("checkpoint_block_mean_ms", float64(c.MeanBlocked().Microseconds())/1000, fmt.Sprintf("ms training paused per checkpoint (%d taken, %.0f MiB copied in all)", c.Taken, float64(c.Copied)/(1<<20)))
			r.add("checkpoint_block_max_ms", float64(c.MaxBlocked.Microseconds())/1000, "ms, the longest pause")
			r.add("test_auc_2w", s.Eval.AUC, fmt.Sprintf("held-out AUC after %d samples (%d records)", s.Samples, s.Eval.Samples))
			r.add("ceiling_auc", s.Ceiling.AUC, "AUC of the generator's own hidden model on the same records")
			r.add("exactly_once", b2f(s.ExactlyOnce), "1 if every trained position was trained once")
		}
	}
	r.add("speedup_2w_over_1w", rates[1]/rates[0], "2-worker over 1-worker throughput (2 cores shared by servers, workers and dispatcher)")
	return runDLRMPauses(ctx, opt, r)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
