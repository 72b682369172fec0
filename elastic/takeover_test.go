package elastic_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/elastictest"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// localFaultJob starts an in-process job of the fault tests' model on n servers.
func localFaultJob(t *testing.T, n int, store checkpoint.Storage, tune func(*elastic.Config)) *local.Job {
	cfg := local.Config{Job: "takeover", Servers: n, Slots: faultSlots, Tables: []ps.TableSpec{faultTable},
		Coordinator: elastic.Config{Storage: store, CheckpointEvery: 8, Logger: testLogger(t),
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(faultRecords), ShardSize: 96, Epochs: faultEpochs,
				Seed: 3, Shuffle: true, LeaseTTL: 2 * time.Second, RetryAfter: 20 * time.Millisecond}},
		Checkpoint: checkpoint.Config{ShmDir: t.TempDir(), FullEvery: 3},
	}
	if tune != nil {
		tune(&cfg.Coordinator)
	}
	job, err := local.Start(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { job.Close() })
	return job
}

// localRows returns the table's weights over the job's servers.
func localRows(job *local.Job) map[uint64][]float32 {
	var servers []*ps.Server
	for _, s := range job.Servers {
		servers = append(servers, s.Server())
	}
	return serverRows(servers)
}

// The coordinator of a running job dies twice while its workers train, once right after a
// snapshot (its commit may or may not have been written) and once well after a commit; each
// time a new coordinator takes the job over from the newest commit without stopping the servers.
// No worker fails, every position is trained exactly once per epoch, and every row equals the
// failure-free result bit for bit: the batches trained since the commit were replayed and
// landed only where they had not.
func TestCoordinatorRestartTakesOverARunningJob(t *testing.T) {
	store := checkpoint.NewMemStorage()
	snapshots := make(chan uint64, 64)
	job := localFaultJob(t, 3, store, func(c *elastic.Config) {
		c.OnCheckpoint = func(ev elastic.CheckpointEvent) {
			if !ev.Commit && ev.Err == nil {
				select {
				case snapshots <- ev.Step:
				default:
				}
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	total := int64(faultRecords * faultEpochs)
	trained := func() int64 {
		var n int64
		for _, e := range job.Coordinator().Dispatcher().Progress().EpochRecords {
			n += e.Done
		}
		return n
	}

	var wg sync.WaitGroup
	errs := make([]error, 4)
	var batches atomic.Int64
	for i := range errs {
		sess, err := job.NewSession([]string{"w0", "w1", "w2", "w3"}[i], shard.ReaderConfig{Source: faultData, BatchSize: 32})
		require.NoError(t, err)
		w := &faultWorker{name: sess.Worker(), sess: sess}
		wg.Go(func() {
			errs[i] = w.run(ctx, func(ctx context.Context, b *elastic.Batch) error {
				batches.Add(1)
				return trainStep(ctx, b)
			})
		})
	}

	var restarts []uint64
	// First: right after a snapshot, once a third of the data is trained.
	for trained() < total/3 {
		select {
		case <-snapshots:
		case <-ctx.Done():
			t.Fatal("the job did not get a third through its data")
		}
	}
	<-snapshots
	step, err := job.RestartCoordinator(ctx)
	require.NoError(t, err)
	restarts = append(restarts, step)
	// Second: a few batches after a commit, two thirds through.
	for trained() < 2*total/3 || job.Coordinator().Status().LastCommit == 0 {
		select {
		case <-snapshots:
		case <-ctx.Done():
			t.Fatal("the job did not get two thirds through its data")
		}
	}
	for n := batches.Load(); batches.Load() < n+5; {
		time.Sleep(time.Millisecond)
	}
	step, err = job.RestartCoordinator(ctx)
	require.NoError(t, err)
	restarts = append(restarts, step)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "worker %d went on through the restarts", i)
	}
	t.Logf("took over at commits %v", restarts)
	assert.Positive(t, restarts[1], "the second restart found a commit")

	c := job.Coordinator()
	_, err = c.Checkpoint(ctx)
	require.NoError(t, err)
	assertEveryEpochOnce(t, c)
	assert.Equal(t, faultExpected(), localRows(job), "every row holds every record once per epoch")
}

// remoteJob is a job whose every role is a process of its own on an in-memory network: servers
// ps-0.. serving their agents (ServeServer), a coordinator on host "coord" driving them through
// remote.Server stubs and serving the workers (the dispatcher and ServeControl), and workers on their
// own hosts.
type remoteJob struct {
	*faultJob
	cfg     elastic.Config
	remotes []*remote.Server
	stopC   func() // ends the coordinator process
}

func startRemoteJob(t *testing.T, n int, store checkpoint.Storage, tune func(*elastic.Config)) *remoteJob {
	j := &remoteJob{faultJob: &faultJob{t: t, net: memnet.New(memnet.Config{}), secret: []byte("a secret of the takeover tests.."), store: store, shm: t.TempDir()}}
	j.addr = "coord:1"
	for i := range n {
		id := fmt.Sprintf("ps-%d", i)
		srv, err := ps.NewServer(ps.ServerConfig{ID: id, Secret: j.secret, Slots: faultSlots, Tables: []ps.TableSpec{faultTable}, Transport: j.net.Host(id)})
		require.NoError(t, err)
		l, err := j.net.Host(id).Listen(id + ":1")
		require.NoError(t, err)
		ls, err := server.New(srv, l.Addr().String(), checkpoint.Config{Job: "remote", Storage: store, ShmDir: j.shm, FullEvery: 3})
		require.NoError(t, err)
		require.NoError(t, remote.ServeServer(srv, ls))
		j.serve(func() { srv.Serve(l) })
		j.servers, j.locals = append(j.servers, srv), append(j.locals, ls)
	}
	j.cfg = elastic.Config{
		Job: "remote", Slots: faultSlots, Storage: store, CheckpointEvery: 8, Logger: testLogger(t),
		WorkerSilence: 2 * time.Second, ArriveTimeout: 2 * time.Second,
		Dispatcher: shard.Config{Dataset: shard.IndexedDataset(faultRecords), ShardSize: 96, Epochs: faultEpochs,
			Seed: 3, Shuffle: true, LeaseTTL: 2 * time.Second, RetryAfter: 20 * time.Millisecond},
	}
	if tune != nil {
		tune(&j.cfg)
	}
	j.close = sync.OnceFunc(func() {
		for _, f := range j.closers {
			f()
		}
		if j.stopC != nil {
			j.stopC()
		}
		for i, s := range j.servers {
			s.Close()
			j.locals[i].Close()
		}
		j.wg.Wait()
	})
	t.Cleanup(j.close)
	return j
}

// coordinator starts a coordinator process on host (resuming the job when resume is set) and
// returns it with the function that stops it as a crash would.
func (j *remoteJob) coordinator(ctx context.Context, host string, resume bool) (*elastic.Coordinator, uint64, func(), error) {
	return j.coordinatorOf(ctx, host, resume, len(j.servers), nil)
}

// coordinatorOf is coordinator with the job's first n servers, each seen through wrap (nil: as
// they are).
func (j *remoteJob) coordinatorOf(ctx context.Context, host string, resume bool, n int, wrap func(elastic.ParameterServer) elastic.ParameterServer) (*elastic.Coordinator, uint64, func(), error) {
	var nodes []elastic.ParameterServer
	var remotes []*remote.Server
	for _, s := range j.servers[:n] {
		rs, err := j.remoteServer(host, s.ID())
		if err != nil {
			return nil, 0, nil, err
		}
		remotes, nodes = append(remotes, rs), append(nodes, rs)
		if wrap != nil {
			nodes[len(nodes)-1] = wrap(rs)
		}
	}
	cfg := j.cfg
	cfg.Servers, cfg.Transport = nodes, j.net.Host(host)
	c, err := elastic.NewCoordinator(ctx, cfg)
	if err != nil {
		return nil, 0, nil, err
	}
	var step uint64
	if resume {
		if step, _, err = c.Resume(ctx); err != nil {
			c.Close()
			return nil, 0, nil, err
		}
	}
	dsrv, err := shardnet.NewServer(shardnet.ServerConfig{Service: c.Service(), Secret: j.secret})
	if err != nil {
		return nil, 0, nil, err
	}
	if err := remote.ServeControl(dsrv, c); err != nil {
		return nil, 0, nil, err
	}
	l, err := j.net.Host(host).Listen(host + ":1")
	if err != nil {
		return nil, 0, nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		dsrv.Serve(l)
	}()
	stop := sync.OnceFunc(func() {
		j.net.Kill(host)
		dsrv.Close()
		<-done
		c.Close()
		for _, rs := range remotes {
			rs.Close()
		}
		j.net.Restart(host)
	})
	return c, step, stop, nil
}

// remoteServer is server id as a coordinator on host reaches it.
func (j *remoteJob) remoteServer(host, id string) (*remote.Server, error) {
	return remote.NewServer(ps.Node{ID: id, Addr: id + ":1"}, remote.Config{Secret: j.secret, Transport: j.net.Host(host)})
}

// remoteWorker is a worker process: its clients reach the servers and the coordinator at
// coord:1 over its host's links.
func (j *remoteJob) remoteWorker(name string) *faultWorker {
	h := j.net.Host(name)
	var addrs []string
	for _, s := range j.servers {
		addrs = append(addrs, s.ID()+":1")
	}
	cli, err := ps.NewClient(ps.ClientConfig{Secret: j.secret, Transport: h, Servers: addrs, Retries: 8, RetryBackoff: time.Millisecond})
	require.NoError(j.t, err)
	svc, err := shardnet.NewClient(shardnet.ClientConfig{Addr: j.addr, Secret: j.secret, Transport: h})
	require.NoError(j.t, err)
	ctl, err := remote.NewControl(remote.Config{Addr: j.addr, Secret: j.secret, Transport: h})
	require.NoError(j.t, err)
	sess, err := elastic.NewSession(elastic.SessionConfig{Worker: name, Control: ctl, Client: cli,
		Reader: shard.ReaderConfig{Service: svc, Source: faultData, BatchSize: 32}, Logger: testLogger(j.t)})
	require.NoError(j.t, err)
	j.closers = append(j.closers, func() {
		sess.Close()
		ctl.Close()
		svc.Close()
		cli.Close()
	})
	return &faultWorker{name: name, cli: cli, sess: sess}
}

// A coordinator process dies mid-training and a new one starts at its address, taking the job
// over from the newest commit; the workers reconnect on their own and none fails. At the end
// every position was trained exactly once per epoch and every row equals the failure-free
// result; a push under an epoch of the dead coordinator is refused.
func TestCoordinatorProcessRestart(t *testing.T) {
	store := checkpoint.NewMemStorage()
	j := startRemoteJob(t, 3, store, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _, stop, err := j.coordinator(ctx, "coord", false)
	require.NoError(t, err)
	j.stopC = stop

	var wg sync.WaitGroup
	errs := make([]error, 3)
	workers := make([]*faultWorker, len(errs))
	var oldEpoch atomic.Uint64
	for i := range errs {
		workers[i] = j.remoteWorker(fmt.Sprintf("w%d", i))
		wg.Go(func() {
			errs[i] = workers[i].run(ctx, func(ctx context.Context, b *elastic.Batch) error {
				if i == 0 && oldEpoch.Load() == 0 {
					oldEpoch.Store(workers[0].cli.Epoch())
				}
				return trainStep(ctx, b)
			})
		})
	}
	for c.Status().LastCommit == 0 || c.Status().Step < c.Status().LastCommit+5 {
		time.Sleep(time.Millisecond)
	}
	j.stopC()
	c2, step, stop2, err := j.coordinator(ctx, "coord", true)
	require.NoError(t, err)
	j.stopC = stop2
	t.Logf("took over from step %d", step)
	assert.Positive(t, step)

	// A push of the dead coordinator's time is refused.
	probe := j.remoteWorker("probe")
	probe.cli.SetEpoch(oldEpoch.Load())
	err = probe.cli.Push(ctx, "emb", []uint64{faultID(0)}, make([]float32, faultDim), 1, ps.At(ps.Position{Shard: 1 << 20, Start: 0, End: 1}))
	require.ErrorIs(t, err, ps.ErrFenced)

	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "worker %d went on through the restart", i)
	}
	_, err = c2.Checkpoint(ctx)
	require.NoError(t, err)
	assertEveryEpochOnce(t, c2)
	assert.Equal(t, faultExpected(), serverRows(j.servers), "every row holds every record once per epoch")
}

// Two coordinators at once: the first still runs (cut off, say) when a second takes the job
// over. The servers refuse the first one's calls from then on, its checkpoint fails, nothing it
// tries to commit is ever restored, and the pushes of its workers are refused.
func TestTakeoverFencesTheEarlierCoordinator(t *testing.T) {
	store := checkpoint.NewMemStorage()
	j := startRemoteJob(t, 2, store, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, _, stop1, err := j.coordinator(ctx, "coord", false)
	require.NoError(t, err)
	j.stopC = stop1
	w := j.remoteWorker("w0")
	steps := 0
	for steps < 20 {
		require.NoError(t, w.sess.Step(ctx, trainStep))
		steps++
		if steps == 10 {
			_, err := first.Checkpoint(ctx)
			require.NoError(t, err)
		}
	}
	require.NoError(t, first.WaitCommits(ctx))
	committed := first.Status().LastCommit
	require.Positive(t, committed)

	second, step, stop2, err := j.coordinator(ctx, "coord2", true)
	require.NoError(t, err)
	j.stopC = func() { stop2(); stop1() }
	assert.Equal(t, committed, step)

	_, err = first.Checkpoint(ctx)
	require.ErrorIs(t, err, elastic.ErrSuperseded, "the servers follow the second coordinator")
	err = w.sess.Step(ctx, trainStep)
	require.ErrorIs(t, err, elastic.ErrSuperseded, "its workers learn it")
	require.ErrorIs(t, w.cli.Push(ctx, "emb", []uint64{1}, make([]float32, faultDim), 1, ps.At(ps.Position{Shard: 1 << 20, Start: 0, End: 1})), ps.ErrFenced)

	cm := second.Status()
	assert.Equal(t, committed, cm.LastCommit)
	m, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "remote", Storage: store})
	require.NoError(t, err)
	commits, err := m.Commits(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, commits)
	assert.Equal(t, committed, commits[0].Step, "nothing the first coordinator tried after the takeover is a commit")
}

