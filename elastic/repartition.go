package elastic

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/elasticps/elasticps/internal/wait"
	"github.com/elasticps/elasticps/ps"
)

// ServerScaler is a Scaler that also starts and stops parameter servers: what a change of the
// job's server count needs, since Scale never does (see Scaler). The coordinator starts servers
// before it moves slots onto them, and stops servers once it has moved every slot off them
// (live repartition).
type ServerScaler interface {
	Scaler
	// StartServers starts n more parameter servers, ps-k .. ps-(k+n-1) after the k of
	// Plan().Servers, serving and without an owner table, and returns them; Plan().Servers is
	// k+n from then on. On an error the servers returned have started (the caller stops them).
	// A scaler that cannot start servers it can reach fails with errors.ErrUnsupported and
	// starts none.
	StartServers(ctx context.Context, n int) ([]ParameterServer, error)
	// StopServers stops the servers with the given ids, which own no slot any more, and waits
	// for them; Plan().Servers drops by len(ids). They must be the highest-numbered: otherwise
	// the error wraps ErrInvalidConfig and no server stops.
	StopServers(ctx context.Context, ids []string) error
}

// RepartitionStatus describes the newest change of the server count.
type RepartitionStatus struct {
	// Running is true while slots move.
	Running bool `json:"running"`
	// From and To are the server counts before and after.
	From int `json:"from"`
	To   int `json:"to"`
	// SlotsDone of SlotsTotal slots have moved; Groups of them moved together.
	SlotsDone  int `json:"slots_done"`
	SlotsTotal int `json:"slots_total"`
	Groups     int `json:"groups"`
	Failed     int `json:"failed_groups,omitempty"`
	// Rows and Bytes count what was copied (a row changed during its move is copied again);
	// MovedRows only the rows moved.
	Rows      int64 `json:"rows"`
	MovedRows int64 `json:"moved_rows"`
	Bytes     int64 `json:"bytes"`
	// MaxFenced is the longest a group's slots were refused (handed over) before their new
	// owner served them.
	MaxFenced time.Duration `json:"max_fenced_ns"`
	Duration  time.Duration `json:"duration_ns"`
	// Err is the failure, empty on success.
	Err string `json:"error,omitempty"`
}

// repartition changes the number of servers to n while training goes on: it starts the new
// servers (ss), moves only the slots whose owner changes (ps.Migrator), one owner table per
// group of slots, and stops the servers it drained (the highest-numbered).
func (c *Coordinator) repartition(ctx context.Context, ss ServerScaler, n int) error {
	if n < 1 {
		return fmt.Errorf("%w: %d parameter servers", ErrInvalidConfig, n)
	}
	c.repMu.Lock()
	defer c.repMu.Unlock()
	servers := c.serverList()
	var added []ParameterServer
	var drain []string
	if n > len(servers) {
		var err error
		if added, err = ss.StartServers(ctx, n-len(servers)); err != nil {
			c.forget(ctx, added, ss.StopServers)
			return fmt.Errorf("elastic: start %d parameter servers: %w", n-len(servers), err)
		}
	}
	for _, s := range servers[min(n, len(servers)):] {
		drain = append(drain, s.Node().ID)
	}
	return c.resizeLocked(ctx, added, drain, ss.StopServers)
}

// AddServers brings servers that the caller (a cluster scheduler) started, serving and with no
// owner table, into the job, and moves slots onto them while training goes on, as a new
// server count does (SetParallelism). It returns once the slots have moved. A remote
// coordinator is asked with remote.Control.AddServers.
func (c *Coordinator) AddServers(ctx context.Context, servers ...ParameterServer) error {
	return c.addServers(ctx, servers)
}

// AddServersAt is AddServers for servers known by their nodes, reached through
// Config.ServerAt: how a scheduler in another process tells the coordinator of the servers it
// started (package remote). Without Config.ServerAt it fails with errors.ErrUnsupported.
func (c *Coordinator) AddServersAt(ctx context.Context, nodes ...ps.Node) error {
	if c.cfg.ServerAt == nil {
		return fmt.Errorf("elastic: the coordinator cannot reach servers it is told of (Config.ServerAt): %w", errors.ErrUnsupported)
	}
	servers := make([]ParameterServer, len(nodes))
	for i, node := range nodes {
		s, err := c.cfg.ServerAt(node)
		if err != nil {
			return fmt.Errorf("elastic: server %s at %s: %w", node.ID, node.Addr, err)
		}
		servers[i] = s
	}
	return c.addServers(ctx, servers)
}

