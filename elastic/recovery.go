package elastic

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/internal/wait"
	"github.com/elasticps/elasticps/ps"
	"golang.org/x/sync/errgroup"
)

// RecoveryPolicy says what a job does when a parameter server fails.
type RecoveryPolicy uint8

const (
	// Rollback returns the whole job to the newest commit: every server reloads its slots
	// (from its own shared memory where it still has them), the dispatcher and the ledger too,
	// and the workers join again. Exactly-once holds; the work since that commit is redone.
	Rollback RecoveryPolicy = iota
	// Partial (after CPR, Maeng et al., MLSys 2021) restores only the failed server's slots
	// from the newest commit, onto its replacement or onto the surviving servers, while the
	// others go on training. The updates those slots lost are counted (RecoveryEvent.Lost).
	Partial
)

// String returns "rollback" or "partial".
func (p RecoveryPolicy) String() string {
	switch p {
	case Rollback:
		return "rollback"
	case Partial:
		return "partial"
	}
	return fmt.Sprintf("RecoveryPolicy(%d)", uint8(p))
}

// MarshalText returns p's String: a policy is "rollback" or "partial" in a Status's JSON.
func (p RecoveryPolicy) MarshalText() ([]byte, error) {
	if p != Rollback && p != Partial {
		return nil, fmt.Errorf("%w: recovery policy %d", ErrInvalidConfig, uint8(p))
	}
	return []byte(p.String()), nil
}

// UnmarshalText parses what MarshalText returns.
func (p *RecoveryPolicy) UnmarshalText(b []byte) error {
	switch string(b) {
	case "rollback":
		*p = Rollback
	case "partial":
		*p = Partial
	default:
		return fmt.Errorf("%w: recovery policy %q (rollback or partial)", ErrInvalidConfig, b)
	}
	return nil
}

// RecoveryEvent reports one recovery from parameter-server failures. In a Status's JSON, the
// spans (Lost, Held), the skipped commits and Err are left out: they can be long, and their
// counts and the log tell the story.
type RecoveryEvent struct {
	Policy RecoveryPolicy `json:"policy"`
	// Failed are the servers that failed, with why.
	Failed map[string]string `json:"failed"`
	// Replaced are the failed servers a new incarnation took over; the slots of the others
	// went to the survivors.
	Replaced []string `json:"replaced,omitempty"`
	// Step is the commit restored (0: none yet, so restored slots start afresh).
	Step uint64 `json:"step"`
	// TableVersion is the owner table published at the end.
	TableVersion uint64 `json:"table_version"`
	// Detected is when the first failure was noticed; Replacement how long the wait for
	// replacements took; Duration the time from Detected until training could go on.
	Detected    time.Time     `json:"detected"`
	Replacement time.Duration `json:"replacement_ns"`
	Duration    time.Duration `json:"duration_ns"`
	// Partial only: the dataset positions trained since the commit and before the restored
	// slots were published, whose updates to those slots are lost (they count as trained);
	// LostRecords counts them and TrainedRecords is every position trained so far. The
	// positions of batches the commit already holds applied to the restored slots are not
	// among them but in Held: a batch applied before the commit and reported after it (after
	// a coordinator's takeover, or by a worker that died between its pushes and its report).
	Lost           []Span `json:"-"`
	LostRecords    int64  `json:"lost_records,omitempty"`
	TrainedRecords int64  `json:"trained_records,omitempty"`
	// Held are the positions trained since the commit (as Lost) whose batch the commit holds
	// applied to some of the restored slots, one Span per run of positions and table (a
	// batch, or positions below a shard's watermark, which the commit holds on every slot):
	// their updates of those slots are in the restored rows. Every push of a batch to a server holds all of
	// the batch's rows there, so a batch held on a server's slots lost nothing on them; only a
	// step function that pushed a part of a table's ids in one try and the rest in a later
	// try (after the commit) lost its updates of the other restored slots, which no server
	// can tell apart: a caller that knows the batch's ids can, with Slots.
	Held []Span `json:"-"`
	// Rollback only: Skipped are the commits newer than Step that could not be restored (a
	// chunk that fails its checksum, an object missing), newest first, each with the reason,
	// which names the object that failed. Each was moved aside (checkpoint's Quarantine):
	// Quarantined[i] is where Skipped[i] went, "" when moving it failed (logged; the commit is
	// then deleted). Step is the newest commit restored in their place.
	Skipped     []checkpoint.SkippedCommit `json:"-"`
	Quarantined []string                   `json:"quarantined,omitempty"`
	// Err is set when the attempt failed (it is tried again).
	Err error `json:"-"`
}

