package sim

import (
	"bytes"
	_ "embed"
	"fmt"
	"math"
	"strings"

	"github.com/elasticps/elasticps/elastic/autoscale"
)

// measuredRepartition is a bench-repartition.json written by `go run ./examples/bench
// repartition` (full sizes), the default live and stop-and-restart costs; README.md says
// where and how it was measured.
//
//go:embed testdata/bench-repartition.json
var measuredRepartition []byte

// DefaultRepartitionFigures returns the figures of the repartition benchmark run shipped
// with the simulator (testdata/bench-repartition.json).
func DefaultRepartitionFigures() (RepartitionFigures, error) {
	return ParseRepartitionFigures("testdata/bench-repartition.json", bytes.NewReader(measuredRepartition))
}

// Setup configures the four comparisons.
type Setup struct {
	Seed   uint64
	PS     PSOptions
	Gavel  GavelOptions
	Pollux PolluxOptions
	// Repartition prices a parameter-server job's changes, live and stop-and-restart.
	Repartition     RepartitionFigures
	RestartOverhead float64 // seconds a stop-and-restart pays beside the restore (default 0)
	GPURestart      float64 // seconds a GPU job's stop-and-restart costs (default 30)
	// PolluxTail is how long after the Pollux workload's last arrival its window closes
	// (default 2 hours): Saxena et al. count the jobs completed in a window.
	PolluxTail float64
	Tick       float64 // default 60
	// Planner configures the DLRover-RM-style policy's planners (zero: the defaults).
	Planner autoscale.Config
}

// Row is one figure of a comparison, beside the published one.
type Row struct {
	Metric    string
	Measured  float64
	Unit      string // "x" for a ratio, "pp" for percentage points, "" for a count
	Published string // the paper's figure and where it is from; "" when none is published
	Detail    string // the two sides
}

// Comparison is a set of policies run on one workload and the figures that compare them.
type Comparison struct {
	Name     string
	Workload *Workload
	Results  []*Result
	Rows     []Row
}

// Result returns the run of the named policy.
func (c *Comparison) Result(policy string) *Result {
	for _, r := range c.Results {
		if r.Policy == policy {
			return r
		}
	}
	return nil
}

// Policy names used in the comparisons.
const (
	Manual         = "manual FIFO"
	AutoRM         = "auto (DLRover-RM style)"
	LASName        = "LAS"
	ElasticLive    = "elastic LAS, live scaling"
	ElasticRestart = "elastic LAS, stop-and-restart"
	DefaultGPU     = "default"
)

