package autoscale

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// memoryLocked is the out-of-memory rule: a server killed for lack of memory, or using
// NearMemory of its limit, is restarted with MemoryGrowth times the limit (or MemoryHeadroom
// times what it used, if more), at most MaxServerMemory, and restores its slots from the
// flash checkpoint; when every server is near its limit and not killed, the rows are spread
// over more servers of the same size instead where that moves fewer rows (spreadLocked). A
// server at MaxServerMemory already cannot grow: the rows are spread over more servers
// (AddServer, each server's share of MemoryGrowth times the servers' memory in all, as many
// servers as that needs at MaxServerMemory each). A kill at the cap is answered at once,
// whatever the Cooldown (the job cannot go on as it is); a server only near the cap waits for
// the Cooldown. At MaxServers nothing can be done, and the planner logs it. These are answered
// whatever they cost: the job cannot go on as it is.
func (p *Planner) memoryLocked(obs Observation, sv ServerLoad) (Decision, bool) {
	c := &p.cfg
	limit := sv.MemoryLimit
	if limit == 0 {
		limit = obs.Shape.Server.Memory
	}
	// A restart or spread asked for and not carried out yet is not asked again, unless the
	// server was killed meanwhile: then it is asked for again, at least as large.
	asked := p.asked[sv.ID]
	if asked > 0 && limit >= asked {
		delete(p.asked, sv.ID)
		asked = 0
	}
	if asked > 0 && !sv.OOMKilled {
		return Decision{}, false
	}
	if p.spreadTo > 0 && obs.Shape.Servers >= p.spreadTo {
		p.spreadTo = 0
	}
	if p.spreadTo > 0 && !sv.OOMKilled {
		return Decision{}, false
	}
	near := limit > 0 && float64(sv.Memory) >= c.NearMemory*float64(limit)
	if !sv.OOMKilled && !near {
		return Decision{}, false
	}
	what := fmt.Sprintf("uses %.2f of %.2f GiB (%.0f%%, near at %.0f%%)",
		gib(sv.Memory), gib(limit), 100*float64(sv.Memory)/max(float64(limit), 1), 100*c.NearMemory)
	if sv.OOMKilled {
		what = fmt.Sprintf("was killed for lack of memory at a limit of %.2f GiB (%.2f GiB in use last seen)", gib(limit), gib(sv.Memory))
	}
	d := Decision{At: obs.At, Target: sv.ID, Role: Server, Value: float64(sv.Memory), Limit: float64(limit)}
	if limit >= c.MaxServerMemory {
		if !sv.OOMKilled && obs.At.Sub(p.changed) < c.Cooldown {
			return Decision{}, false
		}
		total := float64(limit) * float64(obs.Shape.Servers) * c.MemoryGrowth
		n := max(obs.Shape.Servers+1, int(math.Ceil(total/float64(c.MaxServerMemory))), p.spreadTo)
		n = min(n, c.MaxServers)
		if n <= obs.Shape.Servers {
			p.log.Warn("autoscale: a server needs more memory than MaxServerMemory and the job has MaxServers already",
				"server", sv.ID, "memory", sv.Memory, "limit", limit, "servers", obs.Shape.Servers)
			return Decision{}, false
		}
		s := obs.Shape
		s.Servers = n
		s = c.withinQuota(spread(s, total))
		p.serverTotal = total
		p.rowsNeed = max(p.rowsNeed, float64(sv.Memory)*float64(obs.Shape.Servers)*c.MemoryHeadroom)
		p.spreadTo = n
		d.Kind, d.Shape = AddServer, s
		d.Reason = fmt.Sprintf("%s, already the largest a server may have (%.2f GiB): its rows are spread over %d servers of %.2f GiB (x%.2f the servers' memory in all)",
			what, gib(c.MaxServerMemory), n, gib(s.Server.Memory), c.MemoryGrowth)
		return d, true
	}
	if !sv.OOMKilled {
		if d, ok := p.spreadLocked(obs, sv, limit, what); ok {
			return d, true
		}
	}
	grown := max(float64(limit)*c.MemoryGrowth, float64(sv.Memory)*c.MemoryHeadroom, float64(asked))
	size := Resources{CPU: obs.Shape.Server.CPU, Memory: min(roundMiB(grown), c.MaxServerMemory)}
	p.asked[sv.ID] = size.Memory
	p.serverTotal = float64(size.Memory) * float64(obs.Shape.Servers)
	p.rowsNeed = max(p.rowsNeed, float64(sv.Memory)*float64(obs.Shape.Servers)*c.MemoryHeadroom)
	d.Kind, d.Size, d.Shape = RestartServer, size, obs.Shape
	d.Shape.Server.Memory = size.Memory
	d.Shape = c.withinQuota(d.Shape)
	d.Reason = fmt.Sprintf("%s: restart it with %.2f GiB and restore its slots from the flash checkpoint", what, gib(size.Memory))
	if d.Shape.Workers < obs.Shape.Workers {
		d.Reason += fmt.Sprintf("; %d workers to stay within the quota", d.Shape.Workers)
	}
	return d, true
}

