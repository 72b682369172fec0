package elastic_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// kill crashes server i as a process dies: its host drops off the network, its server and
// checkpointer stop; its shared-memory files stay.
func (j *faultJob) kill(i int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	id := j.servers[i].ID()
	j.net.Kill(id)
	j.servers[i].Close()
	j.locals[i].Close()
	if j.dead == nil {
		j.dead = map[int]bool{}
	}
	j.dead[i] = true
}

// liveServers returns the servers not killed (or restarted since).
func (j *faultJob) liveServers() []*ps.Server {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []*ps.Server
	for i, s := range j.servers {
		if !j.dead[i] {
			out = append(out, s)
		}
	}
	return out
}

// restart starts a new incarnation of server i at the same address and shared-memory
// directory, and hands it to the coordinator.
func (j *faultJob) restart(i int) error {
	id := j.servers[i].ID()
	j.net.Restart(id)
	srv, err := ps.NewServer(ps.ServerConfig{ID: id, Secret: j.secret, Slots: faultSlots, Tables: []ps.TableSpec{faultTable}})
	if err != nil {
		return err
	}
	l, err := j.net.Host(id).Listen(id + ":1")
	if err != nil {
		return err
	}
	ls, err := server.New(srv, l.Addr().String(), checkpoint.Config{Job: "faults", Storage: j.store, ShmDir: j.shm, FullEvery: 3})
	if err != nil {
		return err
	}
	j.serve(func() { srv.Serve(l) })
	j.mu.Lock()
	j.servers[i], j.locals[i] = srv, ls
	delete(j.dead, i)
	j.mu.Unlock()
	return j.coord.ReplaceServer(ls)
}

// faultRecoveryCase is one way of losing a server.
type faultRecoveryCase struct {
	policy  elastic.RecoveryPolicy
	replace bool // a new incarnation comes up; otherwise the survivors take the slots
}

// A parameter server dies in the middle of training (a worker's pushes to it fail), and comes
// back as a new incarnation or does not; the job goes on without any worker failing. Under
// Rollback every row at the end equals the failure-free result bit for bit and every position
// was trained exactly once per epoch; under Partial the rows equal it except for the updates of
// the positions the recovery reported lost, on the failed server's slots only.
func TestServerFailureRecovery(t *testing.T) {
	for _, tc := range []faultRecoveryCase{
		{elastic.Rollback, true},
		{elastic.Rollback, false},
		{elastic.Partial, true},
		{elastic.Partial, false},
	} {
		t.Run(fmt.Sprintf("%s/replace=%t", tc.policy, tc.replace), func(t *testing.T) { testServerFailure(t, tc) })
	}
}

