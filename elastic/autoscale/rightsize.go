package autoscale

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// coreCut is a right-size that took cores from a role's processes: from the shape before to
// the shape after, so that the throughput measured at each says whether the cores were worth
// their cost.
type coreCut struct {
	from, to Shape
	roles    []Role
}

// useLocked records what the processes of obs used: the most cores a worker and a server used
// (their CPU share times their cores), and the most memory a worker used. An observation of
// a job being changed says nothing of its steady use and is skipped.
func (p *Planner) useLocked(obs Observation) {
	if obs.Changing || !obs.Shape.valid() {
		return
	}
	most := func(n int, share func(int) float64, cores float64) (float64, bool) {
		var m float64
		seen := false
		for i := range n {
			if v := share(i); v > 0 && !math.IsInf(v, 0) {
				m, seen = max(m, min(v, 1)*cores), true
			}
		}
		return m, seen
	}
	keep := func(xs []float64, x float64) []float64 {
		xs = append(xs, x)
		if len(xs) > perShape {
			xs = slices.Delete(xs, 0, len(xs)-perShape)
		}
		return xs
	}
	if u, ok := most(len(obs.Workers), func(i int) float64 { return obs.Workers[i].CPU }, obs.Shape.Worker.CPU); ok {
		p.workerUsed = keep(p.workerUsed, u)
	}
	if u, ok := most(len(obs.Servers), func(i int) float64 { return obs.Servers[i].CPU }, obs.Shape.Server.CPU); ok {
		p.serverUsed = keep(p.serverUsed, u)
	}
	for _, w := range obs.Workers {
		p.peakWorkerMem = max(p.peakWorkerMem, w.Memory)
	}
	var rows float64
	for _, sv := range obs.Servers {
		rows += float64(sv.Memory)
	}
	p.rowsNeed = max(p.rowsNeed, rows*p.cfg.MemoryHeadroom)
	if rows > 0 {
		p.rowBytes = rows
		p.peakRows = max(p.peakRows, int64(rows))
	}
	// The cores a process uses while it works: its cores in use over the share of the time it
	// works. That is how many threads it keeps busy, whatever the load.
	working := func(cpu, busy, cores float64) (float64, bool) {
		if !(cpu > 0) || !(busy > 0) || busy > 1 || math.IsInf(cpu, 0) {
			return 0, false
		}
		return min(min(cpu, 1)*cores/busy, cores), true
	}
	for _, w := range obs.Workers {
		if e, ok := working(w.CPU, w.Busy, obs.Shape.Worker.CPU); ok {
			p.seen[Worker].add(e, obs.Shape.Worker.CPU)
		}
	}
	for _, sv := range obs.Servers {
		if e, ok := working(sv.CPU, sv.Busy, obs.Shape.Server.CPU); ok {
			p.seen[Server].add(e, obs.Shape.Server.CPU)
		}
	}
}

// saturated is how close to its cores a process's cores in use while it works must come for
// it to count as using all of them (it might use more). It is well below BusyHeadroom's
// margin, so that a process right-sized to its use does not count.
const saturated = 0.02

// coresSeen is what the observations said of the cores a role's processes can use, from the
// cores they used while they worked.
type coresSeen struct {
	// est is the most a process used where that was below its cores; low the most cores a
	// process had and used all of (it can use at least that many); n counts observations.
	est, low float64
	n        int
}

func (c *coresSeen) add(used, cores float64) {
	c.n++
	if used >= (1-saturated)*cores {
		c.low = max(c.low, cores)
	} else {
		c.est = max(c.est, used)
	}
}

// bound is the most cores a process of the role can use as far as measured; 0 while a
// process used all of more cores than that allows for (how many it can use is not known).
// A process that used all of cores within what a right-size gives est (est times headroom,
// rounded up by step) says no more than noise would: est stands.
func (c *coresSeen) bound(headroom, step float64) float64 {
	if c.est > 0 && c.low <= roundUp(c.est*headroom, step)*(1+saturated) {
		return max(c.est, c.low*(1-saturated))
	}
	return 0
}

// record is the most cores a process of the role was seen to use while it worked, and
// whether that is only a lower bound (it used all it had).
func (c *coresSeen) record(headroom, step float64) (float64, bool) {
	if b := c.bound(headroom, step); b > 0 {
		return b, false
	}
	return c.low, c.low > 0
}

