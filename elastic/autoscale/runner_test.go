package autoscale_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/autoscale"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	liveDim   = 4
	liveSlots = 64
)

// live is an in-process job whose records touch only ids in slots that ps-0 owns at the
// start, so ps-0 does all the serving and holds all the rows; its workers train until the
// test ends.
type live struct {
	job     *local.Job
	c       *elastic.Coordinator
	ids     []uint64
	slots   map[int]bool // the slots of ids
	batches chan struct{}
	events  chan elastic.RecoveryEvent
}

func startLive(t *testing.T) *live {
	t.Helper()
	l := &live{batches: make(chan struct{}), events: make(chan elastic.RecoveryEvent, 4), slots: map[int]bool{}}
	// The ids of 8 slots of ps-0 under the placement of 2 servers: made from a probe job's
	// table, which the real job's is (placement is a function of the node ids and slots).
	table := ps.TableSpec{Name: "emb", Config: embedding.Config{Dim: liveDim, Seed: 1,
		Init: embedding.Init{Kind: embedding.InitZeros}, Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.01}}}
	const records = 1 << 20
	data := shard.IndexedSource{Data: shard.IndexedFunc(records, func(i int64, rec *shard.Record) error {
		rec.IDs = append(rec.IDs, l.ids[i%int64(len(l.ids))])
		rec.EndField()
		rec.Label = float32(i % 2)
		return nil
	})}
	job, err := local.Start(context.Background(), local.Config{
		Job: "autoscale", Servers: 2, Slots: liveSlots, Tables: []ps.TableSpec{table},
		Coordinator: elastic.Config{Storage: checkpoint.NewMemStorage(), Logger: slog.New(slog.DiscardHandler),
			OnRecovery: func(ev elastic.RecoveryEvent) { l.events <- ev },
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(records), ShardSize: 512, Seed: 3}},
		Checkpoint: checkpoint.Config{ShmDir: t.TempDir()},
	})
	require.NoError(t, err)
	t.Cleanup(func() { job.Close() })
	l.job, l.c = job, job.Coordinator()
	owners, err := l.c.OwnerTable(context.Background(), 0)
	require.NoError(t, err)
	for id := uint64(1); len(l.ids) < 400; id++ {
		sl := embedding.Slot(id, liveSlots)
		if owners.Owner(sl).ID != "ps-0" || (!l.slots[sl] && len(l.slots) == 8) {
			continue
		}
		l.slots[sl] = true
		l.ids = append(l.ids, id)
	}
	scaler, err := local.NewScaler(local.ScalerConfig{
		Job:    job,
		Reader: func(string) shard.ReaderConfig { return shard.ReaderConfig{Source: data, BatchSize: 64} },
		Worker: func(string) (local.StepFunc, error) {
			return func(ctx context.Context, b *elastic.Batch) error {
				g := make([]float32, liveDim*len(b.IDs))
				for i := range g {
					g[i] = 1
				}
				if err := b.Push(ctx, "emb", b.IDs, g); err != nil {
					return err
				}
				select {
				case l.batches <- struct{}{}:
				default:
				}
				return nil
			}, nil
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { scaler.Close() })
	job.SetScaler(scaler)
	return l
}

// train waits until n more batches have been trained.
func (l *live) train(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	for range n {
		select {
		case <-l.batches:
		case <-ctx.Done():
			t.Fatal("no training: ", ctx.Err())
		}
	}
}

// clock is the runner's clock: it moves only when the test says.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

// A server that stays hot makes the runner add a server and move the hottest slots off it:
// ps-0 serves every row, ps-1 none. The servers are given a millionth of a core, so any
// serving makes ps-0's CPU share far above HotCPU while ps-1's is 0 whatever the machine's
// speed; the runner's clock moves 10 s a tick.
func TestLiveHotServerAddsServerAndMovesSlots(t *testing.T) {
	l := startLive(t)
	hotServerAddsServer(t, l, l.c)
}

// hotServerAddsServer runs the scenario of TestLiveHotServerAddsServerAndMovesSlots on l with a
// runner that drives job, l's coordinator or a client of it.
func hotServerAddsServer(t *testing.T, l *live, job autoscale.Job) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, l.c.SetParallelism(ctx, 2, 2))
	p, err := autoscale.NewPlanner(autoscale.Config{MaxServers: 3, HotFor: 20 * time.Second, Settle: 1000})
	require.NoError(t, err)
	clk := &clock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	r, err := autoscale.NewRunner(autoscale.RunnerConfig{Job: job, Planner: p, Now: clk.Now,
		ServerCPU: 1e-6, RebalanceWindow: 300 * time.Millisecond})
	require.NoError(t, err)
	before, err := l.c.OwnerTable(ctx, 0)
	require.NoError(t, err)
	// Both workers have trained a batch, so both have step times to report.
	for {
		l.train(t, ctx, 1)
		u, err := l.c.Usage(ctx)
		require.NoError(t, err)
		n := 0
		for _, w := range u.Workers {
			if w.Steps > 0 {
				n++
			}
		}
		if n == 2 {
			break
		}
	}

	var applied []autoscale.Applied
	for tick := 0; tick < 4 && len(applied) == 0; tick++ {
		l.train(t, ctx, 5)
		obs, err := r.Observe(ctx)
		require.NoError(t, err)
		if tick > 0 {
			require.Len(t, obs.Servers, 2)
			assert.Greater(t, obs.Servers[0].CPU, 0.85, "tick %d: ps-0 serves", tick)
			assert.Zero(t, obs.Servers[1].CPU, "tick %d: ps-1 serves nothing", tick)
			assert.Positive(t, obs.Servers[0].Memory, "tick %d: ps-0 holds every row", tick)
			assert.Positive(t, obs.Throughput)
			require.Len(t, obs.Workers, 2)
		}
		for _, d := range p.Observe(obs) {
			applied = append(applied, r.Apply(ctx, d))
		}
		clk.now = clk.now.Add(10 * time.Second)
	}
	require.Len(t, applied, 1, "one decision, at the third tick (hot for 20 s)")
	a := applied[0]
	require.NoError(t, a.Err)
	assert.Equal(t, autoscale.AddServer, a.Decision.Kind)
	assert.Equal(t, "ps-0", a.Decision.Target)
	assert.Equal(t, 3, a.Decision.Shape.Servers)
	assert.Contains(t, a.Decision.Reason, "CPU share")

	st := l.c.Status()
	assert.Len(t, st.Servers, 3)
	assert.Equal(t, elastic.Plan{Workers: 2, Servers: 3}, st.Plan, "the decision's plan reached the coordinator")
	after, err := l.c.OwnerTable(ctx, 0)
	require.NoError(t, err)
	assert.Greater(t, after.Version, before.Version)
	owned := map[string]int{}
	for sl := range liveSlots {
		if l.slots[sl] {
			owned[after.Owner(sl).ID]++
		}
	}
	// The 8 hot slots, all on ps-0 before, are spread now: the rebalance moved hot slots off
	// the busiest server, some to ps-1, which had none.
	assert.Positive(t, a.Moves, "the rebalance moved slots")
	assert.Less(t, owned["ps-0"], 8, "%v", owned)
	assert.Positive(t, owned["ps-1"], "%v", owned)
	t.Logf("hot server detected to rebalanced: %v (%d slots moved by load; hot slots now %v)", a.Took, a.Moves, owned)
	l.train(t, ctx, 5) // training goes on
}

