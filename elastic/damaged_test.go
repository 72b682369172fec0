package elastic_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loopJob is a job of the fault tests' model whose roles talk over TCP on loopback as separate
// processes do: each server a ps.Server serving its agent (ServeServer) on a port of its own,
// the coordinator driving the servers through remote.Server stubs and serving the dispatcher
// and the workers' control calls on its port, and the workers reaching both. Checkpoints go to a
// directory (FSStorage); each server incarnation has a shared-memory directory of its own, so a
// restarted server reads storage, as one on another host does.
type loopJob struct {
	t      *testing.T
	secret []byte
	dir    string // the storage directory
	store  *checkpoint.FSStorage
	addrs  []string // the servers', fixed at their first start

	mu      sync.Mutex
	servers []*ps.Server
	locals  []*server.Server
	wg      sync.WaitGroup
	closers []func()
}

func startLoopJob(t *testing.T, n int) *loopJob {
	dir := t.TempDir()
	store, err := checkpoint.NewFSStorage(dir)
	require.NoError(t, err)
	j := &loopJob{t: t, secret: []byte("a secret of the loopback tests.."), dir: dir, store: store,
		addrs: make([]string, n), servers: make([]*ps.Server, n), locals: make([]*server.Server, n)}
	for i := range n {
		require.NoError(t, j.startServer(i))
	}
	t.Cleanup(j.close)
	return j
}

// startServer starts a new incarnation of server i (at its address, once it has one), with an
// empty shared-memory directory.
func (j *loopJob) startServer(i int) error {
	id := fmt.Sprintf("ps-%d", i)
	srv, err := ps.NewServer(ps.ServerConfig{ID: id, Secret: j.secret, Slots: faultSlots, Tables: []ps.TableSpec{faultTable}})
	if err != nil {
		return err
	}
	addr := j.addrs[i]
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		srv.Close()
		return err
	}
	ls, err := server.New(srv, l.Addr().String(), checkpoint.Config{Job: "loop", Storage: j.store, ShmDir: j.t.TempDir(), FullEvery: 1})
	if err == nil {
		err = remote.ServeServer(srv, ls)
	}
	if err != nil {
		l.Close()
		srv.Close()
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.addrs[i], j.servers[i], j.locals[i] = l.Addr().String(), srv, ls
	j.wg.Go(func() { srv.Serve(l) })
	return nil
}

// kill stops server i as its process dies: its port closes, its checkpointer stops.
func (j *loopJob) kill(i int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.servers[i].Close()
	j.locals[i].Close()
}

func (j *loopJob) close() {
	for _, f := range j.closers {
		f()
	}
	j.closers = nil
	j.mu.Lock()
	for i, s := range j.servers {
		s.Close()
		j.locals[i].Close()
	}
	j.mu.Unlock()
	j.wg.Wait()
}

func (j *loopJob) liveServers() []*ps.Server {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]*ps.Server(nil), j.servers...)
}

// loopCoord is a coordinator of a loopJob with its control port.
type loopCoord struct {
	*elastic.Coordinator
	addr string
	stop func() // as the process dies
}

