package autoscale_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/autoscale"
	"github.com/elasticps/elasticps/ps"
)

// fakeJob is a Job whose status the test writes and whose plans it records.
type fakeJob struct {
	mu    sync.Mutex
	st    elastic.Status
	plans []elastic.Plan
	// refuse fails this many SetPlan calls first.
	refuse int
}

func (j *fakeJob) Usage(context.Context) (elastic.Status, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.st, nil
}

func (j *fakeJob) SetPlan(_ context.Context, p elastic.Plan) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.refuse > 0 {
		j.refuse--
		return errors.New("the coordinator refused the plan")
	}
	j.plans = append(j.plans, p)
	j.st.Plan = p
	return nil
}

func (j *fakeJob) Rebalance(context.Context, float64, time.Duration, int) ([]ps.Move, error) {
	return nil, nil
}

// fakeSignals is a platform that tells what the test scripts.
type fakeSignals struct {
	plan     elastic.Plan
	pending  []autoscale.Pending
	kills    []autoscale.OOMKill
	restarts []string
}

func (s *fakeSignals) Plan() elastic.Plan           { return s.plan }
func (s *fakeSignals) Pending() []autoscale.Pending { return s.pending }
func (s *fakeSignals) RestartServer(_ context.Context, id, _ string) error {
	s.restarts = append(s.restarts, id)
	return nil
}

func (s *fakeSignals) OOMKills() []autoscale.OOMKill {
	k := s.kills
	s.kills = nil
	return k
}

var _ autoscale.Signals = (*fakeSignals)(nil)

func signalRunner(t *testing.T, job *fakeJob, sig *fakeSignals, cfg autoscale.Config) (*autoscale.Runner, *clock) {
	t.Helper()
	p, err := autoscale.NewPlanner(cfg)
	require.NoError(t, err)
	clk := &clock{now: time.Unix(1000, 0)}
	r, err := autoscale.NewRunner(autoscale.RunnerConfig{Job: job, Planner: p, Signals: sig, Now: clk.Now})
	require.NoError(t, err)
	return r, clk
}

const mib = 1 << 20

// A server the platform reports killed for lack of memory, which the job counts failed (so its
// Usage has no figures of it), is restarted with MemoryGrowth times the limit it went over, also
// when its resident memory last read above the limit: the runner gives the coordinator the
// platform's plan (the coordinator has none yet) with the servers' new memory, then asks the
// platform to restart it. A kill is answered once.
func TestSignalsOOMKillRestartsTheServerLarger(t *testing.T) {
	plan := elastic.Plan{Servers: 2, Workers: 2, Server: elastic.Resources{CPUs: 1, Memory: 100 * mib}}
	job := &fakeJob{st: elastic.Status{
		Servers: []elastic.ServerStatus{{ID: "ps-0", Pid: 10, ResidentBytes: 60 * mib}, {ID: "ps-1", Pid: 11, ResidentBytes: 140 * mib}},
		Workers: []elastic.WorkerStatus{{ID: "worker-0"}, {ID: "worker-1"}},
	}}
	sig := &fakeSignals{plan: plan}
	r, clk := signalRunner(t, job, sig, autoscale.Config{NearMemory: 2})
	ctx := context.Background()

	applied, err := r.Tick(ctx)
	require.NoError(t, err)
	assert.Empty(t, applied)

	job.mu.Lock()
	job.st.Servers[1] = elastic.ServerStatus{ID: "ps-1", Failed: true, Reason: "pod OOMKilled"}
	job.mu.Unlock()
	sig.kills = []autoscale.OOMKill{{ID: "ps-1", MemoryLimit: 100 * mib}}
	clk.now = clk.now.Add(time.Second)
	applied, err = r.Tick(ctx)
	require.NoError(t, err)
	require.Len(t, applied, 1)
	d := applied[0].Decision
	require.NoError(t, applied[0].Err)
	assert.Equal(t, autoscale.RestartServer, d.Kind)
	assert.Equal(t, "ps-1", d.Target)
	assert.Equal(t, int64(150*mib), d.Size.Memory, "MemoryGrowth times the limit it went over")
	assert.Contains(t, d.Reason, "killed for lack of memory")
	require.Len(t, job.plans, 1)
	want := plan
	want.Server.Memory = 150 * mib
	assert.Equal(t, want, job.plans[0], "the platform's plan, the servers' memory grown, the cores kept")
	assert.Equal(t, []string{"ps-1"}, sig.restarts)

	// The replacement serves; nothing more is killed: nothing more is done.
	job.mu.Lock()
	job.st.Servers[1] = elastic.ServerStatus{ID: "ps-1", Pid: 12, ResidentBytes: 90 * mib}
	job.mu.Unlock()
	for range 3 {
		clk.now = clk.now.Add(time.Second)
		applied, err = r.Tick(ctx)
		require.NoError(t, err)
		assert.Empty(t, applied)
	}
	assert.Len(t, sig.restarts, 1)
}

