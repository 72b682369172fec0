package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// RepartitionFigures are the costs of changing a parameter-server job's servers as the
// repartition benchmark measures them (go run ./examples/bench repartition writes
// bench-repartition.json): a live move of slots while training goes on, and the
// stop-and-restart way (checkpoint, stop, start, restore).
type RepartitionFigures struct {
	// LiveBytesPerSec is the rate a live move copies rows and optimizer state
	// (migrated_bytes_per_s).
	LiveBytesPerSec float64
	// DuringFactor is the training throughput during a live move over before it
	// (throughput_during_vs_before).
	DuringFactor float64
	// RestartBytesPerSec is the model bytes a stop-and-restart checkpoints and restores per
	// second of training stopped: the benchmark job's bytes (the live move's bytes over the
	// fraction of rows it moved) over stop_restart_s.
	RestartBytesPerSec float64
}

// ParseRepartitionFigures reads a bench-repartition.json ({"suite":"repartition","metrics":{...}}).
func ParseRepartitionFigures(file string, r io.Reader) (RepartitionFigures, error) {
	var doc struct {
		Suite   string             `json:"suite"`
		Metrics map[string]float64 `json:"metrics"`
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return RepartitionFigures{}, &ParseError{File: file, Err: err}
	}
	if doc.Suite != "repartition" {
		return RepartitionFigures{}, parseErr(file, 0, "suite %q, want repartition", doc.Suite)
	}
	var errs []error
	get := func(k string) float64 {
		v, ok := doc.Metrics[k]
		if !ok || !(v > 0) || math.IsInf(v, 0) {
			errs = append(errs, fmt.Errorf("metric %s missing or not positive", k))
		}
		return v
	}
	bps, migS, frac, during, stop := get("migrated_bytes_per_s"), get("migration_s"), get("moved_rows_fraction"), get("throughput_during_vs_before"), get("stop_restart_s")
	if len(errs) > 0 {
		return RepartitionFigures{}, &ParseError{File: file, Err: errors.Join(errs...)}
	}
	return RepartitionFigures{
		LiveBytesPerSec:    bps,
		DuringFactor:       math.Min(1, during),
		RestartBytesPerSec: bps * migS / frac / stop,
	}, nil
}

// PSScaleCost prices changes of parameter-server jobs from RepartitionFigures, either as
// elasticps does them (Live) or by stopping and restarting the job. GPU jobs pay
// GPURestart seconds for any change.
type PSScaleCost struct {
	Figures RepartitionFigures
	Live    bool
	// RestartOverhead is seconds a stop-and-restart pays beside restoring the model: starting
	// processes and rejoining; the benchmark runs in one process and counts none (default 0).
	RestartOverhead float64
	GPURestart      float64 // seconds (default 30)
}

// Restart implements ScaleCost: restoring the model from its checkpoint, training stopped.
func (c PSScaleCost) Restart(j *Job, progress float64, _ Config) Stall {
	if j.PSTruth == nil {
		return Stall{Pause: c.gpuRestart()}
	}
	return Stall{Pause: c.RestartOverhead + j.PSTruth.ModelBytesAt(progress)/c.Figures.RestartBytesPerSec}
}

func (c PSScaleCost) gpuRestart() float64 {
	if c.GPURestart > 0 {
		return c.GPURestart
	}
	return 30
}

// Resize implements ScaleCost. Live: a change of the server count moves the slots that change
// owner (|dp|/max(p, p') of the model) while training goes on at DuringFactor; servers of a
// new size replace the old ones the same way, moving the whole model; workers join and leave
// between steps at no cost. Stop-and-restart: any change restarts the job.
func (c PSScaleCost) Resize(j *Job, progress float64, from, to Config) Stall {
	if j.PSTruth == nil {
		return Stall{Pause: c.gpuRestart()}
	}
	if !c.Live {
		return c.Restart(j, progress, to)
	}
	frac := 0.0
	switch {
	case from.ServerCPU != to.ServerCPU || from.ServerMem != to.ServerMem:
		frac = 1
	case from.Servers != to.Servers:
		frac = math.Abs(float64(to.Servers-from.Servers)) / float64(max(from.Servers, to.Servers))
	}
	if frac == 0 {
		return Stall{}
	}
	return Stall{Slow: frac * j.PSTruth.ModelBytesAt(progress) / c.Figures.LiveBytesPerSec, Factor: c.Figures.DuringFactor}
}

// FixedRestartCost prices every change and restart of any job at Seconds of stopped
// training: the stop-and-restart reallocation of GPU jobs (SC20's SideCar, Saxena et al.'s
// autoscaler).
type FixedRestartCost struct{ Seconds float64 }

func (c FixedRestartCost) Restart(*Job, float64, Config) Stall { return Stall{Pause: c.Seconds} }
func (c FixedRestartCost) Resize(*Job, float64, Config, Config) Stall {
	return Stall{Pause: c.Seconds}
}
