package statuspage

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/elastictest"
)

// fakeSource is a Source a test sets the status of.
type fakeSource struct {
	mu sync.Mutex
	st elastic.Status
}

func (f *fakeSource) Status() elastic.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return cloneStatus(f.st)
}

func (f *fakeSource) set(change func(st *elastic.Status)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(&f.st)
}

// newFakeClock is a clock a test moves.
func newFakeClock() *elastictest.Clock {
	return elastictest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
}

// twoServers is a job of two servers owning four slots each and two workers.
func twoServers() elastic.Status {
	return elastic.Status{Job: "ctr", Phase: "training", Recovery: "rollback", Epochs: 2, EpochRecords: 10000,
		TableVersion: 1,
		Servers: []elastic.ServerStatus{
			{ID: "ps-0", Addr: "127.0.0.1:7000", Incarnation: 11},
			{ID: "ps-1", Addr: "127.0.0.1:7001", Incarnation: 12},
		},
		Workers: []elastic.WorkerStatus{{ID: "worker-0", Epoch: "1.1"}, {ID: "worker-1", Epoch: "1.2"}},
		Owners:  []string{"ps-0", "ps-1", "ps-0", "ps-1", "ps-0", "ps-1", "ps-0", "ps-1"},
	}
}

func newTestPage(t *testing.T, cfg Config) (*Page, *fakeSource, *elastictest.Clock) {
	t.Helper()
	src, clk := &fakeSource{st: twoServers()}, newFakeClock()
	if cfg.Source == nil {
		cfg.Source = src
	}
	cfg.Now = clk.Now
	p, err := New(cfg)
	require.NoError(t, err)
	return p, src, clk
}

func TestConfigValidate(t *testing.T) {
	_, err := New(Config{Every: -1, History: -2, Events: -3, MaxSeries: -4})
	require.ErrorIs(t, err, ErrInvalidConfig)
	for _, field := range []string{"Every", "History", "Events", "MaxSeries"} {
		assert.ErrorContains(t, err, field, "every problem is reported at once")
	}
	p, err := New(Config{})
	require.NoError(t, err, "every field has a default; the source may come later")
	assert.Equal(t, DefaultEvery, p.cfg.Every)
	p.Sample(context.Background())
	assert.True(t, p.Snapshot().At.IsZero(), "without a source there is nothing to sample")
}

func TestThroughput(t *testing.T) {
	ctx := context.Background()
	p, src, clk := newTestPage(t, Config{})
	p.Sample(ctx)
	clk.Advance(2 * time.Second)
	src.set(func(st *elastic.Status) { st.EpochDone = 3000 })
	p.Sample(ctx)
	clk.Advance(time.Second)
	src.set(func(st *elastic.Status) { st.Epoch, st.EpochDone = 1, 500 }) // 7000 to end epoch 0, 500 of epoch 1
	p.Sample(ctx)
	clk.Advance(time.Second)
	src.set(func(st *elastic.Status) { st.EpochDone = 100 }) // a rollback
	p.Sample(ctx)

	s := p.Snapshot()
	require.Equal(t, SeriesThroughput, s.Series[0].Name)
	assert.Equal(t, "records/s", s.Series[0].Unit)
	var got []float64
	for _, pt := range s.Series[0].Points {
		got = append(got, pt.V)
	}
	assert.Equal(t, []float64{1500, 7500, 0}, got, "the first sample has nothing to compare with")
	assert.Equal(t, clk.Now(), s.At)
}

func TestObserve(t *testing.T) {
	ctx := context.Background()
	p, _, clk := newTestPage(t, Config{History: 3, MaxSeries: 2})
	p.Observe("loss", 0.7)
	p.Observe("loss", 0.5)
	p.Observe("loss", math.NaN())
	p.Observe("auc", math.Inf(1))
	p.Observe(SeriesThroughput, 5) // the page's own
	p.Sample(ctx)
	p.Observe("auc", 0.61)
	p.Observe("extra", 1) // a third series: refused
	clk.Advance(time.Second)
	p.Sample(ctx)
	for i := range 5 {
		p.Observe("loss", float64(i))
		clk.Advance(time.Second)
		p.Sample(ctx)
	}

	s := p.Snapshot()
	names := []string{}
	for _, se := range s.Series {
		names = append(names, se.Name)
	}
	require.Equal(t, []string{SeriesThroughput, "loss", "auc"}, names, "in the order they came; the third refused")
	loss := s.Series[1].Points
	require.Len(t, loss, 3, "History bounds every series")
	assert.Equal(t, []float64{2, 3, 4}, []float64{loss[0].V, loss[1].V, loss[2].V}, "the newest points")
	assert.Equal(t, clk.Now(), loss[2].At)
	require.Len(t, s.Series[2].Points, 1, "a period with no value adds no point")
	assert.Equal(t, 0.61, s.Series[2].Points[0].V)

	p2, _, _ := newTestPage(t, Config{})
	p2.Observe("loss", 0.7)
	p2.Observe("loss", 0.5)
	p2.Sample(ctx)
	assert.InDelta(t, 0.6, p2.Snapshot().Series[1].Points[0].V, 1e-12, "a point is the mean of the period's values")
}

