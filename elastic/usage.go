package elastic

import (
	"context"
	"slices"
	"time"

	"github.com/elasticps/elasticps/internal/procstat"
)

// Usage is Status with every server's counters read (ServerStatus's Uptime, Busy,
// MemoryBytes and its process's figures): what an autoscaler samples, taking differences between two readings. It reads
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
		p := stats.Process
		s.Host, s.Pid, s.CPU, s.ResidentBytes = p.Host, p.Pid, p.CPU, p.ResidentBytes
		s.CgroupBytes, s.CgroupLimitBytes = p.CgroupBytes, p.CgroupLimitBytes
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
	markShared(st.Servers, procstat.Read())
	return st, nil
}

// markShared sets SharedProcess on the servers whose process is the coordinator's (self) or
// another server's.
func markShared(servers []ServerStatus, self procstat.Sample) {
	type proc struct {
		host string
		pid  int
	}
	n := map[proc]int{{self.Host, self.Pid}: 1}
	for _, s := range servers {
		if s.Pid != 0 {
			n[proc{s.Host, s.Pid}]++
		}
	}
	for i := range servers {
		s := &servers[i]
		s.SharedProcess = s.Pid != 0 && n[proc{s.Host, s.Pid}] > 1
	}
}

// workerSteps times a worker's batches, from Begin to End.
type workerSteps struct {
	began time.Time // zero when not in a batch
	steps uint64
	busy  time.Duration
}
