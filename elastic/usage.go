package elastic

import (
	"context"
	"slices"
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

// workerSteps times a worker's batches, from Begin to End.
type workerSteps struct {
	began time.Time // zero when not in a batch
	steps uint64
	busy  time.Duration
}
