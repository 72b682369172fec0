package main

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// A trial is one measured run of a subject or a baseline: it returns one figure (a rate, or a
// duration in milliseconds) for one round.
type trial struct {
	name string
	run  func() (float64, error)
}

// rate makes a trial whose figure is work units per second of fn's wall time.
func rate(name string, work float64, fn func() error) trial {
	return trial{name, func() (float64, error) {
		start := time.Now()
		err := fn()
		return work / time.Since(start).Seconds(), err
	}}
}

// millis makes a trial whose figure is fn's wall time in milliseconds.
func millis(name string, fn func() error) trial {
	return trial{name, func() (float64, error) {
		start := time.Now()
		err := fn()
		return float64(time.Since(start)) / 1e6, err
	}}
}

// samples holds the figures of interleaved trials, one per round and trial.
type samples map[string][]float64

// interleave runs every trial once per round for rounds rounds, A B A B ..., so that a slow spell of
// the machine hits subjects and baselines alike. The order rotates each round (A B C, B C A, ...) so
// no trial always runs first; list a subject next to its baseline to keep each pair adjacent.
// Figures add to into (which may be nil) and the result is returned.
func interleave(ctx context.Context, rounds int, into samples, trials ...trial) (samples, error) {
	if into == nil {
		into = samples{}
	}
	for round := range rounds {
		for i := range trials {
			if err := ctx.Err(); err != nil {
				return into, err
			}
			t := trials[(round+i)%len(trials)]
			v, err := t.run()
			if err != nil {
				return into, fmt.Errorf("%s: %w", t.name, err)
			}
			into[t.name] = append(into[t.name], v)
		}
	}
	return into, nil
}

// median returns the median figure of a trial.
func (s samples) median(name string) float64 { return median(s[name]) }

// spread is a ratio measured in several rounds: its median and range, and the medians of the
// subject's and the baseline's figures in those rounds (0 if not known).
type spread struct {
	med, lo, hi float64
	pairs       int
	subj, base  float64
}

// ratio returns subject/baseline of each round, summarised.
func (s samples) ratio(subject, baseline string) spread {
	a, b := s[subject], s[baseline]
	n := min(len(a), len(b))
	r := make([]float64, n)
	for i := range r {
		r[i] = a[i] / b[i]
	}
	sp := spreadOf(r)
	if n > 0 {
		sp.subj, sp.base = median(a[:n]), median(b[:n])
	}
	return sp
}

// spreadOf summarises per-round ratios.
func spreadOf(r []float64) spread {
	if len(r) == 0 {
		return spread{}
	}
	return spread{med: median(r), lo: slices.Min(r), hi: slices.Max(r), pairs: len(r)}
}

// sweepTable is a small table of figures against a size, written to the JSON as it is.
type sweepTable struct {
	About   string      `json:"about"`
	Columns []string    `json:"columns"`
	Rows    [][]float64 `json:"rows"`
}
