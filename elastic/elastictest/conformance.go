package elastictest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic"
)

// Procs is what a harness sees of a job's processes: the node id of every process that runs
// now, with an identity of that process (a pid, a pod's uid, a count of starts). A process
// started again under its node id, after a crash or a stop, has a new identity; one that runs on
// keeps its own.
type Procs map[string]string

// IDs returns the node ids, sorted.
func (p Procs) IDs() []string { return slices.Sorted(maps.Keys(p)) }

// AwaitChanges is an Await for a harness that learns of its processes' starts and exits from a
// channel closed at each (changed returns the current one, and a new one is made after each
// close): it reads the processes with procs until cond holds of them, or ctx ends.
func AwaitChanges(ctx context.Context, changed func() <-chan struct{}, procs func() Procs, cond func(Procs) bool) (Procs, error) {
	for {
		ch := changed() // before the look, so that a change after it wakes the wait
		if p := procs(); cond(p) {
			return p, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// ScalerUnderTest is a scaler that TestScaler checks, with the means to watch its processes.
type ScalerUnderTest struct {
	// Scaler is the scaler. If it is an elastic.ServerScaler, its StartServers and StopServers
	// are checked too (unless StartServers fails with errors.ErrUnsupported). Required.
	Scaler elastic.Scaler
	// Await returns the job's processes that run once cond holds of them, or fails when ctx
	// ends; with a cond that holds at once it returns at once. It waits for events (process
	// starts and exits, a watch), not by sleeping. Only the parameter servers and the workers
	// are checked: other node ids (the coordinator's) may be there. Required.
	Await func(ctx context.Context, cond func(Procs) bool) (Procs, error)
	// Crash, if set, ends the process of node id as a crash would, behind the scaler's back (a
	// SIGKILL, a pod deleted, a worker's function failing), and returns; the scaler must start it
	// again under its node id. errors.ErrUnsupported: the scaler does not restart that role, and
	// the check is skipped. Nil: no crash is checked.
	Crash func(ctx context.Context, id string) error
}

// ScalerHarness makes the scaler TestScaler checks: a new scaler for a new job of servers
// parameter servers that runs no worker yet. A scaler made for a job whose servers run already
// has them running; one that starts the servers itself starts them at its first Scale. Its
// workers must train (or wait) until stopped, not end by themselves, and it must restart a
// crashed process at least once. TestScaler closes the scaler; the harness cleans the rest up
// (t.Cleanup).
type ScalerHarness func(t *testing.T, servers int) ScalerUnderTest

// TestScaler checks a Scaler against the contract written on elastic.Scaler and
// elastic.ServerScaler, on a job of two servers: Scale sets the workers (starts the missing,
// stops the highest-numbered, restarts none it keeps, starts a stopped name anew), returns with
// its starts launched and its stops ended, keeps the servers, and refuses a plan with another
// server count or an invalid one with an error wrapping elastic.ErrInvalidConfig, changing
// nothing; Plan follows; a new size restarts nothing; StartServers and StopServers change the
// servers one by one, the highest-numbered, and nothing else; a crashed process is started
// again, alone; Close stops the workers, is idempotent, and Scale fails after it with
// elastic.ErrClosed. It takes a minute at most.
func TestScaler(t *testing.T, h ScalerHarness) {
	t.Helper()
	for _, err := range checkScaler(t, h) {
		t.Error(err)
	}
}

// checkScaler runs TestScaler's checks and returns what failed; it stops at a failure the
// later checks depend on.
func checkScaler(t *testing.T, h ScalerHarness) []error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := h(t, 2)
	c := &contract{ctx: ctx, u: u, s: u.Scaler}
	defer c.s.Close()
	c.run()
	return c.errs
}

// contract is one run of the Scaler checks.
type contract struct {
	ctx  context.Context
	u    ScalerUnderTest
	s    elastic.Scaler
	errs []error
}

func (c *contract) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// procs returns the servers and workers that run now.
func (c *contract) procs() (Procs, bool) {
	p, err := c.u.Await(c.ctx, func(Procs) bool { return true })
	if err != nil {
		c.errorf("observe the processes: %v", err)
		return nil, false
	}
	out := Procs{}
	for id, inst := range p {
		if strings.HasPrefix(id, "ps-") || strings.HasPrefix(id, "worker-") {
			out[id] = inst
		}
	}
	return out, true
}

// expect checks that the servers and workers that run are ps-0..servers-1 and
// worker-0..workers-1, that those of kept run the same process as in kept, and that those of
// fresh run another one. It returns what runs.
func (c *contract) expect(what string, servers, workers int, kept Procs, fresh ...string) (Procs, bool) {
	now, ok := c.procs()
	if !ok {
		return nil, false
	}
	var want []string
	for i := range servers {
		want = append(want, elastic.ServerID(i))
	}
	for i := range workers {
		want = append(want, elastic.WorkerID(i))
	}
	slices.Sort(want)
	if got := now.IDs(); !slices.Equal(got, want) {
		c.errorf("%s: the processes that run are %v, want %v", what, got, want)
		return now, false
	}
	ok = true
	for id, inst := range now {
		old, was := kept[id]
		switch {
		case slices.Contains(fresh, id) && was && old == inst:
			c.errorf("%s: %s runs its old process %s, want a new one", what, id, inst)
			ok = false
		case !slices.Contains(fresh, id) && was && old != inst:
			c.errorf("%s: %s was restarted (process %s, then %s)", what, id, old, inst)
			ok = false
		}
	}
	return now, ok
}

func (c *contract) expectPlan(what string, want elastic.Plan) bool {
	if got := c.s.Plan(); got != want {
		c.errorf("%s: Plan() is %+v, want %+v", what, got, want)
		return false
	}
	return true
}

func (c *contract) run() {
	plan := elastic.Plan{Servers: 2, Workers: 3}
	if err := c.s.Scale(c.ctx, plan); err != nil {
		c.errorf("Scale(%v): %v", plan, err)
		return
	}
	c.expectPlan("the first Scale", plan)
	first, ok := c.expect("the first Scale", 2, 3, nil)
	if !ok {
		return
	}

	// Down: the highest-numbered workers stop, the others and the servers run on.
	plan.Workers = 1
	if err := c.s.Scale(c.ctx, plan); err != nil {
		c.errorf("Scale(%v): %v", plan, err)
		return
	}
	c.expectPlan("a Scale down", plan)
	if _, ok := c.expect("a Scale down (it returns once the stopped workers have ended)", 2, 1, first); !ok {
		return
	}
	// Up again: the stopped names get new processes.
	plan.Workers = 3
	if err := c.s.Scale(c.ctx, plan); err != nil {
		c.errorf("Scale(%v): %v", plan, err)
		return
	}
	c.expectPlan("a Scale up", plan)
	now, ok := c.expect("a Scale up after a Scale down", 2, 3, first, elastic.WorkerID(1), elastic.WorkerID(2))
	if !ok {
		return
	}

	// Refused: another server count, or an invalid plan; nothing changes.
	for _, bad := range []elastic.Plan{{Servers: 3, Workers: 3}, {Servers: 1, Workers: 3}, {Servers: 3, Workers: 5},
		{Servers: 0, Workers: 1}, {Servers: 2, Workers: -1}, {Servers: 2, Workers: 3, Worker: elastic.Resources{CPUs: -1}}} {
		err := c.s.Scale(c.ctx, bad)
		if !errors.Is(err, elastic.ErrInvalidConfig) {
			c.errorf("Scale(%+v) with the scaler running %v: got %v, want an error wrapping ErrInvalidConfig", bad, plan, err)
		}
		c.expectPlan(fmt.Sprintf("a refused Scale(%+v)", bad), plan)
		if _, ok := c.expect(fmt.Sprintf("a refused Scale(%+v)", bad), 2, 3, now); !ok {
			return
		}
	}

	// A new size restarts nothing.
	plan.Worker = elastic.Resources{CPUs: 1, Memory: 1 << 30}
	if err := c.s.Scale(c.ctx, plan); err != nil {
		c.errorf("Scale(%+v): %v", plan, err)
		return
	}
	c.expectPlan("a Scale with new sizes", plan)
	if _, ok := c.expect("a Scale with new sizes", 2, 3, now); !ok {
		return
	}

	if ss, isSS := c.s.(elastic.ServerScaler); isSS {
		if now, ok = c.servers(ss, plan, now); !ok {
			return
		}
	}
	if c.u.Crash != nil {
		for _, id := range []string{elastic.WorkerID(1), elastic.ServerID(1)} {
			if now, ok = c.crash(id, now); !ok {
				return
			}
		}
		c.expectPlan("after the crashes", plan)
	}

	if err := c.s.Close(); err != nil {
		c.errorf("Close: %v", err)
	}
	if now, ok := c.procs(); ok {
		for id := range now {
			if strings.HasPrefix(id, "worker-") {
				c.errorf("after Close: worker %s runs", id)
			}
		}
	}
	if err := c.s.Close(); err != nil {
		c.errorf("Close again: %v", err)
	}
	if err := c.s.Scale(c.ctx, plan); !errors.Is(err, elastic.ErrClosed) {
		c.errorf("Scale after Close: got %v, want an error wrapping ErrClosed", err)
	}
}

// servers checks StartServers and StopServers on a scaler that runs plan (now), and leaves it
// running plan again. It returns what runs then, and whether the later checks may go on.
func (c *contract) servers(ss elastic.ServerScaler, plan elastic.Plan, now Procs) (Procs, bool) {
	added, err := ss.StartServers(c.ctx, 1)
	if errors.Is(err, errors.ErrUnsupported) {
		c.expectPlan("a StartServers that is not supported", plan)
		return c.expect("a StartServers that is not supported", 2, 3, now)
	}
	if err != nil {
		c.errorf("StartServers(1): %v", err)
		return nil, false
	}
	if len(added) != 1 || added[0].Node().ID != elastic.ServerID(2) {
		var ids []string
		for _, s := range added {
			ids = append(ids, s.Node().ID)
		}
		c.errorf("StartServers(1) returned %v, want [ps-2]", ids)
		return nil, false
	}
	grown := plan
	grown.Servers = 3
	c.expectPlan("StartServers(1)", grown)
	more, ok := c.expect("StartServers(1)", 3, 3, now)
	if !ok {
		return nil, false
	}
	if err := c.s.Scale(c.ctx, plan); !errors.Is(err, elastic.ErrInvalidConfig) {
		c.errorf("Scale(%+v) after StartServers(1): got %v, want an error wrapping ErrInvalidConfig", plan, err)
	}
	grown.Workers = 2
	if err := c.s.Scale(c.ctx, grown); err != nil {
		c.errorf("Scale(%+v) after StartServers(1): %v", grown, err)
		return nil, false
	}
	c.expectPlan("a Scale after StartServers", grown)
	if more, ok = c.expect("a Scale after StartServers", 3, 2, more); !ok {
		return nil, false
	}
	for _, bad := range [][]string{{elastic.ServerID(0)}, {elastic.ServerID(1)}, {elastic.ServerID(3)}, {elastic.ServerID(2), elastic.ServerID(2)}} {
		if err := ss.StopServers(c.ctx, bad); !errors.Is(err, elastic.ErrInvalidConfig) {
			c.errorf("StopServers(%v) of 3 servers: got %v, want an error wrapping ErrInvalidConfig", bad, err)
		}
		c.expectPlan(fmt.Sprintf("a refused StopServers(%v)", bad), grown)
		if _, ok := c.expect(fmt.Sprintf("a refused StopServers(%v)", bad), 3, 2, more); !ok {
			return nil, false
		}
	}
	if err := ss.StopServers(c.ctx, []string{elastic.ServerID(2)}); err != nil {
		c.errorf("StopServers([ps-2]): %v", err)
		return nil, false
	}
	grown.Servers = 2
	c.expectPlan("StopServers([ps-2])", grown)
	if _, ok := c.expect("StopServers([ps-2]) (it returns once the server has ended)", 2, 2, more); !ok {
		return nil, false
	}
	if err := c.s.Scale(c.ctx, plan); err != nil {
		c.errorf("Scale(%+v) after StopServers: %v", plan, err)
		return nil, false
	}
	c.expectPlan("a Scale after StopServers", plan)
	return c.expect("a Scale after StopServers", 2, 3, more, elastic.WorkerID(2))
}

// crash crashes node id and checks that it alone is started again.
func (c *contract) crash(id string, before Procs) (Procs, bool) {
	err := c.u.Crash(c.ctx, id)
	if errors.Is(err, errors.ErrUnsupported) {
		return before, true
	}
	if err != nil {
		c.errorf("crash %s: %v", id, err)
		return nil, false
	}
	old := before[id]
	if _, err := c.u.Await(c.ctx, func(p Procs) bool { return p[id] != "" && p[id] != old }); err != nil {
		c.ctx = context.WithoutCancel(c.ctx)
		now, _ := c.procs()
		c.errorf("%s crashed (process %s) and was not started again (%v); what runs: %v", id, old, err, now)
		return nil, false
	}
	servers, workers := 0, 0
	for i := range before {
		if strings.HasPrefix(i, "ps-") {
			servers++
		} else if strings.HasPrefix(i, "worker-") {
			workers++
		}
	}
	return c.expect(fmt.Sprintf("%s crashed", id), servers, workers, before, id)
}
