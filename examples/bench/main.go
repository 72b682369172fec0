// Command bench runs the elasticps benchmark suites.
//
//	go run ./examples/bench [flags] SUITE [SUITE...]
//
// Each suite measures the library against a baseline or a physical limit in the same run, prints a
// table and writes bench-SUITE.json of the form
//
//	{"suite": NAME,
//	 "metrics": {NAME: number, ...},
//	 "ratios": {NAME: {"baseline": WHAT, "baseline_metric": NAME, "median": x, "min": x, "max": x, "pairs": n,
//	                   "subject_median": x, "baseline_median": x}, ...},
//	 "tables": {NAME: {"about": TEXT, "columns": [...], "rows": [[...], ...]}, ...},
//	 "notes": {NAME: TEXT, ...}}
//
// Every ratio (a metric named A_vs_B or A_over_B) names its baseline. A ratio measured in interleaved
// rounds (subject and baseline alternately) gives its median in metrics and its range over the
// pairs in ratios, with the medians of the subject's and the baseline's figures in those rounds.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strings"
	"text/tabwriter"
)

// suite is one named benchmark program.
type suite struct {
	about string
	run   func(ctx context.Context, opt options, r *report) error
}

// options are the flags shared by every suite.
type options struct {
	quick bool   // smaller sizes, for a smoke run
	out   string // directory for bench-SUITE.json
	dir   string // scratch directory on disk (suites that write files)
}

// allSuites lists the suites by name. Each suite lives in its own file.
func allSuites() map[string]suite {
	return map[string]suite{
		"embedding":   {about: "embedding table lookups and updates vs a flat gather and a Go map", run: runEmbedding},
		"ps":          {about: "pulls and pushes over TCP vs in-process lookups and Redis MGET", run: runPS},
		"repartition": {about: "live scale-out 2 -> 3 parameter servers under training vs stop, restore and restart", run: runRepartition},
		"shard":       {about: "data-shard dispatcher round trips over TCP vs in process, report cost per record", run: runShard},

		"checkpoint": {about: "flash checkpoint of a 2 GiB table vs memcpy and a plain disk write", run: runCheckpoint},
		"dlrm":       {about: "DLRM training throughput on the embedded cluster, 1 vs 2 workers; checkpoint pauses of the main command against a memcpy and a batch", run: runDLRM},
		"elastic":    {about: "worker join, server failures under both recovery policies and a coordinator restart vs stopping and restarting the job", run: runElastic},
		"kube":       {about: "the DLRM job on a local Kubernetes control plane: a server's pod deleted, an OOM kill and a scale-out vs stopping and recreating every pod; the scaler's cost per pod vs a bare pod", run: runKube},
		"autoscale":  {about: "cluster simulator on the Philly-derived DLRM workload: manual vs auto configuration, elastic LAS live vs stop-and-restart", run: runAutoscale},
	}
}

func main() {
	var opt options
	flag.BoolVar(&opt.quick, "quick", false, "run with small sizes (a smoke run; the figures mean little)")
	flag.StringVar(&opt.out, "out", ".", "directory to write bench-SUITE.json into")
	flag.StringVar(&opt.dir, "dir", "", "scratch directory on disk for suites that write files (default: the OS temp dir)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: bench [flags] SUITE [SUITE...]\n\nsuites:\n")
		s := allSuites()
		for _, n := range sortedNames(s) {
			fmt.Fprintf(flag.CommandLine.Output(), "  %-12s %s\n", n, s[n].about)
		}
		fmt.Fprintf(flag.CommandLine.Output(), "\nflags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	suites := allSuites()
	for _, name := range flag.Args() {
		s, ok := suites[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "bench: unknown suite %q (have %s)\n", name, strings.Join(sortedNames(suites), ", "))
			os.Exit(2)
		}
		r := &report{suite: name}
		if err := s.run(ctx, opt, r); err != nil {
			fmt.Fprintf(os.Stderr, "bench %s: %v\n", name, err)
			os.Exit(1)
		}
		r.print(os.Stdout)
		path := filepath.Join(opt.out, "bench-"+name+".json")
		if err := r.write(path); err != nil {
			fmt.Fprintf(os.Stderr, "bench %s: %v\n", name, err)
			os.Exit(1)
		}
		fmt.Printf("wrote %s\n\n", path)
	}
}