func (c *Coordinator) addServers(ctx context.Context, servers []ParameterServer) error {
	if len(servers) == 0 {
		return nil
	}
	c.repMu.Lock()
	defer c.repMu.Unlock()
	have := c.serverList()
	for _, s := range servers {
		if slices.ContainsFunc(have, func(h ParameterServer) bool { return h.Node().ID == s.Node().ID }) {
			return fmt.Errorf("%w: the job has a parameter server %q already", ErrInvalidConfig, s.Node().ID)
		}
	}
	return c.resizeLocked(ctx, servers, nil, nil)
}

// RemoveServers moves every slot off the servers with the given ids while training goes on and
// drops them from the job; then the caller may stop them. It returns once the slots have moved.
// A remote coordinator is asked with remote.Control.RemoveServers.
func (c *Coordinator) RemoveServers(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	c.repMu.Lock()
	defer c.repMu.Unlock()
	have := c.serverList()
	for _, id := range ids {
		if !slices.ContainsFunc(have, func(h ParameterServer) bool { return h.Node().ID == id }) {
			return fmt.Errorf("%w: no parameter server %q in the job", ErrInvalidConfig, id)
		}
	}
	if len(ids) >= len(have) {
		return fmt.Errorf("%w: removing %d of %d parameter servers leaves none", ErrInvalidConfig, len(ids), len(have))
	}
	return c.resizeLocked(ctx, nil, ids, nil)
}

// forget stops servers that were started but did not join, through stop (nil: the caller's).
func (c *Coordinator) forget(ctx context.Context, added []ParameterServer, stop func(context.Context, []string) error) {
	ids := idsOf(added)
	if len(ids) == 0 {
		return
	}
	c.mu.Lock()
	for _, id := range ids {
		delete(c.srvs, id)
		delete(c.core.servers, id)
	}
	c.servers = slices.DeleteFunc(c.servers, func(s ParameterServer) bool { return slices.Contains(ids, s.Node().ID) })
	c.mu.Unlock()
	if stop != nil {
		if err := stop(context.WithoutCancel(ctx), ids); err != nil {
			c.log.Warn("could not stop servers that failed to join", "servers", ids, "err", err)
		}
	}
}

// resizeLocked enlists added, moves the slots so that the job's servers are its current ones
// plus added minus drain, drops the drained servers and stops them with stop (nil: the caller
// does). c.repMu is held.
func (c *Coordinator) resizeLocked(ctx context.Context, added []ParameterServer, drain []string, stop func(context.Context, []string) error) (err error) {
	if len(c.cfg.Secret) == 0 {
		c.forget(ctx, added, stop)
		return fmt.Errorf("%w: Config.Secret is needed to move slots between servers", ErrInvalidConfig)
	}
	c.mu.Lock()
	servers := slices.Clone(c.servers)
	failed := c.core.failedServers()
	c.mu.Unlock()
	if len(failed) > 0 {
		c.forget(ctx, added, stop)
		return fmt.Errorf("elastic: parameter servers %v failed and are not recovered yet: try again after the recovery", failed)
	}
	have, n := len(servers), len(servers)+len(added)-len(drain)
	start := c.clock.now()
	finished := c.moving(have, n)
	defer func() { finished(err) }()
	c.log.Info("changing the parameter servers", "from", have, "to", n, "adding", len(added), "draining", drain)
	if len(added) > 0 {
		if err := c.enlist(ctx, added); err != nil {
			c.forget(ctx, added, stop)
			return fmt.Errorf("elastic: enlist %d parameter servers: %w", len(added), err)
		}
	}
	var keep, drained []ParameterServer
	for _, s := range append(servers, added...) {
		if slices.Contains(drain, s.Node().ID) {
			drained = append(drained, s)
		} else {
			keep = append(keep, s)
		}
	}
	nodes := nodesOf(keep)
	cur := c.holder.Get()
	next, err := ps.NewOwnerTable(0, cur.Slots, nodes, cur)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	c.mu.Lock()
	if t := c.repTarget; t != nil && sameNodeIDs(t.Nodes, next.Nodes) {
		next = t // finish the move that failed part of the way, to the placement it aimed at
	}
	c.mu.Unlock()
	m, err := c.migratorFor()
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { // progress for Status while the slots move
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				c.noteProgress(m.Progress())
			}
		}
	}()
	c.movingTo(next)
	final, err := m.Migrate(ctx, cur, next, c.publishMove, ps.WithPublishLock(c.lockTable))
	close(done)
	c.noteProgress(m.Progress())
	c.mu.Lock()
	c.repIncomplete = err != nil // the next SetPlan finishes the move
	c.repTarget = nil
	if err != nil {
		c.repTarget = next
	}
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("elastic: move slots to %d servers (owner table now %d; set the plan again to finish): %w", n, final.Version, err)
	}
	if len(drained) > 0 {
		ids := idsOf(drained)
		c.mu.Lock()
		c.servers = slices.DeleteFunc(c.servers, func(s ParameterServer) bool { return slices.Contains(ids, s.Node().ID) })
		for _, id := range ids {
			delete(c.srvs, id)
			delete(c.core.servers, id)
		}
		c.mu.Unlock()
		// A commit under way may still wait for a drained server's persist; later ones do
		// not involve it (waiting for a moment with no checkpoint at all could last as long
		// as training when checkpoints follow each other).
		if err := c.waitCheckpointsUnderWay(ctx); err != nil {
			return err
		}
		if stop != nil {
			if err := stop(ctx, ids); err != nil {
				return fmt.Errorf("elastic: stop drained parameter servers %v: %w", ids, err)
			}
		}
	}
	p := m.Progress()
	c.log.Info("parameter servers changed", "from", have, "to", n, "slots_moved", p.SlotsDone, "rows", p.BaseRows,
		"bytes", p.Bytes, "max_fenced", p.MaxFenced, "table", final.Version, "took", c.clock.now().Sub(start).Round(time.Millisecond))
	return nil
}

