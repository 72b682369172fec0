package ps_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/ps/pstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
)

const syncWorkers = 3

// syncTrainer runs syncWorkers synchronous workers whose batches share rows: each step every
// worker pulls a seeded batch of ids, pushes gradients that depend on what it pulled, and pushes
// the dense tensor. Synchronous servers apply a step's pushes in worker order, so the final
// rows depend only on the number of steps, whatever the placement did meanwhile.
type syncTrainer struct {
	cls    []*ps.Client
	step   atomic.Int64 // highest step a worker has started
	stopAt atomic.Int64 // last step to run, once set
	notify chan int64   // worker 0's finished steps, once started (dropped when nobody listens)
	done   chan error   // the result of the run start began
	// beforePush, if set, runs before worker w pushes step s.
	beforePush func(w int, s int64)
}

func newSyncTrainer(c *pstest.Cluster) *syncTrainer {
	tr := &syncTrainer{}
	for w := range syncWorkers {
		tr.cls = append(tr.cls, c.Client("w"+string(rune('0'+w)), ps.ClientConfig{Sync: true, Worker: w, FenceWait: 5 * time.Second}))
	}
	return tr
}

func (tr *syncTrainer) batch(ctx context.Context, w int, s int64) error {
	cl := tr.cls[w]
	rng := rand.New(rand.NewPCG(uint64(w), uint64(s)))
	ids := make([]uint64, 24)
	for i := range ids {
		ids[i] = uint64(rng.IntN(300))
	}
	vals := make([]float32, len(ids)*migDim)
	if err := cl.Pull(ctx, "emb", ids, vals); err != nil {
		return err
	}
	g := make([]float32, len(vals))
	for i := range g {
		g[i] = float32(rng.NormFloat64()) + 0.05*vals[i]
	}
	if tr.beforePush != nil {
		tr.beforePush(w, s)
	}
	if err := cl.Push(ctx, "emb", ids, g, uint64(s)); err != nil {
		return err
	}
	dense := make([]float32, 24)
	if err := cl.PullDense(ctx, "mlp", dense); err != nil {
		return err
	}
	for i := range dense {
		dense[i] = float32(rng.NormFloat64()) + 0.05*dense[i]
	}
	return cl.PushDense(ctx, "mlp", dense, uint64(s))
}

// run trains from step first until stopAt (set by the caller, or fixed beforehand) and returns
// the first error; a worker's error stops the others (they would wait for it at every barrier).
func (tr *syncTrainer) run(ctx context.Context, first int64) error {
	g, ctx := errgroup.WithContext(ctx)
	for w := range syncWorkers {
		g.Go(func() error {
			for s := first; ; s++ {
				if stop := tr.stopAt.Load(); stop != 0 && s > stop {
					return nil
				}
				if s > 100_000 {
					return errors.New("training never stopped")
				}
				for cur := tr.step.Load(); s > cur && !tr.step.CompareAndSwap(cur, s); cur = tr.step.Load() {
				}
				if err := tr.batch(ctx, w, s); err != nil {
					return fmt.Errorf("worker %d, step %d: %w", w, s, err)
				}
				if w == 0 && tr.notify != nil {
					select {
					case tr.notify <- s:
					default:
					}
				}
			}
		})
	}
	return g.Wait()
}

// start runs the workers from step first in the background; wait returns their result.
func (tr *syncTrainer) start(ctx context.Context, first int64) {
	tr.notify, tr.done = make(chan int64), make(chan error, 1)
	go func() { tr.done <- tr.run(ctx, first) }()
}

func (tr *syncTrainer) wait() error { return <-tr.done }

// stopSoon sets the last step a little after every worker's current one: workers of a
// synchronous job are at most a step apart, so all of them stop at the same step.
func (tr *syncTrainer) stopSoon() int64 {
	stop := tr.step.Load() + 8
	tr.stopAt.Store(stop)
	return stop
}

// waitSteps returns once worker 0 has finished n more steps, and fails the test if training
// ends first.
func (tr *syncTrainer) waitSteps(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-tr.notify:
		case err := <-tr.done:
			t.Fatalf("training ended: %v", err)
		case <-time.After(time.Minute):
			t.Fatal("training does not progress")
		}
	}
}

