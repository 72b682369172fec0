package elastic

import (
	"fmt"
	"slices"
	"time"

	"github.com/elasticps/elasticps/ps"
)

// The core's side of parameter-server failures: which server is failed, and how the job
// recovers, in three phases the driver's recoveryStep moves through:
//
//	drain    snapshots taken before the failure may commit for ServerTimeout; then ActAbandon
//	replace  ActProbe of the failed nodes, until each has a new incarnation or ReplaceWait passed
//	restore  ActRestore: the commit, the policy, the servers and the owner table
//
// restoreDone ends it; a server that failed meanwhile, or a failed restore, starts a new round.

// recPhase is where a recovery is.
type recPhase uint8

const (
	recDrain recPhase = iota
	recReplace
	recRestore
)

// server is what the core knows of a parameter server's health.
type server struct {
	node     ps.Node
	inc      uint64    // the incarnation admitted
	lastOK   time.Time // its last good answer
	failed   bool
	reason   string
	failedAt time.Time
	probed   time.Time // the last probe a worker's report (suspect) caused
	next     ps.Node   // failed: the new incarnation found at its node (nextInc 0: none yet)
	nextInc  uint64
}

// restorePlan is what ActRestore restores: the commit ev.Step under ev.Policy, onto servers
// (the job's afterwards, in its order) under table; replaced are the failed servers a new
// incarnation took over, with its incarnation; gaining those that load slots under Partial
// (the replacements, and the survivors the table gives slots they did not have).
type restorePlan struct {
	ev       RecoveryEvent
	replaced map[string]uint64
	servers  []ps.Node
	table    *ps.OwnerTable
	gaining  []string
}

// probeAnswer is a health answer from a failed server's node during a recovery.
type probeAnswer struct {
	node ps.Node
	inc  uint64
}

// admitServer records that the driver directs its calls at incarnation inc of node.
func (c *core) admitServer(now time.Time, node ps.Node, inc uint64) {
	c.tick(now)
	c.servers[node.ID] = &server{node: node, inc: inc, lastOK: c.now}
}

