package elastic_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/elastictest"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fenceProbe is a client of the fault job's servers on its own host, for pushes under a chosen
// epoch.
func (j *faultJob) fenceProbe(host string) *ps.Client {
	j.t.Helper()
	cli, err := ps.NewClient(ps.ClientConfig{Secret: j.secret, Transport: j.net.Host(host), Resolver: j.coord, RetryBackoff: time.Millisecond})
	require.NoError(j.t, err)
	j.closers = append(j.closers, func() { cli.Close() })
	return cli
}

// probeBatch returns ids (with gradients) of every slot some server of table owns, or only of
// the slots of server only when it is not empty.
func probeBatch(table *ps.OwnerTable, only string) ([]uint64, []float32) {
	var ids []uint64
	for i := int64(0); i < 61; i++ {
		id := faultID(i)
		if only == "" || table.Owner(embedding.Slot(id, table.Slots)).ID == only {
			ids = append(ids, id)
		}
	}
	g := make([]float32, faultDim*len(ids))
	for k := range ids {
		faultGrad(int64(k), g[k*faultDim:(k+1)*faultDim])
	}
	return ids, g
}

// A worker that joins again before it began a batch (its first Join's answer was lost, say)
// is given a new epoch at once, and its first one is fenced on every server: a push under it
// is refused and changes no row, Begin under it is refused (ErrNotMember), and End under it
// counts nothing. The new epoch trains.
func TestJoinAgainFencesTheFirstEpoch(t *testing.T) {
	j := startFaultJobWith(t, 2, checkpoint.NewMemStorage(), t.TempDir(), func(c *elastic.Config) { c.CheckpointEvery = 0 })
	ctx := context.Background()
	c := j.coord
	first, err := c.Join(ctx, "w", 32)
	require.NoError(t, err)
	second, err := c.Join(ctx, "w", 32)
	require.NoError(t, err)
	require.NotEqual(t, first, second)
	require.NoError(t, c.Settle(ctx))

	table, err := c.OwnerTable(ctx, 0)
	require.NoError(t, err)
	ids, g := probeBatch(table, "")
	cli := j.fenceProbe("w")
	before := serverRows(j.servers)
	cli.SetEpoch(first)
	require.ErrorIs(t, cli.Push(ctx, "emb", ids, g, 1), ps.ErrFenced)
	for _, s := range j.servers {
		cli.SetEpoch(first)
		only, og := probeBatch(table, s.ID())
		require.NotEmpty(t, only)
		assert.ErrorIs(t, cli.Push(ctx, "emb", only, og, 1), ps.ErrFenced, "%s applies the first epoch's pushes", s.ID())
	}
	assert.Equal(t, before, serverRows(j.servers), "a fenced push changed rows")

	assert.ErrorIs(t, c.Begin(ctx, "w", first), elastic.ErrNotMember)
	step := c.Status().Step

	// The second epoch begins a batch; an End under the first counts nothing and leaves the
	// batch in hand to the second.
	require.NoError(t, c.Begin(ctx, "w", second))
	require.NoError(t, c.End(ctx, "w", first, true))
	assert.Equal(t, step, c.Status().Step, "an End under the first epoch counted a step")
	cli.SetEpoch(second)
	require.NoError(t, cli.Push(ctx, "emb", ids, g, 1))
	require.NoError(t, c.End(ctx, "w", second, true))
	assert.Equal(t, step+1, c.Status().Step, "the second epoch's batch counts")
	assert.NotEqual(t, before, serverRows(j.servers))
}

