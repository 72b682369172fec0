package statuspage

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/elasticps/elasticps/elastic"
)

// noteLocked records the status st read at now: the throughput and rates since the previous
// sample, a point of each series observed since, the members, and the changes between the two.
func (p *Page) noteLocked(now time.Time, st elastic.Status) {
	prev, prevAt, first := p.mu.status, p.mu.at, p.mu.at.IsZero()
	dt := now.Sub(prevAt).Seconds()
	if first {
		p.eventLocked(now, EventJob, fmt.Sprintf("watching job %s: %s, %s, phase %s", st.Job,
			count(len(st.Servers), "server"), count(len(st.Workers), "worker"), st.Phase))
	} else {
		p.changesLocked(now, prev, st)
		if dt > 0 {
			p.mu.series[SeriesThroughput].points.push(Point{At: now, V: float64(trained(prev, st)) / dt})
		}
	}
	if st.LastRecovery != nil && (first || st.Recoveries != prev.Recoveries) {
		p.recoveryLocked(now, *st.LastRecovery)
	}
	for _, name := range p.mu.order[1:] {
		if s := p.mu.series[name]; s.n > 0 {
			s.points.push(Point{At: now, V: s.sum / float64(s.n)})
			s.sum, s.n = 0, 0
		}
	}
	if first {
		dt = 0
	}
	p.mu.members = members(p.mu.members, prev, st, dt)
	p.mu.at, p.mu.status = now, st
}

// trained returns the records trained from prev to cur, across epochs; a data position that
// went back (a rollback to a commit) counts nothing.
func trained(prev, cur elastic.Status) int64 {
	switch {
	case cur.Epoch == prev.Epoch:
		return max(0, cur.EpochDone-prev.EpochDone)
	case cur.Epoch > prev.Epoch:
		// The rest of prev's epoch, the epochs between, and cur's so far.
		return max(0, prev.EpochRecords-prev.EpochDone) + int64(cur.Epoch-prev.Epoch-1)*prev.EpochRecords + cur.EpochDone
	}
	return 0
}

