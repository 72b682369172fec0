package kube

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/autoscale"
)

var _ autoscale.Signals = (*Scaler)(nil)

// resizePendingLocked asks again for the pods of a role whose size the plan changes (from prev
// to plan) and that the scheduler has not placed, at the new size: the fields plan sets replace
// the pod's own, so a pod grown after an OOM kill, or one whose template sets what the plan does
// not, is asked for again only when the plan itself changes. s.mu is held.
func (s *Scaler) resizePendingLocked(prev, plan elastic.Plan) {
	for _, n := range s.nodes {
		was, size := prev.Worker, plan.Worker
		if n.role == elastic.RoleServer {
			was, size = prev.Server, plan.Server
		}
		if size == was || size == (elastic.Resources{}) || n.finished || n.uid == "" || n.scheduled || n.stop != stopNone {
			continue
		}
		if n.redo != nil && n.redo.running {
			continue // a restart larger comes first
		}
		want := n.size
		if size.CPUs > 0 {
			want.CPUs = size.CPUs
		}
		if size.Memory > 0 {
			want.Memory = size.Memory
		}
		if want != n.size {
			n.redo = &redo{size: want}
		}
	}
	s.notifyLocked()
}

// Pending implements autoscale.Signals: the pods of the plan the scheduler has not placed, each
// with the size it asks for, how long since it was asked for at that size (a pod asked for
// again smaller, by a Scale, starts its wait again) and the scheduler's message. A pod is
// listed from its creation until it is placed: the scheduler takes a moment even when a node
// has room, which autoscale.Config.PendingFor is meant to be well above.
//
// With an autoscaler, Config.PendingTimeout is the last resort: it should be well above the
// autoscaler's PendingFor plus its period, so that a pending pod is asked for smaller, or given
// up, before its start fails with ErrPending.
func (s *Scaler) Pending() []autoscale.Pending {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []autoscale.Pending
	for _, n := range s.nodes {
		if n.finished || n.uid == "" || n.scheduled || n.stop != stopNone || n.asked.IsZero() {
			continue
		}
		role := autoscale.Worker
		if n.role == elastic.RoleServer {
			role = autoscale.Server
		}
		out = append(out, autoscale.Pending{ID: n.id, Role: role, Size: autoscale.Resources{CPU: n.size.CPUs, Memory: n.size.Memory},
			Waited: now.Sub(n.asked), Reason: n.unschedulable})
	}
	slices.SortFunc(out, func(a, b autoscale.Pending) int {
		if a.Role != b.Role {
			return int(b.Role) - int(a.Role) // servers first
		}
		return indexOf(a.ID) - indexOf(b.ID)
	})
	return out
}

// OOMKills implements autoscale.Signals: the servers whose pod the kernel killed for going over
// its memory limit since the previous call, each kill once, in order, with the limit it went
// over. The scaler has replaced each already with Config.OOMGrowth times the memory, within
// MaxRestarts; see RestartServer for what an autoscaler's answer then does.
func (s *Scaler) OOMKills() []autoscale.OOMKill {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.oomKills
	s.oomKills = nil
	return out
}

// RestartServer implements autoscale.Signals: it makes server id run at least the plan's server
// size (Plan().Server, which the autoscaler sets first with the coordinator's SetPlan): when its
// pod, running or on its way, is smaller, the pod is deleted at once and a new incarnation
// created at the plan's size, and the Reporter is told of the server's end, so that the
// coordinator restores its slots onto the new pod once it serves. It returns once that is asked
// for, not once the new pod runs.
//
// When the pod already has that size it does nothing: an OOM kill is answered by the scaler
// itself first (the pod replaced with Config.OOMGrowth times the limit it went over), and by an
// autoscaler later, which asks for autoscale.Config.MemoryGrowth times that limit; with the two
// factors equal (both 1.5 by default) the autoscaler's restart finds the replacement as large
// as it asks and only its plan's size changes (for the servers started later), so the kill is
// not answered twice. With a larger MemoryGrowth, the replacement is restarted once more,
// larger.
//
// An error wraps elastic.ErrInvalidConfig when the plan has no server id.
func (s *Scaler) RestartServer(ctx context.Context, id, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[id]
	if n == nil || n.role != elastic.RoleServer {
		return fmt.Errorf("%w: restart %s: the plan has no such server", elastic.ErrInvalidConfig, id)
	}
	if s.closed {
		return elastic.ErrClosed
	}
	want := s.plan.Server
	if n.redo != nil && n.redo.running {
		want = larger(want, n.redo.size) // a restart asked already: at least as large
	}
	if covers(n.size, want) || n.finished || n.stop != stopNone {
		return nil
	}
	n.redo = &redo{size: larger(n.size, want), running: true, reason: reason}
	s.notifyLocked()
	return nil
}