// syncReference trains steps steps on 2 servers that never move a slot.
func syncReference(t *testing.T, ctx context.Context, steps int64) (emb, mlp map[uint64]embedding.RowData) {
	ref := pstest.New(t, 2, pstest.Options{Tables: migTables(), SyncWorkers: syncWorkers})
	tr := newSyncTrainer(ref)
	tr.stopAt.Store(steps)
	require.NoError(t, tr.run(ctx, 1))
	table := ref.Holder.Get()
	return rowsByID(t, ref, table, "emb"), rowsByID(t, ref, table, "mlp")
}

// TestSyncMigrateIsBitExact trains a synchronous job on 2 servers, scales it to 3, then 5, then
// back to 2 other servers while its workers push throughout; the final rows (weights, optimizer
// state, steps, counts) equal those of the same training with no repartition, bit for bit. The
// tables go out to the servers in order, or in reverse order with a pause before each server
// (clients then hold a table some servers have not installed).
func TestSyncMigrateIsBitExact(t *testing.T) {
	t.Run("publish in order", func(t *testing.T) { testSyncMigrateIsBitExact(t, nil) })
	t.Run("publish reversed and slow", func(t *testing.T) {
		testSyncMigrateIsBitExact(t, func(c *pstest.Cluster) ps.Publish {
			return func(ctx context.Context, table *ps.OwnerTable) error {
				c.Holder.Set(table)
				for i := len(table.Nodes) - 1; i >= 0; i-- {
					time.Sleep(5 * time.Millisecond) // the clients get ahead of the servers
					if _, err := c.Server(table.Nodes[i].ID).SetOwnerTable(table); err != nil {
						return err
					}
				}
				return nil
			}
		})
	})
}

func testSyncMigrateIsBitExact(t *testing.T, publish func(*pstest.Cluster) ps.Publish) {
	ctx := pstest.Context(t)
	c := pstest.New(t, 2, pstest.Options{Tables: migTables(), SyncWorkers: syncWorkers})
	m := c.Migrator(ps.MigratorConfig{GroupSlots: 4, Concurrency: 2, StepWait: 5 * time.Second})
	pub := c.PublishTo
	if publish != nil {
		pub = publish(c)
	}
	tr := newSyncTrainer(c)
	tr.start(ctx, 1)

	cur := c.Holder.Get()
	var during []int64
	for _, servers := range [][]string{{"ps-0", "ps-1", "ps-2"}, {"ps-0", "ps-1", "ps-2", "ps-3", "ps-4"}, {"ps-2", "ps-4"}} {
		tr.waitSteps(t, 3)
		before := tr.step.Load()
		cur = migrateWith(t, ctx, c, m, cur, pub, servers...)
		during = append(during, tr.step.Load()-before)
	}
	tr.waitSteps(t, 3)
	steps := tr.stopSoon()
	require.NoError(t, tr.wait())
	t.Logf("%d steps; steps run during each repartition: %v; final table version %d", steps, during, cur.Version)
	assert.Positive(t, during[0]+during[1]+during[2], "training went on during the repartitions")

	emb, mlp := rowsByID(t, c, cur, "emb"), rowsByID(t, c, cur, "mlp")
	refEmb, refMlp := syncReference(t, ctx, steps)
	require.NotEmpty(t, refEmb)
	assert.Equal(t, refEmb, emb, "embedding rows differ from training with no repartition")
	assert.Equal(t, refMlp, mlp, "dense tensor differs from training with no repartition")
	for _, id := range []string{"ps-0", "ps-1", "ps-3"} {
		tab, _ := c.Server(id).Table("emb")
		assert.Zero(t, tab.Len(), "%s left the job but keeps rows", id)
	}
}