// coordinator starts a coordinator (resuming when resume is set: ResumeReport's report is
// returned) whose Config tune adjusts.
func (j *loopJob) coordinator(ctx context.Context, resume bool, tune func(*elastic.Config)) (*loopCoord, elastic.Resumed, error) {
	var nodes []elastic.ParameterServer
	var remotes []*remote.Server
	closeRemotes := func() {
		for _, r := range remotes {
			r.Close()
		}
	}
	for i, a := range j.addrs {
		rs, err := remote.NewServer(ps.Node{ID: fmt.Sprintf("ps-%d", i), Addr: a}, remote.Config{Secret: j.secret})
		if err != nil {
			closeRemotes()
			return nil, elastic.Resumed{}, err
		}
		remotes, nodes = append(remotes, rs), append(nodes, rs)
	}
	cfg := elastic.Config{Job: "loop", Servers: nodes, Slots: faultSlots, Storage: j.store, Logger: testLogger(j.t),
		WorkerSilence: 10 * time.Second, ArriveTimeout: 10 * time.Second,
		Dispatcher: shard.Config{Dataset: shard.IndexedDataset(faultRecords), ShardSize: 96, Epochs: faultEpochs,
			Seed: 3, Shuffle: true, LeaseTTL: 20 * time.Second, RetryAfter: 20 * time.Millisecond}}
	if tune != nil {
		tune(&cfg)
	}
	c, err := elastic.NewCoordinator(ctx, cfg)
	if err != nil {
		closeRemotes()
		return nil, elastic.Resumed{}, err
	}
	var res elastic.Resumed
	fail := func(err error) (*loopCoord, elastic.Resumed, error) {
		c.Close()
		closeRemotes()
		return nil, res, err
	}
	if resume {
		if res, err = c.ResumeReport(ctx); err != nil {
			return fail(err)
		}
	}
	dsrv, err := shardnet.NewServer(shardnet.ServerConfig{Service: c.Service(), Secret: j.secret})
	if err != nil {
		return fail(err)
	}
	if err := remote.ServeControl(dsrv, c); err != nil {
		return fail(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		dsrv.Serve(l)
	}()
	lc := &loopCoord{Coordinator: c, addr: l.Addr().String()}
	lc.stop = sync.OnceFunc(func() {
		dsrv.Close()
		<-done
		c.Close()
		closeRemotes()
	})
	j.closers = append(j.closers, lc.stop)
	return lc, res, nil
}

// worker is a worker process of coordinator c.
func (j *loopJob) worker(c *loopCoord, name string) *faultWorker {
	cli, err := ps.NewClient(ps.ClientConfig{Secret: j.secret, Resolver: c.Coordinator, Retries: 4, RetryBackoff: time.Millisecond})
	require.NoError(j.t, err)
	svc, err := shardnet.NewClient(shardnet.ClientConfig{Addr: c.addr, Secret: j.secret})
	require.NoError(j.t, err)
	ctl, err := remote.NewControl(remote.Config{Addr: c.addr, Secret: j.secret})
	require.NoError(j.t, err)
	sess, err := elastic.NewSession(elastic.SessionConfig{Worker: name, Control: ctl, Client: cli,
		Reader: shard.ReaderConfig{Service: svc, Source: faultData, BatchSize: 32}})
	require.NoError(j.t, err)
	j.closers = append(j.closers, func() {
		sess.Close()
		ctl.Close()
		svc.Close()
		cli.Close()
	})
	return &faultWorker{name: name, cli: cli, sess: sess}
}

// damage flips one byte in the middle of a chunk file of node's part of the commit of step and
// returns the chunk's name.
func (j *loopJob) damage(step uint64, node string) (string, error) {
	chunks, err := filepath.Glob(filepath.Join(j.dir, "loop", "data", stepDir(step), node, "*", "t*"))
	if err != nil || len(chunks) == 0 {
		return "", fmt.Errorf("no chunk of %s at step %d (%v)", node, step, err)
	}
	b, err := os.ReadFile(chunks[0])
	if err != nil {
		return "", err
	}
	b[len(b)/2] ^= 0x10
	return filepath.Base(chunks[0]), os.WriteFile(chunks[0], b, 0o644)
}

// assertSkipped checks that the report lists the commit of step, damaged in chunk, as skipped
// and moved aside with its evidence.
func (j *loopJob) assertSkipped(skipped []checkpoint.SkippedCommit, quarantined []string, step uint64, chunk string) {
	t := j.t
	t.Helper()
	require.Len(t, skipped, 1, "one commit skipped")
	assert.Equal(t, step, skipped[0].Step)
	assert.ErrorIs(t, skipped[0].Err, checkpoint.ErrCorrupt, "the damage is known for what it is across the wire")
	assert.Contains(t, skipped[0].Err.Error(), chunk, "the reason names the damaged object")
	require.Len(t, quarantined, 1)
	assert.True(t, strings.HasPrefix(quarantined[0], "loop/quarantine/"+stepDir(step)+"-"), quarantined[0])
	_, err := os.Stat(filepath.Join(j.dir, filepath.FromSlash(quarantined[0]), "commit"))
	assert.NoError(t, err, "the damaged commit's record is kept in quarantine")
}

// trainBatches trains n batches one at a time with a session of c.
func (j *loopJob) trainBatches(ctx context.Context, w *faultWorker, n int) {
	for range n {
		require.NoError(j.t, w.sess.Step(ctx, trainStep))
	}
}

// A server of a multi-process job dies and comes back empty (on another host, say) while the
// newest commit has a byte flipped in one of that server's chunks: the rollback finds the
// damage from the remote server's answer, moves the commit aside and restores the one before
// it on every server, once. The job then goes on to the end: every position is trained exactly
// once per epoch and every row equals the failure-free result.
func TestRemoteRollbackSkipsADamagedCommit(t *testing.T) {
	j := startLoopJob(t, 3)
	ctx, cancel := context.WithTimeoutCause(context.Background(), 2*time.Minute, errors.New("the job did not finish"))
	defer cancel()
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	var mu sync.Mutex
	var events []elastic.RecoveryEvent
	c, _, err := j.coordinator(ctx, false, func(cfg *elastic.Config) {
		cfg.Recovery = elastic.Rollback
		cfg.HealthEvery = 20 * time.Millisecond
		cfg.ServerTimeout = time.Second // a stall of a loaded machine under the race detector is not a failure
		cfg.ReplaceWait = time.Minute
		cfg.Dispatcher.MaxFailures = 1
		cfg.OnRecovery = func(ev elastic.RecoveryEvent) {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
			if ev.Err != nil {
				fail(fmt.Errorf("a recovery failed: %w", ev.Err))
			}
		}
	})
	require.NoError(t, err)

	// Two commits, taken when the test asks (none on its own: CheckpointEvery is 0).
	first := j.worker(c, "first")
	var commits []uint64
	for range 2 {
		j.trainBatches(ctx, first, 5)
		step, err := c.Checkpoint(ctx)
		require.NoError(t, err)
		commits = append(commits, step)
	}
	require.NoError(t, first.sess.Close())

	// The first worker to begin a batch then damages the newest commit and kills ps-1. It is
	// in its batch: no barrier, so no snapshot and no commit, comes until the recovery.
	var (
		kmu     sync.Mutex
		n       int
		damaged uint64
		chunk   string
	)
	restarted := make(chan error, 1)
	step := func(ctx context.Context, b *elastic.Batch) error {
		kmu.Lock()
		n++
		if damaged == 0 {
			damaged = commits[1]
			var err error
			if chunk, err = j.damage(damaged, "ps-1"); err != nil {
				kmu.Unlock()
				return err
			}
			t.Logf("flipped a byte of %s in the commit of step %d; killing ps-1", chunk, damaged)
			j.kill(1)
			go func() { restarted <- j.startServer(1) }()
		}
		kmu.Unlock()
		return trainStep(ctx, b)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		w := j.worker(c, fmt.Sprintf("w%d", i))
		wg.Go(func() { errs[i] = w.run(ctx, step) })
	}
	wg.Wait()
	require.NoError(t, context.Cause(ctx))
	for i, err := range errs {
		require.NoError(t, err, "worker %d went on through the recovery", i)
	}
	require.NotZero(t, damaged, "a worker damaged a commit and killed ps-1 (the workers trained %d batches)", n)
	require.NoError(t, <-restarted)
	_, err = c.Checkpoint(ctx)
	require.NoError(t, err)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, events, 1, "one recovery, at the first attempt")
	ev := events[0]
	require.NoError(t, ev.Err)
	assert.Equal(t, []string{"ps-1"}, ev.Replaced)
	assert.Equal(t, commits[0], ev.Step, "restored from the commit before the damaged one")
	j.assertSkipped(ev.Skipped, ev.Quarantined, damaged, chunk)
	t.Logf("recovered from step %d, skipping step %d, in %v", ev.Step, damaged, ev.Duration.Round(time.Millisecond))

	assertEveryEpochOnce(t, c.Coordinator)
	assert.Equal(t, faultExpected(), serverRows(j.liveServers()), "every row holds every record once per epoch")
}