// modelSaysServersLocked reports whether the fitted model can say what more servers do: it
// has a prior, measured serve shares, or measurements at two server counts.
func (p *Planner) modelSaysServersLocked() bool {
	if p.prior != nil || len(p.serverCounts) >= 2 {
		return true
	}
	for _, m := range p.shapes {
		for _, x := range m.xs {
			if x.serve > 0 {
				return true
			}
		}
	}
	return false
}

// spreadLocked answers a server near its memory limit by spreading the rows over more servers
// of the same size, when every server is near its limit (the rows, not one server's share of
// them, have outgrown the memory) and that moves fewer rows than restarting the servers
// larger: as many servers as give MemoryGrowth times the memory in all, when the quota
// allows them without taking workers. A restart larger gives a server a new size, and a new
// size takes all the rows; a server added takes a share of them.
func (p *Planner) spreadLocked(obs Observation, sv ServerLoad, limit int64, what string) (Decision, bool) {
	c := &p.cfg
	if len(obs.Servers) < obs.Shape.Servers {
		return Decision{}, false // some servers unreported: not every server is known near
	}
	for _, o := range obs.Servers {
		l := o.MemoryLimit
		if l == 0 {
			l = obs.Shape.Server.Memory
		}
		if float64(o.Memory) < c.NearMemory*float64(l) {
			return Decision{}, false
		}
	}
	n := max(obs.Shape.Servers+1, int(math.Ceil(float64(obs.Shape.Servers)*c.MemoryGrowth)))
	s := obs.Shape
	s.Servers = n
	s.Server.Memory = limit
	s = c.withinQuota(s)
	restart := obs.Shape
	restart.Server.Memory = roundMiB(float64(limit) * c.MemoryGrowth)
	if n > c.MaxServers || !c.allows(s) || s.Workers < obs.Shape.Workers || movedFraction(obs.Shape, s) >= movedFraction(obs.Shape, restart) {
		return Decision{}, false // a restart larger keeps the workers the quota would take
	}
	p.spreadTo = n
	p.serverTotal = float64(limit) * float64(n)
	p.rowsNeed = max(p.rowsNeed, float64(sv.Memory)*float64(obs.Shape.Servers)*c.MemoryHeadroom)
	return Decision{
		Kind: AddServer, At: obs.At, Target: sv.ID, Role: Server, Shape: s, Value: float64(sv.Memory), Limit: float64(limit),
		Reason: fmt.Sprintf("%s, as every server: its rows are spread over %d servers of %.2f GiB (x%.2f the memory in all), which moves %.0f%% of the rows where a restart larger would move them all",
			what, n, gib(limit), float64(n)/float64(obs.Shape.Servers), 100*movedFraction(obs.Shape, s)),
	}, true
}

func gib(b int64) float64 { return float64(b) / (1 << 30) }

