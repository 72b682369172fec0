package elastic

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"
)

// Usage is what the job's processes use, as counters since each started: what an autoscaler
// samples, taking differences between two readings.
type Usage struct {
	Servers []ServerUsage
	Workers []WorkerUsage
}

// ServerUsage is one parameter server's counters (ps.Server.Stats).
type ServerUsage struct {
	ID string
	// Uptime is how long its process has run; it starts again at a restart.
	Uptime time.Duration
	// Busy is the time it spent serving rows since it started, summed over its slots: serving
	// is in-memory work, so this is close to its CPU time.
	Busy time.Duration
	// MemoryBytes is the memory its tables hold (rows and optimizer state): the part of its
	// memory that grows with the model.
	MemoryBytes int64
	// Err says why the server could not be read (the other fields are zero).
	Err error
}

// WorkerUsage is one worker's batches as the coordinator saw them: Steps batches applied and
// reported (Begin to End), which took Busy in all; the time a checkpoint barrier holds the
// workers does not count.
type WorkerUsage struct {
	ID    string
	Steps uint64
	Busy  time.Duration
}

// Usage reads every server of the owner table (one call each, like Rebalance's measurement)
// and the workers' batch times. A server that does not answer has Err set; Usage fails only
// when ctx ends or the coordinator cannot make its migration client (Config.Secret unset).
func (c *Coordinator) Usage(ctx context.Context) (Usage, error) {
	m, err := c.migratorFor()
	if err != nil {
		return Usage{}, err
	}
	var u Usage
	for _, n := range c.holder.Get().Nodes {
		st, err := m.ServerStats(ctx, n.Addr)
		if ctx.Err() != nil {
			return Usage{}, ctx.Err()
		}
		su := ServerUsage{ID: n.ID, Err: err}
		if err == nil {
			su.Uptime = st.Uptime
			for _, s := range st.Slots {
				su.Busy += time.Duration(s.BusyNanos)
			}
			for _, t := range st.Tables {
				su.MemoryBytes += t.MemoryBytes
			}
		}
		u.Servers = append(u.Servers, su)
	}
	u.Workers = c.steps.usage()
	return u, nil
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

func (s *stepTimes) usage() []WorkerUsage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]WorkerUsage, 0, len(s.w))
	for id, w := range s.w {
		out = append(out, WorkerUsage{ID: id, Steps: w.steps, Busy: w.busy})
	}
	slices.SortFunc(out, func(a, b WorkerUsage) int { return strings.Compare(a.ID, b.ID) })
	return out
}