func testServerFailure(t *testing.T, tc faultRecoveryCase) {
	store := checkpoint.NewMemStorage()
	j := startFaultJobWith(t, 3, store, t.TempDir(), func(c *elastic.Config) {
		c.Recovery = tc.policy
		// A batch the recovery voids is no fault of its shard: with a single failure allowed,
		// counting one would give the shard up (assertEveryEpochOnce sees it). Leases, silence
		// and barriers are given room, so that no other loss of a shard can come of a slow
		// moment of a loaded machine.
		c.Dispatcher.MaxFailures = 1
		c.Dispatcher.LeaseTTL, c.WorkerSilence, c.ArriveTimeout = 20*time.Second, 10*time.Second, 10*time.Second
		c.Logger = testLogger(t)
		c.HealthEvery = 20 * time.Millisecond
		c.ServerTimeout = 200 * time.Millisecond
		c.ReplaceWait = time.Hour
		if !tc.replace {
			c.ReplaceWait = 100 * time.Millisecond
		}
	})
	j.logger = testLogger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	table, err := j.coord.OwnerTable(ctx, 0)
	require.NoError(t, err)
	failedSlots := table.SlotsOf("ps-1")

	// The first worker to begin a batch when the job is at its 10th batch or later, some steps
	// after a commit (so that Partial has updates to lose), kills ps-1 just before pushing it.
	// Every worker looks: one worker alone may see too few batches to meet the moment.
	var mu sync.Mutex
	n, killed := 0, false
	restarted := make(chan error, 1)
	step := func(ctx context.Context, b *elastic.Batch) error {
		mu.Lock()
		n++
		// The coordinator's own figure: OnCheckpoint hears of a snapshot only after its
		// barrier came down, when this batch may have begun right after it.
		if st := j.coord.Status(); n >= 10 && !killed && st.LastCommit > 0 && st.Step > st.LastSnapshot+3 {
			killed = true
			t.Logf("killing ps-1 at step %d, last snapshot %d", st.Step, st.LastSnapshot)
			j.kill(1)
			if tc.replace {
				go func() { restarted <- j.restart(1) }()
			}
		}
		mu.Unlock()
		return trainStep(ctx, b)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, name := range []string{"w0", "w1", "w2"} {
		w := j.worker(name)
		wg.Go(func() { errs[i] = w.run(ctx, step) })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "worker %d went on through the recovery", i)
	}
	require.True(t, killed, "a worker killed ps-1 (the workers trained %d batches)", n)
	if tc.replace {
		require.NoError(t, <-restarted)
	}
	_, err = j.coord.Checkpoint(ctx)
	require.NoError(t, err)

	st := j.coord.Status()
	require.Equal(t, 1, st.Recoveries, "one recovery")
	ev := st.LastRecovery
	require.NoError(t, ev.Err)
	assert.Contains(t, ev.Failed, "ps-1")
	assert.Positive(t, ev.Step, "restored from a commit")
	if tc.replace {
		assert.Equal(t, []string{"ps-1"}, ev.Replaced)
	} else {
		assert.Empty(t, ev.Replaced)
		now, err := j.coord.OwnerTable(ctx, 0)
		require.NoError(t, err)
		assert.Empty(t, now.SlotsOf("ps-1").Members(), "the survivors took its slots")
	}
	t.Logf("%s: recovered from step %d in %v (waited %v for a replacement), lost %d of %d records",
		tc.policy, ev.Step, ev.Duration.Round(time.Millisecond), ev.Replacement.Round(time.Millisecond), ev.LostRecords, ev.TrainedRecords)

	assertEveryEpochOnce(t, j.coord)
	want := faultExpected()
	live := j.liveServers()
	switch tc.policy {
	case elastic.Rollback:
		assert.Zero(t, ev.LostRecords)
		assert.Zero(t, j.coord.Status().LostRecords)
		assert.Equal(t, want, serverRows(live), "every row holds every record once per epoch")
	case elastic.Partial:
		require.Positive(t, ev.LostRecords, "training went on between the commit and the failure")
		counted := withoutLost(want, ev.Lost, failedSlots)
		assert.Equal(t, ev.LostRecords, counted)
		assert.Equal(t, ev.LostRecords, j.coord.Status().LostRecords, "the job's count of lost updates")
		assert.Equal(t, ev.LostRecords, j.coord.Status().LostRecords, "the status's")
		assert.Equal(t, want, serverRows(live), "every row holds every record once per epoch, but the lost ones on the failed slots")
	}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// A coordinator's calls are meant for the incarnation it admitted: once the server's process
// restarts at the same address, the new one refuses them (it has not been restored) until the
// coordinator admits it, and Health shows the change.
func TestRemoteServerRefusesCallsForAnEarlierIncarnation(t *testing.T) {
	net := memnet.New(memnet.Config{})
	secret := []byte("a secret of the incarnation test")
	ctx := context.Background()
	start := func() (*ps.Server, *server.Server) {
		srv, err := ps.NewServer(ps.ServerConfig{ID: "ps-0", Secret: secret, Slots: faultSlots, Tables: []ps.TableSpec{faultTable}})
		require.NoError(t, err)
		l, err := net.Host("ps-0").Listen("ps-0:1")
		require.NoError(t, err)
		ls, err := server.New(srv, l.Addr().String(), checkpoint.Config{})
		require.NoError(t, err)
		require.NoError(t, remote.ServeServer(srv, ls))
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
		return srv, ls
	}
	srv, first := start()
	rs, err := remote.NewServer(ps.Node{ID: "ps-0", Addr: "ps-0:1"}, remote.Config{Addr: "ps-0:1", Secret: secret, Transport: net.Host("coord")})
	require.NoError(t, err)
	defer rs.Close()
	table, err := ps.NewOwnerTable(1, faultSlots, []ps.Node{rs.Node()}, nil)
	require.NoError(t, err)

	h, err := rs.Health(ctx)
	require.NoError(t, err)
	assert.Equal(t, first.Incarnation(), h.Incarnation)
	assert.Zero(t, h.TableVersion)
	rs.Admit(h.Incarnation)
	require.NoError(t, rs.InstallTable(ctx, table))

	net.Kill("ps-0")
	srv.Close()
	net.Restart("ps-0")
	_, second := start()
	require.NotEqual(t, first.Incarnation(), second.Incarnation())
	err = rs.InstallTable(ctx, table)
	require.ErrorIs(t, err, elastic.ErrReplaced, "a call meant for the old process")
	require.ErrorIs(t, rs.Fence(ctx, 1<<32, nil), elastic.ErrReplaced)
	h, err = rs.Health(ctx)
	require.NoError(t, err)
	assert.Equal(t, second.Incarnation(), h.Incarnation)
	assert.Zero(t, h.TableVersion, "the new process serves nothing")
	rs.Admit(h.Incarnation)
	require.NoError(t, rs.InstallTable(ctx, table))
	h, err = rs.Health(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), h.TableVersion)
	assert.Zero(t, h.Restoring)

	// A restore for a table shows until that table is installed.
	next, err := ps.NewOwnerTable(2, faultSlots, []ps.Node{rs.Node()}, table)
	require.NoError(t, err)
	require.NoError(t, rs.Restore(ctx, 0, next, elastic.RestoreAll))
	h, err = rs.Health(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), h.Restoring)
	require.NoError(t, rs.InstallTable(ctx, table), "an older table changes nothing")
	h, err = rs.Health(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), h.Restoring)
	require.NoError(t, rs.InstallTable(ctx, next))
	h, err = rs.Health(ctx)
	require.NoError(t, err)
	assert.Zero(t, h.Restoring)
}

