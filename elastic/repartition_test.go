package elastic_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/ps/pstest"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A local job on 2 servers trains with 3 workers, checkpointing every 8 steps, while the
// coordinator takes it to 3 servers, then 4, then back to 2 (SetParallelism). Training never
// stops; every position is trained exactly once per epoch; every row equals the failure-free
// result bit for bit and lives only on its owner; the drained servers are stopped; checkpoints
// go on committing between and after the moves.
func TestLiveRepartitionWhileTraining(t *testing.T) {
	store := checkpoint.NewMemStorage()
	job := localFaultJob(t, 2, store, func(c *elastic.Config) {
		c.Migration.GroupSlots = 4 // many groups, many owner tables
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	scaler, reached := trainers(t, job, nil, 15, 60, 110)
	c := job.Coordinator()
	require.NoError(t, c.SetParallelism(ctx, 3, 2))

	for _, move := range []struct {
		at      int64
		servers int
	}{{15, 3}, {60, 4}, {110, 2}} {
		<-reached[move.at]
		require.NoError(t, c.SetParallelism(ctx, 3, move.servers), "to %d servers", move.servers)
		r := c.Repartition()
		require.NotNil(t, r)
		assert.False(t, r.Running)
		assert.Equal(t, move.servers, r.To)
		assert.Positive(t, r.SlotsTotal)
		assert.Equal(t, r.SlotsTotal, r.SlotsDone)
		assert.Empty(t, r.Err)
		assert.Len(t, job.Servers, move.servers)
		table, err := c.OwnerTable(ctx, 0)
		require.NoError(t, err)
		assert.Len(t, table.Nodes, move.servers)
		st := c.Status()
		require.Len(t, st.Owners, table.Slots)
		for sl, id := range st.Owners {
			assert.Equal(t, table.Owner(sl).ID, id, "slot %d", sl)
		}
		assert.Empty(t, st.Migrating, "the move is over")
		assert.Zero(t, st.ExactlyOnceViolations)
	}
	require.NoError(t, scaler.Wait(ctx))
	_, err := c.Checkpoint(ctx)
	require.NoError(t, err)
	assert.Greater(t, c.Status().Commits, 3, "checkpoints went on around the moves")
	assertEveryEpochOnce(t, c)
	assert.Equal(t, faultExpected(), localRows(job), "every row holds every record once per epoch")
	table, err := c.OwnerTable(ctx, 0)
	require.NoError(t, err)
	for _, s := range job.Servers {
		tab, _ := s.Server().Table("emb")
		tab.Range(func(v embedding.RowView) bool {
			assert.Equal(t, s.Node().ID, table.Owner(embedding.Slot(v.ID, table.Slots)).ID, "row %d on a server that does not own it", v.ID)
			return true
		})
	}
	st := c.Status()
	require.NotNil(t, st.Repartition)
	assert.Equal(t, 4, st.Repartition.From)
	assert.Equal(t, 2, st.Repartition.To)
	assert.Len(t, st.Servers, 2)
}

// A source of the slots moving to a new server is killed in the middle of the move: the move
// fails part of the way, the job recovers (Rollback) once the server restarts, the same plan
// set again finishes the move, and at the end every position was trained exactly once and
// every row equals the failure-free result.
func TestRepartitionSurvivesASourceKilledMidway(t *testing.T) {
	store := checkpoint.NewMemStorage()
	recovered := make(chan elastic.RecoveryEvent, 4)
	job := localFaultJob(t, 2, store, func(c *elastic.Config) {
		c.Migration.Bandwidth = 1500 // bytes/s: each group's copy takes a good part of a second
		c.OnRecovery = func(ev elastic.RecoveryEvent) { recovered <- ev }
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	scaler, marks := trainers(t, job, nil, 20)
	reached := marks[20]
	c := job.Coordinator()
	require.NoError(t, c.SetParallelism(ctx, 2, 2))
	<-reached

	moved := make(chan error, 1)
	go func() { moved <- c.SetParallelism(ctx, 2, 3) }()
	for {
		if r := c.Repartition(); r != nil && r.Running && c.Status().TableVersion > 0 && len(c.Status().Servers) == 3 {
			break
		}
		time.Sleep(time.Millisecond) // polling the status, as an operator would
	}
	require.NoError(t, job.KillServer(0))
	require.Error(t, <-moved, "a move whose source died fails")
	require.NoError(t, job.RestartServer(ctx, 0))
	ev := <-recovered
	require.NoError(t, ev.Err)
	require.NoError(t, c.SetParallelism(ctx, 2, 3), "the same plan again finishes the move")
	r := c.Repartition()
	assert.Equal(t, r.SlotsTotal, r.SlotsDone)
	require.NoError(t, scaler.Wait(ctx))
	_, err := c.Checkpoint(ctx)
	require.NoError(t, err)
	assertEveryEpochOnce(t, c)
	assert.Equal(t, faultExpected(), localRows(job), "every row holds every record once per epoch")
	table, err := c.OwnerTable(ctx, 0)
	require.NoError(t, err)
	require.Len(t, table.Nodes, 3)
	for i, n := range table.Loads() {
		assert.InDelta(t, faultSlots/3, n, float64(faultSlots)/3*0.15, "server %s's share of the slots", table.Nodes[i].ID)
	}
}

// Workers read a few slots of ps-0 far more than the rest while they train: Rebalance measures
// the servers' per-slot load, moves hot slots from ps-0 to ps-1 while training goes on, and
// the job stays exact.
func TestRebalanceMovesHotSlotsOffTheHotServer(t *testing.T) {
	store := checkpoint.NewMemStorage()
	job := localFaultJob(t, 2, store, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := job.Coordinator()
	table, err := c.OwnerTable(ctx, 0)
	require.NoError(t, err)
	var hot []uint64 // ids in 6 slots of ps-0
	hotSlots := map[int]bool{}
	for id := uint64(1); len(hot) < 600; id++ {
		sl := embedding.Slot(id, table.Slots)
		if table.Owner(sl).ID != "ps-0" || (!hotSlots[sl] && len(hotSlots) == 6) {
			continue
		}
		hotSlots[sl] = true
		hot = append(hot, id)
	}
	// From the 20th batch on, the workers read the hot rows again and again until the
	// rebalance has measured (however slow this machine is, the window sees the load).
	var begun atomic.Int64
	var measured atomic.Bool
	step := func(ctx context.Context, b *elastic.Batch) error {
		vals := make([]float32, len(hot)*faultDim)
		for first := true; first || begun.Load() >= 20 && !measured.Load(); first = false {
			if err := b.Pull(ctx, "emb", hot, vals, ps.ReadOnly()); err != nil {
				return err
			}
		}
		return trainStep(ctx, b)
	}
	scaler, marks := trainers(t, job, func(ctx context.Context, b *elastic.Batch) error {
		begun.Add(1)
		return step(ctx, b)
	}, 20)
	reached := marks[20]
	require.NoError(t, c.SetParallelism(ctx, 2, 2))
	<-reached
	moves, err := c.Rebalance(ctx, 1.2, 150*time.Millisecond, 0)
	measured.Store(true)
	require.NoError(t, err)
	require.NotEmpty(t, moves, "ps-0 carries the hot slots")
	movedHot := 0
	for _, m := range moves {
		assert.Equal(t, "ps-0", m.From)
		assert.Equal(t, "ps-1", m.To)
		if hotSlots[m.Slot] {
			movedHot++
		}
	}
	assert.Positive(t, movedHot, "hot slots moved")
	now, err := c.OwnerTable(ctx, 0)
	require.NoError(t, err)
	assert.Greater(t, now.Version, table.Version)
	require.NoError(t, scaler.Wait(ctx))
	_, err = c.Checkpoint(ctx)
	require.NoError(t, err)
	assertEveryEpochOnce(t, c)
	assert.Equal(t, faultExpected(), localRows(job), "every row holds every record once per epoch")
}

// A local job whose every connection is mutual TLS trains, moves slots to a third server
// (server to server, and the coordinator's calls) and commits; every row is exact.
func TestLocalJobOverTLS(t *testing.T) {
	store := checkpoint.NewMemStorage()
	cfg := local.Config{Job: "tls", Servers: 2, Slots: faultSlots, Tables: []ps.TableSpec{faultTable},
		TLS: pstest.TLS(t),
		Coordinator: elastic.Config{Storage: store, CheckpointEvery: 8, Logger: testLogger(t),
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(faultRecords), ShardSize: 96, Epochs: faultEpochs, Seed: 3}},
		Checkpoint: checkpoint.Config{ShmDir: t.TempDir()},
	}
	job, err := local.Start(context.Background(), cfg)
	require.NoError(t, err)
	defer job.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	scaler, marks := trainers(t, job, nil, 20)
	reached := marks[20]
	c := job.Coordinator()
	require.NoError(t, c.SetParallelism(ctx, 2, 2))
	<-reached
	require.NoError(t, c.SetParallelism(ctx, 2, 3))
	require.NoError(t, scaler.Wait(ctx))
	_, err = c.Checkpoint(ctx)
	require.NoError(t, err)
	assertEveryEpochOnce(t, c)
	assert.Equal(t, faultExpected(), localRows(job))

	plain, err := ps.NewClient(ps.ClientConfig{Secret: job.Secret(), Resolver: c, Retries: 1})
	require.NoError(t, err)
	defer plain.Close()
	cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
	defer ccancel()
	assert.Error(t, plain.Pull(cctx, "emb", []uint64{faultID(1)}, make([]float32, faultDim)), "a client without TLS is refused")
}

// trainers runs workers of job as a local.Scaler (made the coordinator's scaler) that train
// faultData with step (trainStep when nil); marks[n] is closed once n batches have begun.
func trainers(t *testing.T, job *local.Job, step local.StepFunc, marks ...int64) (*local.Scaler, map[int64]chan struct{}) {
	t.Helper()
	if step == nil {
		step = trainStep
	}
	reached := map[int64]chan struct{}{}
	for _, n := range marks {
		reached[n] = make(chan struct{})
	}
	var batches atomic.Int64
	scaler, err := local.NewScaler(local.ScalerConfig{
		Job:    job,
		Reader: func(string) shard.ReaderConfig { return shard.ReaderConfig{Source: faultData, BatchSize: 32} },
		Worker: func(string) (local.StepFunc, error) {
			return func(ctx context.Context, b *elastic.Batch) error {
				if ch, ok := reached[batches.Add(1)]; ok {
					close(ch)
				}
				return step(ctx, b)
			}, nil
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { scaler.Close() })
	job.SetScaler(scaler)
	return scaler, reached
}

// A scheduler starts a server process and tells the coordinator of it over the control
// protocol (remote.Control.AddServers): slots move onto it while the workers train; then it has
// a server drained (RemoveServers) and stops it. Every position once, every row exact.
func TestAddAndRemoveServersOverTheControlProtocol(t *testing.T) {
	j := startFaultJob(t, 2, checkpoint.NewMemStorage(), t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var batches atomic.Int64
	reached := make(chan struct{})
	step := func(ctx context.Context, b *elastic.Batch) error {
		if batches.Add(1) == 30 {
			close(reached)
		}
		return trainStep(ctx, b)
	}
	var wg sync.WaitGroup
	for _, name := range []string{"w0", "w1"} {
		w := j.worker(name)
		wg.Go(func() { assert.NoError(t, w.run(ctx, step)) })
	}
	<-reached

	// The scheduler's side: a new server process (a ps.Server with its control calls served
	// on its port), then the calls.
	id := "ps-2"
	srv, err := ps.NewServer(ps.ServerConfig{ID: id, Secret: j.secret, Slots: faultSlots, Tables: []ps.TableSpec{faultTable}, Transport: j.net.Host(id)})
	require.NoError(t, err)
	l, err := j.net.Host(id).Listen(id + ":1")
	require.NoError(t, err)
	ls, err := server.New(srv, l.Addr().String(), checkpoint.Config{Job: "faults", Storage: j.store, ShmDir: j.shm, FullEvery: 3})
	require.NoError(t, err)
	require.NoError(t, remote.ServeServer(srv, ls))
	j.serve(func() { srv.Serve(l) })
	j.mu.Lock()
	j.servers, j.locals = append(j.servers, srv), append(j.locals, ls)
	j.mu.Unlock()
	ctl, err := remote.NewControl(remote.Config{Addr: j.addr, Secret: j.secret, Transport: j.net.Host("scheduler")})
	require.NoError(t, err)
	defer ctl.Close()
	require.NoError(t, ctl.AddServers(ctx, ps.Node{ID: id, Addr: l.Addr().String()}))
	table, err := j.coord.OwnerTable(ctx, 0)
	require.NoError(t, err)
	assert.NotEmpty(t, table.SlotsOf(id).Members(), "slots moved onto the new server")

	require.NoError(t, ctl.RemoveServers(ctx, "ps-0"))
	table, err = j.coord.OwnerTable(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, -1, table.IndexOf("ps-0"), "ps-0 is out of the table")
	j.kill(0) // the scheduler stops the drained server
	assert.ErrorIs(t, ctl.RemoveServers(ctx, "ps-0"), elastic.ErrInvalidConfig, "no such server any more")
	_, err = ctl.Rebalance(ctx, 1, time.Millisecond, 0)
	assert.ErrorIs(t, err, elastic.ErrInvalidConfig, "a threshold of 1 moves forever")
	_, err = ctl.Rebalance(ctx, 1.5, 20*time.Millisecond, 4)
	assert.NoError(t, err, "a rebalance over the control port")

	wg.Wait()
	final, err := j.coord.Checkpoint(ctx)
	require.NoError(t, err)
	// ps-2 is reached through the remote stubs: its digest crosses the wire.
	live, err := j.coord.Digest(ctx)
	require.NoError(t, err)
	commit, err := j.coord.DigestCommit(ctx, final)
	require.NoError(t, err)
	assert.NoError(t, commit.Compare(live))
	assertEveryEpochOnce(t, j.coord)
	assert.Equal(t, faultExpected(), serverRows(j.liveServers()), "every row holds every record once per epoch")
	assert.Len(t, j.coord.Status().Servers, 2)
}
