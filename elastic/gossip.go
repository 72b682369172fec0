package elastic

import (
	"context"
	"fmt"

	"github.com/elasticps/elasticps/ps"
)

// Observe feeds the coordinator one membership event; give it to membership.Config.OnEvent of
// the coordinator's process, so that failures are acted on as soon as gossip notices them
// rather than at the next health check, silence timeout or lease expiry. Gossip is a hint,
// never a verdict:
//
//   - a parameter server gossip declares failed (or gone) is asked for its health at once, and
//     failed only if it does not answer as the incarnation the coordinator admitted; a server
//     that answers is kept, whatever gossip says;
//   - a parameter server that joins as a new incarnation is asked at once too, so the restart
//     is noticed without waiting for the next health check;
//   - a worker (its Member.ID must be its Session's worker name) gossip declares failed is
//     fenced and its shards go back, unless the coordinator heard from it within HealthEvery:
//     a worker still calling is alive (say, a new process under the same name that joined
//     before its predecessor's failure was gossiped).
//
// Events of the coordinator role and of unknown nodes are ignored. Observe blocks for at most
// one health call, bounded by HealthEvery.
func (c *Coordinator) Observe(ev MemberEvent) {
	switch ev.Member.Role {
	case RoleServer:
		switch ev.Kind {
		case MemberFailed, MemberLeft:
			c.probe([]string{ev.Member.ID}, fmt.Sprintf("gossip: %s", ev.Kind), c.cfg.HealthEvery)
		case MemberJoined:
			c.probe([]string{ev.Member.ID}, "", c.cfg.HealthEvery)
		}
	case RoleWorker:
		if ev.Kind != MemberFailed && ev.Kind != MemberLeft {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed || c.superseded != nil {
			return
		}
		c.applyLocked(c.core.gossipFailed(c.clock.now(), ev.Member.ID, c.cfg.HealthEvery))
	}
}

// judgeLocked hands the core one health answer (h, or the call's error err) of server id;
// gossip, if set, is why it was asked, which makes a failed call fail the server at once. A
// server that follows a later coordinator shows that this one is superseded.
func (c *Coordinator) judgeLocked(id string, h ServerHealth, err error, gossip string) {
	switch s := c.core.servers[id]; {
	case err == nil && h.Leader > c.leading:
		c.supersededLocked(fmt.Errorf("%w: server %s follows coordinator incarnation %d, this one is %d", ErrSuperseded, id, h.Leader, c.leading))
	case c.closed || c.superseded != nil || s == nil:
	default:
		if err == nil && gossip != "" && h.Incarnation == s.inc {
			c.log.Info("a parameter server was reported failed, but it answers: kept", "server", id, "why", gossip)
		}
		n := c.core.serverFailures
		c.judgedLocked(id, n, c.core.health(c.clock.now(), id, h.Incarnation, err, gossip))
	}
}

// Suspect reports that a worker could not reach the parameter server at server (its node id or
// RPC address; reason says how), a failure signal like gossip's: the server is asked for its
// health at once and failed if it does not answer as the incarnation admitted, rather than
// after ServerTimeout. A server that answers is kept (the worker's link alone may be at fault).
// Reports about one server within HealthEvery of the last probe are folded into it. Sessions
// report on their own; unknown servers are ignored.
func (c *Coordinator) Suspect(ctx context.Context, server, reason string) error {
	c.mu.Lock()
	id := c.core.suspect(c.clock.now(), server)
	c.mu.Unlock()
	if id != "" {
		c.probe([]string{id}, "a worker cannot reach it ("+reason+")", c.cfg.HealthEvery)
	}
	return nil
}

// Unreachable implements ps.UnreachableReporter: a client (the coordinator as its Resolver)
// could not reach server at all, which Suspect looks into.
func (c *Coordinator) Unreachable(ctx context.Context, server string, err error) {
	c.Suspect(ctx, server, err.Error())
}

var _ ps.UnreachableReporter = (*Coordinator)(nil)

// suspecter is a Control that takes workers' reports of unreachable servers (Suspect): the
// Coordinator, and the stubs of the in-process job (package local) and of other processes
// (package remote).
type suspecter interface {
	Suspect(ctx context.Context, server, reason string) error
}

var _ suspecter = (*Coordinator)(nil)
