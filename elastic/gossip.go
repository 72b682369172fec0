package elastic

import (
	"context"
	"fmt"
	"time"

	"github.com/elasticps/elasticps/ps"
)

// Observe feeds the coordinator one membership event; give it to MembershipConfig.OnEvent of
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
			c.probeServer(ev.Member.ID, fmt.Sprintf("gossip: %s", ev.Kind))
		case MemberJoined:
			c.probeServer(ev.Member.ID, "")
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

// probeServer asks server id for its health now and judges the answer as the health check
// does; gossip, if set, is why it was asked: a server gossip declared failed that does not
// answer is failed at once, not after ServerTimeout.
func (c *Coordinator) probeServer(id, gossip string) {
	c.mu.Lock()
	e := c.srvs[id]
	if e == nil || e.failed || c.closed || c.superseded != nil {
		c.mu.Unlock()
		return
	}
	s := e.ps
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.HealthEvery)
	defer cancel()
	h, err := s.Health(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.failed || e.ps != s {
		return // changed meanwhile
	}
	c.judgeLocked(e, h, err, c.clock.now(), gossip)
}

// judgeLocked acts on one health answer (h, or the call's error err) of e's server, at now;
// gossip, if set, is gossip's verdict on it, which makes a failed call fail the server at once.
func (c *Coordinator) judgeLocked(e *serverEntry, h ServerHealth, err error, now time.Time, gossip string) {
	id := e.ps.Node().ID
	switch {
	case err == nil && h.Leader > c.leading:
		c.supersededLocked(fmt.Errorf("%w: server %s follows coordinator incarnation %d, this one is %d", ErrSuperseded, id, h.Leader, c.leading))
	case err == nil && h.Incarnation == e.inc:
		e.lastOK = now
		if gossip != "" {
			c.log.Info("gossip declared a parameter server failed, but it answers: kept", "server", id, "gossip", gossip)
		}
	case err == nil:
		c.serverFailedLocked(id, fmt.Sprintf("restarted (incarnation %x, was %x)", h.Incarnation, e.inc))
	case gossip != "":
		c.serverFailedLocked(id, fmt.Sprintf("%s, and no answer: %v", gossip, err))
	case now.Sub(e.lastOK) > c.cfg.ServerTimeout:
		c.serverFailedLocked(id, fmt.Sprintf("no answer for %v: %v", now.Sub(e.lastOK).Round(time.Millisecond), err))
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
	var id string
	for sid, e := range c.srvs {
		if sid == server || e.ps.Node().Addr == server {
			id = sid
			break
		}
	}
	e := c.srvs[id]
	now := c.clock.now()
	if e == nil || e.failed || now.Sub(e.probed) < c.cfg.HealthEvery {
		c.mu.Unlock()
		return nil
	}
	e.probed = now
	c.mu.Unlock()
	c.probeServer(id, "a worker cannot reach it ("+reason+")")
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