// A kill heard only once the job serves from the replacement, whose resident memory reads above
// the limit the killed one went over (shared pages the cgroup does not charge it), is answered
// at MemoryGrowth times that limit, as large as the platform's own replacement: not larger,
// which would restart the replacement once more.
func TestSignalsOOMKillHeardAfterTheReplacementServes(t *testing.T) {
	plan := elastic.Plan{Servers: 2, Workers: 1, Server: elastic.Resources{CPUs: 1, Memory: 100 * mib}}
	job := &fakeJob{st: elastic.Status{
		Servers: []elastic.ServerStatus{{ID: "ps-0", Pid: 10, ResidentBytes: 60 * mib}, {ID: "ps-1", Pid: 11, ResidentBytes: 90 * mib}},
		Workers: []elastic.WorkerStatus{{ID: "worker-0"}},
	}}
	sig := &fakeSignals{plan: plan}
	r, clk := signalRunner(t, job, sig, autoscale.Config{NearMemory: 2})
	ctx := context.Background()
	_, err := r.Tick(ctx)
	require.NoError(t, err)

	job.mu.Lock()
	job.st.Servers[1] = elastic.ServerStatus{ID: "ps-1", Pid: 12, ResidentBytes: 160 * mib}
	job.mu.Unlock()
	sig.kills = []autoscale.OOMKill{{ID: "ps-1", MemoryLimit: 100 * mib}}
	clk.now = clk.now.Add(time.Second)
	applied, err := r.Tick(ctx)
	require.NoError(t, err)
	require.Len(t, applied, 1)
	assert.Equal(t, autoscale.RestartServer, applied[0].Decision.Kind)
	assert.Equal(t, int64(150*mib), applied[0].Decision.Size.Memory, "MemoryGrowth times the limit, not the replacement's reading")
}

// A server whose process reports its memory cgroup is judged near its limit by the cgroup's
// charge against the cgroup's limit, with the default NearMemory: one whose resident memory
// reads above the limit (the flash checkpoint's shared pages, charged elsewhere) while its
// charge is well within it is left alone; once its charge reaches NearMemory of the cgroup's
// limit (not of the plan's server memory, here larger) it is restarted with MemoryGrowth times
// the cgroup's limit. A server that reports no cgroup is judged by its resident memory against
// the plan's server memory, as before.
func TestSignalsNearMemoryIsTheCgroupCharge(t *testing.T) {
	plan := elastic.Plan{Servers: 2, Workers: 1, Server: elastic.Resources{CPUs: 1, Memory: 128 * mib}}
	healthy := elastic.ServerStatus{ID: "ps-1", Pid: 11, ResidentBytes: 160 * mib, CgroupBytes: 80 * mib, CgroupLimitBytes: 112 * mib}
	job := &fakeJob{st: elastic.Status{
		Servers: []elastic.ServerStatus{{ID: "ps-0", Pid: 10, ResidentBytes: 60 * mib}, healthy},
		Workers: []elastic.WorkerStatus{{ID: "worker-0"}},
	}}
	sig := &fakeSignals{plan: plan}
	r, clk := signalRunner(t, job, sig, autoscale.Config{})
	ctx := context.Background()
	for range 3 {
		applied, err := r.Tick(ctx)
		require.NoError(t, err)
		assert.Empty(t, applied, "160 MiB resident, but 80 MiB charged of 112 MiB")
		clk.now = clk.now.Add(time.Second)
	}

	job.mu.Lock()
	job.st.Servers[1].CgroupBytes = 108 * mib
	job.mu.Unlock()
	applied, err := r.Tick(ctx)
	require.NoError(t, err)
	require.Len(t, applied, 1)
	d := applied[0].Decision
	assert.Equal(t, autoscale.RestartServer, d.Kind)
	assert.Equal(t, "ps-1", d.Target)
	assert.Equal(t, float64(108*mib), d.Value, "the charge")
	assert.Equal(t, float64(112*mib), d.Limit, "the cgroup's limit")
	assert.Equal(t, int64(168*mib), d.Size.Memory, "MemoryGrowth times the limit")
	assert.Contains(t, d.Reason, "uses 0.11 of 0.11 GiB")

	// No cgroup reported: the resident memory against the plan's server memory.
	job2 := &fakeJob{st: elastic.Status{
		Servers: []elastic.ServerStatus{{ID: "ps-0", Pid: 10, ResidentBytes: 60 * mib}, {ID: "ps-1", Pid: 11, ResidentBytes: 124 * mib}},
		Workers: []elastic.WorkerStatus{{ID: "worker-0"}},
	}}
	r2, _ := signalRunner(t, job2, &fakeSignals{plan: plan}, autoscale.Config{})
	applied, err = r2.Tick(ctx)
	require.NoError(t, err)
	require.Len(t, applied, 1)
	assert.Equal(t, float64(124*mib), applied[0].Decision.Value, "the resident memory")
	assert.Equal(t, float64(128*mib), applied[0].Decision.Limit, "the plan's server memory")
}