// waitCheckpointsUnderWay waits until the checkpoints under way now are over: the barrier that
// is up, if any, has come down, and every snapshot awaiting its commit, that barrier's
// included, has committed or failed. Checkpoints begun later are not waited for.
func (c *Coordinator) waitCheckpointsUnderWay(ctx context.Context) error {
	c.mu.Lock()
	pending := slices.Clone(c.core.snapshots)
	gen, up := c.core.gen, c.core.phase != phaseIdle
	if up {
		pending = append(pending, c.core.step) // the step its snapshot takes: steps wait at a barrier
	}
	c.mu.Unlock()
	return c.await(ctx, func() (bool, error) {
		if up && c.core.gen == gen && c.core.phase != phaseIdle {
			return false, nil
		}
		for _, s := range pending {
			if slices.Contains(c.core.snapshots, s) {
				return false, nil
			}
		}
		return true, nil
	})
}

// Rebalance moves the hottest slots off the servers whose share of the load is above over
// times the average (over > 1): it measures every server's per-slot load for window (the CPU
// each slot cost, from the servers' own counters), plans the moves (ps.PlanRebalance, at most
// maxMoves, 0: no limit) and carries them out while training goes on, as a change of the
// server count does. It returns the moves made (none when the load is balanced). A hot server
// is what an autoscaler calls it for.
func (c *Coordinator) Rebalance(ctx context.Context, over float64, window time.Duration, maxMoves int) ([]ps.Move, error) {
	c.repMu.Lock()
	defer c.repMu.Unlock()
	if len(c.cfg.Secret) == 0 {
		return nil, fmt.Errorf("%w: Config.Secret is needed to move slots between servers", ErrInvalidConfig)
	}
	m, err := c.migratorFor()
	if err != nil {
		return nil, err
	}
	cur := c.holder.Get()
	stats := func() ([]ps.ServerStats, error) {
		out := make([]ps.ServerStats, len(cur.Nodes))
		for i, n := range cur.Nodes {
			st, err := m.ServerStats(ctx, n.Addr)
			if err != nil {
				return nil, fmt.Errorf("elastic: load of %s: %w", n.ID, err)
			}
			out[i] = st
		}
		return out, nil
	}
	before, err := stats()
	if err != nil {
		return nil, err
	}
	if err := wait.Sleep(ctx, window); err != nil { // the servers' counters run on real time
		return nil, err
	}
	after, err := stats()
	if err != nil {
		return nil, err
	}
	rates := make([][]ps.SlotRate, len(after))
	for i := range after {
		rates[i] = after[i].Since(before[i])
	}
	moves, err := ps.PlanRebalance(cur, ps.SlotLoads(cur.Slots, rates...), over, maxMoves)
	if err != nil || len(moves) == 0 {
		return nil, err
	}
	next, err := cur.WithMoves(cur.Version+1, cur.Nodes, moves)
	if err != nil {
		return nil, err
	}
	n := len(cur.Nodes)
	finished := c.moving(n, n)
	c.movingTo(next)
	final, err := m.Migrate(ctx, cur, next, c.publishMove, ps.WithPublishLock(c.lockTable))
	c.noteProgress(m.Progress())
	finished(err)
	if err != nil {
		return nil, fmt.Errorf("elastic: rebalance (owner table now %d): %w", final.Version, err)
	}
	c.log.Info("rebalanced by load", "slots_moved", len(moves), "over", over, "table", final.Version)
	return moves, nil
}

