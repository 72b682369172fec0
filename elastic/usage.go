package elastic

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Usage is Status with every server's counters read (ServerStatus's Uptime, Busy and
// MemoryBytes): what an autoscaler samples, taking differences between two readings. It reads
// every server of the owner table (one call each, like Rebalance's measurement); a server that
// does not answer, and one the owner table does not hold (failed, or not serving yet), has
// UsageError set. Usage fails only when ctx ends or the coordinator cannot
// make its migration client (Config.Secret unset).
func (c *Coordinator) Usage(ctx context.Context) (Status, error) {
	m, err := c.migratorFor()
	if err != nil {
		return Status{}, err
	}
	st := c.Status()
	read := make([]bool, len(st.Servers))
	for _, n := range c.holder.Get().Nodes {
		stats, err := m.ServerStats(ctx, n.Addr)
		if ctx.Err() != nil {
			return Status{}, ctx.Err()
		}
		i := slices.IndexFunc(st.Servers, func(s ServerStatus) bool { return s.ID == n.ID })
		if i < 0 {
			continue // a server that joined after the Status: the next reading has it
		}
		s := &st.Servers[i]
		read[i] = true
		if err != nil {
			s.UsageError = err.Error()
			continue
		}
		s.Uptime = stats.Uptime
		for _, sl := range stats.Slots {
			s.Busy += time.Duration(sl.BusyNanos)
		}
		for _, t := range stats.Tables {
			s.MemoryBytes += t.MemoryBytes
		}
	}
	for i := range st.Servers {
		if !read[i] {
			st.Servers[i].UsageError = "not in the owner table"
		}
	}
	return st, nil
}

// stepTimes times each worker's batches, from Begin to End.
type stepTimes struct {
	mu sync.Mutex
	w  map[string]*workerSteps
}

type workerSteps struct {
	began time.Time // zero when not in a batch
	steps uint64
	busy  time.Duration
}

func (s *stepTimes) begin(worker string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w == nil {
		s.w = map[string]*workerSteps{}
	}
	w := s.w[worker]
	if w == nil {
		w = &workerSteps{}
		s.w[worker] = w
	}
	w.began = now
}

func (s *stepTimes) end(worker string, now time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.w[worker]
	if w == nil || w.began.IsZero() {
		return
	}
	if ok {
		w.steps++
		w.busy += now.Sub(w.began)
	}
	w.began = time.Time{}
}

// all returns a copy of every worker's figures, by id.
func (s *stepTimes) all() map[string]workerSteps {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]workerSteps, len(s.w))
	for id, w := range s.w {
		out[id] = *w
	}
	return out
}