// halfPublishedMove starts a job on ps-0..2 (ps-3 serving, not in it) with 3 workers training,
// and has its coordinator add ps-3 once a commit is behind it; the first group's owner table
// reaches ps-3 only, the coordinator's move fails, and the coordinator is stopped as a crash
// would. It returns the job, the table before the move, and a function that waits for the
// workers and returns their errors.
func halfPublishedMove(ctx context.Context, t *testing.T) (*remoteJob, *ps.OwnerTable, func() []error) {
	j := startRemoteJob(t, 4, checkpoint.NewMemStorage(), func(c *elastic.Config) {
		c.Secret = []byte("a secret of the takeover tests..")
		c.Migration.Concurrency = 1 // one group's table at a time: the first one is half given out
	})
	var servers []*elastictest.FaultServer // their owner tables above the move's first never arrive
	c, _, stop, err := j.coordinatorOf(ctx, "coord", false, 3, func(s elastic.ParameterServer) elastic.ParameterServer {
		f := elastictest.NewFaultServer(s)
		servers = append(servers, f)
		return f
	})
	require.NoError(t, err)
	j.stopC = stop
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		w := j.remoteWorker(fmt.Sprintf("w%d", i))
		wg.Go(func() { errs[i] = w.run(ctx, trainStep) })
	}
	for c.Status().LastCommit == 0 || c.Status().Step < c.Status().LastCommit+5 {
		time.Sleep(time.Millisecond)
	}
	before, err := c.OwnerTable(ctx, 0)
	require.NoError(t, err)
	for _, f := range servers {
		f.Inject(elastictest.Rule{Method: elastictest.MethodInstallTable, Err: errors.New("owner table lost on its way"),
			Match: func(c elastictest.Call) bool { return c.Table.Version > before.Version }})
	}
	ps3, err := j.remoteServer("coord", "ps-3")
	require.NoError(t, err)
	t.Cleanup(func() { ps3.Close() })
	require.Error(t, c.AddServers(ctx, ps3), "the table of the first group reached only ps-3")
	j.stopC()
	return j, before, func() []error { wg.Wait(); return errs }
}