// enlist brings new servers into the job: it learns their incarnations, leads and fences them
// as the others, gives them the current owner table (they own nothing in it) and watches their
// health.
func (c *Coordinator) enlist(ctx context.Context, added []ParameterServer) error {
	// A server just started may not listen yet: give each up to ServerTimeout to answer.
	for _, s := range added {
		deadline := c.clock.now().Add(c.cfg.ServerTimeout)
		for {
			hctx, cancel := context.WithTimeout(ctx, c.cfg.HealthEvery)
			_, err := s.Health(hctx)
			cancel()
			if err == nil {
				break
			}
			if c.clock.now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("elastic: server %s does not answer: %w", s.Node().ID, err)
			}
			if err := wait.Sleep(ctx, 20*time.Millisecond); err != nil {
				return err
			}
		}
	}
	if _, err := c.admit(ctx, added); err != nil {
		return err
	}
	c.mu.Lock()
	floor, fenced, inc := c.core.floor(), slices.Clone(c.fenced), c.core.incarnation
	c.mu.Unlock()
	if err := c.lead(ctx, added, inc); err != nil {
		return err
	}
	if err := c.fence(ctx, added, floor, fenced); err != nil {
		return err
	}
	c.tableMu.Lock()
	defer c.tableMu.Unlock()
	t := c.holder.Get()
	for _, s := range added {
		if err := s.InstallTable(ctx, t); err != nil {
			return fmt.Errorf("elastic: install owner table %d on %s: %w", t.Version, s.Node().ID, err)
		}
	}
	c.mu.Lock()
	c.servers = append(c.servers, added...)
	c.mu.Unlock()
	return nil
}

// lockTable takes the table lock for the Migrator (ps.WithPublishLock): from a group's fence to
// its table's publication no snapshot or recovery runs, and none delays the table.
func (c *Coordinator) lockTable(ctx context.Context) (func(), error) {
	c.tableMu.Lock()
	if err := ctx.Err(); err != nil {
		c.tableMu.Unlock()
		return nil, err
	}
	return c.tableMu.Unlock, nil
}

// publishMove is the Migrator's Publish, called with the table lock held (lockTable): it makes
// t the job's table and installs it on every server. A table that does not follow the job's (a
// recovery replaced it meanwhile) is refused with ps.ErrNotPublished.
func (c *Coordinator) publishMove(ctx context.Context, t *ps.OwnerTable) error {
	if cur := c.holder.Get(); cur.Version+1 != t.Version {
		return fmt.Errorf("owner table %d follows %d, the job has %d: %w", t.Version, t.Version-1, cur.Version, ps.ErrNotPublished)
	}
	c.mu.Lock()
	servers := slices.Clone(c.servers)
	c.mu.Unlock()
	// The job's table from now on, even if a server cannot install it: a server that did
	// serves the moved slots, so a recovery must start from t.
	c.holder.Set(t)
	return c.installAll(ctx, servers, t)
}