// failedServers returns the ids of the servers failed and not yet recovered: while there is
// one, no snapshot is taken and no slot moves.
func (c *core) failedServers() []string {
	var ids []string
	for id, s := range c.servers {
		if s.failed {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// health judges an answer of server id to a health call: the incarnation inc it answers as,
// or err when it did not answer. gossip, if set, is why it was asked (gossip declared it
// failed, a worker could not reach it): then no answer fails it at once, not after
// ServerTimeout.
func (c *core) health(now time.Time, id string, inc uint64, err error, gossip string) []action {
	c.tick(now)
	s := c.servers[id]
	switch {
	case s == nil || s.failed:
		return nil
	case err == nil && inc == s.inc:
		s.lastOK = c.now
		return nil
	case err == nil:
		return c.serverFailed(now, id, fmt.Sprintf("restarted (incarnation %x, was %x)", inc, s.inc))
	case gossip != "":
		return c.serverFailed(now, id, fmt.Sprintf("%s, and no answer: %v", gossip, err))
	case c.now.Sub(s.lastOK) > c.cfg.serverTimeout:
		return c.serverFailed(now, id, fmt.Sprintf("no answer for %v: %v", c.now.Sub(s.lastOK).Round(time.Millisecond), err))
	}
	return nil
}

// suspect returns the id of the server a worker could not reach (server is its id or address)
// if it is to be probed now, else "": reports within probeEvery of the last probe are folded
// into it.
func (c *core) suspect(now time.Time, server string) string {
	c.tick(now)
	for id, s := range c.servers {
		if (id == server || s.node.Addr == server) && !s.failed && c.now.Sub(s.probed) >= c.cfg.probeEvery {
			s.probed = c.now
			return id
		}
	}
	return ""
}

// serverFailed records that parameter server id failed: no barrier goes up until it is
// recovered and, under Rollback, no worker begins a batch meanwhile. The first failure asks
// the driver to recover (ActRecover); later ones join the recovery under way.
func (c *core) serverFailed(now time.Time, id, reason string) []action {
	c.tick(now)
	s := c.servers[id]
	if s == nil || s.failed {
		return nil
	}
	s.failed, s.reason, s.failedAt = true, reason, c.now
	c.serverFailures++
	if c.recovering {
		return nil
	}
	c.recovering, c.hold = true, !c.cfg.partial
	c.rec = recovery{phase: recDrain, since: c.now}
	return []action{{kind: actRecover, worker: id, reason: reason}}
}

// recoveryStep moves the recovery on at now, given the answers to the last ActProbe (nil:
// none since the last step), old the job's owner table and servers its servers, in order.
// After a drain, the snapshots not committed are abandoned. A node that answers a probe as
// another incarnation than the one admitted holds a replacement; the restore goes ahead once
// every failed server is replaced, or after a probe ReplaceWait has passed since the failure
// of each one that is not; until then, the nodes are probed.
func (c *core) recoveryStep(now time.Time, answers []probeAnswer, old *ps.OwnerTable, servers []ps.Node) []action {
	c.tick(now)
	if !c.recovering {
		return nil
	}
	var acts []action
	if c.rec.phase == recDrain {
		if len(c.snapshots) > 0 && c.now.Sub(c.rec.since) < c.cfg.serverTimeout {
			return nil // they may still commit: their state is whole
		}
		if len(c.snapshots) > 0 {
			c.abandoned = append(c.abandoned, c.snapshots...)
			acts = append(acts, action{kind: actAbandon, steps: slices.Clone(c.snapshots), reason: "a server failed before their commit"})
		}
		c.rec.phase, c.rec.since, answers = recReplace, c.now, nil
	}
	if c.rec.phase != recReplace {
		return acts
	}
	for _, a := range answers {
		if s := c.servers[a.node.ID]; s != nil && s.failed && a.inc != s.inc {
			s.next, s.nextInc = a.node, a.inc
		}
	}
	for _, id := range c.unreplaced() {
		if answers == nil || c.now.Sub(c.servers[id].failedAt) <= c.cfg.replaceWait {
			return append(acts, action{kind: actProbe, servers: c.unreplaced()})
		}
	}
	return append(acts, c.restoreAction(old, servers))
}

// unreplaced returns the failed servers no new incarnation has answered for yet.
func (c *core) unreplaced() []string {
	var ids []string
	for _, id := range c.failedServers() {
		if c.servers[id].nextInc == 0 {
			ids = append(ids, id)
		}
	}
	return ids
}

// restoreAction decides the restore: every failed server's slots go to its replacement, or,
// without one, to the survivors (only those slots move), and the policy says how.
func (c *core) restoreAction(old *ps.OwnerTable, servers []ps.Node) action {
	p := &restorePlan{ev: RecoveryEvent{Policy: Rollback, Step: c.committed, Failed: map[string]string{}, Replacement: c.now.Sub(c.rec.since)},
		replaced: map[string]uint64{}}
	if c.cfg.partial {
		p.ev.Policy = Partial
	}
	for _, n := range servers {
		if s := c.servers[n.ID]; s == nil || !s.failed {
			p.servers = append(p.servers, n)
		} else if s.nextInc != 0 {
			p.servers = append(p.servers, s.next)
		}
	}
	for _, id := range c.failedServers() {
		s := c.servers[id]
		if p.ev.Failed[id] = s.reason; s.nextInc != 0 {
			p.replaced[id] = s.nextInc
			p.ev.Replaced = append(p.ev.Replaced, id)
		}
		if p.ev.Detected.IsZero() || s.failedAt.Before(p.ev.Detected) {
			p.ev.Detected = s.failedAt
		}
	}
	c.rec.phase = recRestore
	act := action{kind: actRestore, plan: p, reason: "no parameter server is left, and none was replaced"}
	if len(p.servers) > 0 {
		var err error
		if p.table, err = recoveryTable(old, p.servers); err != nil {
			act.reason = err.Error()
			return act
		}
		p.ev.TableVersion, act.reason = p.table.Version, ""
	}
	for _, n := range p.servers { // a rollback restores every server whole
		have, want := old.SlotsOf(n.ID), p.table.SlotsOf(n.ID).Members()
		if c.cfg.partial && (p.replaced[n.ID] != 0 || slices.ContainsFunc(want, func(s int) bool { return !have.Has(s) })) {
			p.gaining = append(p.gaining, n.ID)
		}
	}
	return act
}

// restoreDone ends the restore ActRestore asked for: err is its failure. On success the
// replaced servers run as their new incarnation and the others are forgotten; if none failed
// meanwhile, the recovery is over (workers may begin again, their silence starting now, and a
// checkpoint due meanwhile starts). Otherwise another round begins and the error says why.
func (c *core) restoreDone(now time.Time, plan *restorePlan, err error) ([]action, error) {
	c.tick(now)
	if !c.recovering || c.rec.phase != recRestore {
		return nil, nil
	}
	c.rec = recovery{phase: recDrain, since: c.now}
	if err != nil {
		return nil, err
	}
	for id := range plan.ev.Failed {
		s := c.servers[id]
		if inc, ok := plan.replaced[id]; ok {
			c.servers[id] = &server{node: s.next, inc: inc, lastOK: c.now}
		} else {
			delete(c.servers, id)
		}
	}
	if ids := c.failedServers(); len(ids) > 0 {
		return nil, fmt.Errorf("parameter servers %v failed during the recovery", ids)
	}
	c.recovering, c.hold = false, false
	for _, m := range c.members {
		m.seen = c.now
	}
	return c.advance(), nil
}

// commitAbandoned reports whether the snapshot of step was abandoned by a recovery: it holds a
// state the job has left behind, and must not be committed.
func (c *core) commitAbandoned(step uint64) bool { return slices.Contains(c.abandoned, step) }

// voidBatches fails every worker in the middle of a batch (a partial recovery publishes the
// restored slots: their batches are trained again) and returns them.
func (c *core) voidBatches(now time.Time) ([]string, []action) {
	c.tick(now)
	var ids []string
	var acts []action
	for _, id := range c.sortedMembers() {
		if c.members[id].inBatch {
			ids = append(ids, id)
			acts = append(acts, c.failLocked(id, "in a batch during a partial recovery: the batch is trained again")...)
		}
	}
	return ids, acts
}