// TestSyncMigrateDestinationDies kills the destination of a synchronous job's scale-out just
// after it fenced the source: the move fails, nothing moves, and training goes on to the same
// rows as with no repartition at all.
func TestSyncMigrateDestinationDies(t *testing.T) {
	ctx := pstest.Context(t)
	c := pstest.New(t, 2, pstest.Options{Tables: migTables(), SyncWorkers: syncWorkers})
	m := c.Migrator(ps.MigratorConfig{GroupSlots: 1000})
	tr := newSyncTrainer(c)
	tr.start(ctx, 1)

	tr.waitSteps(t, 3)
	cur := c.Holder.Get()
	dest, node := c.AddServer("ps-2")
	var once sync.Once
	ps.SetAfterFenceHook(dest, func(ctx context.Context) {
		once.Do(func() { go dest.Close() })
		<-ctx.Done()
	})
	next, err := ps.NewOwnerTable(0, cur.Slots, append(append([]ps.Node(nil), cur.Nodes...), node), cur)
	require.NoError(t, err)
	got, err := m.Migrate(ctx, cur, next, c.PublishTo)
	require.ErrorIs(t, err, ps.ErrMigration)
	assert.True(t, got.SamePlacement(cur), "nothing moved")
	tr.waitSteps(t, 3)
	steps := tr.stopSoon()
	require.NoError(t, tr.wait())

	live := c.Servers[:2] // what the dead destination had received died with it
	refEmb, refMlp := syncReference(t, ctx, steps)
	assert.Equal(t, refEmb, serverRows(t, live, cur, "emb"))
	assert.Equal(t, refMlp, serverRows(t, live, cur, "mlp"))
}

// TestSyncMigrateSourceDies kills the source of a synchronous job's scale-out in its handover,
// while every server is held at a step boundary. Its rows are gone, so the job rolls back to
// its last commit onto three fresh servers and replays the steps since: the final rows equal the
// training with no failure and no repartition, bit for bit.
func TestSyncMigrateSourceDies(t *testing.T) {
	ctx := pstest.Context(t)
	c := pstest.New(t, 2, pstest.Options{Tables: migTables(), SyncWorkers: syncWorkers})
	// One group at a time, ps-0's first: the first handover is ps-0's.
	m := c.Migrator(ps.MigratorConfig{GroupSlots: 1000, Concurrency: 1})
	store, shm := checkpoint.NewMemStorage(), t.TempDir()
	local := func(srv *ps.Server) *server.Server {
		l, err := server.New(srv, c.Node(srv.ID()).Addr, checkpoint.Config{Job: "sync", Storage: store, ShmDir: shm})
		require.NoError(t, err)
		t.Cleanup(func() { l.Close() })
		return l
	}
	const commit, last = 10, 30
	tr := newSyncTrainer(c)
	tr.stopAt.Store(commit)
	require.NoError(t, tr.run(ctx, 1))
	committer, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "sync", Storage: store})
	require.NoError(t, err)
	var refs []checkpoint.ManifestRef
	for _, srv := range c.Servers {
		l := local(srv)
		_, err := l.Snapshot(ctx, commit, elastic.Progress{}, elastic.Progress{})
		require.NoError(t, err)
		ref, err := l.WaitPersisted(ctx, commit)
		require.NoError(t, err)
		refs = append(refs, ref)
	}
	_, err = committer.Commit(ctx, commit, refs)
	require.NoError(t, err)

	// Training goes on, with no last step: it must still be running when the destination of a
	// scale-out kills the source, once it has fenced it.
	tr.stopAt.Store(0)
	tr.start(ctx, commit+1)
	tr.waitSteps(t, 2)
	cur := c.Holder.Get()
	dest, node := c.AddServer("ps-2")
	var once sync.Once
	ps.SetAfterFenceHook(dest, func(context.Context) {
		once.Do(func() {
			c.Net.Kill("ps-0")
			c.Server("ps-0").Close()
		})
	})
	next, err := ps.NewOwnerTable(0, cur.Slots, append(append([]ps.Node(nil), cur.Nodes...), node), cur)
	require.NoError(t, err)
	got, err := m.Migrate(ctx, cur, next, c.PublishTo)
	require.ErrorIs(t, err, ps.ErrMigration)
	assert.True(t, got.SamePlacement(cur), "nothing moved")
	require.Error(t, tr.wait(), "training cannot go on without ps-0")

	// Rollback: every server restarts from the commit, here as three fresh ones.
	for _, srv := range c.Servers {
		srv.Close()
	}
	var restored []*ps.Server
	var nodes []ps.Node
	for _, id := range []string{"ps-3", "ps-4", "ps-5"} {
		srv, node := c.AddServer(id)
		restored, nodes = append(restored, srv), append(nodes, node)
	}
	table, err := ps.NewOwnerTable(got.Version+1, cur.Slots, nodes, nil)
	require.NoError(t, err)
	for _, srv := range restored {
		require.NoError(t, local(srv).Load(ctx, commit, table))
	}
	require.NoError(t, c.PublishTo(ctx, table))
	rt := newSyncTrainer(c)
	rt.stopAt.Store(last)
	require.NoError(t, rt.run(ctx, commit+1))

	refEmb, refMlp := syncReference(t, ctx, last)
	assert.Equal(t, refEmb, serverRows(t, restored, table, "emb"))
	assert.Equal(t, refMlp, serverRows(t, restored, table, "mlp"))
}