// boundLocked is the role's bound on cores, as far as measured (coresSeen.bound).
func (p *Planner) boundLocked(role Role) float64 {
	return p.seen[role].bound(p.cfg.BusyHeadroom, p.cfg.CPUStep)
}

// replanBusyLocked is the re-plan of a job whose processes report the share of the time they
// work (Busy): the measured cores a process uses while it works size each role, and the
// model, fitted to the compute and serve shares of the step as well as the throughput,
// sets the counts, in one decision:
//
//   - a role whose processes use fewer cores than they have while they work gets those
//     cores times BusyHeadroom (rounded up to CPUStep), when its cores are more than
//     RightsizeMargin above that or below it; one whose processes use all of theirs gets
//     CPUHeadroom times as many when the model finds the cores worth AddEfficiency and the
//     quota has room;
//   - a worker's memory as rightsizeLocked sizes it;
//   - then workers and servers are added or removed by the model (replan) from the new
//     sizes.
//
// Workers change for nothing (they join and leave between steps); a change of the servers
// (their count or their size) is made only when it pays for the rows it moves (Payback).
func (p *Planner) replanBusyLocked(obs Observation) (Decision, bool) {
	c := &p.cfg
	s := obs.Shape
	m, err := p.fitLocked()
	if err != nil {
		p.log.Warn("autoscale: no model", "err", err)
		return Decision{}, false
	}
	x0 := p.meanAtLocked(s)
	if !(x0 > 0) {
		x0 = obs.Throughput
	}
	to := s
	var why []string
	size := func(role Role, r *Resources) {
		seen := p.seen[role]
		if seen.n == 0 {
			return
		}
		cur := r.CPU
		trial := to
		tr := &trial.Worker
		if role == Server {
			tr = &trial.Server
		}
		var what string
		if b := p.boundLocked(role); b > 0 {
			target := max(roundUp(b*c.BusyHeadroom, c.CPUStep), c.MinProcess.CPU, p.floorCPU[role])
			if cur >= target && cur <= target*(1+c.RightsizeMargin) {
				return
			}
			tr.CPU = target
			what = fmt.Sprintf("%ss use %.2f cores while they work: %g -> %g cores with x%.2f headroom", role, b, cur, target, c.BusyHeadroom)
		} else if seen.low >= cur {
			tr.CPU = roundUp(cur*c.CPUHeadroom, c.CPUStep)
			e := c.efficiency(m, to, trial)
			if e < c.AddEfficiency || !c.allows(c.withinQuota(trial)) || c.withinQuota(trial).Workers < trial.Workers {
				return
			}
			what = fmt.Sprintf("%ss use all %g of their cores while they work: %g cores, marginal efficiency %.2f >= %.2f", role, cur, tr.CPU, e, c.AddEfficiency)
		} else {
			return
		}
		if role == Server {
			x1 := x0 * m.Throughput(trial) / m.Throughput(s)
			ok, pw := p.paysLocked(s, trial, x0, x1)
			if !ok {
				p.log.Info("autoscale: servers keep their size", "would", what, "because", pw)
				return
			}
			if pw != "" {
				what += " (" + pw + ")"
			}
		}
		*r = *tr
		why = append(why, what)
	}
	size(Worker, &to.Worker)
	size(Server, &to.Server)
	if target, what, ok := p.workerMemoryLocked(s.Worker.Memory); ok {
		to.Worker.Memory = target
		why = append(why, what)
	}
	if !c.allows(to) {
		// Larger processes the quota has no room for: keep the sizes.
		to, why = s, nil
	}
	d := Decision{Kind: Resize, At: obs.At, Before: obs.Throughput, Value: to.CPU(), Limit: s.CPU()}
	if rd, ok := c.replan(m, to, p.movesLocked(m, s, x0)); ok {
		to = rd.Shape
		d.Value, d.Limit = rd.Value, rd.Limit
		why = append(why, rd.Reason)
	}
	if sameSize(to, s) && to.Worker.Memory == s.Worker.Memory && to.Server.Memory == s.Server.Memory {
		p.log.Debug("autoscale: shape kept", "shape", s.String(), "model", m.String())
		return Decision{}, false
	}
	if ok, pw := p.paysLocked(s, to, x0, x0*m.Throughput(to)/m.Throughput(s)); pw != "" && ok {
		why = append(why, pw)
	}
	d.Shape = to
	d.After = m.Throughput(to)
	d.Reason = fmt.Sprintf("%s; %g -> %g cores, %.1f -> %.1f GiB in all; %s",
		strings.Join(why, "; "), s.CPU(), to.CPU(), gib(s.Memory()), gib(to.Memory()), m.String())
	return d, true
}