// Two live processes under one worker name: the second one's Join waits for the first, which
// goes on calling the coordinator, and is refused with ErrDuplicateWorker (through the control
// protocol) once the first is heard from; the first is not fenced and trains on.
func TestDuplicateLiveWorkerIsRefused(t *testing.T) {
	j := startFaultJobWith(t, 2, checkpoint.NewMemStorage(), t.TempDir(), func(c *elastic.Config) { c.CheckpointEvery = 0 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The first process: a worker whose batches (given up: they consume no data) keep it
	// calling the coordinator.
	ctl, err := remote.NewControl(remote.Config{Addr: j.addr, Secret: j.secret, Transport: j.net.Host("w")})
	require.NoError(t, err)
	defer ctl.Close()
	epoch, err := ctl.Join(ctx, "w", 32)
	require.NoError(t, err)
	batch := func() {
		t.Helper()
		require.NoError(t, ctl.Begin(ctx, "w", epoch), "the first process trains on")
		require.NoError(t, ctl.End(ctx, "w", epoch, false))
	}
	batch()

	twin, err := remote.NewControl(remote.Config{Addr: j.addr, Secret: j.secret, Transport: j.net.Host("twin")})
	require.NoError(t, err)
	defer twin.Close()
	joined := make(chan error, 1)
	go func() {
		_, err := twin.Join(ctx, "w", 32)
		joined <- err
	}()
	batches := 0
	for done := false; !done; {
		select {
		case err := <-joined:
			require.ErrorIs(t, err, elastic.ErrDuplicateWorker)
			done = true
		default:
			batch()
			batches++
		}
	}
	batch()
	assert.Equal(t, []string{"w"}, j.coord.Members())
	assert.Zero(t, j.coord.Status().Fenced, "no epoch was fenced")
	table, err := j.coord.OwnerTable(ctx, 0)
	require.NoError(t, err)
	ids, g := probeBatch(table, "")
	cli := j.fenceProbe("w")
	cli.SetEpoch(epoch)
	require.NoError(t, cli.Push(ctx, "emb", ids, g, 1), "the first process's epoch is not fenced")
	t.Logf("the refusal came after %d batches of the first process", batches)
}

// A worker process dies in the middle of training and a new one starts under its name: the
// new one's Join waits until the coordinator has failed the dead one (silent for
// WorkerSilence), and then it trains; the dead one's epoch is fenced.
func TestRestartedWorkerGetsItsNameBack(t *testing.T) {
	j := startFaultJobWith(t, 2, checkpoint.NewMemStorage(), t.TempDir(), func(c *elastic.Config) { c.CheckpointEvery = 0 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dead := j.worker("w")
	for range 3 {
		require.NoError(t, dead.sess.Step(ctx, trainStep))
	}
	// The process dies: its session is abandoned, and nothing more comes from it.

	again := j.workerOn("w-restarted", "w")
	require.NoError(t, again.sess.Step(ctx, trainStep), "the restarted worker trains once the dead one is failed")
	assert.Equal(t, 1, j.coord.Status().Evicted, "the dead membership was failed")
	assert.Equal(t, []string{"w"}, j.coord.Members())
	for range 3 {
		require.NoError(t, again.sess.Step(ctx, trainStep))
	}
}

// A server a scale-out adds refuses what the job's servers refuse: the epochs fenced before it
// joined (a worker failed earlier) and those below the incarnation's floor; live epochs train.
func TestAddedServerRefusesEpochsFencedBeforeItJoined(t *testing.T) {
	j := startFaultJobWith(t, 2, checkpoint.NewMemStorage(), t.TempDir(), func(c *elastic.Config) { c.CheckpointEvery = 0 })
	ctx := context.Background()
	c := j.coord
	gone, err := c.Join(ctx, "gone", 32)
	require.NoError(t, err)
	live, err := c.Join(ctx, "live", 32)
	require.NoError(t, err)
	c.Fail("gone", "the test failed it")
	require.NoError(t, c.Settle(ctx))

	id := "ps-2"
	srv, err := ps.NewServer(ps.ServerConfig{ID: id, Secret: j.secret, Slots: faultSlots, Tables: []ps.TableSpec{faultTable}, Transport: j.net.Host(id)})
	require.NoError(t, err)
	l, err := j.net.Host(id).Listen(id + ":1")
	require.NoError(t, err)
	ls, err := server.New(srv, l.Addr().String(), checkpoint.Config{Job: "faults", Storage: j.store, ShmDir: j.shm, FullEvery: 3})
	require.NoError(t, err)
	j.serve(func() { srv.Serve(l) })
	j.mu.Lock()
	j.servers, j.locals = append(j.servers, srv), append(j.locals, ls)
	j.mu.Unlock()
	require.NoError(t, c.AddServers(ctx, ls))

	table, err := c.OwnerTable(ctx, 0)
	require.NoError(t, err)
	ids, g := probeBatch(table, id)
	require.NotEmpty(t, ids, "the new server owns slots")
	tab, _ := srv.Table("emb")
	cli := j.fenceProbe("probe")
	for _, e := range []uint64{gone, 0} {
		cli.SetEpoch(e)
		assert.ErrorIs(t, cli.Push(ctx, "emb", ids, g, 1), ps.ErrFenced, "epoch %#x", e)
	}
	assert.Zero(t, tab.Len(), "a refused push created rows on the new server")
	cli.SetEpoch(live)
	require.NoError(t, cli.Push(ctx, "emb", ids, g, 1))
	assert.Equal(t, len(ids), tab.Len())
}

// A snapshot is taken and persisted everywhere, and its commit waits for one server's answer;
// meanwhile another server dies, and a partial recovery gives its slots, from the commit
// before, to a new incarnation. The snapshot holds the dead server's slots as they were before
// the recovery, a state the job has left: it is never committed, though every server persisted
// it and the server that holds up its commit was not touched by the recovery.
func TestSnapshotBeforeARecoveryIsNeverCommittedAfterIt(t *testing.T) {
	store := checkpoint.NewMemStorage()
	var gate *elastictest.FaultServer // ps-0: its persists of the held snapshot wait
	release := make(chan struct{})
	recovered := make(chan elastic.RecoveryEvent, 4)
	j := startFaultJobWith(t, 2, store, t.TempDir(), func(c *elastic.Config) {
		c.CheckpointEvery = 0
		c.Recovery = elastic.Partial
		c.ServerTimeout = time.Second
		c.OnRecovery = func(ev elastic.RecoveryEvent) { recovered <- ev }
		gate = elastictest.NewFaultServer(c.Servers[0])
		c.Servers[0] = gate
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := j.coord
	w := j.worker("w")
	for range 3 {
		require.NoError(t, w.sess.Step(ctx, trainStep))
	}
	first, err := c.Checkpoint(ctx)
	require.NoError(t, err)

	persist := gate.Inject(elastictest.Rule{Method: elastictest.MethodWaitPersisted, Hold: release,
		Match: func(pc elastictest.Call) bool { return pc.Step > first }})
	for range 3 {
		require.NoError(t, w.sess.Step(ctx, trainStep))
	}
	checkpointed := make(chan error, 1)
	go func() {
		_, err := c.Checkpoint(ctx)
		checkpointed <- err
	}()
	call, err := persist.Wait(ctx, 1) // the snapshot is taken; its commit waits for ps-0's answer
	require.NoError(t, err)
	held := call.Step
	require.Greater(t, held, first)
	_, err = j.locals[0].WaitPersisted(ctx, held)
	require.NoError(t, err)
	_, err = j.locals[1].WaitPersisted(ctx, held)
	require.NoError(t, err)

	j.kill(1)
	require.NoError(t, j.restart(1))
	ev := <-recovered
	require.NoError(t, ev.Err)
	assert.Equal(t, first, ev.Step, "the dead server's slots came from the first commit")
	assert.Contains(t, ev.Replaced, elastic.ServerID(1))
	close(release)
	require.Error(t, <-checkpointed, "the held snapshot was committed after the recovery")

	m, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "faults", Storage: store})
	require.NoError(t, err)
	require.NoError(t, c.WaitCommits(ctx))
	commits, err := m.Commits(ctx)
	require.NoError(t, err)
	var steps []uint64
	for _, ci := range commits {
		steps = append(steps, ci.Step)
	}
	assert.NotContains(t, steps, held, "the snapshot taken before the recovery was committed after it")
	assert.Contains(t, steps, first)
	assert.Equal(t, first, c.Status().LastCommit)
}

// A final checkpoint asked for while a worker holds a batch it began, with no batch ended since
// the newest commit, waits for that batch: the batch is in the final commit, not trained after
// it (the job's last steps would otherwise be lost to a resume).
func TestFinishWaitsForTheBatchInHand(t *testing.T) {
	j := startFaultJobWith(t, 2, checkpoint.NewMemStorage(), t.TempDir(), func(c *elastic.Config) { c.CheckpointEvery = 0 })
	ctx := context.Background()
	c := j.coord
	w, err := c.Join(ctx, "w", 32)
	require.NoError(t, err)
	v, err := c.Join(ctx, "v", 32)
	require.NoError(t, err)
	require.NoError(t, c.Settle(ctx))
	require.NoError(t, c.Begin(ctx, "w", w))
	require.NoError(t, c.End(ctx, "w", w, true))
	_, err = c.Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, c.WaitCommits(ctx))

	require.NoError(t, c.Begin(ctx, "w", w)) // in hand while the job finishes
	finished := make(chan error, 1)
	go func() { finished <- c.Finish(ctx, true, 0) }()
	// Finish refuses every new batch first: v asks until it is refused (a batch it gets before
	// that it gives up, which counts nothing).
	for {
		err := c.Begin(ctx, "v", v)
		if errors.Is(err, elastic.ErrStopped) {
			break
		}
		require.NoError(t, err)
		require.NoError(t, c.End(ctx, "v", v, false))
		runtime.Gosched()
	}
	require.NoError(t, c.End(ctx, "w", w, true))
	require.NoError(t, <-finished)
	st := c.Status()
	assert.Equal(t, uint64(2), st.Step)
	assert.Equal(t, st.Step, st.LastCommit, "the batch in hand at the final request is in the final commit")
}
