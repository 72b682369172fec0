package autoscale_test

import (
	"context"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/autoscale"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scripted is a Job whose Usage returns its readings in turn.
type scripted struct{ readings []elastic.Status }

func (s *scripted) Usage(context.Context) (elastic.Status, error) {
	st := s.readings[0]
	s.readings = s.readings[1:]
	return st, nil
}

func (s *scripted) SetPlan(context.Context, elastic.Plan) error { return nil }

func (s *scripted) Rebalance(context.Context, float64, time.Duration, int) ([]ps.Move, error) {
	return nil, nil
}

// A server alone in its process is observed by its process's CPU time and resident memory; a
// server that shares its process, by its serving time and its tables' memory, as is a server
// whose process changed between the readings.
func TestObserveReadsWhatProcessesUse(t *testing.T) {
	const gib = 1 << 30
	reading := func(cpu, busy, up time.Duration, pid1 int) elastic.Status {
		return elastic.Status{Servers: []elastic.ServerStatus{
			{ID: "ps-0", Host: "h1", Pid: 100, CPU: cpu, Busy: busy, Uptime: up, MemoryBytes: gib, ResidentBytes: 3 * gib},
			{ID: "ps-1", Host: "h1", Pid: 7, SharedProcess: true, CPU: 5 * cpu, Busy: busy, Uptime: up, MemoryBytes: gib, ResidentBytes: 9 * gib},
			{ID: "ps-2", Host: "h2", Pid: pid1, CPU: cpu, Busy: busy, Uptime: up, MemoryBytes: gib, ResidentBytes: 2 * gib},
		}}
	}
	job := &scripted{readings: []elastic.Status{
		reading(time.Second, 500*time.Millisecond, 10*time.Second, 200),
		reading(3*time.Second, 1500*time.Millisecond, 14*time.Second, 201),
	}}
	planner, err := autoscale.NewPlanner(autoscale.Config{})
	require.NoError(t, err)
	at := time.Unix(1000, 0)
	r, err := autoscale.NewRunner(autoscale.RunnerConfig{Job: job, Planner: planner, ServerCPU: 2, Now: func() time.Time { return at }})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = r.Observe(ctx)
	require.NoError(t, err)
	at = at.Add(4 * time.Second)
	obs, err := r.Observe(ctx)
	require.NoError(t, err)
	require.Len(t, obs.Servers, 3)
	alone, shared, restarted := obs.Servers[0], obs.Servers[1], obs.Servers[2]

	assert.InDelta(t, 2.0/4/2, alone.CPU, 1e-9, "2 s of CPU in 4 s on 2 cores")
	assert.InDelta(t, 0.25, alone.Busy, 1e-9, "1 s of serving in 4 s")
	assert.Equal(t, int64(3*gib), alone.Memory, "the process's resident memory")

	assert.InDelta(t, 1.0/4/2, shared.CPU, 1e-9, "the serving time, not the shared process's CPU")
	assert.Zero(t, shared.Busy)
	assert.Equal(t, int64(gib), shared.Memory, "the tables' memory, not the shared process's")

	assert.InDelta(t, 1.0/4/2, restarted.CPU, 1e-9, "a new process's CPU time is not compared with the old one's: its serving time counts")
	assert.Zero(t, restarted.Busy)
	assert.Equal(t, int64(2*gib), restarted.Memory)
}