// The coordinator dies while it gives out the owner table of a move: the new server got it, the
// others never did (the source of the slots still holds them, refusing them). The coordinator
// that takes the job over finishes the publication instead of returning the job to its commit:
// the job goes on under that table, with the slots moved so far on the new server and nowhere
// else. No worker fails, every position is trained exactly once per epoch, and every row equals
// the failure-free result.
func TestTakeoverFinishesAHalfPublishedMove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	j, before, workers := halfPublishedMove(ctx, t)
	half := j.servers[3].OwnerTable()
	require.NotNil(t, half)
	require.Equal(t, before.Version+1, half.Version)
	for _, s := range j.servers[:3] {
		require.Equal(t, before.Version, s.OwnerTable().Version)
	}

	c2, step, stop2, err := j.coordinator(ctx, "coord", true)
	require.NoError(t, err)
	j.stopC = stop2
	t.Logf("took over from step %d", step)
	now, err := c2.OwnerTable(ctx, 0)
	require.NoError(t, err)
	assert.True(t, now.Equal(half), "the half-published table is the job's (not a new one: no rollback)")
	for _, s := range j.servers {
		assert.True(t, s.OwnerTable().Equal(half), "%s has the table", s.ID())
	}

	assertTrainedWhole(ctx, t, j, c2, workers())
	moved := 0
	for _, s := range j.servers {
		tab, _ := s.Table("emb")
		tab.Range(func(v embedding.RowView) bool {
			owner := half.Owner(embedding.Slot(v.ID, half.Slots)).ID
			assert.Equal(t, s.ID(), owner, "row %d on a server that does not own it", v.ID)
			if owner == "ps-3" {
				moved++
			}
			return true
		})
	}
	assert.Positive(t, moved, "rows of the moved slots live on ps-3")
}

