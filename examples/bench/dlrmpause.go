package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/elasticps/elasticps/examples/dlrm/train"
)

// pauseRun is what one embedded dlrm run tells of its checkpoints.
type pauseRun struct {
	pauses  []ckPause     // every snapshot taken, in order
	batch   time.Duration // one worker's batch: workers x batch size / samples per second
	steps   int64
	applied int64   // the servers' records of applied positions at the end, in bytes
	records []int64 // the same right after each snapshot, in order
}

// ckPause is one checkpoint's pause and the bytes its servers copied.
type ckPause struct {
	blocked time.Duration
	bytes   int64
	memcpy  time.Duration // the baseline: a parallel memcpy of as many bytes (filled afterwards)
}

// ratio is the pause over the baseline: the memcpy of the same bytes and one batch's drain.
func (p ckPause) ratio(batch time.Duration) float64 {
	return float64(p.blocked) / float64(p.memcpy+batch)
}

// pauseStop says when runPauses interrupts its run (a final checkpoint follows, not recorded):
// after checkpoints snapshots, or once steps steps are trained (0: neither).
type pauseStop struct {
	checkpoints int
	steps       int64
}

// runPauses trains the dlrm example's embedded cluster with cfg (in a fresh checkpoint
// directory) and records every snapshot taken until stop. A run stopped by steps may record none.
func runPauses(ctx context.Context, opt options, cfg train.Config, stop pauseStop) (*pauseRun, error) {
	dir, err := os.MkdirTemp(opt.dir, "bench-dlrm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg.CheckpointDir = dir
	if stop.steps > 0 {
		cfg.ProgressEvery = 10 * time.Millisecond
	}
	var mu sync.Mutex
	var pauses []ckPause
	var records []int64
	stopped := false
	cfg.OnEvent = func(ev train.Event) {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if stop.steps > 0 && ev.Progress.Steps >= stop.steps {
			stopped = true
			cancel()
		}
		c := ev.Checkpoint
		if ev.Kind != train.EventCheckpoint || c.Err != nil || c.Skipped {
			return
		}
		pauses = append(pauses, ckPause{blocked: c.Blocked, bytes: c.Bytes})
		records = append(records, c.Applied)
		if len(pauses) == stop.checkpoints {
			stopped = true
			cancel()
		}
	}
	s, err := train.Run(ctx, cfg)
	if err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	if (len(pauses) == 0 && stop.steps == 0) || s.SamplesPerSec <= 0 {
		return nil, fmt.Errorf("dlrm: %d checkpoints taken, %.0f samples/s", len(pauses), s.SamplesPerSec)
	}
	batch := cfg.BatchSize
	if batch == 0 {
		batch = train.DefaultBatchSize
	}
	return &pauseRun{pauses: pauses, steps: s.Steps, applied: s.AppliedBytes, records: records,
		batch: time.Duration(float64(s.Workers*batch) / s.SamplesPerSec * float64(time.Second))}, nil
}

// memcpyBaselines sets each pause's memcpy: the median of three parallel copies of as many bytes
// between two pre-faulted buffers, on as many goroutines as a snapshot copies with, measured
// after the runs (a quiet machine: the baseline at its best).
func memcpyBaselines(runs ...*pauseRun) {
	var most int64
	for _, r := range runs {
		for _, p := range r.pauses {
			most = max(most, p.bytes)
		}
	}
	src, dst := make([]byte, most), make([]byte, most)
	for i := range src {
		src[i] = byte(i * 131) // written: faulted in, and not the shared zero page
	}
	parallelCopy(dst, src, ckCopyWorkers()) // faults dst in
	for _, r := range runs {
		for i := range r.pauses {
			n := r.pauses[i].bytes
			var t [3]float64
			for k := range t {
				t0 := time.Now()
				parallelCopy(dst[:n], src[:n], ckCopyWorkers())
				t[k] = float64(time.Since(t0))
			}
			r.pauses[i].memcpy = time.Duration(ckMedian(t[:]))
		}
	}
}

// growthEvery is the checkpoint schedule of the record's growth figure: a checkpoint every
// fortieth of the steps of the main run, so that a tenth of the run lies past several commits.
func growthEvery(steps int64) int {
	return max(int(steps/10/4), 5)
}

// runDLRMPauses measures the checkpoint pauses of the dlrm example's main command: a 60 s
// embedded run (6 s with -quick, with a checkpoint every 2 s of training rather than 10 s so it
// takes several) with the command's settings, each snapshot's pause against a parallel memcpy of
// the bytes its servers copied plus one worker's batch (the drain the barrier waits for at most),
// both measured in the same run; the servers' records of applied positions after that run, and
// after the same run on a denser step schedule and after it stopped at a tenth of its steps
// (the record's growth with history); and a sweep of the pauses against the steps
// between checkpoints. The shorter runs evaluate 1000 held-out records instead of 20000 at
// their end, which changes nothing they measure.
func runDLRMPauses(ctx context.Context, opt options, r *report) error {
	dur, interval := 60*time.Second, time.Duration(0) // 0: the main command's
	if opt.quick {
		dur, interval = 6*time.Second, 2*time.Second
	}
	fmt.Printf("dlrm: checkpoint pauses of a %v run with the main command's settings...\n", dur)
	cfg := train.CommandDefaults()
	cfg.Duration = dur
	if interval > 0 {
		cfg.CheckpointInterval = interval
	}
	long, err := runPauses(ctx, opt, cfg, pauseStop{})
	if err != nil {
		return fmt.Errorf("pauses: %w", err)
	}
	// The record's growth with history: the same run on a schedule of a checkpoint every
	// growthEvery steps, stopped after a tenth of its steps and at its end, so that both points
	// lie past several commits (a run stopped before its first commit holds every shard it
	// trained, which is its whole history, not the growth of one).
	growthCfg := cfg
	growthCfg.TestRecords = 1000
	growthCfg.CheckpointEvery, growthCfg.CheckpointInterval = growthEvery(long.steps), -1
	// Shards of 1024 records, so that one checkpoint's interval holds many: the record is a
	// watermark per shard trained since the newest commit, and with few shards per interval
	// its size jumps with where the run stops in a shard, not with history.
	growthCfg.ShardSize = 1024
	fmt.Printf("dlrm: the same run with a checkpoint every %d steps, at its end and stopped at a tenth of its steps, for the growth of the applied-positions record...\n", growthCfg.CheckpointEvery)
	grown, err := runPauses(ctx, opt, growthCfg, pauseStop{})
	if err != nil {
		return fmt.Errorf("pauses: %w", err)
	}
	// At a tenth of its steps, and at least four checkpoints in, so that the short run has
	// snapshots past its first whatever the machine's speed made of the full run's length.
	short, err := runPauses(ctx, opt, growthCfg, pauseStop{steps: max(grown.steps/10, 4*int64(growthCfg.CheckpointEvery)+1)})
	if err != nil {
		return fmt.Errorf("pauses: %w", err)
	}
	sweep, err := dlrmStepSweep(ctx, opt)
	if err != nil {
		return err
	}
	memcpyBaselines(append([]*pauseRun{long, short, grown}, sweep...)...)

	var blocked, mem, ratios []float64
	var bytes int64
	for _, p := range long.pauses {
		blocked = append(blocked, ckMillis(p.blocked))
		mem = append(mem, ckMillis(p.memcpy))
		ratios = append(ratios, p.ratio(long.batch))
		bytes += p.bytes
	}
	worst := slices.Index(ratios, slices.Max(ratios))
	base := fmt.Sprintf("a parallel memcpy of the bytes the checkpoint's servers copied (%d goroutines, pre-faulted buffers, median of 3 after the run) plus one worker's batch (%.1f ms: workers x batch size / samples per second of the same run), the most the barrier waits for a batch in hand", ckCopyWorkers(), ckMillis(long.batch))
	r.add("ckpt_pauses", float64(len(long.pauses)), fmt.Sprintf("checkpoints of a %v run with the main command's settings (train.CommandDefaults: every %d steps or %v), the final one included", dur, cfg.CheckpointEvery, cfg.CheckpointInterval))
	r.add("ckpt_pause_median_ms", ckMedian(blocked), "training paused per checkpoint: the barrier's drain, the dispatcher's snapshot, every server's copy")
	r.add("ckpt_pause_worst_ms", slices.Max(blocked), "the longest pause")
	r.add("ckpt_copied_mib", float64(bytes)/(1<<20)/float64(len(long.pauses)), "MiB copied into shared memory per checkpoint, on average")
	r.add("ckpt_memcpy_ms", ckMedian(mem), "baseline: a parallel memcpy of a checkpoint's bytes, median")
	r.add("ckpt_batch_ms", ckMillis(long.batch), "baseline: one worker's batch in the same run")
	r.addRatio("ckpt_pause_vs_copy_median", spread{med: ckMedian(ratios), lo: slices.Min(ratios), hi: slices.Max(ratios), pairs: len(ratios),
		subj: ckMedian(blocked), base: ckMedian(mem) + ckMillis(long.batch)}, base, "ckpt_memcpy_ms", "median over the checkpoints of pause / (memcpy + batch); target <= 2")
	r.addRatio("ckpt_pause_vs_copy_worst", spread{med: ratios[worst], lo: ratios[worst], hi: ratios[worst], pairs: 1,
		subj: blocked[worst], base: mem[worst] + ckMillis(long.batch)}, base, "ckpt_memcpy_ms", "the checkpoint with the largest pause / (memcpy + batch); target <= 4")

	each := sweepTable{About: fmt.Sprintf("every checkpoint of the %v run, in order (the last is the final one)", dur),
		Columns: []string{"copied_mib", "pause_ms", "memcpy_ms", "pause_vs_copy"}}
	for _, p := range long.pauses {
		each.Rows = append(each.Rows, []float64{float64(p.bytes) / (1 << 20), ckMillis(p.blocked), ckMillis(p.memcpy), p.ratio(long.batch)})
	}
	r.addTable("ckpt_pause_each", each)

	r.add("applied_record_bytes", float64(long.applied), fmt.Sprintf("the servers' records of the batch positions they applied (ps.Server.AppliedState, summed) after the %v run, %d steps", dur, long.steps))
	// The record right after each snapshot but the first (the first commit's has no commit
	// before it to prune by): the median over the short run's, against the median over the
	// last half of the full run's. Where one run stops in a shard moves its last record by a
	// shard per table; the medians take that out.
	late := func(recs []int64, from int) []float64 {
		var out []float64
		for _, v := range recs[min(from, len(recs)):] {
			out = append(out, float64(v))
		}
		return out
	}
	shortRecs, grownRecs := late(short.records, 1), late(grown.records, len(grown.records)/2)
	if len(shortRecs) == 0 || len(grownRecs) == 0 {
		return fmt.Errorf("dlrm: the record's growth needs snapshots after the first: %d and %d taken", len(short.records), len(grown.records))
	}
	shortMed, grownMed := ckMedian(shortRecs), ckMedian(grownRecs)
	r.add("applied_record_bytes_grown", grownMed, fmt.Sprintf("the same right after a snapshot, median over the last half of a %v run with a checkpoint every %d steps (%d snapshots, %d steps)", dur, growthCfg.CheckpointEvery, len(grown.records), grown.steps))
	r.add("applied_record_bytes_short", shortMed, fmt.Sprintf("the same, median over that run's snapshots but the first when stopped at a tenth of its steps or four checkpoints in, whichever is later (%d snapshots, %d steps)", len(short.records), short.steps))
	if shortMed <= 0 {
		return errors.New("dlrm: the applied-positions record is empty after the short run")
	}
	growth := grownMed / shortMed
	r.addRatio("applied_record_growth", spread{med: growth, lo: slices.Min(grownRecs) / slices.Max(shortRecs), hi: slices.Max(grownRecs) / slices.Min(shortRecs), pairs: len(grownRecs), subj: grownMed, base: shortMed},
		fmt.Sprintf("the record after the same run (a checkpoint every %d steps) stopped at a tenth of its steps (%d)", growthCfg.CheckpointEvery, short.steps), "applied_record_bytes_short",
		fmt.Sprintf("record after %.1fx the steps over the record after 1x, on one checkpoint schedule; target <= 1.2 (bounded by what is in flight, not by history)", float64(grown.steps)/float64(max(short.steps, 1))))

	t := sweepTable{About: "checkpoint pauses against the steps between checkpoints (a run interrupted after a few, the first full, medians over them; memcpy and batch as for ckpt_pause_vs_copy); flat is the target",
		Columns: []string{"steps_between", "checkpoints", "copied_mib", "pause_ms", "memcpy_ms", "batch_ms", "pause_vs_copy", "applied_record_kib"}}
	for i, run := range sweep {
		var b, m, q, c []float64
		for _, p := range run.pauses {
			b, m, q, c = append(b, ckMillis(p.blocked)), append(m, ckMillis(p.memcpy)), append(q, p.ratio(run.batch)), append(c, float64(p.bytes)/(1<<20))
		}
		t.Rows = append(t.Rows, []float64{float64(sweepSteps(opt)[i]), float64(len(run.pauses)), ckMedian(c), ckMedian(b), ckMedian(m),
			ckMillis(run.batch), ckMedian(q), float64(run.applied) / 1024})
	}
	r.addTable("pause_vs_steps_between", t)
	return nil
}

// sweepSteps are the steps between checkpoints of the sweep's points.
func sweepSteps(opt options) []int {
	if opt.quick {
		return []int{5, 20}
	}
	return []int{100, 300, 1000}
}

// sweepCheckpoints is how many checkpoints each point of the sweep takes before it is
// interrupted.
const sweepCheckpoints = 4

// dlrmStepSweep runs the main command's settings with a checkpoint every n steps (and none by
// time) for each n of sweepSteps, each interrupted after sweepCheckpoints checkpoints (a final
// one follows, not counted).
func dlrmStepSweep(ctx context.Context, opt options) ([]*pauseRun, error) {
	var out []*pauseRun
	for _, n := range sweepSteps(opt) {
		fmt.Printf("dlrm: %d checkpoints %d steps apart...\n", sweepCheckpoints, n)
		cfg := train.CommandDefaults()
		cfg.CheckpointEvery, cfg.CheckpointInterval, cfg.Duration, cfg.TestRecords = n, -1, 0, 1000
		run, err := runPauses(ctx, opt, cfg, pauseStop{checkpoints: sweepCheckpoints})
		if err != nil {
			return nil, fmt.Errorf("sweep, %d steps apart: %w", n, err)
		}
		out = append(out, run)
	}
	return out, nil
}