func TestEvents(t *testing.T) {
	ctx := context.Background()
	p, src, clk := newTestPage(t, Config{})
	step := func(change func(st *elastic.Status)) {
		clk.Advance(time.Second)
		src.set(change)
		p.Sample(ctx)
	}
	p.Sample(ctx)
	step(func(st *elastic.Status) { st.Plan = elastic.Plan{Servers: 2, Workers: 2} })
	step(func(st *elastic.Status) {
		st.Plan.Servers = 3
		st.Repartition = &elastic.RepartitionStatus{Running: true, From: 2, To: 3}
		st.Servers = append(st.Servers, elastic.ServerStatus{ID: "ps-2", Addr: "127.0.0.1:7002", Incarnation: 13})
	})
	step(func(st *elastic.Status) { st.Repartition.SlotsDone = 1 }) // progress only: no event
	step(func(st *elastic.Status) {
		*st.Repartition = elastic.RepartitionStatus{From: 2, To: 3, SlotsDone: 3, SlotsTotal: 3, Duration: 1500 * time.Millisecond, Bytes: 3 << 20}
	})
	step(func(st *elastic.Status) { st.Servers[1].Failed, st.Servers[1].Reason = true, "connection refused" })
	step(func(st *elastic.Status) {
		st.Servers[1].Failed, st.Servers[1].Reason, st.Servers[1].Incarnation = false, "", 14
	})
	step(func(st *elastic.Status) {
		st.Servers = st.Servers[:2]
		st.Workers = []elastic.WorkerStatus{{ID: "worker-1"}, {ID: "worker-2"}}
	})
	step(func(st *elastic.Status) { st.Finished = true })
	step(func(st *elastic.Status) { st.Phase = "superseded" })

	var got []string
	for _, e := range p.Snapshot().Events {
		got = append(got, e.Kind+": "+e.Text)
	}
	assert.Equal(t, []string{
		"job: watching job ctr: 2 servers, 2 workers, phase training",
		"plan: plan: 2 servers, 2 workers",
		"plan: plan: 2 servers, 2 workers → 3 servers, 2 workers",
		"repartition: servers 2 → 3: moving slots",
		"server: ps-2 joined at 127.0.0.1:7002",
		"repartition: servers 2 → 3: 3 slots moved in 1.5s (3.0 MiB), longest fence 0s",
		"server: ps-1 failed: connection refused",
		"server: ps-1 restarted at 127.0.0.1:7001",
		"server: ps-2 left",
		"worker: worker-2 joined",
		"worker: worker-0 left",
		"job: every epoch trained (2)",
		"job: coordinator superseded",
	}, got)

	p3, _, _ := newTestPage(t, Config{Events: 2})
	for range 5 {
		p3.ObserveCheckpoint(elastic.CheckpointEvent{Step: 1, Err: errors.New("disk full")})
	}
	assert.Len(t, p3.Snapshot().Events, 2, "Events bounds the events kept")
}

func TestCheckpoints(t *testing.T) {
	p, _, clk := newTestPage(t, Config{})
	p.ObserveCheckpoint(elastic.CheckpointEvent{Step: 10, Bytes: 4096, Full: true, Blocked: 3 * time.Millisecond})
	clk.Advance(time.Second)
	p.ObserveCheckpoint(elastic.CheckpointEvent{Step: 20, Bytes: 512, Blocked: time.Millisecond})
	p.ObserveCheckpoint(elastic.CheckpointEvent{Step: 10, Commit: true, Persist: 400 * time.Millisecond})
	p.ObserveCheckpoint(elastic.CheckpointEvent{Step: 20, Commit: true, Persist: time.Second, Err: errors.New("storage: quota")})
	p.ObserveCheckpoint(elastic.CheckpointEvent{Step: 5, Commit: true, Persist: time.Second}) // its snapshot came before the page

	s := p.Snapshot()
	start := newFakeClock().Now()
	assert.Equal(t, []Checkpoint{
		{Step: 10, At: start, Bytes: 4096, Full: true, Blocked: 3 * time.Millisecond, Committed: true, CommitLag: 400 * time.Millisecond},
		{Step: 20, At: start.Add(time.Second), Bytes: 512, Blocked: time.Millisecond, CommitLag: time.Second, Err: "storage: quota"},
		{Step: 5, At: start.Add(time.Second), Committed: true, CommitLag: time.Second},
	}, s.Checkpoints)
	require.Len(t, s.Events, 1)
	assert.Equal(t, Event{At: start.Add(time.Second), Kind: EventCheckpoint, Text: "commit of step 20 failed: storage: quota"}, s.Events[0])
}