// The whole multi-process job restarts with every server empty (the shared memory is gone) and
// resumes while a byte is flipped in a chunk of its newest commit: the servers' answers to
// Verify say the commit is damaged, so the resume restores the one before it, moves the
// damaged one aside and reports it; the job then goes on to the end exactly once.
func TestRemoteResumeSkipsADamagedCommit(t *testing.T) {
	testRemoteResumeSkipsADamagedCommit(t, false)
}

// A coordinator of a multi-process job dies while a server has restarted empty, and the newest
// commit has a byte flipped in a chunk of that server: the coordinator started in its place
// takes the job over by returning every server to the newest commit, finds it damaged from the
// server's answer, moves it aside and returns every server to the one before it instead.
func TestRemoteTakeoverSkipsADamagedCommit(t *testing.T) {
	testRemoteResumeSkipsADamagedCommit(t, true)
}

func testRemoteResumeSkipsADamagedCommit(t *testing.T, takeover bool) {
	j := startLoopJob(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _, err := j.coordinator(ctx, false, nil) // checkpoints only when the test asks
	require.NoError(t, err)
	w := j.worker(c, "w0")
	var steps []uint64
	var want map[uint64][]float32
	for range 3 {
		j.trainBatches(ctx, w, 5)
		step, err := c.Checkpoint(ctx)
		require.NoError(t, err)
		steps = append(steps, step)
		if len(steps) == 2 {
			want = serverRows(j.liveServers())
		}
	}
	require.NoError(t, w.sess.Close())
	c.stop()
	chunk, err := j.damage(steps[2], "ps-1")
	require.NoError(t, err)
	if takeover {
		// ps-0 goes on serving the job; ps-1 comes back empty.
		j.kill(1)
		require.NoError(t, j.startServer(1))
	} else {
		for i := range j.addrs {
			j.kill(i)
			require.NoError(t, j.startServer(i))
		}
	}

	c, res, err := j.coordinator(ctx, true, nil)
	require.NoError(t, err)
	assert.Equal(t, steps[1], res.Step, "the commit before the damaged one")
	j.assertSkipped(res.Skipped, res.Quarantined, steps[2], chunk)
	assert.Equal(t, want, serverRows(j.liveServers()), "the rows of the commit restored")

	require.NoError(t, j.worker(c, "w1").run(ctx, trainStep))
	_, err = c.Checkpoint(ctx)
	require.NoError(t, err)
	assertEveryEpochOnce(t, c.Coordinator)
	assert.Equal(t, faultExpected(), serverRows(j.liveServers()), "every row holds every record once per epoch")
}