// LostShare is the share of the trained records whose effect on the restored slots was lost.
func (e RecoveryEvent) LostShare() float64 {
	if e.TrainedRecords == 0 {
		return 0
	}
	return float64(e.LostRecords) / float64(e.TrainedRecords)
}

// Span is the dataset positions [From, To) of a data epoch. In RecoveryEvent.Held it is the
// positions of one batch that the restored commit holds applied to Slots (restored slots,
// ascending) of Table; elsewhere Table and Slots are unset.
type Span struct {
	Epoch    int
	From, To int64
	Table    string
	Slots    []int
}

// serverEntry is how the coordinator reaches a parameter server; the core judges its health.
type serverEntry struct {
	ps   ParameterServer // the incarnation admitted
	next ParameterServer // a replacement handed to ReplaceServer
	cand ParameterServer // the last one a recovery's probe reached at its node
}

// serverList returns the servers the owner table names.
func (c *Coordinator) serverList() []ParameterServer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.servers)
}

// admit learns the incarnation of each server and directs later calls at it; it returns what
// each answered, by node id.
func (c *Coordinator) admit(ctx context.Context, servers []ParameterServer) (map[string]ServerHealth, error) {
	found := map[string]ServerHealth{}
	for _, s := range servers {
		h, err := s.Health(ctx)
		if err != nil {
			return nil, fmt.Errorf("elastic: health of %s: %w", s.Node().ID, err)
		}
		s.Admit(h.Incarnation)
		found[s.Node().ID] = h
		c.mu.Lock()
		c.srvs[s.Node().ID] = &serverEntry{ps: s}
		c.core.admitServer(c.clock.now(), s.Node(), h.Incarnation)
		c.mu.Unlock()
	}
	return found, nil
}

// lead makes incarnation inc the coordinator every one of servers obeys.
func (c *Coordinator) lead(ctx context.Context, servers []ParameterServer, inc uint64) error {
	c.mu.Lock()
	c.leading = max(c.leading, inc)
	c.mu.Unlock()
	return onEach(ctx, servers, func(ctx context.Context, _ int, s ParameterServer) error {
		if err := s.Lead(ctx, inc); err != nil {
			return fmt.Errorf("elastic: lead %s as incarnation %d: %w", s.Node().ID, inc, err)
		}
		return nil
	})
}

// ServerFailed reports that parameter server id failed, for a program that knows it for sure
// (its process is gone): it is failed at once, without a health call, and recovered under
// Config.Recovery. Hints go to Observe (gossip) and Suspect (a server not reached), which confirm
// first. Unknown ids are ignored.
func (c *Coordinator) ServerFailed(id, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.serverFailedLocked(id, reason)
}

func (c *Coordinator) serverFailedLocked(id, reason string) {
	if !c.closed && c.superseded == nil {
		n := c.core.serverFailures
		c.judgedLocked(id, n, c.core.serverFailed(c.clock.now(), id, reason))
	}
}

// judgedLocked applies the core's verdict acts on server id, logging a failure it noticed
// (failures: the core's count before).
func (c *Coordinator) judgedLocked(id string, failures int, acts []action) {
	if c.core.serverFailures > failures {
		c.log.Warn("parameter server failed", "server", id, "reason", c.core.servers[id].reason, "policy", c.cfg.Recovery)
	}
	c.applyLocked(acts)
}