func (s *Setup) runAll(w *Workload, opt Options, ps ...Policy) ([]*Result, error) {
	var out []*Result
	for _, p := range ps {
		r, err := Run(w, p, opt)
		if err != nil {
			return nil, fmt.Errorf("%s on %s: %w", p.Name(), w.Name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// RunComparisons runs the four comparisons on the traces.
func RunComparisons(tr *Traces, setup Setup) ([]*Comparison, error) {
	if setup.Tick <= 0 {
		setup.Tick = 60
	}
	if setup.PolluxTail <= 0 {
		setup.PolluxTail = 2 * 3600
	}
	var out []*Comparison

	// 1 and 2: the DLRM workload.
	psw, err := PSWorkload(tr, setup.Seed, setup.PS)
	if err != nil {
		return nil, err
	}
	live := PSScaleCost{Figures: setup.Repartition, Live: true, RestartOverhead: setup.RestartOverhead, GPURestart: setup.GPURestart}
	stop := live
	stop.Live = false
	// The planners price the changes that move rows at the platform's measured live rate, as
	// a coordinator configured from the repartition benchmark would.
	if setup.Planner.MoveBytesPerSecond == 0 {
		setup.Planner.MoveBytesPerSecond = setup.Repartition.LiveBytesPerSec
	}
	if setup.Planner.MoveSpeed == 0 {
		setup.Planner.MoveSpeed = setup.Repartition.DuringFactor
	}
	if setup.Planner.RestoreBytesPerSecond == 0 {
		setup.Planner.RestoreBytesPerSecond = setup.Repartition.RestartBytesPerSec
	}
	{
		// The planners' history: the records auto configuration leaves on an earlier window of
		// the trace (another seed), as a platform's history holds its earlier jobs.
		hw, err := PSWorkload(tr, setup.Seed+1000, setup.PS)
		if err != nil {
			return nil, err
		}
		warm, err := NewAuto(setup.Planner, AutoRM, nil)
		if err != nil {
			return nil, err
		}
		if _, err := Run(hw, warm, Options{Tick: setup.Tick, Seed: setup.Seed + 1000, Cost: live}); err != nil {
			return nil, err
		}
		auto, err := NewAuto(setup.Planner, AutoRM, warm.History())
		if err != nil {
			return nil, err
		}
		c := &Comparison{Name: "Manual configuration vs DLRover-RM-style auto configuration", Workload: psw}
		man, err := Run(psw, FIFO{Label: Manual}, Options{Tick: setup.Tick, Seed: setup.Seed, Cost: live})
		if err != nil {
			return nil, err
		}
		ar, err := Run(psw, auto, Options{Tick: setup.Tick, Seed: setup.Seed, Cost: live})
		if err != nil {
			return nil, err
		}
		c.Results = []*Result{man, ar}
		c.Rows = autoRows(man, ar)
		out = append(out, c)
	}
	{
		c := &Comparison{Name: "Tiresias LAS vs elastic LAS (live scaling vs stop-and-restart)", Workload: psw}
		las, err := Run(psw, &LAS{Label: LASName}, Options{Tick: setup.Tick, Seed: setup.Seed, Cost: stop})
		if err != nil {
			return nil, err
		}
		el, err := Run(psw, &LAS{Label: ElasticLive, Elastic: true}, Options{Tick: setup.Tick, Seed: setup.Seed, Cost: live})
		if err != nil {
			return nil, err
		}
		es, err := Run(psw, &LAS{Label: ElasticRestart, Elastic: true}, Options{Tick: setup.Tick, Seed: setup.Seed, Cost: stop})
		if err != nil {
			return nil, err
		}
		c.Results = []*Result{las, el, es}
		sl, se, ss := las.Summary(), el.Summary(), es.Summary()
		c.Rows = []Row{
			{Metric: "mean JCT, LAS over elastic LAS (live)", Measured: sl.MeanJCT / se.MeanJCT, Unit: "x",
				Detail: fmt.Sprintf("%s vs %s; %d and %d of %d jobs completed", dur(sl.MeanJCT), dur(se.MeanJCT), sl.Completed, se.Completed, sl.Jobs)},
			{Metric: "mean JCT, elastic LAS stop-and-restart over live", Measured: ss.MeanJCT / se.MeanJCT, Unit: "x",
				Detail: fmt.Sprintf("%s vs %s; %d and %d completed", dur(ss.MeanJCT), dur(se.MeanJCT), ss.Completed, se.Completed)},
		}
		ca, cb := CommonJCTs(es, el)
		c.Rows = append(c.Rows, Row{Metric: "mean JCT over jobs both completed, stop-and-restart over live", Measured: mean(ca) / mean(cb), Unit: "x",
			Detail: fmt.Sprintf("%d jobs: %s vs %s", len(ca), dur(mean(ca)), dur(mean(cb)))})
		out = append(out, c)
	}

	// 3: SC20 on a Gavel trace.
	gw, err := GavelWorkload(tr, setup.Seed, setup.Gavel)
	if err != nil {
		return nil, err
	}
	{
		gpuCost := FixedRestartCost{Seconds: live.gpuRestart()}
		// The window stays open until every job is done: SC20 compares makespans.
		opt := Options{Tick: setup.Tick, Seed: setup.Seed, Cost: gpuCost, Tail: 60 * 86400}
		rs, err := setup.runAll(gw, opt, FIFO{Label: DefaultGPU}, TerminationRealloc{}, &ProgressAware{Restart: gpuCost.Seconds})
		if err != nil {
			return nil, err
		}
		c := &Comparison{Name: "SC20 progress-aware allocation vs default and termination-based re-allocation", Workload: gw, Results: rs}
		d, t, p := rs[0].Summary(), rs[1].Summary(), rs[2].Summary()
		c.Rows = []Row{
			{Metric: "makespan, default over progress-aware", Measured: d.Makespan / p.Makespan, Unit: "x", Published: "1.82x (up to 45% shorter; Wang et al., SC20)",
				Detail: fmt.Sprintf("%s vs %s", dur(d.Makespan), dur(p.Makespan))},
			{Metric: "mean JCT, default over progress-aware", Measured: d.MeanJCT / p.MeanJCT, Unit: "x", Published: "2.70x (up to 63% shorter; Wang et al., SC20)",
				Detail: fmt.Sprintf("%s vs %s; %d and %d of %d completed", dur(d.MeanJCT), dur(p.MeanJCT), d.Completed, p.Completed, d.Jobs)},
			{Metric: "makespan, termination-based over progress-aware", Measured: t.Makespan / p.Makespan, Unit: "x",
				Detail: fmt.Sprintf("%s vs %s", dur(t.Makespan), dur(p.Makespan))},
			{Metric: "mean JCT, termination-based over progress-aware", Measured: t.MeanJCT / p.MeanJCT, Unit: "x",
				Detail: fmt.Sprintf("%s vs %s; %d completed", dur(t.MeanJCT), dur(p.MeanJCT), t.Completed)},
		}
		out = append(out, c)
	}

	// 4: Saxena et al. on a Pollux workload.
	pw, err := PolluxWorkload(tr, setup.Seed, setup.Pollux)
	if err != nil {
		return nil, err
	}
	{
		opt := Options{Tick: setup.Tick, Seed: setup.Seed, Cost: FixedRestartCost{Seconds: live.gpuRestart()}, Tail: setup.PolluxTail}
		rs, err := setup.runAll(pw, opt, &DPScaler{}, &DPScaler{BatchElastic: true})
		if err != nil {
			return nil, err
		}
		c := &Comparison{Name: "DP optimiser over batch size and GPUs vs GPUs at a fixed batch size", Workload: pw, Results: rs}
		f, d := rs[0].Summary(), rs[1].Summary()
		c.Rows = []Row{
			{Metric: "jobs completed in the window, DP over fixed batch", Measured: float64(d.Completed) / float64(max(1, f.Completed)), Unit: "x", Published: "~2x (up to; Saxena et al., MASCOTS 2020)",
				Detail: fmt.Sprintf("%d vs %d of %d", d.Completed, f.Completed, d.Jobs)},
			{Metric: "mean completion time, fixed batch over DP", Measured: f.MeanJCT / d.MeanJCT, Unit: "x", Published: "~10x (up to; Saxena et al., MASCOTS 2020)",
				Detail: fmt.Sprintf("%s vs %s (each over its completed jobs)", dur(f.MeanJCT), dur(d.MeanJCT))},
		}
		ca, cb := CommonJCTs(rs[0], rs[1])
		c.Rows = append(c.Rows, Row{Metric: "mean completion time over jobs both completed, fixed over DP", Measured: mean(ca) / mean(cb), Unit: "x",
			Detail: fmt.Sprintf("%d jobs: %s vs %s", len(ca), dur(mean(ca)), dur(mean(cb)))})
		out = append(out, c)
	}
	return out, nil
}

func autoRows(man, auto *Result) []Row {
	sm, sa := man.Summary(), auto.Summary()
	cm, ca := CommonJCTs(man, auto)
	return []Row{
		{Metric: "median JCT, manual over auto (jobs both completed)", Measured: median(cm) / median(ca), Unit: "x", Published: "1.45x (31% lower; DLRover-RM, VLDB 2024)",
			Detail: fmt.Sprintf("%s vs %s over %d jobs", dur(median(cm)), dur(median(ca)), len(cm))},
		{Metric: "mean JCT, manual over auto (jobs both completed)", Measured: mean(cm) / mean(ca), Unit: "x",
			Detail: fmt.Sprintf("%s vs %s", dur(mean(cm)), dur(mean(ca)))},
		{Metric: "completion rate in the trace window, auto minus manual", Measured: 100 * (sa.CompletionRate - sm.CompletionRate), Unit: "pp", Published: "+6 pp (DLRover-RM)",
			Detail: fmt.Sprintf("%.1f%% vs %.1f%% (%d and %d failed)", 100*sa.CompletionRate, 100*sm.CompletionRate, sa.Failed, sm.Failed)},
		{Metric: "CPU utilisation (used / allocated), auto minus manual", Measured: 100 * (sa.CPUUtil - sm.CPUUtil), Unit: "pp", Published: "+15 pp (DLRover-RM)",
			Detail: fmt.Sprintf("%.1f%% vs %.1f%%", 100*sa.CPUUtil, 100*sm.CPUUtil)},
		{Metric: "memory utilisation (used / allocated), auto minus manual", Measured: 100 * (sa.MemUtil - sm.MemUtil), Unit: "pp", Published: "+20 pp (DLRover-RM)",
			Detail: fmt.Sprintf("%.1f%% vs %.1f%%", 100*sa.MemUtil, 100*sm.MemUtil)},
	}
}

// dur formats seconds for a table.
func dur(s float64) string {
	switch {
	case math.IsNaN(s):
		return "n/a"
	case s < 120:
		return fmt.Sprintf("%.0f s", s)
	case s < 7200:
		return fmt.Sprintf("%.1f min", s/60)
	default:
		return fmt.Sprintf("%.2f h", s/3600)
	}
}

// Table renders the comparisons as Markdown: each figure measured beside the published one.
func Table(cs []*Comparison) string {
	var b strings.Builder
	b.WriteString("| comparison | figure | measured | published | detail |\n|---|---|---|---|---|\n")
	for _, c := range cs {
		for i, r := range c.Rows {
			name := ""
			if i == 0 {
				name = fmt.Sprintf("%s (%s, %d jobs)", c.Name, c.Workload.Name, len(c.Workload.Jobs))
			}
			pub := r.Published
			if pub == "" {
				pub = "none published"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", name, r.Metric, formatMeasured(r), pub, r.Detail)
		}
	}
	b.WriteString("\n| workload | policy | jobs | completed | failed | median JCT | mean JCT | makespan | CPU used/alloc | mem used/alloc | GPU busy |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range cs {
		for _, r := range c.Results {
			s := r.Summary()
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %s | %s | %s | %s | %s | %s |\n", r.Workload, r.Policy, s.Jobs, s.Completed, s.Failed,
				dur(s.MedianJCT), dur(s.MeanJCT), dur(s.Makespan), pct(s.CPUUtil), pct(s.MemUtil), pct(s.GPUUtil))
		}
	}
	return b.String()
}

func pct(x float64) string {
	if math.IsNaN(x) || x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*x)
}

func formatMeasured(r Row) string {
	switch r.Unit {
	case "x":
		return fmt.Sprintf("%.2fx", r.Measured)
	case "pp":
		return fmt.Sprintf("%+.1f pp", r.Measured)
	}
	return fmt.Sprintf("%.3g", r.Measured)
}
