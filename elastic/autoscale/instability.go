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
// flash checkpoint. A server at MaxServerMemory already cannot grow: the rows are spread over
// more servers (AddServer, each server's share of MemoryGrowth times the servers' memory in
// all, as many servers as that needs at MaxServerMemory each). A kill at the cap is answered
// at once, whatever the Cooldown (the job cannot go on as it is); a server only near the cap
// waits for the Cooldown. At MaxServers nothing can be done, and the planner logs it.
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

func gib(b int64) float64 { return float64(b) / (1 << 30) }

// hotLocked is the hot-server rule: a server whose CPU share stayed at or above HotCPU for
// HotFor gets a server added (then slots moved by load), or, at MaxServers, just the moves.
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
	if s := spread(with(obs.Shape, 0, 1), p.serverTotal); c.allows(s) {
		d.Kind, d.Shape = AddServer, s
		d.Reason = what + fmt.Sprintf(": add server %d and move the hottest slots by measured load", s.Servers)
	} else {
		d.Kind = Rebalance
		d.Reason = what + fmt.Sprintf(": %d servers is the quota's most; move the hottest slots by measured load", obs.Shape.Servers)
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

// pendingLocked is the pending-request rule: a process that waited PendingFor is asked for
// again ShrinkFactor times as large, down to MinProcess, and never below what it is known to
// need: a server's share of the memory the rows need (rowsNeed; at most MaxServerMemory), a
// worker's peak memory times MemoryHeadroom. One that can shrink no further is given up (the
// count drops by one, not below the quota's minimum; a server only when the others can hold
// its rows within MaxServerMemory, their memory then their larger share).
func (p *Planner) pendingLocked(obs Observation) []Decision {
	c := &p.cfg
	var ds []Decision
	for _, pd := range obs.Pending {
		if pd.Waited < c.PendingFor {
			continue
		}
		d := Decision{At: obs.At, Target: pd.ID, Role: pd.Role, Shape: obs.Shape, Value: pd.Waited.Seconds(), Limit: c.PendingFor.Seconds()}
		floor := p.memoryFloorLocked(pd.Role, obs.Shape.Servers)
		size := Resources{CPU: max(pd.Size.CPU*c.ShrinkFactor, c.MinProcess.CPU), Memory: max(int64(float64(pd.Size.Memory)*c.ShrinkFactor), c.MinProcess.Memory, floor)}
		if pd.Size.Memory == 0 || size.Memory > pd.Size.Memory {
			size.Memory = pd.Size.Memory
		}
		if size.CPU < pd.Size.CPU || size.Memory < pd.Size.Memory {
			d.Kind, d.Size = ShrinkRequest, size
			if pd.Role == Server {
				d.Shape.Server = size
			} else {
				d.Shape.Worker = size
			}
			d.Reason = fmt.Sprintf("pending for %v >= %v: ask for %v instead of %v", pd.Waited.Round(time.Second), c.PendingFor, size, pd.Size)
			if size.Memory == floor && floor > 0 {
				d.Reason += fmt.Sprintf(" (%.2f GiB is the least it needs)", gib(floor))
			}
			ds = append(ds, d)
			continue
		}
		s := obs.Shape
		if pd.Role == Server {
			s = with(s, 0, -1)
			if need := p.memoryFloorLocked(Server, s.Servers); need > c.MaxServerMemory {
				continue // the others cannot hold its rows
			} else if need > s.Server.Memory {
				s.Server.Memory = need
			}
		} else {
			s = with(s, -1, 0)
		}
		if !c.allows(s) {
			continue
		}
		d.Kind, d.Size, d.Shape = ShrinkRequest, pd.Size, s
		d.Reason = fmt.Sprintf("pending for %v >= %v at the smallest size %v: give it up, %d workers and %d servers",
			pd.Waited.Round(time.Second), c.PendingFor, pd.Size, s.Workers, s.Servers)
		ds = append(ds, d)
	}
	return ds
}

// memoryFloorLocked is the least memory a process of role may ask for: a server's share of
// the rows' need over servers servers, a worker's peak use times MemoryHeadroom; 0 when
// unknown.
func (p *Planner) memoryFloorLocked(role Role, servers int) int64 {
	if role == Server {
		if p.rowsNeed <= 0 || servers <= 0 {
			return 0
		}
		return roundMiB(p.rowsNeed / float64(servers))
	}
	if p.peakWorkerMem <= 0 {
		return 0
	}
	return roundMiB(float64(p.peakWorkerMem) * p.cfg.MemoryHeadroom)
}