// workerMemoryLocked returns a worker's right memory, from the most a worker used, and why; or
// false when none was measured or cur is within RightsizeMargin of it.
func (p *Planner) workerMemoryLocked(cur int64) (int64, string, bool) {
	c := &p.cfg
	if p.peakWorkerMem <= 0 {
		return 0, "", false
	}
	target := max(roundMiB(float64(p.peakWorkerMem)*c.MemoryHeadroom), c.MinProcess.Memory)
	what := fmt.Sprintf("workers use at most %.2f GiB: %.2f GiB with x%.2f headroom", gib(p.peakWorkerMem), gib(target), c.MemoryHeadroom)
	if cur > 0 && float64(p.peakWorkerMem) >= c.NearMemory*float64(cur) {
		target = max(target, roundMiB(float64(cur)*c.MemoryGrowth))
		what = fmt.Sprintf("workers use %.2f of %.2f GiB (near at %.0f%%): %.2f GiB", gib(p.peakWorkerMem), gib(cur), 100*c.NearMemory, gib(target))
	}
	if cur != 0 && math.Abs(float64(target-cur)) <= c.RightsizeMargin*float64(cur) {
		return 0, "", false
	}
	return target, what, true
}

// roundUp rounds x up to a multiple of step.
func roundUp(x, step float64) float64 { return math.Ceil(x/step-1e-9) * step }

// rightsizeLocked sizes each role's processes from what they were measured to use, once the
// job has run Settle observations at its sizes:
//
//   - cores: the most a process of the role used in an observation, over the newest
//     measured at the current sizes, times CPUHeadroom, rounded up to CPUStep, at least
//     MinProcess.CPU and any floor a reverted cut left; a worker whose mean share is at least
//     HotCPU gets CPUHeadroom times its cores instead (a hot server gets a server: hotLocked);
//   - a worker's memory: the most a worker used times MemoryHeadroom, at least
//     MinProcess.Memory; MemoryGrowth times the limit when one used NearMemory of it.
//
// A size changes only when its right size is more than RightsizeMargin away from it. The
// counts are then brought within the quota (growth that the quota does not allow is not
// made). A cut of cores is judged (judgeCutLocked) once the new sizes have settled: when the throughput it
// cost, per core saved, is worth at least AddEfficiency of the throughput per core, the cores
// are given back and the role is not cut below them again.
func (p *Planner) rightsizeLocked(obs Observation) (Decision, bool) {
	c := &p.cfg
	s := obs.Shape
	to := s
	var why []string
	var cutRoles []Role
	size := func(role Role, r *Resources, used []float64, hot bool) {
		if len(used) < c.Settle || len(used) == 0 {
			return
		}
		peak, mean := slices.Max(used), 0.0
		for _, u := range used {
			mean += u / float64(len(used))
		}
		target := max(roundUp(peak*c.CPUHeadroom, c.CPUStep), c.MinProcess.CPU, p.floorCPU[role])
		what := fmt.Sprintf("%ss use at most %.2f of %g cores: %g with x%.2f headroom", role, peak, r.CPU, target, c.CPUHeadroom)
		if hot && mean >= c.HotCPU*r.CPU {
			target = roundUp(r.CPU*c.CPUHeadroom, c.CPUStep)
			what = fmt.Sprintf("%ss use %.0f%% of their %g cores on average (hot at %.0f%%): %g", role, 100*mean/r.CPU, r.CPU, 100*c.HotCPU, target)
		}
		if math.Abs(target-r.CPU) <= c.RightsizeMargin*r.CPU {
			return
		}
		if target < r.CPU {
			cutRoles = append(cutRoles, role)
		}
		r.CPU = target
		why = append(why, what)
	}
	size(Worker, &to.Worker, p.workerUsed, true)
	size(Server, &to.Server, p.serverUsed, false)
	if target, what, ok := p.workerMemoryLocked(s.Worker.Memory); ok {
		to.Worker.Memory = target
		why = append(why, what)
	}
	if len(why) == 0 {
		return Decision{}, false
	}
	grown := to.CPU() > s.CPU() || to.Worker.Memory > s.Worker.Memory
	to = c.withinQuota(to)
	if !c.allows(to) || (grown && to.Workers < s.Workers) {
		// Larger processes the quota has no room for: keep the job as it is rather than
		// trade workers for cores.
		return Decision{}, false
	}
	d := Decision{
		Kind: Resize, At: obs.At, Shape: to, Before: obs.Throughput,
		Value: to.CPU(), Limit: s.CPU(),
		Reason: fmt.Sprintf("right-size from measured use: %s; %g -> %g cores, %.1f -> %.1f GiB in all",
			strings.Join(why, "; "), s.CPU(), to.CPU(), gib(s.Memory()), gib(to.Memory())),
	}
	if len(cutRoles) > 0 {
		p.cut = &coreCut{from: s, to: to, roles: cutRoles}
	}
	return d, true
}

