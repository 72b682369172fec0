package ps_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/ps/pstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	notify chan int64   // worker 0's finished steps, if set (dropped when nobody listens)
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

// run trains until stopAt (set by the caller, or fixed beforehand) and returns the first error.
func (tr *syncTrainer) run(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, syncWorkers)
	for w := range syncWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := int64(1); ; s++ {
				if stop := tr.stopAt.Load(); stop != 0 && s > stop {
					return
				}
				if s > 100_000 {
					errs[w] = assert.AnError
					return
				}
				for cur := tr.step.Load(); s > cur && !tr.step.CompareAndSwap(cur, s); cur = tr.step.Load() {
				}
				if err := tr.batch(ctx, w, s); err != nil {
					errs[w] = err
					return
				}
				if w == 0 && tr.notify != nil {
					select {
					case tr.notify <- s:
					default:
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// stopSoon sets the last step a little after every worker's current one: workers of a
// synchronous job are at most a step apart, so all of them stop at the same step.
func (tr *syncTrainer) stopSoon() int64 {
	stop := tr.step.Load() + 8
	tr.stopAt.Store(stop)
	return stop
}

// waitSteps returns once worker 0 has finished n more steps.
func (tr *syncTrainer) waitSteps(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-tr.notify:
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
	require.NoError(t, tr.run(ctx))
	table := ref.Holder.Get()
	return rowsByID(t, ref, table, "emb"), rowsByID(t, ref, table, "mlp")
}

// TestSyncMigrateIsBitExact trains a synchronous job on 2 servers, scales it to 3, then 5, then
// back to 2 other servers while its workers push throughout; the final rows (weights, optimizer
// state, steps, counts) equal those of the same training with no repartition, bit for bit.
func TestSyncMigrateIsBitExact(t *testing.T) {
	ctx := pstest.Context(t)
	c := pstest.New(t, 2, pstest.Options{Tables: migTables(), SyncWorkers: syncWorkers})
	m := c.Migrator(ps.MigratorConfig{GroupSlots: 4, Concurrency: 2, StepWait: 3 * time.Second})
	tr := newSyncTrainer(c)
	tr.notify = make(chan int64)
	done := make(chan error, 1)
	go func() { done <- tr.run(ctx) }()

	cur := c.Holder.Get()
	var during []int64
	for _, servers := range [][]string{{"ps-0", "ps-1", "ps-2"}, {"ps-0", "ps-1", "ps-2", "ps-3", "ps-4"}, {"ps-2", "ps-4"}} {
		tr.waitSteps(t, 3)
		before := tr.step.Load()
		cur = migrate(t, ctx, c, m, cur, servers...)
		during = append(during, tr.step.Load()-before)
	}
	tr.waitSteps(t, 3)
	steps := tr.stopSoon()
	require.NoError(t, <-done)
	t.Logf("%d steps; steps run during each repartition: %v; final table version %d", steps, during, cur.Version)

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
	tr.notify = make(chan int64)
	done := make(chan error, 1)
	go func() { done <- tr.run(ctx) }()

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
	require.NoError(t, <-done)

	c.Servers = c.Servers[:2] // what the dead destination had received died with it
	refEmb, refMlp := syncReference(t, ctx, steps)
	assert.Equal(t, refEmb, rowsByID(t, c, cur, "emb"))
	assert.Equal(t, refMlp, rowsByID(t, c, cur, "mlp"))
}