// hotLocked is the hot-server rule: a server whose CPU share stayed at or above HotCPU for
// HotFor gets a server like the others added (then slots moved by load) when a server more
// pays for the rows it takes (Payback; the gain is the model's, or at most (p+1)/p when the
// model cannot say); otherwise, and at MaxServers, the hottest slots are moved (Rebalance).
// It returns the hottest such server.
func (p *Planner) hotLocked(obs Observation) (Decision, bool) {
	c := &p.cfg
	seen := map[string]bool{}
	var hot *ServerLoad
	var mean float64
	for i, sv := range obs.Servers {
		seen[sv.ID] = true
		mean += sv.CPU / float64(len(obs.Servers))
		if sv.CPU < c.HotCPU || obs.Changing {
			delete(p.hotSince, sv.ID)
			continue
		}
		since, ok := p.hotSince[sv.ID]
		if !ok {
			p.hotSince[sv.ID] = obs.At
			continue
		}
		if obs.At.Sub(since) >= c.HotFor && (hot == nil || sv.CPU > hot.CPU) {
			hot = &obs.Servers[i]
		}
	}
	for id := range p.hotSince {
		if !seen[id] {
			delete(p.hotSince, id)
		}
	}
	if hot == nil {
		return Decision{}, false
	}
	held := obs.At.Sub(p.hotSince[hot.ID])
	// Each server must be hot for HotFor again before another decision.
	clear(p.hotSince)
	d := Decision{
		At: obs.At, Target: hot.ID, Role: Server, Value: hot.CPU, Limit: c.HotCPU,
		Before: obs.Throughput, Shape: obs.Shape,
	}
	what := fmt.Sprintf("CPU share %.2f >= %.2f for %v (mean of %d servers %.2f)", hot.CPU, c.HotCPU, held.Round(time.Second), len(obs.Servers), mean)
	s := with(obs.Shape, 0, 1) // a server like the others: the others keep their size
	if !c.allows(s) {
		d.Kind = Rebalance
		d.Reason = what + fmt.Sprintf(": %d servers is the quota's most; move the hottest slots by measured load", obs.Shape.Servers)
		return d, true
	}
	// What a server more gains: the model's prediction where one is fitted, else at most the
	// servers' share growing by (p+1)/p, as when they alone held the job back.
	x0 := obs.Throughput
	if m := p.meanAtLocked(obs.Shape); m > 0 {
		x0 = m
	}
	x1 := x0 * float64(s.Servers) / float64(obs.Shape.Servers)
	if m, err := p.fitLocked(); err == nil && p.modelSaysServersLocked() && m.Throughput(obs.Shape) > 0 {
		x1 = x0 * m.Throughput(s) / m.Throughput(obs.Shape)
	}
	ok, why := p.paysLocked(obs.Shape, s, x0, x1)
	if !ok {
		d.Kind = Rebalance
		d.Reason = what + fmt.Sprintf(": a server more would not pay (%s); move the hottest slots by measured load", why)
		return d, true
	}
	d.Kind, d.Shape, d.After = AddServer, s, x1
	d.Reason = what + fmt.Sprintf(": add server %d and move the hottest slots by measured load", s.Servers)
	if why != "" {
		d.Reason += " (" + why + ")"
	}
	return d, true
}

// stragglersLocked is the straggler rule: with StragglerMinWorkers or more reporting, a
// worker whose step time stayed at or above StragglerFactor times the median for
// StragglerFor is replaced.
func (p *Planner) stragglersLocked(obs Observation) []Decision {
	c := &p.cfg
	var times []time.Duration
	seen := map[string]bool{}
	for _, w := range obs.Workers {
		seen[w.ID] = true
		if w.StepTime > 0 {
			times = append(times, w.StepTime)
		}
	}
	for id := range p.slowSince {
		if !seen[id] {
			delete(p.slowSince, id)
		}
	}
	if len(times) < c.StragglerMinWorkers {
		clear(p.slowSince)
		return nil
	}
	slices.Sort(times)
	median := times[len(times)/2]
	if len(times)%2 == 0 {
		median = (times[len(times)/2-1] + times[len(times)/2]) / 2
	}
	limit := time.Duration(float64(median) * c.StragglerFactor)
	var ds []Decision
	for _, w := range obs.Workers {
		if w.StepTime == 0 {
			continue // nothing finished: no evidence either way
		}
		if w.StepTime < limit {
			delete(p.slowSince, w.ID)
			continue
		}
		since, ok := p.slowSince[w.ID]
		if !ok {
			p.slowSince[w.ID] = obs.At
			continue
		}
		if obs.At.Sub(since) < c.StragglerFor {
			continue
		}
		delete(p.slowSince, w.ID)
		ds = append(ds, Decision{
			Kind: ReplaceWorker, At: obs.At, Target: w.ID, Role: Worker, Shape: obs.Shape,
			Value: w.StepTime.Seconds(), Limit: limit.Seconds(),
			Reason: fmt.Sprintf("step time %v >= %.1f x the median %v of %d workers for %v: replace it",
				w.StepTime.Round(time.Millisecond), c.StragglerFactor, median.Round(time.Millisecond), len(times), obs.At.Sub(since).Round(time.Second)),
		})
	}
	return ds
}