// ReplaceServer hands the coordinator a new incarnation of one of its servers (same node id):
// the one it replaces is failed if it was not already, and s takes its slots when recovered.
// The embedded job uses it; a remote server that restarts at its address is found by Health.
func (c *Coordinator) ReplaceServer(s ParameterServer) error {
	id := s.Node().ID
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.srvs[id]
	if e == nil {
		return fmt.Errorf("%w: no parameter server %q in the job", ErrInvalidConfig, id)
	}
	e.next = s
	c.serverFailedLocked(id, "replaced")
	return nil
}

// monitor asks every server for its health and fails those that restarted or stopped
// answering.
func (c *Coordinator) monitor() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.HealthEvery)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			c.mu.Lock()
			ids := slices.Collect(maps.Keys(c.core.servers))
			c.mu.Unlock()
			c.probe(ids, "", max(c.cfg.HealthEvery, c.cfg.ServerTimeout/2))
		}
	}
}

// probe asks those of the servers ids that are not failed for their health at once, within
// timeout, and hands the core the answers (judgeLocked); why, if set, is why they were asked.
func (c *Coordinator) probe(ids []string, why string, timeout time.Duration) {
	servers, answers, errs := make([]ParameterServer, len(ids)), make([]ServerHealth, len(ids)), make([]error, len(ids))
	c.mu.Lock()
	for i, id := range ids {
		if e, s := c.srvs[id], c.core.servers[id]; e != nil && s != nil && !s.failed && !c.closed && c.superseded == nil {
			servers[i] = e.ps
		}
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, s := range servers {
		if s != nil {
			wg.Go(func() { answers[i], errs[i] = s.Health(ctx) })
		}
	}
	wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range ids {
		if e := c.srvs[id]; e != nil && servers[i] != nil && e.ps == servers[i] { // else changed meanwhile
			c.judgeLocked(id, answers[i], errs[i], why)
		}
	}
}

// recover carries out the recovery the core decided (actRecover): it moves it on
// (recoveryStep) at every change of the coordinator's state and every HealthEvery, probes the
// failed nodes and restores as the core says, until the core says it is over or the
// coordinator closes. It runs on the executor: no snapshot or fence runs meanwhile; and, but
// while it probes, with the table lock held: no move publishes a table meanwhile.
func (c *Coordinator) recover() {
	ctx, cancel := c.untilClosed(context.Background())
	defer cancel()
	tick := time.NewTicker(c.cfg.HealthEvery)
	defer tick.Stop()
	backoff := c.cfg.HealthEvery
	var answers []probeAnswer // the last probe's (nil: none since the last step)
	for ctx.Err() == nil {
		c.tableMu.Lock()
		c.mu.Lock()
		if !c.core.recovering {
			c.mu.Unlock()
			c.tableMu.Unlock()
			return
		}
		nodes := nodesOf(c.servers)
		acts := c.core.recoveryStep(c.clock.now(), answers, c.holder.Get(), nodes)
		changed, probed := c.changed, answers != nil
		c.mu.Unlock()
		answers = nil
		var probe []string
		var restored *RecoveryEvent
		for _, a := range acts {
			switch a.kind {
			case actAbandon:
				c.log.Warn("snapshots abandoned", "steps", a.steps, "reason", a.reason)
			case actProbe:
				probe = a.servers
			case actRestore:
				ev, err := c.restore(ctx, a)
				c.mu.Lock()
				more, err := c.core.restoreDone(c.clock.now(), a.plan, err)
				if ev.Err = err; err == nil {
					ev.Duration = c.clock.now().Sub(ev.Detected)
				}
				c.applyLocked(more)
				c.mu.Unlock()
				restored = &ev
			}
		}
		c.tableMu.Unlock()
		switch {
		case restored != nil:
			c.recoveryEvent(*restored)
			if restored.Err != nil {
				c.log.Warn("recovery failed; trying again", "err", restored.Err, "in", backoff)
				_ = wait.Sleep(ctx, backoff) // an ended ctx ends the loop
				backoff = min(2*backoff, 10*time.Second)
			}
			continue
		case probe != nil && probed:
			changed = nil // probe again a HealthEvery after the last probe
		case probe != nil:
			answers = c.probeNodes(ctx, probe) // the first probe of a round goes at once
			continue
		}
		select { // look again at the next change, or a while later (timeouts, probes)
		case <-changed:
		case <-tick.C:
		case <-ctx.Done():
		}
		if probe != nil {
			answers = c.probeNodes(ctx, probe)
		}
	}
}

// probeNodes asks the nodes of the failed servers ids for their health: the new incarnation
// handed to ReplaceServer, or whatever answers at the old one's address.
func (c *Coordinator) probeNodes(ctx context.Context, ids []string) []probeAnswer {
	answers := []probeAnswer{}
	for _, id := range ids {
		c.mu.Lock()
		e := c.srvs[id]
		cand := cmp.Or(e.next, e.ps)
		c.mu.Unlock()
		hctx, cancel := context.WithTimeout(ctx, c.cfg.HealthEvery)
		h, err := cand.Health(hctx)
		cancel()
		if err == nil {
			c.mu.Lock()
			e.cand = cand
			c.mu.Unlock()
			answers = append(answers, probeAnswer{node: cand.Node(), inc: h.Incarnation})
		}
	}
	return answers
}

// restore carries out a's plan, the table lock held, and makes its servers the job's.
func (c *Coordinator) restore(ctx context.Context, a action) (RecoveryEvent, error) {
	p := a.plan
	if p.table == nil {
		return p.ev, errors.New(a.reason)
	}
	servers := make([]ParameterServer, len(p.servers))
	replacement := map[string]ParameterServer{}
	c.mu.Lock()
	for i, n := range p.servers {
		if servers[i] = c.srvs[n.ID].ps; p.replaced[n.ID] != 0 {
			servers[i], replacement[n.ID] = c.srvs[n.ID].cand, c.srvs[n.ID].cand
		}
	}
	c.mu.Unlock()
	for id, s := range replacement {
		s.Admit(p.replaced[id])
	}
	ev, err := p.ev, error(nil)
	if ev.Policy == Partial {
		err = c.partial(ctx, p, servers, replacement, c.holder.Get(), &ev)
	} else {
		err = c.rollback(ctx, ev.Step, servers, p.table, &ev)
	}
	if err != nil {
		return ev, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.servers = servers
	for id := range p.ev.Failed {
		if r := replacement[id]; r != nil {
			c.srvs[id] = &serverEntry{ps: r}
		} else {
			delete(c.srvs, id)
		}
	}
	return ev, nil
}

func (c *Coordinator) recoveryEvent(ev RecoveryEvent) {
	c.mu.Lock()
	if ev.Err == nil {
		c.stats.Recoveries++
		c.stats.LastRecovery = ev
		c.stats.LostRecords += ev.LostRecords
	}
	c.mu.Unlock()
	if ev.Err == nil {
		level, msg := slog.LevelInfo, "recovered"
		if ev.LostRecords > 0 {
			level, msg = slog.LevelWarn, "recovered, losing updates"
		}
		c.log.Log(context.Background(), level, msg, "policy", ev.Policy, "failed", ev.Failed, "replaced", ev.Replaced, "step", ev.Step,
			"table", ev.TableVersion, "took", ev.Duration.Round(time.Millisecond), "lost_records", ev.LostRecords,
			"lost_share", fmt.Sprintf("%.3f%%", 100*ev.LostShare()))
		for i, s := range ev.Skipped {
			c.log.Warn("the recovery skipped a damaged commit: the training since the commit restored is done again",
				"skipped", s.Step, "restored", ev.Step, "err", s.Err, "quarantined", ev.Quarantined[i])
		}
	}
	c.prog.emit(ProgressEvent{Kind: EventRecovery, Step: c.stepNow(), Recovery: ev})
	if c.cfg.OnRecovery != nil {
		c.cfg.OnRecovery(ev)
	}
}

// onEach runs f on every one of servers (i its index) in parallel and returns the first error;
// f's ctx ends with it.
func onEach(ctx context.Context, servers []ParameterServer, f func(ctx context.Context, i int, s ParameterServer) error) error {
	g, gctx := errgroup.WithContext(ctx)
	for i, s := range servers {
		g.Go(func() error { return f(gctx, i, s) })
	}
	return g.Wait()
}

// nodesOf returns the nodes of servers, in order.
func nodesOf(servers []ParameterServer) []ps.Node {
	nodes := make([]ps.Node, len(servers))
	for i, s := range servers {
		nodes[i] = s.Node()
	}
	return nodes
}

// idsOf returns the node ids of servers, in order.
func idsOf(servers []ParameterServer) []string {
	ids := make([]string, len(servers))
	for i, s := range servers {
		ids[i] = s.Node().ID
	}
	return ids
}

// recoveryTable is the owner table after a recovery: the slots of old's servers that are not
// among nodes go where NewOwnerTable (with old as prev) would put them, and every other slot
// stays with its owner, however old was balanced (a live repartition or a rebalance leaves it
// so on purpose): a recovery restores only the slots it moves, so it must not move a live
// server's slots.
func recoveryTable(old *ps.OwnerTable, nodes []ps.Node) (*ps.OwnerTable, error) {
	cand, err := ps.NewOwnerTable(old.Version+1, old.Slots, nodes, old)
	if err != nil {
		return nil, err
	}
	present := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		present[n.ID] = true
	}
	var moves []ps.Move
	for s := range old.Slots {
		if o := old.Owner(s).ID; !present[o] {
			moves = append(moves, ps.Move{Slot: s, From: o, To: cand.Owner(s).ID})
		}
	}
	return old.WithMoves(old.Version+1, nodes, moves)
}

// rollback returns every server, the dispatcher and the ledger to the commit of step (or to
// the start of the job before any commit), under a new incarnation: every epoch issued so far
// is fenced, and the workers join again. A commit that turns out damaged (checkpointDamaged) is
// moved aside and the one before it restored instead, as Resume does; ev.Step says which.
//
// The core becomes the new incarnation only after the dispatcher is restored. A worker that
// joins while the rollback runs may take a lease of the dispatcher's state from before it; the
// restore voids that lease, but not the batch the worker already read of it. Joined before the
// core's restore, the worker holds an epoch of the old incarnation, so its Begin is refused and
// it joins again with a fresh reader. Were the core restored first, the worker would be a member
// of the new incarnation and train the stale batch as well as whoever takes the same positions
// from the restored dispatcher, out of their order in the shard, which the servers' records of
// applied batches rely on.
func (c *Coordinator) rollback(ctx context.Context, step uint64, servers []ParameterServer, table *ps.OwnerTable, ev *RecoveryEvent) error {
	var inc uint64
	for {
		ev.Step = step
		err := c.rollbackTo(ctx, step, servers, table, &inc)
		if err == nil {
			if len(ev.Skipped) > 0 {
				// Nothing above the commit restored may be restored later, nor collide with
				// the steps committed from now on: what could not be moved aside goes.
				return c.committer.DropAfter(ctx, step)
			}
			return nil
		}
		if step == 0 || !checkpointDamaged(err) {
			return err
		}
		if step, err = c.setAside(ctx, step, err, &ev.Skipped, &ev.Quarantined); err != nil {
			return err
		}
	}
}

// rollbackTo is one attempt of rollback at the commit of step, as incarnation *inc; the first
// (*inc 0) claims the job as a new incarnation and has the servers follow it.
func (c *Coordinator) rollbackTo(ctx context.Context, step uint64, servers []ParameterServer, table *ps.OwnerTable, inc *uint64) error {
	disp, led, err := c.commitData(ctx, step)
	if err != nil {
		return err
	}
	done, err := c.commitProgress(ctx, step)
	if err != nil {
		return err
	}
	if *inc == 0 {
		if *inc, err = c.newIncarnation(ctx, step, 0, nil); err != nil {
			return err
		}
		if err := c.lead(ctx, servers, *inc); err != nil {
			return err
		}
	}
	// Every epoch issued so far, and every one the core issues until its restore below, is
	// below the floor.
	if err := c.fence(ctx, servers, *inc<<32, nil); err != nil {
		return err
	}
	if err := c.restoreEach(ctx, servers, step, table, RestoreAll); err != nil {
		return err
	}
	if f := c.beforeDispatcherRestore.Load(); f != nil {
		(*f)()
	}
	if err := c.svc.restore(disp, led); err != nil {
		return fmt.Errorf("elastic: commit %d: dispatcher: %w", step, err)
	}
	c.mu.Lock()
	c.core.restore(step, step, *inc)
	c.fenced = nil
	c.committedDone = done
	if step > 0 {
		c.stats.LastCommitted = step
	}
	c.applyLocked(nil) // workers held in Begin learn now that they must join again
	c.mu.Unlock()
	c.clock.reset() // a barrier the failure interrupted never comes down
	return c.install(ctx, servers, table)
}

// partial restores the slots the failed servers had, from the commit p restores, onto the
// servers p says take them (replacements, or survivors under the new table), while the others
// go on.
func (c *Coordinator) partial(ctx context.Context, p *restorePlan, servers []ParameterServer, replacement map[string]ParameterServer, old *ps.OwnerTable, ev *RecoveryEvent) error {
	step, table := p.ev.Step, p.table
	c.mu.Lock()
	floor, fenced := c.core.floor(), slices.Clone(c.fenced)
	c.mu.Unlock()
	gaining := slices.DeleteFunc(slices.Clone(servers), func(s ParameterServer) bool { return !slices.Contains(p.gaining, s.Node().ID) })
	reps := slices.Collect(maps.Values(replacement))
	// A replacement follows this coordinator and refuses whatever the survivors refuse before
	// it serves anything.
	if err := c.lead(ctx, reps, floor>>32); err != nil {
		return err
	}
	if err := c.fence(ctx, reps, floor, fenced); err != nil {
		return err
	}
	if err := c.restoreEach(ctx, gaining, step, table, RestoreNew); err != nil {
		return err
	}
	_, led, err := c.commitData(ctx, step)
	if err != nil {
		return err
	}
	held, err := c.heldBatches(ctx, step, old, ev.Failed)
	if err != nil {
		return err
	}
	// A batch in flight may have reached the failed server and not yet be reported: counted
	// below it would not be, and its updates of the restored slots would be lost unseen. Its
	// worker is failed (fenced, its leases back at their reported offsets), so the batch is
	// trained again: the servers that applied it skip it, those that took the restored slots
	// apply it. A batch reported before the count is counted.
	c.mu.Lock()
	voided, acts := c.core.voidBatches(c.clock.now()) // each logged as its worker is evicted
	c.applyLocked(acts)
	granted := c.disp.Granted()
	c.mu.Unlock()
	// What was trained from the commit until the table is published updated the failed
	// slots on a server that is gone: count it, at the moment before the servers that now
	// hold those slots start taking updates, but the batches the commit holds on them.
	// The voided workers' shards go back without counting a failure (the shards are not at
	// fault; several recoveries in one epoch must not fail them), and only those they held
	// when voided: one that joined again since keeps what it took after.
	c.svc.mu.Lock()
	for _, w := range voided {
		c.svc.evictLocked(w, granted, false)
	}
	ev.Lost, ev.LostRecords, ev.Held = c.svc.ledger.sinceHeld(led, held)
	ev.TrainedRecords = c.svc.ledger.trained()
	err = c.install(ctx, servers, table)
	c.svc.mu.Unlock()
	return err
}

// heldBatches returns the batches the commit of step holds applied to the slots failed held
// in old (what Partial restores): the applied states the servers saved with their rows. A
// batch applied before the commit and reported after it is among them; its updates of those
// slots are not lost.
func (c *Coordinator) heldBatches(ctx context.Context, step uint64, old *ps.OwnerTable, failed map[string]string) ([]heldBatch, error) {
	if step == 0 || c.committer == nil {
		return nil, nil
	}
	restored := make([]bool, old.Slots)
	var all []int // every restored slot
	for id := range failed {
		for _, s := range old.SlotsOf(id).Members() {
			restored[s], all = true, append(all, s)
		}
	}
	slices.Sort(all)
	blobs, err := c.committer.NodeBlobs(ctx, step, func(_, name string) bool { return name == AppliedBlob })
	if err != nil {
		return nil, fmt.Errorf("elastic: commit %d: applied batches: %w", step, err)
	}
	type shardKey struct {
		table string
		shard ps.DataShard
	}
	type key struct {
		table string
		pos   ps.Position
	}
	states := make([]map[string]map[ps.DataShard]ps.AppliedShard, len(blobs))
	through := map[shardKey]int64{} // a watermark holds for every slot: the highest of the servers'
	for i, b := range blobs {
		state, err := ps.DecodeApplied(b.Data)
		if err != nil {
			return nil, fmt.Errorf("elastic: commit %d: applied batches of %s: %w", step, b.Node, err)
		}
		states[i] = state
		for table, shards := range state {
			for k, r := range shards {
				sk := shardKey{table, k}
				through[sk] = max(through[sk], r.Through)
			}
		}
	}
	slots := map[key][]int{} // a batch's slots may be on several servers' checkpoints
	for _, state := range states {
		for table, shards := range state {
			for k, r := range shards {
				for _, bt := range r.Batches {
					if bt.End <= through[shardKey{table, k}] {
						continue // below another server's watermark: held on every slot
					}
					for _, s := range bt.Slots {
						if int(s) < len(restored) && restored[s] {
							k := key{table, ps.Position{Epoch: k.Epoch, Shard: k.Shard, Start: bt.Start, End: bt.End}}
							slots[k] = append(slots[k], int(s))
						}
					}
				}
			}
		}
	}
	held := make([]heldBatch, 0, len(slots)+len(through))
	for sk, t := range through {
		if t > 0 && len(all) > 0 {
			held = append(held, heldBatch{table: sk.table, pos: ps.Position{Epoch: sk.shard.Epoch, Shard: sk.shard.Shard, Start: 0, End: t}, slots: all})
		}
	}
	for k, ss := range slots {
		slices.Sort(ss)
		held = append(held, heldBatch{table: k.table, pos: k.pos, slots: slices.Compact(ss)})
	}
	return held, nil
}

// restoreEach runs Restore on servers in parallel.
func (c *Coordinator) restoreEach(ctx context.Context, servers []ParameterServer, step uint64, table *ps.OwnerTable, mode RestoreMode) error {
	return onEach(ctx, servers, func(ctx context.Context, _ int, s ParameterServer) error {
		if err := s.Restore(ctx, step, table, mode); err != nil {
			return fmt.Errorf("restore step %d on %s: %w", step, s.Node().ID, err)
		}
		return nil
	})
}

// commitData reads the dispatcher's state and the ledger of the commit of step; step 0 is the
// start of the job.
func (c *Coordinator) commitData(ctx context.Context, step uint64) ([]byte, *ledger, error) {
	if step == 0 {
		return c.initial, newLedger(), nil
	}
	if c.committer == nil {
		return nil, nil, fmt.Errorf("%w: no checkpoint storage", ErrInvalidConfig)
	}
	disp, err := c.committer.Blob(ctx, step, blobDispatcher)
	if err != nil {
		return nil, nil, fmt.Errorf("elastic: commit %d: %w", step, err)
	}
	raw, err := c.committer.Blob(ctx, step, blobLedger)
	if err != nil {
		return nil, nil, fmt.Errorf("elastic: commit %d: %w", step, err)
	}
	led, err := decodeLedger(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("elastic: commit %d: %w", step, err)
	}
	return disp, led, nil
}
