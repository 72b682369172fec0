package sim

import (
	"math"
	"slices"
)

// Summary is a run's figures.
type Summary struct {
	Jobs, Completed, Failed int
	// CompletionRate is the fraction of jobs completed within the trace window.
	CompletionRate float64
	// MeanJCT and MedianJCT are over the completed jobs, seconds.
	MeanJCT, MedianJCT float64
	// Makespan is from the first arrival to the last completion, seconds (the window's end
	// when a job did not complete).
	Makespan float64
	// CPUUtil and MemUtil are the resources the jobs used over what they were allocated,
	// over the run; GPUUtil the GPUs allocated over the cluster's, over the run.
	CPUUtil, MemUtil, GPUUtil float64
}

// Summary computes r's figures.
func (r *Result) Summary() Summary {
	var s Summary
	var jcts []float64
	var aC, uC, aM, uM, gpu float64
	first, last := math.Inf(1), 0.0
	for _, j := range r.Jobs {
		s.Jobs++
		first = math.Min(first, j.Arrival)
		if j.Completed {
			s.Completed++
			jcts = append(jcts, j.JCT())
			last = math.Max(last, j.Finish)
		} else {
			last = r.End
		}
		if j.Failed {
			s.Failed++
		}
		aC += j.AllocCPU
		uC += j.UsedCPU
		aM += j.AllocMem
		uM += j.UsedMem
		gpu += j.GPUSeconds
	}
	s.CompletionRate = float64(s.Completed) / float64(max(1, s.Jobs))
	s.MeanJCT, s.MedianJCT = mean(jcts), median(jcts)
	s.Makespan = last - first
	s.CPUUtil, s.MemUtil = ratio(uC, aC), ratio(uM, aM)
	if r.Capacity.GPU > 0 && s.Makespan > 0 {
		s.GPUUtil = gpu / (r.Capacity.GPU * s.Makespan)
	}
	return s
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	var t float64
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// CommonJCTs returns the completion times, in each run, of the jobs both runs completed, so
// that a comparison is over the same jobs.
func CommonJCTs(a, b *Result) (ja, jb []float64) {
	byID := map[int]JobResult{}
	for _, j := range b.Jobs {
		byID[j.ID] = j
	}
	for _, x := range a.Jobs {
		if y, ok := byID[x.ID]; ok && x.Completed && y.Completed {
			ja = append(ja, x.JCT())
			jb = append(jb, y.JCT())
		}
	}
	return ja, jb
}

// JCTs returns the completion times of r's completed jobs, ascending.
func (r *Result) JCTs() []float64 {
	var out []float64
	for _, j := range r.Jobs {
		if j.Completed {
			out = append(out, j.JCT())
		}
	}
	slices.Sort(out)
	return out
}

// Median is the median of xs (the mean of the middle two for an even count; NaN for none),
// as the comparisons compute it.
func Median(xs []float64) float64 { return median(xs) }