// A kill whose answer fails (the coordinator refused the plan) is answered at the next
// observation, though the platform tells of each kill once.
func TestSignalsOOMKillAnsweredAgainAfterAFailure(t *testing.T) {
	plan := elastic.Plan{Servers: 2, Workers: 1, Server: elastic.Resources{CPUs: 1, Memory: 100 * mib}}
	job := &fakeJob{refuse: 1, st: elastic.Status{
		Servers: []elastic.ServerStatus{{ID: "ps-0", Pid: 10, ResidentBytes: 60 * mib}, {ID: "ps-1", Failed: true}},
		Workers: []elastic.WorkerStatus{{ID: "worker-0"}},
	}}
	sig := &fakeSignals{plan: plan, kills: []autoscale.OOMKill{{ID: "ps-1", MemoryLimit: 100 * mib}}}
	r, clk := signalRunner(t, job, sig, autoscale.Config{NearMemory: 2})
	ctx := context.Background()
	applied, err := r.Tick(ctx)
	require.NoError(t, err)
	require.Len(t, applied, 1)
	require.Error(t, applied[0].Err, "the first answer fails")
	assert.Empty(t, sig.restarts)

	clk.now = clk.now.Add(time.Second)
	applied, err = r.Tick(ctx)
	require.NoError(t, err)
	require.Len(t, applied, 1, "the kill is answered again")
	require.NoError(t, applied[0].Err)
	assert.Equal(t, autoscale.RestartServer, applied[0].Decision.Kind)
	assert.Equal(t, []string{"ps-1"}, sig.restarts)

	clk.now = clk.now.Add(time.Second)
	applied, err = r.Tick(ctx)
	require.NoError(t, err)
	assert.Empty(t, applied, "answered once it took effect")
}

// A worker the platform reports pending for PendingFor, with the scheduler's reason, is given
// up: the coordinator's plan loses a worker, and the decision says what the scheduler said.
// Before PendingFor nothing is done.
func TestSignalsPendingWorkerIsGivenUp(t *testing.T) {
	plan := elastic.Plan{Servers: 2, Workers: 2, Worker: elastic.Resources{CPUs: 1, Memory: 600 * mib}}
	job := &fakeJob{st: elastic.Status{
		Servers: []elastic.ServerStatus{{ID: "ps-0"}, {ID: "ps-1"}},
		Workers: []elastic.WorkerStatus{{ID: "worker-0"}},
	}}
	const said = "0/1 nodes are available: 1 Insufficient memory."
	sig := &fakeSignals{plan: plan, pending: []autoscale.Pending{{ID: "worker-1", Role: autoscale.Worker,
		Size: autoscale.Resources{CPU: 1, Memory: 600 * mib}, Waited: time.Second, Reason: said}}}
	r, clk := signalRunner(t, job, sig, autoscale.Config{PendingFor: 3 * time.Second})
	ctx := context.Background()

	applied, err := r.Tick(ctx)
	require.NoError(t, err)
	assert.Empty(t, applied, "not pending for long enough yet")

	sig.pending[0].Waited = 3 * time.Second
	clk.now = clk.now.Add(2 * time.Second)
	applied, err = r.Tick(ctx)
	require.NoError(t, err)
	require.Len(t, applied, 1)
	require.NoError(t, applied[0].Err)
	d := applied[0].Decision
	assert.Equal(t, autoscale.ShrinkRequest, d.Kind)
	assert.Equal(t, "worker-1", d.Target)
	assert.Contains(t, d.Reason, said)
	require.Len(t, job.plans, 1)
	want := plan
	want.Workers = 1
	assert.Equal(t, want, job.plans[0], "the platform's plan less the pending worker")
}

// With the workers at MinWorkers, a pending worker is asked for again smaller instead.
func TestSignalsPendingWorkerAtMinWorkersShrinks(t *testing.T) {
	plan := elastic.Plan{Servers: 1, Workers: 2, Worker: elastic.Resources{CPUs: 2, Memory: 4 << 30}}
	job := &fakeJob{st: elastic.Status{Servers: []elastic.ServerStatus{{ID: "ps-0"}}, Workers: []elastic.WorkerStatus{{ID: "worker-0"}}}}
	sig := &fakeSignals{plan: plan, pending: []autoscale.Pending{{ID: "worker-1", Role: autoscale.Worker,
		Size: autoscale.Resources{CPU: 2, Memory: 4 << 30}, Waited: time.Minute}}}
	r, _ := signalRunner(t, job, sig, autoscale.Config{PendingFor: time.Second, MinWorkers: 2})
	applied, err := r.Tick(context.Background())
	require.NoError(t, err)
	require.Len(t, applied, 1)
	assert.Equal(t, autoscale.ShrinkRequest, applied[0].Decision.Kind)
	require.Len(t, job.plans, 1)
	assert.Equal(t, 2, job.plans[0].Workers)
	assert.Equal(t, elastic.Resources{CPUs: 1.5, Memory: 3 << 30}, job.plans[0].Worker, "ShrinkFactor times the request")
}