// TestSyncMigrateStepWait: a worker stalls in the middle of a step another worker has pushed,
// so the servers cannot reach a step boundary within StepWait. The handovers are called off,
// the holds end, and once the worker goes on training does too (no server stays held), to the
// same rows as with no repartition.
func TestSyncMigrateStepWait(t *testing.T) {
	ctx := pstest.Context(t)
	c := pstest.New(t, 2, pstest.Options{Tables: migTables(), SyncWorkers: syncWorkers})
	m := c.Migrator(ps.MigratorConfig{GroupSlots: 8, StepWait: 100 * time.Millisecond})
	tr := newSyncTrainer(c)
	const stallAt = 6
	stalled, goOn := make(chan struct{}), make(chan struct{})
	tr.beforePush = func(w int, s int64) {
		if w == 2 && s == stallAt {
			close(stalled)
			<-goOn
		}
	}
	// Until a server has counted another worker's push of the step, the servers can stop at
	// the boundary before it, and a handover could go through.
	begun := make(chan struct{})
	var once sync.Once
	for _, srv := range c.Servers {
		ps.SetCountedHook(srv, func(table string, w, s uint32) {
			if w != 2 && s == stallAt {
				once.Do(func() { close(begun) })
			}
		})
	}
	tr.start(ctx, 1)
	<-stalled
	<-begun
	cur := c.Holder.Get()
	_, node := c.AddServer("ps-2")
	next, err := ps.NewOwnerTable(0, cur.Slots, append(append([]ps.Node(nil), cur.Nodes...), node), cur)
	require.NoError(t, err)
	got, err := m.Migrate(ctx, cur, next, c.PublishTo)
	require.ErrorIs(t, err, ps.ErrMigration)
	assert.ErrorContains(t, err, "step boundary")
	assert.True(t, got.SamePlacement(cur), "nothing moved")
	close(goOn)
	tr.waitSteps(t, 5)
	steps := tr.stopSoon()
	require.NoError(t, tr.wait())

	// And the next scale-out goes through.
	refEmb, refMlp := syncReference(t, ctx, steps)
	assert.Equal(t, refEmb, rowsByID(t, c, cur, "emb"))
	assert.Equal(t, refMlp, rowsByID(t, c, cur, "mlp"))
	tr.stopAt.Store(0)
	tr.start(ctx, steps+1)
	tr.waitSteps(t, 2)
	patient := c.Migrator(ps.MigratorConfig{GroupSlots: 8}) // a step may take 100 ms here
	cur = migrateWith(t, ctx, c, patient, cur, c.PublishTo, "ps-0", "ps-1", "ps-2")
	tr.waitSteps(t, 2)
	steps = tr.stopSoon()
	require.NoError(t, tr.wait())
	refEmb, refMlp = syncReference(t, ctx, steps)
	assert.Equal(t, refEmb, rowsByID(t, c, cur, "emb"))
	assert.Equal(t, refMlp, rowsByID(t, c, cur, "mlp"))
}