// A server whose table memory reaches its limit is restarted with more memory and restores
// its slots from the newest commit: the plan's server memory is set to what ps-0's table holds
// (ps-0 holds every row), so its reading is at 100% of the limit.
func TestLiveMemoryLimitRestartsServerLarger(t *testing.T) {
	l := startLive(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, l.c.SetParallelism(ctx, 2, 2))
	l.train(t, ctx, 20)
	step, err := l.c.Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, l.c.WaitCommits(ctx))
	u, err := l.c.Usage(ctx)
	require.NoError(t, err)
	limit := u.Servers[0].MemoryBytes
	require.Positive(t, limit)
	require.Less(t, float64(u.Servers[1].MemoryBytes), 0.95*float64(limit), "ps-1 holds no rows")
	require.NoError(t, l.c.SetPlan(ctx, elastic.Plan{Workers: 2, Servers: 2, Server: elastic.Resources{CPUs: 2, Memory: limit}}))
	inc := l.c.Status().Servers[0].Incarnation

	p, err := autoscale.NewPlanner(autoscale.Config{Settle: 1000})
	require.NoError(t, err)
	var told []autoscale.Applied
	r, err := autoscale.NewRunner(autoscale.RunnerConfig{Job: l.c, Planner: p, RestartServer: l.job.RestartServerByID,
		OnApplied: func(a autoscale.Applied) { told = append(told, a) }})
	require.NoError(t, err)
	applied, err := r.Tick(ctx)
	require.NoError(t, err)
	require.Len(t, applied, 1)
	assert.Equal(t, applied, told, "OnApplied hears of every decision carried out")
	a := applied[0]
	require.NoError(t, a.Err)
	assert.Equal(t, autoscale.RestartServer, a.Decision.Kind)
	assert.Equal(t, "ps-0", a.Decision.Target)
	grown := int64(float64(limit) * 1.5)
	assert.GreaterOrEqual(t, a.Decision.Size.Memory, grown)
	assert.Less(t, a.Decision.Size.Memory, grown+1<<20)
	assert.Equal(t, 2.0, a.Decision.Size.CPU)

	var ev elastic.RecoveryEvent
	select {
	case ev = <-l.events:
	case <-ctx.Done():
		t.Fatal("no recovery")
	}
	assert.Contains(t, ev.Failed, "ps-0")
	assert.Equal(t, step, ev.Step, "restored from the commit")
	st := l.c.Status()
	assert.Equal(t, a.Decision.Size.Memory, st.Plan.Server.Memory, "the plan holds the larger size")
	assert.NotEqual(t, inc, st.Servers[0].Incarnation, "a new process")
	tab, ok := l.job.Servers[0].Server().Table("emb")
	require.True(t, ok)
	assert.Equal(t, len(l.ids), tab.Len(), "every row restored")

	// Under the new limit it is not near any more: nothing to do.
	l.train(t, ctx, 5)
	applied, err = r.Tick(ctx)
	require.NoError(t, err)
	assert.Empty(t, applied)
}