func sortedNames(s map[string]suite) []string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// report collects a suite's metrics in the order they were measured.
type report struct {
	suite  string
	names  []string
	vals   map[string]float64
	notes  map[string]string
	ratios map[string]ratioRecord
	tables map[string]sweepTable
	tnames []string
}

// ratioRecord is the JSON record of one ratio.
type ratioRecord struct {
	Baseline       string  `json:"baseline"`
	BaselineMetric string  `json:"baseline_metric,omitempty"`
	Median         float64 `json:"median"`
	Min            float64 `json:"min,omitempty"`
	Max            float64 `json:"max,omitempty"`
	Pairs          int     `json:"pairs,omitempty"`
	// The medians of the subject's and the baseline's own figures in the same rounds.
	SubjectMedian  float64 `json:"subject_median,omitempty"`
	BaselineMedian float64 `json:"baseline_median,omitempty"`
}

// add records metric name = v with a short human note (unit, target, baseline).
func (r *report) add(name string, v float64, note string) {
	if r.vals == nil {
		r.vals = map[string]float64{}
		r.notes = map[string]string{}
	}
	if _, dup := r.vals[name]; !dup {
		r.names = append(r.names, name)
	}
	r.vals[name] = v
	r.notes[name] = note
}

// addRatio records the ratio name measured in interleaved rounds against baseline (what the baseline
// does) whose figure is the metric baselineMetric ("" if none).
func (r *report) addRatio(name string, s spread, baseline, baselineMetric, note string) {
	of := ""
	if s.base != 0 {
		of = fmt.Sprintf(" (%s over %s)", formatValue(s.subj), formatValue(s.base))
	}
	r.add(name, s.med, fmt.Sprintf("%s [%.3g-%.3g over %d pairs%s; baseline: %s]", note, s.lo, s.hi, s.pairs, of, baseline))
	if r.ratios == nil {
		r.ratios = map[string]ratioRecord{}
	}
	r.ratios[name] = ratioRecord{Baseline: baseline, BaselineMetric: baselineMetric, Median: s.med, Min: s.lo, Max: s.hi, Pairs: s.pairs,
		SubjectMedian: s.subj, BaselineMedian: s.base}
}

// addTable records a small table of figures (a size sweep).
func (r *report) addTable(name string, t sweepTable) {
	if r.tables == nil {
		r.tables = map[string]sweepTable{}
	}
	if _, dup := r.tables[name]; !dup {
		r.tnames = append(r.tnames, name)
	}
	r.tables[name] = t
}

// get returns a metric recorded earlier.
func (r *report) get(name string) float64 { return r.vals[name] }

func (r *report) print(w *os.File) {
	fmt.Fprintf(w, "suite %s\n", r.suite)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, n := range r.names {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", n, formatValue(r.vals[n]), r.notes[n])
	}
	tw.Flush()
	for _, n := range r.tnames {
		t := r.tables[n]
		fmt.Fprintf(w, "  %s: %s\n", n, t.About)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "    \t%s\t\n", strings.Join(t.Columns, "\t"))
		for _, row := range t.Rows {
			fmt.Fprint(tw, "    ")
			for _, v := range row {
				if v == math.Trunc(v) && math.Abs(v) < 1e6 {
					fmt.Fprintf(tw, "\t%.0f", v) // sizes and counts as they are
				} else {
					fmt.Fprintf(tw, "\t%s", formatValue(v))
				}
			}
			fmt.Fprint(tw, "\t\n")
		}
		tw.Flush()
	}
}

func formatValue(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func (r *report) write(path string) error {
	if len(r.names) == 0 {
		return errors.New("no metrics recorded")
	}
	// A ratio recorded with add names its baseline in its note.
	ratios := map[string]ratioRecord{}
	for _, n := range r.names {
		if rec, ok := r.ratios[n]; ok {
			ratios[n] = rec
		} else if strings.Contains(n, "_vs_") || strings.Contains(n, "_over_") {
			ratios[n] = ratioRecord{Baseline: r.notes[n], Median: r.vals[n]}
		}
	}
	b, err := json.MarshalIndent(struct {
		Suite   string                 `json:"suite"`
		Metrics map[string]float64     `json:"metrics"`
		Ratios  map[string]ratioRecord `json:"ratios,omitempty"`
		Tables  map[string]sweepTable  `json:"tables,omitempty"`
		Notes   map[string]string      `json:"notes"`
	}{r.suite, r.vals, ratios, r.tables, r.notes}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
