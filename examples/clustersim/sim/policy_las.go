package sim

import (
	"math"
	"sort"
)

// LAS is Tiresias's discretised least-attained-service scheduling: jobs are ranked by the
// queue their attained service (resource-seconds, over the cluster's size) falls in, and
// first come first served within a queue; the ranking is served in order, and a job that
// does not fit preempts running jobs ranked below it. A preempted job checkpoints and later
// restarts from it (a stop-and-restart, priced by the run's ScaleCost).
//
// Elastic, it is the elastic Tiresias of Amoeba-style schedulers: instead of preempting, it
// shrinks jobs ranked lower (down to MinScale of their request) to give every job in rank
// order at least its smallest configuration, then grows them in rank order (up to MaxScale)
// with what is left. Each change is priced by the ScaleCost, live or stop-and-restart.
type LAS struct {
	Label   string
	Elastic bool
	// Queues are the attained-service limits of the queues in cluster-seconds (service over
	// the cluster's capacity of the job's main resource); default 60 and 600: a job that used
	// the whole cluster for a minute drops to the second queue.
	Queues []float64
	// MinScale and MaxScale bound an elastic job's size relative to its request (default 0.25
	// and 1.5); Hold is the seconds a job keeps a size before it grows again (default 600).
	MinScale, MaxScale, Hold float64

	level map[int]int // the level each running elastic job runs at
}

// Name implements Policy.
func (l *LAS) Name() string {
	if l.Label != "" {
		return l.Label
	}
	if l.Elastic {
		return "elastic LAS"
	}
	return "LAS"
}

func (l *LAS) queue(s *State, j *Job) int {
	qs := l.Queues
	if len(qs) == 0 {
		qs = []float64{60, 600}
	}
	capa := s.Capacity().CPU
	if j.Kind == GPU {
		capa = s.Capacity().GPU
	}
	a := s.Attained(j) / capa
	for i, q := range qs {
		if a < q {
			return i
		}
	}
	return len(qs)
}

// ranked returns every active job in LAS order.
func (l *LAS) ranked(s *State) []*Job {
	jobs := append(s.Running(), s.Waiting()...)
	q := map[int]int{}
	for _, j := range jobs {
		q[j.ID] = l.queue(s, j)
	}
	sort.SliceStable(jobs, func(a, b int) bool {
		ja, jb := jobs[a], jobs[b]
		if q[ja.ID] != q[jb.ID] {
			return q[ja.ID] < q[jb.ID]
		}
		if ja.Arrival != jb.Arrival {
			return ja.Arrival < jb.Arrival
		}
		return ja.ID < jb.ID
	})
	return jobs
}

// Schedule implements Policy.
func (l *LAS) Schedule(s *State) {
	jobs := l.ranked(s)
	if l.Elastic {
		l.elastic(s, jobs)
		return
	}
	for i, j := range jobs {
		if s.IsRunning(j) || s.Start(j, j.Request) {
			continue
		}
		// Preempt from the lowest-ranked running job up while that could make room.
		need := j.Request.Demand()
		var lower []*Job
		room := s.Free()
		for _, o := range jobs[i+1:] {
			if s.IsRunning(o) {
				lower = append(lower, o)
				room = room.add(s.Config(o).Demand())
			}
		}
		if !need.fitsIn(room) {
			continue
		}
		for k := len(lower) - 1; k >= 0; k-- {
			s.Preempt(lower[k])
			if s.Start(j, j.Request) {
				break
			}
		}
	}
}

// scaleLevels are the sizes an elastic job takes, relative to its request.
var scaleLevels = []float64{0.25, 0.5, 0.75, 1, 1.25, 1.5, 2}

// ScaleConfig is c with its workers and servers scaled by f (at least one of each), each
// process the same size, and the servers' total memory kept (the model must fit).
func ScaleConfig(c Config, f float64) Config {
	out := c
	out.Workers = max(1, int(math.Round(float64(c.Workers)*f)))
	if c.Servers > 0 {
		out.Servers = max(1, int(math.Round(float64(c.Servers)*f)))
		out.ServerMem = c.ServerMem * float64(c.Servers) / float64(out.Servers)
	}
	return out
}

func (l *LAS) elastic(s *State, jobs []*Job) {
	minS, maxS, hold := l.MinScale, l.MaxScale, l.Hold
	if minS <= 0 {
		minS = 0.25
	}
	if maxS <= 0 {
		maxS = 1.5
	}
	if hold <= 0 {
		hold = 600
	}
	var levels []float64
	for _, f := range scaleLevels {
		if f >= minS-1e-9 && f <= maxS+1e-9 {
			levels = append(levels, f)
		}
	}
	full := len(levels) - 1 // the request's level
	for full > 0 && levels[full] > 1+1e-9 {
		full--
	}
	if l.level == nil {
		l.level = map[int]int{}
	}
	// start runs waiting j at the largest level up to its request that fits now.
	start := func(j *Job) bool {
		for lv := full; lv >= 0; lv-- {
			if s.Start(j, ScaleConfig(j.Request, levels[lv])) {
				l.level[j.ID] = lv
				return true
			}
		}
		return false
	}
	blocked := false
	for i, j := range jobs {
		if s.IsRunning(j) || start(j) {
			continue
		}
		// Make room from the lowest-ranked running jobs up: shrink them to their smallest
		// size, then, if that is not enough, preempt them, while the totals say it can help.
		var lower []*Job
		for _, o := range jobs[i+1:] {
			if s.IsRunning(o) {
				lower = append(lower, o)
			}
		}
		need := ScaleConfig(j.Request, levels[0]).Demand()
		shrunk, all := s.Free(), s.Free()
		for _, o := range lower {
			shrunk = shrunk.add(s.Config(o).Demand()).sub(ScaleConfig(o.Request, levels[0]).Demand())
			all = all.add(s.Config(o).Demand())
		}
		switch {
		case need.fitsIn(shrunk):
			for k := len(lower) - 1; k >= 0; k-- {
				o := lower[k]
				if l.level[o.ID] > 0 && s.Resize(o, ScaleConfig(o.Request, levels[0])) {
					l.level[o.ID] = 0
				}
				if start(j) {
					break
				}
			}
		case need.fitsIn(all):
			for k := len(lower) - 1; k >= 0; k-- {
				s.Preempt(lower[k])
				if start(j) {
					break
				}
			}
		}
		if !s.IsRunning(j) {
			blocked = true
		}
	}
	if blocked {
		return // what is free is held for the waiting jobs
	}
	// Grow running jobs in rank order into what is idle, each after Hold at its size.
	for _, j := range jobs {
		if !s.IsRunning(j) || s.Now()-s.LastChange(j) < hold {
			continue
		}
		for lv := len(levels) - 1; lv > l.level[j.ID]; lv-- {
			if s.Resize(j, ScaleConfig(j.Request, levels[lv])) {
				l.level[j.ID] = lv
				break
			}
		}
	}
}
