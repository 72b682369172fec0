// Command clustersim runs the cluster simulator's four comparisons on the public traces and
// prints their table beside the published figures, and writes the table and SVG charts (JCT
// CDF per policy, utilisation over time, allocated vs used per job) to a directory.
//
//	go run ./examples/clustersim [flags]
//
// With no flags it runs the small default workloads (160 jobs each) from
// ../shared/data/traces in a few seconds. See README.md for the models behind the figures.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/elasticps/elasticps/examples/clustersim/sim"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "clustersim:", err)
		os.Exit(1)
	}
}

func run() error {
	data := flag.String("data", filepath.Join("..", "shared", "data", "traces"), "directory of the public traces (the project's shared data)")
	out := flag.String("out", filepath.Join(os.TempDir(), "elasticps-clustersim"), "directory for results.md and the SVG charts")
	seed := flag.Uint64("seed", 1, "seed of the workloads and the observations' noise")
	jobs := flag.Int("jobs", 160, "jobs of the DLRM (Philly) and Gavel workloads")
	load := flag.Float64("load", 1, "requested CPU load of the DLRM workload over the cluster's cores during its arrivals (sets its node count)")
	gpus := flag.Int("gpus", 32, "GPUs of the Gavel workload's cluster (V100 machines of 8)")
	pollux := flag.Int("pollux-workload", 6, "Pollux workload (1-8) of the batch-size comparison")
	polluxGPUs := flag.Int("pollux-gpus", 64, "GPUs of the Pollux workload's cluster (machines of 4)")
	repartition := flag.String("repartition", "", "a bench-repartition.json (go run ./examples/bench repartition) to price live and stop-and-restart scaling (default: the measurement shipped in sim/testdata)")
	overhead := flag.Float64("restart-overhead", 0, "seconds a stop-and-restart of a parameter-server job pays beside restoring its model (process start, rejoin)")
	gpuRestart := flag.Float64("gpu-restart", 30, "seconds a GPU job's stop-and-restart costs")
	tick := flag.Float64("tick", 60, "seconds between scheduling decisions")
	flag.Parse()

	if _, err := os.Stat(filepath.Join(*data, sim.PhillyPath)); err != nil {
		return fmt.Errorf("traces not found under %s (give the shared data's traces directory with -data): %w", *data, err)
	}
	tr, err := sim.LoadTraces(os.DirFS(*data))
	if err != nil {
		return err
	}
	setup := sim.Setup{
		Seed: *seed, RestartOverhead: *overhead, GPURestart: *gpuRestart, Tick: *tick,
		PS:     sim.PSOptions{Jobs: *jobs, Load: *load},
		Gavel:  sim.GavelOptions{Jobs: *jobs, GPUs: *gpus},
		Pollux: sim.PolluxOptions{Workload: *pollux, GPUs: *polluxGPUs},
	}
	if *repartition != "" {
		f, err := os.Open(*repartition)
		if err != nil {
			return err
		}
		setup.Repartition, err = sim.ParseRepartitionFigures(*repartition, f)
		f.Close()
		if err != nil {
			return err
		}
	} else if setup.Repartition, err = sim.DefaultRepartitionFigures(); err != nil {
		return err
	}
	cs, err := sim.RunComparisons(tr, setup)
	if err != nil {
		return err
	}
	completed := 0
	for _, c := range cs {
		for _, r := range c.Results {
			completed += r.Summary().Completed
		}
	}
	if completed == 0 {
		return errors.New("simulated nothing: no job completed under any policy")
	}
	f := setup.Repartition
	table := fmt.Sprintf("Seed %d. Scaling priced by the repartition benchmark: live moves at %.0f MB/s with training at %.0f%% of its speed; stop-and-restart restores at %.0f MB/s plus %.0f s.\n\n%s",
		*seed, f.LiveBytesPerSec/1e6, 100*f.DuringFactor, f.RestartBytesPerSec/1e6, *overhead, sim.Table(cs))
	fmt.Print(table)
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "results.md"), []byte(table), 0o644); err != nil {
		return err
	}
	files, err := writeCharts(*out, cs)
	if err != nil {
		return err
	}
	fmt.Printf("\nwrote %s and %d charts to %s\n", "results.md", len(files), *out)
	return nil
}