// A batch applied on every server, the failed one included, and reported only after a Partial
// recovery published the restored slots: counted by the ledger after the count, its updates of
// those slots would be lost with nobody told. The recovery voids the batches in flight (their
// workers are failed and join again), so the batch is trained again and lands on the restored
// slots; the rows equal the failure-free result but for the updates reported lost.
func TestPartialRecoveryVoidsBatchesInFlight(t *testing.T) {
	store := checkpoint.NewMemStorage()
	recovered := make(chan struct{})
	j := startFaultJobWith(t, 3, store, t.TempDir(), func(c *elastic.Config) {
		c.Recovery = elastic.Partial
		c.Logger = testLogger(t)
		c.HealthEvery = 20 * time.Millisecond
		c.ServerTimeout = 200 * time.Millisecond
		c.ReplaceWait = time.Hour
		c.OnRecovery = func(ev elastic.RecoveryEvent) {
			if ev.Err == nil {
				close(recovered)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	table, err := j.coord.OwnerTable(ctx, 0)
	require.NoError(t, err)
	failedSlots := table.SlotsOf("ps-1")

	var wg sync.WaitGroup
	errs := make([]error, 2)
	w0 := j.worker("w0")
	wg.Go(func() { errs[0] = w0.run(ctx, trainStep) })
	killer := j.worker("killer")
	n, killed := 0, false
	var voided ps.Position
	wg.Go(func() {
		errs[1] = killer.run(ctx, func(ctx context.Context, b *elastic.Batch) error {
			n++
			if st := j.coord.Status(); killed || n < 10 || st.LastCommit == 0 || st.Step <= st.LastSnapshot+3 {
				return trainStep(ctx, b)
			}
			// Every push of the batch lands, ps-1's too; then ps-1 dies, a new incarnation
			// takes its slots from the commit, and only then does the batch end and report.
			if err := trainStep(ctx, b); err != nil {
				return err
			}
			killed, voided = true, b.Position()
			j.kill(1)
			require.NoError(t, j.restart(1))
			select {
			case <-recovered:
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		})
	})
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "worker %d went on through the recovery", i)
	}
	require.True(t, killed)
	_, err = j.coord.Checkpoint(ctx)
	require.NoError(t, err)
	st := j.coord.Status()
	require.Equal(t, 1, st.Recoveries)
	ev := st.LastRecovery
	t.Logf("batch %v reported after the recovery from step %d; lost %d records", voided, ev.Step, ev.LostRecords)
	assertEveryEpochOnce(t, j.coord)
	want := faultExpected()
	withoutLost(want, ev.Lost, failedSlots)
	assert.Equal(t, want, serverRows(j.liveServers()), "every row holds every record once per epoch, but the lost ones on the failed slots")
}

// gatedBegin holds a worker's first Begin until the test releases it: by then the worker has
// joined, taken a lease and read a batch of it, and not begun training it.
type gatedBegin struct {
	elastic.Control
	once    sync.Once
	begun   chan struct{} // closed when the first Begin is called
	release chan struct{} // closed by the test: the first Begin goes on
}

func (g *gatedBegin) Begin(ctx context.Context, worker string, epoch uint64) error {
	g.once.Do(func() {
		close(g.begun)
		select {
		case <-g.release:
		case <-ctx.Done():
		}
	})
	return g.Control.Begin(ctx, worker, epoch)
}

// A worker that joins while a rollback runs, before the dispatcher is restored, takes a lease
// of the dispatcher's state from before the failure and reads a batch of it; the restore voids
// that lease. The worker must not train that batch: another worker trains the same positions
// from the restored dispatcher, a commit holds them done and the servers forget them
// (PruneApplied), so a push of the stale batch would land a second time with nothing left to
// refuse it. The schedule is injected: the worker joins and reads just before the dispatcher's
// restore, and calls Begin only once the data epoch of its batch is committed and pruned.
func TestRollbackTrainsNoBatchOfALeaseItVoided(t *testing.T) {
	recovered := make(chan elastic.RecoveryEvent, 8)
	j := startFaultJobWith(t, 3, checkpoint.NewMemStorage(), t.TempDir(), func(c *elastic.Config) {
		c.Recovery = elastic.Rollback
		c.CheckpointEvery = 0 // only the test's: it decides what is committed and pruned, and when
		c.Dispatcher.LeaseTTL, c.WorkerSilence, c.ArriveTimeout = time.Minute, time.Minute, time.Minute
		c.HealthEvery, c.ServerTimeout, c.ReplaceWait = 20*time.Millisecond, time.Second, time.Hour
		c.OnRecovery = func(ev elastic.RecoveryEvent) { recovered <- ev }
		c.Logger = testLogger(t)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	b := j.worker("b")
	steps := func(n int) {
		t.Helper()
		for range n {
			require.NoError(t, b.sess.Step(ctx, trainStep))
		}
	}
	checkpoint := func(why string) {
		t.Helper()
		_, err := j.coord.Checkpoint(ctx)
		require.NoError(t, err, why)
	}
	steps(4)
	checkpoint("the commit the rollback restores")
	steps(2) // rolled back, and trained again

	gate := &gatedBegin{begun: make(chan struct{}), release: make(chan struct{})}
	a := j.workerWith("a", func(c elastic.Control) elastic.Control {
		gate.Control = c
		return gate
	})
	var mu sync.Mutex
	var trained []ps.Position // by a
	stepA := func(ctx context.Context, bt *elastic.Batch) error {
		mu.Lock()
		trained = append(trained, bt.Position())
		mu.Unlock()
		return trainStep(ctx, bt)
	}
	aDone, hooked := make(chan error, 1), make(chan error, 1)
	var once sync.Once
	elastic.SetBeforeDispatcherRestore(j.coord, func() {
		once.Do(func() {
			go func() { aDone <- a.run(ctx, stepA) }()
			select {
			case <-gate.begun:
				hooked <- nil
			case err := <-aDone:
				hooked <- fmt.Errorf("worker a ended before its first batch: %v", err)
			case <-ctx.Done():
				hooked <- ctx.Err()
			}
		})
	})

	j.kill(1)
	require.NoError(t, j.restart(1))
	for ev := range recovered {
		if ev.Err == nil {
			assert.Equal(t, []string{"ps-1"}, ev.Replaced)
			break
		}
		t.Logf("recovery attempt failed: %v", ev.Err)
	}
	require.NoError(t, <-hooked, "worker a joined and read a batch while the rollback ran")
	elastic.SetBeforeDispatcherRestore(j.coord, nil)

	// b alone trains the rest of the first data epoch, the positions of a's batch among them.
	for j.coord.Dispatcher().Progress().Epoch < 1 {
		steps(1)
	}
	checkpoint("a commit that holds the first data epoch done")
	steps(1)
	checkpoint("a snapshot at which the servers forget the first data epoch's positions")

	close(gate.release)
	bDone := make(chan error, 1)
	go func() { bDone <- b.run(ctx, trainStep) }()
	require.NoError(t, <-aDone)
	require.NoError(t, <-bDone)
	checkpoint("the final commit")

	mu.Lock()
	for _, p := range trained {
		assert.NotZero(t, p.Epoch, "worker a trained %v, of the data epoch committed done before it began", p)
	}
	mu.Unlock()
	assertEveryEpochOnce(t, j.coord)
	assert.Equal(t, faultExpected(), serverRows(j.liveServers()), "every row holds every record once per epoch")
}
