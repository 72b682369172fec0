package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/elasticps/elasticps/examples/clustersim/sim"
)

// The autoscale suite's inputs, given by flag: the shared traces and, optionally, the
// repartition benchmark's figures to price live and stop-and-restart scaling with.
var (
	autoscaleTraces      = flag.String("traces", "../shared/data/traces", "autoscale: directory of the public traces (the project's shared data)")
	autoscaleRepartition = flag.String("repartition", "", "autoscale: a bench-repartition.json to price scaling with (default: the measurement shipped in examples/clustersim/sim/testdata)")
)

// runAutoscale runs the cluster simulator once, seeded, on the Philly-derived DLRM workload
// (examples/clustersim): the users' configurations under FIFO against DLRover-RM-style auto
// configuration by elastic/autoscale's planner, and elastic Tiresias with the live scaling
// the repartition benchmark measures against stop-and-restart. It reports:
//
//   - jct_median_manual_vs_auto: manual median JCT over auto's, over the jobs both completed
//     (DLRover-RM reports 1/(1-0.31) = 1.45);
//   - cpu_util_auto_minus_manual, mem_util_auto_minus_manual: used over allocated, in
//     percentage points (DLRover-RM: +15 and +20);
//   - completion_auto_minus_manual: jobs completed within the trace window, percentage points
//     (DLRover-RM: +6);
//   - jct_mean_stop_restart_vs_live: elastic LAS's mean JCT when each change stops and
//     restarts the job, over its mean JCT when servers move live;
//   - hot_ps_detect_to_rebalanced_s: the live hot-server scenario on an in-process job (one
//     server serving every row): from the autoscale runner's AddServer decision, once the
//     server was hot for HotFor, to the new server started and the hot slots moved by
//     measured load (Applied.Took). The job has 4096 slots, 1024 with -quick.
func runAutoscale(ctx context.Context, opt options, r *report) error {
	if _, err := os.Stat(*autoscaleTraces + "/" + sim.PhillyPath); err != nil {
		return fmt.Errorf("traces not found at %s (run from the repository root beside ../shared/data, or pass -traces): %w", *autoscaleTraces, err)
	}
	tr, err := sim.LoadTraces(os.DirFS(*autoscaleTraces))
	if err != nil {
		return err
	}
	setup := sim.Setup{Seed: 1}
	if opt.quick {
		setup.PS.Jobs, setup.Gavel.Jobs = 60, 60
	}
	source := "the shipped repartition measurement"
	if *autoscaleRepartition != "" {
		f, err := os.Open(*autoscaleRepartition)
		if err != nil {
			return err
		}
		setup.Repartition, err = sim.ParseRepartitionFigures(*autoscaleRepartition, f)
		f.Close()
		source = *autoscaleRepartition
	} else {
		setup.Repartition, err = sim.DefaultRepartitionFigures()
	}
	if err != nil {
		return err
	}
	cs, err := sim.RunComparisons(tr, setup)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var man, auto, live, stop *sim.Result
	for _, c := range cs {
		man, auto = or(man, c.Result(sim.Manual)), or(auto, c.Result(sim.AutoRM))
		live, stop = or(live, c.Result(sim.ElasticLive)), or(stop, c.Result(sim.ElasticRestart))
	}
	if man == nil || auto == nil || live == nil || stop == nil {
		return errors.New("the simulator ran no manual, auto or elastic LAS policy")
	}
	sm, sa := man.Summary(), auto.Summary()
	if sm.Completed == 0 || sa.Completed == 0 {
		return fmt.Errorf("nothing completed: manual %d, auto %d of %d jobs", sm.Completed, sa.Completed, sm.Jobs)
	}
	cm, ca := sim.CommonJCTs(man, auto)
	if len(cm) == 0 {
		return errors.New("no job completed under both manual and auto configuration")
	}
	r.add("jct_median_manual_vs_auto", sim.Median(cm)/sim.Median(ca), fmt.Sprintf("manual median JCT over auto's over the %d jobs both completed (DLRover-RM: 1.45)", len(cm)))
	r.add("cpu_util_auto_minus_manual", 100*(sa.CPUUtil-sm.CPUUtil), fmt.Sprintf("pp of CPU used over allocated, %.1f%% vs %.1f%% (DLRover-RM: +15)", 100*sa.CPUUtil, 100*sm.CPUUtil))
	r.add("mem_util_auto_minus_manual", 100*(sa.MemUtil-sm.MemUtil), fmt.Sprintf("pp of memory used over allocated, %.1f%% vs %.1f%% (DLRover-RM: +20)", 100*sa.MemUtil, 100*sm.MemUtil))
	r.add("completion_auto_minus_manual", 100*(sa.CompletionRate-sm.CompletionRate), fmt.Sprintf("pp of %d jobs completed in the trace window, %d vs %d (DLRover-RM: +6)", sm.Jobs, sa.Completed, sm.Completed))
	slots := 4096
	if opt.quick {
		slots = 1024
	}
	hot, err := runHotPS(ctx, slots)
	if err != nil {
		return fmt.Errorf("live hot-server scenario: %w", err)
	}
	r.add("hot_ps_detect_to_rebalanced_s", hot.took.Seconds(), fmt.Sprintf("s from the AddServer decision (ps-0 hot for 20 s) to a third server started and %d slots moved by measured load; %d of %d hot slots left on ps-0 (%d slots, in process)", hot.moves, hot.hot, hotSlots, slots))
	sl, ss := live.Summary(), stop.Summary()
	r.add("jct_mean_stop_restart_vs_live", ss.MeanJCT/sl.MeanJCT, fmt.Sprintf("elastic LAS mean JCT, stop-and-restart (%.0f s) over live scaling (%.0f s), priced by %s", ss.MeanJCT, sl.MeanJCT, source))
	return nil
}

func or(a, b *sim.Result) *sim.Result {
	if a != nil {
		return a
	}
	return b
}