func TestRecoveries(t *testing.T) {
	ctx := context.Background()
	p, src, clk := newTestPage(t, Config{})
	p.Sample(ctx)
	detected := clk.Now().Add(-time.Second)
	ev := elastic.RecoveryEvent{Policy: elastic.Rollback, Failed: map[string]string{"ps-1": "killed"}, Replaced: []string{"ps-1"},
		Step: 40, TableVersion: 3, Detected: detected, Duration: 800 * time.Millisecond}
	p.ObserveRecovery(elastic.RecoveryEvent{Policy: elastic.Rollback, Failed: map[string]string{"ps-1": "killed"}, Detected: detected,
		Err: errors.New("replacement not ready")})
	p.ObserveRecovery(ev)
	clk.Advance(time.Second)
	src.set(func(st *elastic.Status) { st.Recoveries, st.LastRecovery = 1, &ev })
	p.Sample(ctx) // the same recovery: not twice

	// A recovery the page was not told of is found in the status.
	ev2 := ev
	ev2.Detected, ev2.Step, ev2.Policy, ev2.LostRecords = clk.Now(), 60, elastic.Partial, 25
	clk.Advance(time.Second)
	src.set(func(st *elastic.Status) { st.Recoveries, st.LastRecovery = 2, &ev2 })
	p.Sample(ctx)

	s := p.Snapshot()
	require.Len(t, s.Recoveries, 3)
	assert.Equal(t, "replacement not ready", s.Recoveries[0].Err)
	assert.Equal(t, Recovery{At: detected, Policy: "rollback", Failed: map[string]string{"ps-1": "killed"}, Replaced: []string{"ps-1"},
		Step: 40, TableVersion: 3, Duration: 800 * time.Millisecond}, s.Recoveries[1])
	assert.Equal(t, int64(25), s.Recoveries[2].LostRecords)
	var texts []string
	for _, e := range s.Events {
		if e.Kind == EventRecovery {
			texts = append(texts, e.Text)
		}
	}
	assert.Equal(t, []string{
		"recovery of ps-1 failed (tried again): replacement not ready",
		"ps-1 recovered by rollback from the commit of step 40 in 800ms",
		"ps-1 recovered by partial from the commit of step 60 in 800ms, updates of 25 records lost",
	}, texts)
}

// usageSource is a Source with the servers' counters, whose Usage may fail.
type usageSource struct {
	fakeSource
	fail error
}

func (u *usageSource) Usage(ctx context.Context) (elastic.Status, error) {
	if u.fail != nil {
		return elastic.Status{}, u.fail
	}
	return u.Status(), nil
}

func TestMembers(t *testing.T) {
	ctx := context.Background()
	src := &usageSource{fakeSource: fakeSource{st: twoServers()}}
	p, _, clk := newTestPage(t, Config{Source: src})
	src.set(func(st *elastic.Status) {
		st.Servers[0].Host, st.Servers[0].Pid, st.Servers[0].CPU, st.Servers[0].ResidentBytes = "node-a", 100, time.Second, 1<<30
		st.Servers[1].Host, st.Servers[1].Busy, st.Servers[1].MemoryBytes = "node-b", time.Second, 1<<20
		// ps-1 shares its process: its process's figures are not its own.
		st.Servers[1].Pid, st.Servers[1].SharedProcess, st.Servers[1].CPU, st.Servers[1].ResidentBytes = 7, true, 10*time.Second, 1<<30
		st.Workers[0].Steps = 10
	})
	p.Sample(ctx)
	clk.Advance(2 * time.Second)
	src.set(func(st *elastic.Status) {
		st.Servers[0].CPU = 4 * time.Second
		st.Servers[1].Busy, st.Servers[1].Silent, st.Servers[1].CPU = 2*time.Second, true, 20*time.Second
		st.Workers[0].Steps, st.Workers[0].InBatch = 50, true
		st.Migrating = []int{1, 2, 3}
	})
	p.Sample(ctx)
	m := p.Snapshot().Members
	require.Len(t, m, 4)
	assert.Equal(t, Member{Role: RoleServer, ID: "ps-0", Addr: "127.0.0.1:7000", Host: "node-a", Pid: 100, Health: HealthServing,
		Incarnation: 11, Slots: 4, Migrating: 1, CPU: 1.5, Memory: 1 << 30}, m[0], "CPU: the process's, 3 s over 2 s")
	assert.Equal(t, Member{Role: RoleServer, ID: "ps-1", Addr: "127.0.0.1:7001", Host: "node-b", Pid: 7, Health: HealthSilent,
		Incarnation: 12, Slots: 4, Migrating: 2, CPU: 0.5, Memory: 1 << 20}, m[1], "CPU and memory: the serving time and the tables' of a server sharing its process")
	assert.Equal(t, Member{Role: RoleWorker, ID: "worker-0", Health: HealthBatch, Steps: 50, StepsPerSecond: 20}, m[2])
	assert.Equal(t, HealthIdle, m[3].Health)

	// Usage fails: the status without counters, the host kept.
	src.fail = errors.New("a server does not answer")
	clk.Advance(time.Second)
	src.set(func(st *elastic.Status) {
		st.Servers[0].Host, st.Servers[0].Pid, st.Servers[0].CPU = "", 0, 0
		st.Servers[1].Failed, st.Servers[1].Reason = true, "timeout"
	})
	p.Sample(ctx)
	m = p.Snapshot().Members
	assert.Equal(t, "node-a", m[0].Host)
	assert.Equal(t, 100, m[0].Pid)
	assert.Zero(t, m[0].CPU, "no counter, no rate")
	assert.Equal(t, HealthFailed, m[1].Health)
	assert.Equal(t, "timeout", m[1].Reason)

	p2, err := New(Config{Source: src, NoUsage: true, Now: clk.Now})
	require.NoError(t, err)
	src.fail = nil
	src.set(func(st *elastic.Status) { st.Servers[0].Host = "from-usage" })
	p2.Sample(ctx)
	assert.Equal(t, "from-usage", p2.Snapshot().Members[0].Host, "the fake's Status has it too; NoUsage only skips Usage")
}