// A straggler is replaced through the coordinator's Fail when the runner has no ReplaceWorker
// of its own, and cannot be through a Job that has no Fail.
func TestLiveReplaceWorkerFailsIt(t *testing.T) {
	l := startLive(t)
	replaceWorkerFailsIt(t, l, l.c)

	p, err := autoscale.NewPlanner(autoscale.Config{})
	require.NoError(t, err)
	r, err := autoscale.NewRunner(autoscale.RunnerConfig{Job: struct{ autoscale.Job }{l.c}, Planner: p})
	require.NoError(t, err)
	a := r.Apply(context.Background(), autoscale.Decision{Kind: autoscale.ReplaceWorker, Role: autoscale.Worker, Target: "w-0", Reason: "a straggler"})
	assert.ErrorIs(t, a.Err, autoscale.ErrNoReplacer)
}

// replaceWorkerFailsIt has a runner driving job replace l's one worker: the worker's membership
// ends before Apply returns.
func replaceWorkerFailsIt(t *testing.T, l *live, job autoscale.Job) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, l.c.SetParallelism(ctx, 1, 2))
	l.train(t, ctx, 1)
	st := l.c.Status()
	require.Len(t, st.Workers, 1)
	w := st.Workers[0]
	evicted := st.Evicted

	p, err := autoscale.NewPlanner(autoscale.Config{})
	require.NoError(t, err)
	r, err := autoscale.NewRunner(autoscale.RunnerConfig{Job: job, Planner: p})
	require.NoError(t, err)
	a := r.Apply(ctx, autoscale.Decision{Kind: autoscale.ReplaceWorker, Role: autoscale.Worker, Target: w.ID, Reason: "a straggler"})
	require.NoError(t, a.Err)
	for _, now := range l.c.Status().Workers {
		require.False(t, now.ID == w.ID && now.Epoch == w.Epoch, "worker %s still a member under epoch %s", w.ID, w.Epoch)
	}
	// The scaler's worker joins again and trains; by then its failure has been carried out.
	for l.c.Status().Evicted == evicted {
		l.train(t, ctx, 1)
	}
}