// assertTrainedWhole checks the end of a half-published move's job under coordinator c: every
// worker went on (errs, from halfPublishedMove's wait) and, after one more checkpoint, every
// record of every epoch was trained once and every row holds it once.
func assertTrainedWhole(ctx context.Context, t *testing.T, j *remoteJob, c *elastic.Coordinator, errs []error) {
	t.Helper()
	for i, err := range errs {
		require.NoError(t, err, "worker %d went on through the takeover", i)
	}
	_, err := c.Checkpoint(ctx)
	require.NoError(t, err)
	assertEveryEpochOnce(t, c)
	assert.Equal(t, faultExpected(), serverRows(j.servers), "every row holds every record once per epoch")
}

// failsRollback is a server whose installs fail and whose whole restore fails once the job's
// other servers have begun theirs.
type failsRollback struct {
	elastic.ParameterServer
	others []*server.Server
}

func (f failsRollback) InstallTable(context.Context, *ps.OwnerTable) error {
	return fmt.Errorf("owner table lost on its way to %s", f.Node().ID)
}

func (f failsRollback) Restore(ctx context.Context, step uint64, t *ps.OwnerTable, mode elastic.RestoreMode) error {
	if mode != elastic.RestoreAll {
		return f.ParameterServer.Restore(ctx, step, t, mode)
	}
	for _, o := range f.others {
		for {
			h, err := o.Health(ctx)
			if err != nil || h.Restoring != 0 || ctx.Err() != nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	return fmt.Errorf("restore of %s failed", f.Node().ID)
}

// A takeover that finds a half-given-out move table, cannot finish giving it out and falls
// back to returning the job to its commit, dies in the middle of the restores: some servers
// have cleared and reloaded their slots for a table none of them has installed. The next
// coordinator must not take that job over live (nor finish the move table over the restored
// servers): it returns every server to the commit again, and the rows come out right.
func TestTakeoverAfterAnInterruptedRollback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	j, _, workers := halfPublishedMove(ctx, t)

	_, _, _, err := j.coordinatorOf(ctx, "coord", true, 4, func(s elastic.ParameterServer) elastic.ParameterServer {
		if s.Node().ID == "ps-0" {
			return failsRollback{ParameterServer: s, others: j.locals[1:]}
		}
		return s
	})
	require.Error(t, err, "the second coordinator's rollback fails halfway")
	restoring := 0
	for _, l := range j.locals {
		h, err := l.Health(ctx)
		require.NoError(t, err)
		if h.Restoring != 0 {
			restoring++
		}
	}
	require.Positive(t, restoring, "servers were left restored for a table they never got")

	c3, step, stop3, err := j.coordinator(ctx, "coord", true)
	require.NoError(t, err)
	j.stopC = stop3
	t.Logf("took over from step %d", step)
	for _, l := range j.locals {
		h, err := l.Health(ctx)
		require.NoError(t, err)
		assert.Zero(t, h.Restoring, "every server got the table it was restored for")
	}
	assertTrainedWhole(ctx, t, j, c3, workers())
}