// pendingLocked is the pending-request rule: a process that waited PendingFor is given up or
// asked for again smaller. A pending worker is given up while the job has more than
// MinWorkers workers: a worker costs nothing to add once the job runs, and the re-plan adds
// it back if the model still finds it worth its cores. Only when no worker can be given up
// is a request made smaller: ShrinkFactor times as large, down to MinProcess, and never below
// what it is known to need: a server's share of the memory the rows need (rowsNeed; at most
// MaxServerMemory) and the median cores the history's processes used of their requests
// (times this one's), a worker's peak memory times MemoryHeadroom or the history's estimate.
// A server that can shrink no further is given up (the count drops by one, not below the
// quota's minimum, and only when the others can hold its rows within MaxServerMemory, their
// memory then their larger share). The decisions of one observation compose: each one's
// Shape is the job's once it and those before it are carried out.
func (p *Planner) pendingLocked(obs Observation) []Decision {
	c := &p.cfg
	var ds []Decision
	s := obs.Shape
	gaveUp := false
	for _, pd := range obs.Pending {
		if pd.Waited < c.PendingFor || pd.Role != Worker || s.Workers <= c.MinWorkers {
			continue
		}
		s = with(s, -1, 0)
		gaveUp = true
		ds = append(ds, Decision{Kind: ShrinkRequest, At: obs.At, Target: pd.ID, Role: pd.Role, Shape: s, Size: pd.Size,
			Value: pd.Waited.Seconds(), Limit: c.PendingFor.Seconds(),
			Reason: fmt.Sprintf("pending for %v >= %v: give it up, %d workers (a worker is added back for nothing once the job runs)",
				pd.Waited.Round(time.Second), c.PendingFor, s.Workers) + schedulerSaid(pd)})
	}
	if gaveUp {
		return ds
	}
	for _, pd := range obs.Pending {
		if pd.Waited < c.PendingFor {
			continue
		}
		d := Decision{At: obs.At, Target: pd.ID, Role: pd.Role, Value: pd.Waited.Seconds(), Limit: c.PendingFor.Seconds()}
		floor := p.memoryFloorLocked(pd.Role, s.Servers)
		size := Resources{CPU: max(pd.Size.CPU*c.ShrinkFactor, c.MinProcess.CPU, p.minCPU[pd.Role]), Memory: max(int64(float64(pd.Size.Memory)*c.ShrinkFactor), c.MinProcess.Memory, floor)}
		if pd.Size.Memory == 0 || size.Memory > pd.Size.Memory {
			size.Memory = pd.Size.Memory
		}
		if size.CPU > pd.Size.CPU {
			size.CPU = pd.Size.CPU
		}
		if size.CPU < pd.Size.CPU || size.Memory < pd.Size.Memory {
			d.Kind, d.Size = ShrinkRequest, size
			if pd.Role == Server {
				s.Server = size
			} else {
				s.Worker = size
			}
			d.Shape = s
			d.Reason = fmt.Sprintf("pending for %v >= %v: ask for %v instead of %v", pd.Waited.Round(time.Second), c.PendingFor, size, pd.Size)
			if size.Memory == floor && floor > 0 {
				d.Reason += fmt.Sprintf(" (%.2f GiB is the least it needs)", gib(floor))
			}
			if size.CPU == p.minCPU[pd.Role] && size.CPU > c.MinProcess.CPU {
				d.Reason += fmt.Sprintf(" (%g cores: the median the history's %ss used of their requests)", size.CPU, pd.Role)
			}
			d.Reason += schedulerSaid(pd)
			ds = append(ds, d)
			continue
		}
		next := s
		if pd.Role == Server {
			next = with(next, 0, -1)
			if need := p.memoryFloorLocked(Server, next.Servers); need > c.MaxServerMemory {
				continue // the others cannot hold its rows
			} else if need > next.Server.Memory {
				next.Server.Memory = need
			}
		} else {
			next = with(next, -1, 0)
		}
		if !c.allows(next) {
			continue
		}
		s = next
		d.Kind, d.Size, d.Shape = ShrinkRequest, pd.Size, s
		d.Reason = fmt.Sprintf("pending for %v >= %v at the smallest size %v: give it up, %d workers and %d servers",
			pd.Waited.Round(time.Second), c.PendingFor, pd.Size, s.Workers, s.Servers) + schedulerSaid(pd)
		ds = append(ds, d)
	}
	return ds
}

// schedulerSaid is the scheduler's reason for pd's wait, for a decision's Reason.
func schedulerSaid(pd Pending) string {
	if pd.Reason == "" {
		return ""
	}
	return "; the scheduler: " + pd.Reason
}

// memoryFloorLocked is the least memory a process of role may ask for: a server's share of
// the rows' need over servers servers, a worker's peak use times MemoryHeadroom (before any
// is measured, what the history says a worker needs); 0 when unknown.
func (p *Planner) memoryFloorLocked(role Role, servers int) int64 {
	if role == Server {
		if p.rowsNeed <= 0 || servers <= 0 {
			return 0
		}
		return roundMiB(p.rowsNeed / float64(servers))
	}
	if p.peakWorkerMem <= 0 {
		return p.minWorkerMem
	}
	return roundMiB(float64(p.peakWorkerMem) * p.cfg.MemoryHeadroom)
}