// installAll gives t to every one of servers, each on its own (one failing does not stop the
// others), trying a failed one again a few times; it returns the failures. A server left on an
// older table is found by the next snapshot (syncTables) or failed and recovered.
func (c *Coordinator) installAll(ctx context.Context, servers []ParameterServer, t *ps.OwnerTable) error {
	ctx = context.WithoutCancel(ctx) // a table half installed is worse than a slow one
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Go(func() {
			var err error
			for try, pause := 0, 20*time.Millisecond; try < 4; try, pause = try+1, 2*pause {
				ictx, cancel := context.WithTimeout(ctx, c.cfg.ServerTimeout)
				err = s.InstallTable(ictx, t)
				cancel()
				if err == nil || errors.Is(err, ErrSuperseded) {
					break
				}
				time.Sleep(pause)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("install owner table %d on %s: %w", t.Version, s.Node().ID, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// syncTables makes sure every one of servers has installed the job's table t before they
// snapshot: a server left on an older one (its install failed) would snapshot slots it gave
// away, and the commit would hold them twice. It installs t where it is missing.
func (c *Coordinator) syncTables(ctx context.Context, servers []ParameterServer, t *ps.OwnerTable) error {
	var stale []ParameterServer
	for _, s := range servers {
		have, err := s.Table(ctx)
		if err != nil {
			return fmt.Errorf("owner table of %s: %w", s.Node().ID, err)
		}
		if have == nil || have.Version != t.Version {
			stale = append(stale, s)
		}
	}
	if len(stale) == 0 {
		return nil
	}
	c.log.Warn("servers behind the job's owner table: installing it before the snapshot", "servers", len(stale), "table", t.Version)
	return c.installAll(ctx, stale, t)
}

// migratorFor returns the coordinator's migrator, made on first use.
func (c *Coordinator) migratorFor() (*ps.Migrator, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.migrator != nil {
		return c.migrator, nil
	}
	mc := c.cfg.Migration
	mc.Secret, mc.Logger = c.cfg.Secret, c.log
	if mc.Transport == nil {
		mc.Transport = c.cfg.Transport
	}
	if mc.TLS == nil {
		mc.TLS = c.cfg.TLS
	}
	m, err := ps.NewMigrator(mc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	c.migrator = m
	return m, nil
}

// moving records that the server count goes from from to to (Repartition), and returns what
// records its end, with its error.
func (c *Coordinator) moving(from, to int) func(error) {
	start := c.clock.now()
	c.repStatus.Lock()
	c.repStatus.s = &RepartitionStatus{Running: true, From: from, To: to}
	c.repStatus.Unlock()
	return func(err error) {
		step := c.stepNow()
		c.repStatus.Lock()
		c.repStatus.s.Running, c.repStatus.s.Duration = false, c.clock.now().Sub(start)
		c.repStatus.target = nil
		if err != nil {
			c.repStatus.s.Err = err.Error()
		}
		s := *c.repStatus.s
		c.repStatus.Unlock()
		c.prog.emit(ProgressEvent{Kind: EventMove, Step: step, Move: s})
	}
}

// movingTo records the owner table a move under way aims at (Status.Migrating).
func (c *Coordinator) movingTo(next *ps.OwnerTable) {
	c.repStatus.Lock()
	c.repStatus.target = next
	c.repStatus.Unlock()
}

// migrating returns the slots whose owner in served differs from the one the move under way
// gives them.
func (c *Coordinator) migrating(served *ps.OwnerTable) []int {
	c.repStatus.Lock()
	target := c.repStatus.target
	c.repStatus.Unlock()
	if target == nil || target.Slots != served.Slots {
		return nil
	}
	var out []int
	for sl := 0; sl < served.Slots; sl++ {
		if served.Owner(sl).ID != target.Owner(sl).ID {
			out = append(out, sl)
		}
	}
	return out
}

func (c *Coordinator) noteProgress(p ps.MigrationProgress) {
	c.repStatus.Lock()
	defer c.repStatus.Unlock()
	s := c.repStatus.s
	if s == nil {
		return
	}
	s.SlotsDone, s.SlotsTotal, s.Groups, s.Failed = p.SlotsDone, p.SlotsTotal, p.Groups, p.GroupsFailed
	s.Rows, s.MovedRows, s.Bytes, s.MaxFenced = p.Rows, p.BaseRows, p.Bytes, p.MaxFenced
}

// Repartition returns the newest change of the server count (nil: none yet).
func (c *Coordinator) Repartition() *RepartitionStatus {
	c.repStatus.Lock()
	defer c.repStatus.Unlock()
	if c.repStatus.s == nil {
		return nil
	}
	s := *c.repStatus.s
	return &s
}

// sameNodeIDs reports whether a and b (sorted by ID) name the same servers.
func sameNodeIDs(a, b []ps.Node) bool {
	return slices.EqualFunc(a, b, func(x, y ps.Node) bool { return x.ID == y.ID })
}

// errNoServerScaler is returned by SetPlan for a server count the scaler cannot provide.
var errNoServerScaler = errors.New("the scaler does not start or stop parameter servers")