// judgeCutLocked measures the latest cut of cores once the shape it made has Settle samples:
// the throughput lost per core saved over the throughput per core before. At AddEfficiency
// or more the cores were worth keeping: they are given back and become the roles' floor.
func (p *Planner) judgeCutLocked(obs Observation) (Decision, bool) {
	c := &p.cfg
	cut := p.cut
	if cut == nil || !sameSize(obs.Shape, cut.to) || p.atShape < c.Settle {
		return Decision{}, false
	}
	p.cut = nil
	before, after := p.meanAtLocked(cut.from), p.meanAtLocked(cut.to)
	c0, c1 := cut.from.CPU(), cut.to.CPU()
	if before <= 0 || after <= 0 || c1 >= c0 {
		return Decision{}, false
	}
	eff := ((before - after) / (c0 - c1)) / (before / c0)
	if eff < c.AddEfficiency {
		return Decision{}, false
	}
	back := obs.Shape
	for _, r := range cut.roles {
		if r == Worker {
			back.Worker.CPU = cut.from.Worker.CPU
		} else {
			back.Server.CPU = cut.from.Server.CPU
		}
		p.floorCPU[r] = max(p.floorCPU[r], map[Role]float64{Worker: cut.from.Worker.CPU, Server: cut.from.Server.CPU}[r])
	}
	back = c.withinQuota(back)
	return Decision{
		Kind: Resize, At: obs.At, Shape: back, Before: after, After: before, Value: eff, Limit: c.AddEfficiency,
		Reason: fmt.Sprintf("the right-size from %g to %g cores cost %.0f -> %.0f samples/s, marginal efficiency %.2f >= %.2f: the cores go back and stay",
			c0, c1, before, after, eff, c.AddEfficiency),
	}, true
}

// meanAtLocked is the mean throughput measured most recently at s's counts and cores (0:
// none).
func (p *Planner) meanAtLocked(s Shape) float64 {
	x := 0.0
	for _, m := range p.samplesLocked() {
		if sameSize(m.Shape, s) {
			x = m.Throughput
		}
	}
	return x
}

// sameSize reports whether a and b have the same counts and cores (their memory may differ
// by a rounding of whoever reports the shape).
func sameSize(a, b Shape) bool {
	return a.Workers == b.Workers && a.Servers == b.Servers && a.Worker.CPU == b.Worker.CPU && a.Server.CPU == b.Server.CPU
}

// scaleCoresLocked raises the cores of to's processes where the most a process of the role
// was measured to use at from, scaled by the load per process the model predicts (before at
// from, after at to), needs more than it has with CPUHeadroom; why says what changed ("":
// nothing). A shape the quota does not allow is left as it was.
func (p *Planner) scaleCoresLocked(from, to Shape, before, after float64) (Shape, string) {
	c := &p.cfg
	if !(before > 0) || !(after > 0) {
		return to, ""
	}
	out := to
	var why []string
	scale := func(role Role, r *Resources, used []float64, n0, n1 int) {
		if len(used) == 0 || n0 <= 0 || n1 <= 0 {
			return
		}
		f := (after / float64(n1)) / (before / float64(n0))
		if f <= 1 {
			return // as much load each or less: the right-size, at the new counts, sees to it
		}
		target := roundUp(slices.Max(used)*f*c.CPUHeadroom, c.CPUStep)
		if target > r.CPU {
			why = append(why, fmt.Sprintf("%ss %g -> %g cores for %.2fx the load each", role, r.CPU, target, f))
			r.CPU = target
		}
	}
	scale(Worker, &out.Worker, p.workerUsed, from.Workers, to.Workers)
	scale(Server, &out.Server, p.serverUsed, from.Servers, to.Servers)
	if len(why) == 0 || !c.allows(out) {
		return to, ""
	}
	return out, strings.Join(why, ", ")
}