// members returns the servers and workers of st, with their rates since prev (dt seconds
// before; 0: none); old are the members of prev, whose host and process carry over a sample
// that lacks the servers' counters.
func members(old []Member, prev, st elastic.Status, dt float64) []Member {
	slots, migrating := ownership(st)
	out := make([]Member, 0, len(st.Servers)+len(st.Workers))
	for _, s := range st.Servers {
		m := Member{Role: RoleServer, ID: s.ID, Addr: s.Addr, Health: HealthServing, Incarnation: s.Incarnation,
			Slots: slots[s.ID], Migrating: migrating[s.ID], Unheard: s.Unheard}
		switch {
		case s.Failed:
			m.Health, m.Reason = HealthFailed, s.Reason
		case s.Silent:
			m.Health = HealthSilent
		}
		usage(&m, s)
		i := slices.IndexFunc(prev.Servers, func(ps elastic.ServerStatus) bool { return ps.ID == s.ID })
		if i >= 0 && dt > 0 && prev.Servers[i].Incarnation == s.Incarnation {
			m.CPU = cpu(prev.Servers[i], s, dt)
		}
		if j := slices.IndexFunc(old, func(o Member) bool { return o.Role == RoleServer && o.ID == s.ID }); j >= 0 && old[j].Incarnation == s.Incarnation {
			m.Host, m.Pid = cmp.Or(m.Host, old[j].Host), cmp.Or(m.Pid, old[j].Pid)
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	nServers := len(out)
	for _, w := range st.Workers {
		m := Member{Role: RoleWorker, ID: w.ID, Health: HealthIdle, Unheard: w.Unheard, Steps: w.Steps}
		if w.InBatch {
			m.Health = HealthBatch
		}
		i := slices.IndexFunc(prev.Workers, func(pw elastic.WorkerStatus) bool { return pw.ID == w.ID })
		if i >= 0 && dt > 0 && w.Steps >= prev.Workers[i].Steps {
			m.StepsPerSecond = float64(w.Steps-prev.Workers[i].Steps) / dt
		}
		out = append(out, m)
	}
	slices.SortFunc(out[nServers:], func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// changesLocked records the changes from prev to cur as events.
func (p *Page) changesLocked(now time.Time, prev, cur elastic.Status) {
	if cur.Plan != prev.Plan {
		if prev.Plan == (elastic.Plan{}) {
			p.eventLocked(now, EventPlan, "plan: "+cur.Plan.String())
		} else {
			p.eventLocked(now, EventPlan, fmt.Sprintf("plan: %s → %s", prev.Plan, cur.Plan))
		}
	}
	if r := cur.Repartition; r != nil && repartitionChanged(prev.Repartition, r) {
		p.eventLocked(now, EventRepartition, repartitionText(r))
	}
	before := map[string]elastic.ServerStatus{}
	for _, s := range prev.Servers {
		before[s.ID] = s
	}
	for _, s := range cur.Servers {
		b, ok := before[s.ID]
		delete(before, s.ID)
		switch {
		case !ok:
			p.eventLocked(now, EventServer, fmt.Sprintf("%s joined at %s", s.ID, s.Addr))
		case s.Failed && !b.Failed:
			p.eventLocked(now, EventServer, fmt.Sprintf("%s failed: %s", s.ID, s.Reason))
		case s.Incarnation != b.Incarnation && b.Incarnation != 0 && s.Incarnation != 0:
			p.eventLocked(now, EventServer, fmt.Sprintf("%s restarted at %s", s.ID, s.Addr))
		case !s.Failed && b.Failed:
			p.eventLocked(now, EventServer, fmt.Sprintf("%s serving again", s.ID))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(before)) {
		p.eventLocked(now, EventServer, id+" left")
	}
	workers := map[string]bool{}
	for _, w := range prev.Workers {
		workers[w.ID] = true
	}
	for _, w := range cur.Workers {
		if !workers[w.ID] {
			p.eventLocked(now, EventWorker, w.ID+" joined")
		}
		delete(workers, w.ID)
	}
	for _, id := range slices.Sorted(maps.Keys(workers)) {
		p.eventLocked(now, EventWorker, id+" left")
	}
	switch {
	case cur.Finished && !prev.Finished:
		p.eventLocked(now, EventJob, fmt.Sprintf("every epoch trained (%d)", cur.Epochs))
	case cur.Phase != prev.Phase && (cur.Phase == "stopped" || cur.Phase == "superseded"):
		p.eventLocked(now, EventJob, "coordinator "+cur.Phase)
	}
}

// repartitionChanged reports whether the repartition cur began, ended or is another than prev.
func repartitionChanged(prev, cur *elastic.RepartitionStatus) bool {
	if prev == nil {
		return true
	}
	if prev.From != cur.From || prev.To != cur.To || prev.Running != cur.Running || prev.Err != cur.Err {
		return true
	}
	return !cur.Running && prev.Duration != cur.Duration
}

func repartitionText(r *elastic.RepartitionStatus) string {
	head := fmt.Sprintf("servers %d → %d", r.From, r.To)
	switch {
	case r.Running:
		return head + ": moving slots"
	case r.Err != "":
		return fmt.Sprintf("%s failed after %v, %d of %d slots moved: %s", head, r.Duration.Round(time.Millisecond), r.SlotsDone, r.SlotsTotal, r.Err)
	}
	return fmt.Sprintf("%s: %d slots moved in %v (%s), longest fence %v", head, r.SlotsDone, r.Duration.Round(time.Millisecond),
		bytesText(r.Bytes), r.MaxFenced.Round(time.Microsecond))
}

func recoveryText(r Recovery) string {
	ids := slices.Sorted(maps.Keys(r.Failed))
	if r.Err != "" {
		return fmt.Sprintf("recovery of %s failed (tried again): %s", strings.Join(ids, ", "), r.Err)
	}
	from := fmt.Sprintf("the commit of step %d", r.Step)
	if r.Step == 0 {
		from = "scratch (no commit yet)"
	}
	s := fmt.Sprintf("%s recovered by %s from %s in %v", strings.Join(ids, ", "), r.Policy, from, r.Duration.Round(time.Millisecond))
	if r.LostRecords > 0 {
		s += fmt.Sprintf(", updates of %d records lost", r.LostRecords)
	}
	return s
}

// count returns "1 server", "2 servers".
func count(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// bytesText returns n in B, KiB, MiB or GiB.
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), 0
	for v >= unit && i < 3 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", v, [...]string{"B", "KiB", "MiB", "GiB"}[i])
}
