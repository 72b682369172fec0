package autoscale

import "fmt"

// cost is what a shape holds, in cores: its cores, and its memory at CoreMemory bytes a core.
func (c *Config) cost(s Shape) float64 {
	return s.CPU() + float64(s.Memory())/float64(c.CoreMemory)
}

// efficiency is the marginal efficiency of going from one shape to another under m: the
// throughput changed per resource changed (cost: cores, and memory at CoreMemory a core),
// over from's throughput per resource. Linear scaling gives 1, adding a process that helps
// nothing 0.
func (c *Config) efficiency(m Model, from, to Shape) float64 {
	return c.marginal(m.Throughput(from), m.Throughput(to), from, to)
}

// marginal is the marginal efficiency of going from one shape at throughput x0 to another at
// x1.
func (c *Config) marginal(x0, x1 float64, from, to Shape) float64 {
	c0, c1 := c.cost(from), c.cost(to)
	if c1 == c0 || x0 <= 0 || c0 <= 0 {
		return 0
	}
	return ((x1 - x0) / (c1 - c0)) / (x0 / c0)
}

// allows reports whether s is within the quota: counts, cores, memory, and a server's
// memory at most MaxServerMemory.
func (c *Config) allows(s Shape) bool {
	return s.Workers >= c.MinWorkers && s.Workers <= c.MaxWorkers &&
		s.Servers >= c.MinServers && s.Servers <= c.MaxServers &&
		(c.MaxCPU == 0 || s.CPU() <= c.MaxCPU+1e-9) &&
		c.memoryAllows(s) && s.Server.Memory <= c.MaxServerMemory
}

// memoryAllows reports whether s is within MaxMemory, or, when the servers' memory for the
// rows leaves no room for more, has MinWorkers workers at most: the rows' memory is never
// what the quota refuses.
func (c *Config) memoryAllows(s Shape) bool {
	if c.MaxMemory == 0 {
		return true
	}
	rows := int64(s.Servers)*s.Server.Memory + int64(c.MinWorkers)*s.Worker.Memory
	return s.Memory() <= max(c.MaxMemory, rows)
}

// withinQuota takes workers away, down to MinWorkers, while s is over the quota's cores or
// memory. The servers are left alone: their memory holds the model's rows.
func (c *Config) withinQuota(s Shape) Shape {
	for s.Workers > c.MinWorkers &&
		((c.MaxCPU > 0 && s.CPU() > c.MaxCPU+1e-9) || (c.MaxMemory > 0 && s.Memory() > c.MaxMemory)) {
		s.Workers--
	}
	return s
}

// spread gives each of s's servers an equal share of total bytes of server memory (0: s's
// server memory is kept), at least 1 MiB.
func spread(s Shape, total float64) Shape {
	if total > 0 && s.Servers > 0 {
		s.Server.Memory = max(roundMiB(total/float64(s.Servers)), 1<<20)
	}
	return s
}

// clamp brings s's counts within the quota's bounds.
func (c *Config) clamp(s Shape) Shape {
	s.Workers = min(max(s.Workers, c.MinWorkers), c.MaxWorkers)
	s.Servers = min(max(s.Servers, c.MinServers), c.MaxServers)
	return s
}

// step is one move of a search.
type step struct {
	to  Shape
	eff float64
}

// moves says how a search changes the servers, and which changes it may make.
type moves struct {
	// total is the bytes of server memory spread anew over any count of servers, as at a
	// job's start; 0: a server added is like the others and a server removed leaves its rows
	// to the others, which are given rows' share each (spread, and so resized) only when
	// their memory cannot hold them.
	total float64
	// rows is the least bytes the servers must hold in all; 0: unknown, each keeps its
	// memory.
	rows float64
	// pays reports whether a change from one shape to another pays for the rows it moves
	// (Config.Payback), and why not; nil: every change does.
	pays func(from, to Shape) (bool, string)
}