func TestSnapshotIsACopy(t *testing.T) {
	ctx := context.Background()
	p, _, _ := newTestPage(t, Config{})
	p.Observe("loss", 1)
	p.Sample(ctx)
	s := p.Snapshot()
	s.Status.Servers[0].ID = "changed"
	s.Status.Owners[0] = "changed"
	s.Members[0].ID = "changed"
	s.Series[1].Points[0].V = 99
	s2 := p.Snapshot()
	assert.Equal(t, "ps-0", s2.Status.Servers[0].ID)
	assert.Equal(t, "ps-0", s2.Status.Owners[0])
	assert.Equal(t, "ps-0", s2.Members[0].ID)
	assert.Equal(t, 1.0, s2.Series[1].Points[0].V)
}

// The ring against a slice that keeps everything.
func TestRing(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		n := 1 + rng.IntN(8)
		r := newRing[int](n)
		var all []int
		for i := range rng.IntN(30) {
			r.push(i)
			all = append(all, i)
			want := all[max(0, len(all)-n):]
			require.Equal(t, want, r.values())
			require.Equal(t, len(want), r.len())
			require.Equal(t, want[len(want)-1], *r.last())
			k := want[rng.IntN(len(want))]
			require.Equal(t, k, *r.find(func(v *int) bool { return *v == k }))
		}
	}
	var r ring[int]
	assert.Nil(t, r.last())
	assert.Nil(t, r.find(func(*int) bool { return true }))
}

func TestRunOnce(t *testing.T) {
	called := make(chan struct{}, 1)
	src := SourceFunc(func() elastic.Status {
		select {
		case called <- struct{}{}:
		default:
		}
		return twoServers()
	})
	p, err := New(Config{Source: src, Every: time.Hour})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	<-called // Run samples at once
	assert.ErrorIs(t, p.Run(ctx), ErrRunning, "one loop samples a page")
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
	assert.ErrorIs(t, p.Run(ctx), context.Canceled, "a Run that ended frees the page")
}

// The coordinator's progress events carry the checkpoints and recoveries the page shows.
func TestObserveProgress(t *testing.T) {
	p, _, _ := newTestPage(t, Config{})
	p.ObserveProgress(elastic.ProgressEvent{Kind: elastic.EventStep, Step: 9})
	p.ObserveProgress(elastic.ProgressEvent{Kind: elastic.EventCheckpoint, Step: 10, Checkpoint: elastic.CheckpointEvent{Step: 10, Bytes: 64}})
	p.ObserveProgress(elastic.ProgressEvent{Kind: elastic.EventCheckpoint, Step: 12, Checkpoint: elastic.CheckpointEvent{Step: 10, Commit: true}})
	p.ObserveProgress(elastic.ProgressEvent{Kind: elastic.EventRecovery, Step: 12, Recovery: elastic.RecoveryEvent{Policy: elastic.Partial, Step: 10}})
	s := p.Snapshot()
	require.Len(t, s.Checkpoints, 1)
	assert.True(t, s.Checkpoints[0].Committed)
	assert.EqualValues(t, 64, s.Checkpoints[0].Bytes)
	require.Len(t, s.Recoveries, 1)
	assert.Equal(t, "partial", s.Recoveries[0].Policy)
}