// addServer is s with one server more.
func (mv moves) addServer(s Shape) Shape {
	return spread(with(s, 0, 1), mv.total)
}

// removeServer is s with one server fewer, its memory spread when it must be.
func (mv moves) removeServer(s Shape) Shape {
	to := with(s, 0, -1)
	if mv.total > 0 {
		return spread(to, mv.total)
	}
	if mv.rows > 0 && float64(to.Servers)*float64(to.Server.Memory) < mv.rows {
		return spread(to, mv.rows)
	}
	return to
}

func (mv moves) ok(from, to Shape) bool {
	if mv.pays == nil {
		return true
	}
	ok, _ := mv.pays(from, to)
	return ok
}

// grow adds one process at a time, the one of highest marginal efficiency, while that is at
// least AddEfficiency, the quota allows and the change from start pays, up to n processes.
func (c *Config) grow(m Model, s Shape, n int, mv moves) []step {
	var steps []step
	start := s
	for range n {
		best := step{eff: -1}
		for _, to := range []Shape{with(s, 1, 0), mv.addServer(s)} {
			if !c.allows(to) || !mv.ok(start, to) {
				continue
			}
			if e := c.efficiency(m, s, to); e > best.eff {
				best = step{to, e}
			}
		}
		if best.eff < c.AddEfficiency {
			break
		}
		steps = append(steps, best)
		s = best.to
	}
	return steps
}

// shrink removes one process at a time, the one whose loss per core is least, while that is
// below RemoveEfficiency and the change from start pays, up to n processes.
func (c *Config) shrink(m Model, s Shape, n int, mv moves) []step {
	var steps []step
	start := s
	for range n {
		best, found := step{}, false
		for _, to := range []Shape{with(s, -1, 0), mv.removeServer(s)} {
			if !c.allows(to) || !mv.ok(start, to) {
				continue
			}
			if e := c.efficiency(m, s, to); !found || e < best.eff {
				best, found = step{to, e}, true
			}
		}
		if !found || best.eff >= c.RemoveEfficiency {
			break
		}
		steps = append(steps, best)
		s = best.to
	}
	return steps
}

func with(s Shape, dw, dp int) Shape {
	s.Workers += dw
	s.Servers += dp
	return s
}

// replan returns the shape the model recommends from s, and the Decision for it; ok is false
// when s is best. mv says how servers are added and removed and which changes pay.
func (c *Config) replan(m Model, s Shape, mv moves) (Decision, bool) {
	from := s
	s = c.withinQuota(c.clamp(s))
	if s.Servers != from.Servers {
		s = spread(s, max(mv.total, mv.rows))
	}
	steps := c.grow(m, s, c.MaxStep, mv)
	limit, verb := c.AddEfficiency, ">="
	if len(steps) == 0 {
		steps = c.shrink(m, s, c.MaxStep, mv)
		limit, verb = c.RemoveEfficiency, "<"
	}
	if len(steps) > 0 {
		s = steps[len(steps)-1].to
	}
	if s.Workers == from.Workers && s.Servers == from.Servers {
		return Decision{}, false
	}
	d := Decision{
		Kind: Resize, Shape: s, Limit: limit,
		Before: m.Throughput(from), After: m.Throughput(s),
	}
	change := fmt.Sprintf("%+d workers, %+d servers (%+g cores, %+.1f GiB)", s.Workers-from.Workers, s.Servers-from.Servers, s.CPU()-from.CPU(), gib(s.Memory()-from.Memory()))
	if len(steps) == 0 {
		d.Reason = fmt.Sprintf("%s to stay within the quota", change)
		return d, true
	}
	d.Value = steps[0].eff
	d.Reason = fmt.Sprintf("%s: the model predicts %.0f -> %.0f samples/s (%+.1f%%), marginal efficiency %.2f %s %.2f",
		change, d.Before, d.After, 100*(d.After/d.Before-1), d.Value, verb, limit)
	return d, true
}
