package ps_test

import (
	"context"
	"fmt"
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

const migDim = 8

func migTables() []ps.TableSpec {
	opt := embedding.Optimizer{Kind: embedding.Adagrad, LearningRate: 0.05}
	return []ps.TableSpec{
		{Name: "emb", Config: embedding.Config{Dim: migDim, Seed: 11, Shards: 8, Optimizer: opt}},
		{Name: "mlp", Dense: 24, Config: embedding.Config{Optimizer: opt}},
	}
}

// detWorker trains a deterministic model: worker w of n owns the ids k*n+w, pulls and pushes
// batches of distinct ids from them with seeded gradients, and worker 0 also pushes the dense
// tensor. Rows of different workers never meet, so the final rows do not depend on how the
// workers' pushes interleave, only on how many batches each made.
type detWorker struct {
	w, n, rows int
	cl         *ps.Client
}

func (d *detWorker) batch(ctx context.Context, b int) error {
	rng := rand.New(rand.NewPCG(uint64(d.w), uint64(b)))
	perm := rng.Perm(d.rows)[:24]
	ids := make([]uint64, len(perm))
	for i, k := range perm {
		ids[i] = uint64(k*d.n + d.w)
	}
	vals := make([]float32, len(ids)*migDim)
	if err := d.cl.Pull(ctx, "emb", ids, vals); err != nil {
		return err
	}
	g := make([]float32, len(vals))
	for i := range g {
		g[i] = float32(rng.NormFloat64()) + 0.01*vals[i]
	}
	if err := d.cl.Push(ctx, "emb", ids, g, uint64(b+1)); err != nil {
		return err
	}
	if d.w == 0 {
		dg := make([]float32, 24)
		for i := range dg {
			dg[i] = float32(rng.NormFloat64())
		}
		if err := d.cl.PushDense(ctx, "mlp", dg, uint64(b+1)); err != nil {
			return err
		}
	}
	return nil
}

// rowsByID returns every row of table name on every server of c, failing the test when a row
// is on a server that does not own its slot by table, or on two servers.
func rowsByID(t *testing.T, c *pstest.Cluster, table *ps.OwnerTable, name string) map[uint64]embedding.RowData {
	t.Helper()
	return serverRows(t, c.Servers, table, name)
}

// serverRows is rowsByID over the given servers.
func serverRows(t *testing.T, servers []*ps.Server, table *ps.OwnerTable, name string) map[uint64]embedding.RowData {
	t.Helper()
	out := map[uint64]embedding.RowData{}
	for _, s := range servers {
		tab, ok := s.Table(name)
		require.True(t, ok)
		dense := name == "mlp"
		tab.Range(func(v embedding.RowView) bool {
			slot := embedding.Slot(v.ID, table.Slots)
			if dense {
				slot = table.NameSlot(name)
			}
			if owner := table.Owner(slot).ID; owner != s.ID() {
				t.Errorf("%s: row %d of slot %d is on %s, owner %s", name, v.ID, slot, s.ID(), owner)
			}
			if _, dup := out[v.ID]; dup && !dense {
				t.Errorf("%s: row %d on two servers", name, v.ID)
			}
			out[v.ID] = embedding.RowData{ID: v.ID, Weights: append([]float32(nil), v.Weights...), State: append([]float32(nil), v.State...), LastStep: v.LastStep, Freq: v.Freq}
			return true
		})
	}
	return out
}

func migrate(t *testing.T, ctx context.Context, c *pstest.Cluster, m *ps.Migrator, cur *ps.OwnerTable, ids ...string) *ps.OwnerTable {
	t.Helper()
	return migrateWith(t, ctx, c, m, cur, c.PublishTo, ids...)
}

// migrateWith is migrate with publish.
func migrateWith(t *testing.T, ctx context.Context, c *pstest.Cluster, m *ps.Migrator, cur *ps.OwnerTable, publish ps.Publish, ids ...string) *ps.OwnerTable {
	t.Helper()
	var nodes []ps.Node
	for _, id := range ids {
		if c.Server(id) == nil {
			c.AddServer(id)
		}
		nodes = append(nodes, c.Node(id))
	}
	next, err := ps.NewOwnerTable(0, cur.Slots, nodes, cur)
	require.NoError(t, err)
	moves := cur.Moves(next)
	got, err := m.Migrate(ctx, cur, next, publish)
	require.NoError(t, err)
	assert.True(t, got.SamePlacement(next))
	assert.Greater(t, got.Version, cur.Version)
	p := m.Progress()
	assert.False(t, p.Running)
	assert.Equal(t, len(moves), p.SlotsTotal)
	assert.Equal(t, len(moves), p.SlotsDone)
	assert.Equal(t, got.Version, p.Version)
	assert.Len(t, got.Nodes, len(ids))
	return got
}

// TestMigrateWhileTrainingIsBitExact trains a deterministic model on 2 servers while it is
// moved to 3, then 5, then back to 2 servers, and compares every row, optimizer state and
// update count, and the dense tensor, with a run that never moved: they are equal bit for bit.
func TestMigrateWhileTrainingIsBitExact(t *testing.T) {
	ctx := pstest.Context(t)
	const workers, rows = 4, 150
	c := pstest.New(t, 2, pstest.Options{Tables: migTables()})
	m := c.Migrator(ps.MigratorConfig{Concurrency: 3, GroupSlots: 5, ChunkBytes: 2048, Bandwidth: 4 << 20, SmallRound: 512})
	counts := make([]int, workers)
	var stop atomic.Bool
	var pushed, running atomic.Int64
	var warm, wg sync.WaitGroup
	running.Store(workers)
	for w := range workers {
		d := &detWorker{w: w, n: workers, rows: rows, cl: c.Client(fmt.Sprintf("worker-%d", w), ps.ClientConfig{})}
		warm.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer running.Add(-1)
			for b := 0; ; b++ {
				if b == 5 {
					warm.Done()
				}
				if b >= 5 && stop.Load() {
					counts[w] = b
					return
				}
				if err := d.batch(ctx, b); err != nil {
					t.Errorf("worker %d batch %d: %v", w, b, err)
					counts[w] = b
					if b < 5 {
						warm.Done()
					}
					return
				}
				pushed.Add(1)
			}
		}()
	}
	warm.Wait()
	// Every group waits after its copy for pushes to land, so training goes on during each
	// move whatever the scheduling (unless every worker has stopped on an error).
	pushesLand := func(ctx context.Context) {
		for start := pushed.Load(); pushed.Load() < start+2 && running.Load() > 0 && ctx.Err() == nil; {
			time.Sleep(time.Millisecond)
		}
	}
	cur := c.Holder.Get()
	for _, ids := range [][]string{{"ps-0", "ps-1", "ps-2"}, {"ps-0", "ps-1", "ps-2", "ps-3", "ps-4"}, {"ps-1", "ps-4"}} {
		for _, id := range ids {
			s := c.Server(id)
			if s == nil {
				s, _ = c.AddServer(id)
			}
			ps.SetAfterCopyHook(s, pushesLand)
		}
		before := pushed.Load()
		cur = migrate(t, ctx, c, m, cur, ids...)
		assert.Greater(t, pushed.Load(), before, "no push ran during the move to %v", ids)
	}
	stop.Store(true)
	wg.Wait()

	ref := pstest.New(t, 2, pstest.Options{Tables: migTables()})
	for w := range workers {
		d := &detWorker{w: w, n: workers, rows: rows, cl: ref.Client(fmt.Sprintf("ref-%d", w), ps.ClientConfig{})}
		for b := range counts[w] {
			require.NoError(t, d.batch(ctx, b))
		}
	}
	for _, name := range []string{"emb", "mlp"} {
		got := rowsByID(t, c, cur, name)
		want := rowsByID(t, ref, ref.Holder.Get(), name)
		require.NotEmpty(t, want)
		assert.Equal(t, len(want), len(got), name)
		for id, r := range want {
			assert.Equal(t, r, got[id], "%s row %d", name, id)
		}
	}
}

// TestMigrateManyWorkersLoseNoPush moves slots back and forth under many workers pushing
// overlapping rows, and checks every row's update count against the pushes made: a push lost,
// applied twice, or applied by a server that no longer owned the slot shows. A client that kept
// a table from before every move still lands its push on the right owner.
func TestMigrateManyWorkersLoseNoPush(t *testing.T) {
	ctx := pstest.Context(t)
	const workers, ids = 8, 400
	c := pstest.New(t, 2, pstest.Options{Tables: migTables()})
	m := c.Migrator(ps.MigratorConfig{Concurrency: 4, GroupSlots: 3, ChunkBytes: 1024})
	stale := c.Client("stale", ps.ClientConfig{})
	_, err := stale.OwnerTable(ctx)
	require.NoError(t, err)

	want := make([]atomic.Int64, ids)
	var stop atomic.Bool
	var wg, warm sync.WaitGroup
	for w := range workers {
		cl := c.Client(fmt.Sprintf("worker-%d", w), ps.ClientConfig{})
		wg.Add(1)
		warm.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 5))
			for b := 0; b < 3 || !stop.Load(); b++ {
				if b == 3 {
					warm.Done()
				}
				perm := rng.Perm(ids)[:16]
				batch := make([]uint64, len(perm))
				for i, k := range perm {
					batch[i] = uint64(k)
				}
				g := make([]float32, len(batch)*migDim)
				for i := range g {
					g[i] = 0.01
				}
				if err := cl.Push(ctx, "emb", batch, g, uint64(b+1)); err != nil {
					t.Errorf("worker %d push %d: %v", w, b, err)
					if b < 3 {
						warm.Done()
					}
					return
				}
				for _, id := range batch {
					want[id].Add(1)
				}
			}
		}()
	}
	warm.Wait()
	cur := c.Holder.Get()
	for _, set := range [][]string{{"ps-0", "ps-1", "ps-2", "ps-3"}, {"ps-1", "ps-2", "ps-3"}, {"ps-0", "ps-1", "ps-3"}, {"ps-3", "ps-4"}} {
		cur = migrate(t, ctx, c, m, cur, set...)
	}
	stop.Store(true)
	wg.Wait()
	// The stale client still routes by version 1.
	g := make([]float32, ids*migDim)
	all := make([]uint64, ids)
	for i := range all {
		all[i] = uint64(i)
		want[i].Add(1)
	}
	require.NoError(t, stale.Push(ctx, "emb", all, g, 1000))
	tab, err := stale.OwnerTable(ctx)
	require.NoError(t, err)
	assert.Equal(t, cur.Version, tab.Version, "the stale client ends with the newest table")

	got := rowsByID(t, c, cur, "emb")
	for id := range ids {
		r, ok := got[uint64(id)]
		if assert.True(t, ok, "row %d lost", id) {
			assert.Equal(t, uint32(want[id].Load()), r.Freq, "updates of row %d", id)
		}
	}
}

// TestMigrateKeepsExactlyOnceAcrossTheMove: a push marked with its batch position, applied by
// the old owner, is resent to the new owner after the move (as after a lost answer) and is not
// applied again.
func TestMigrateKeepsExactlyOnceAcrossTheMove(t *testing.T) {
	ctx := pstest.Context(t)
	c := pstest.New(t, 1, pstest.Options{Tables: migTables()})
	m := c.Migrator(ps.MigratorConfig{})
	cl := c.Client("w", ps.ClientConfig{})
	ids := make([]uint64, 200)
	for i := range ids {
		ids[i] = uint64(i)
	}
	g := make([]float32, len(ids)*migDim)
	for i := range g {
		g[i] = 1
	}
	pos := ps.Position{Epoch: 1, Shard: 2, Start: 100, End: 164}
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(pos)))
	cur := migrate(t, ctx, c, m, c.Holder.Get(), "ps-0", "ps-1")
	require.NotEmpty(t, cur.SlotsOf("ps-1").Members())
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(pos)))
	for id, r := range rowsByID(t, c, cur, "emb") {
		assert.Equal(t, uint32(1), r.Freq, "row %d applied twice", id)
	}
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 2, ps.At(ps.Position{Epoch: 1, Shard: 2, Start: 164, End: 228})))
	for id, r := range rowsByID(t, c, cur, "emb") {
		assert.Equal(t, uint32(2), r.Freq, "row %d: a new position must apply", id)
	}
}

// TestMigrateDestinationDiesMidway kills the destination of a move just after it fenced the
// source: the move fails, its slots stay with the source, which lifts the fence and serves them
// again, and training goes on without losing an update.
func TestMigrateDestinationDiesMidway(t *testing.T) {
	ctx := pstest.Context(t)
	const rows = 100
	c := pstest.New(t, 2, pstest.Options{Tables: migTables()})
	m := c.Migrator(ps.MigratorConfig{GroupSlots: 1000})
	d := &detWorker{w: 0, n: 1, rows: rows, cl: c.Client("w", ps.ClientConfig{FenceWait: 500 * time.Millisecond})}
	for b := range 5 {
		require.NoError(t, d.batch(ctx, b))
	}
	cur := c.Holder.Get()
	dest, node := c.AddServer("ps-2")
	reached := make(chan struct{})
	ps.SetAfterFenceHook(dest, func(ctx context.Context) {
		close(reached)
		<-ctx.Done()
	})
	go func() {
		<-reached
		dest.Close()
	}()
	next, err := ps.NewOwnerTable(0, cur.Slots, append(append([]ps.Node(nil), cur.Nodes...), node), cur)
	require.NoError(t, err)
	got, err := m.Migrate(ctx, cur, next, c.PublishTo)
	require.ErrorIs(t, err, ps.ErrMigration)
	assert.True(t, got.SamePlacement(cur), "nothing moved")
	p := m.Progress()
	assert.Equal(t, p.Groups, p.GroupsFailed)
	for b := 5; b < 10; b++ {
		require.NoError(t, d.batch(ctx, b), "the source serves its slots again")
	}
	ref := pstest.New(t, 2, pstest.Options{Tables: migTables()})
	rd := &detWorker{w: 0, n: 1, rows: rows, cl: ref.Client("w", ps.ClientConfig{})}
	for b := range 10 {
		require.NoError(t, rd.batch(ctx, b))
	}
	c.Servers = c.Servers[:2] // the dead destination holds nothing anyone reads
	want, gotRows := rowsByID(t, ref, ref.Holder.Get(), "emb"), rowsByID(t, c, got, "emb")
	assert.Equal(t, want, gotRows)
}

// TestRequestRoutedByAnOlderTableIsRefused: a slot moves away and back; a client still routing
// by the table from before is refused by the owner (which gained the slot at a newer version)
// and refreshes, though the owner's ID is the same in both tables.
func TestRequestRoutedByAnOlderTableIsRefused(t *testing.T) {
	ctx := pstest.Context(t)
	c := pstest.New(t, 1, pstest.Options{Tables: migTables()})
	m := c.Migrator(ps.MigratorConfig{})
	old := c.Client("old", ps.ClientConfig{})
	v1, err := old.OwnerTable(ctx)
	require.NoError(t, err)
	cur := migrate(t, ctx, c, m, v1, "ps-1")
	cur = migrate(t, ctx, c, m, cur, "ps-0")
	require.Equal(t, "ps-0", cur.Owner(0).ID)
	vals := make([]float32, migDim)
	require.NoError(t, old.Pull(ctx, "emb", []uint64{0}, vals))
	now, err := old.OwnerTable(ctx)
	require.NoError(t, err)
	assert.Equal(t, cur.Version, now.Version, "the refusal made the client refresh")
}

// TestMigratePublishRefusedCallsTheGroupOff: a Publish that answers ErrNotPublished (the job's
// table changed meanwhile) makes the Migrator lift the source's fence and stop; the source
// serves the slots again and the destination keeps none of their rows.
func TestMigratePublishRefusedCallsTheGroupOff(t *testing.T) {
	ctx := pstest.Context(t)
	c := pstest.New(t, 1, pstest.Options{Tables: migTables()})
	m := c.Migrator(ps.MigratorConfig{})
	d := &detWorker{w: 0, n: 1, rows: 100, cl: c.Client("w", ps.ClientConfig{FenceWait: 500 * time.Millisecond})}
	require.NoError(t, d.batch(ctx, 0))
	cur := c.Holder.Get()
	_, node := c.AddServer("ps-1")
	next, err := ps.NewOwnerTable(0, cur.Slots, append(append([]ps.Node(nil), cur.Nodes...), node), cur)
	require.NoError(t, err)
	got, err := m.Migrate(ctx, cur, next, func(ctx context.Context, t *ps.OwnerTable) error {
		return fmt.Errorf("the table changed: %w", ps.ErrNotPublished)
	})
	require.ErrorIs(t, err, ps.ErrNotPublished)
	assert.Same(t, cur, got)
	require.NoError(t, d.batch(ctx, 1), "the source serves its slots again")
	tab, _ := c.Server("ps-1").Table("emb")
	assert.Zero(t, tab.Len(), "the destination keeps nothing of a called-off group")
}

// TestMigratePublishFailureCallsOffEveryGroup: when a group's table cannot go out, the groups
// that finished their copy meanwhile are called off too, so no source stays fenced or keeps
// tracking them: the same move can be made again at once.
func TestMigratePublishFailureCallsOffEveryGroup(t *testing.T) {
	ctx := pstest.Context(t)
	c := pstest.New(t, 1, pstest.Options{Tables: migTables()})
	m := c.Migrator(ps.MigratorConfig{GroupSlots: 4, Concurrency: 2})
	d := &detWorker{w: 0, n: 1, rows: 100, cl: c.Client("w", ps.ClientConfig{FenceWait: 300 * time.Millisecond})}
	require.NoError(t, d.batch(ctx, 0))
	cur := c.Holder.Get()
	dest, node := c.AddServer("ps-1")
	var copied atomic.Int64
	second := make(chan struct{})
	ps.SetAfterCopyHook(dest, func(context.Context) {
		if copied.Add(1) == 2 {
			close(second)
		}
	})
	next, err := ps.NewOwnerTable(0, cur.Slots, append(append([]ps.Node(nil), cur.Nodes...), node), cur)
	require.NoError(t, err)
	_, err = m.Migrate(ctx, cur, next, func(ctx context.Context, t *ps.OwnerTable) error {
		<-second // a second group has copied and queues behind this publish
		return fmt.Errorf("the table changed: %w", ps.ErrNotPublished)
	})
	require.ErrorIs(t, err, ps.ErrNotPublished)
	for b := 1; b < 4; b++ {
		require.NoError(t, d.batch(ctx, b), "no slot is left fenced")
	}
	ps.SetAfterCopyHook(dest, nil)
	got, err := m.Migrate(ctx, cur, next, c.PublishTo)
	require.NoError(t, err, "no migration of those slots is left open on the source")
	assert.True(t, got.SamePlacement(next))
}

// TestMigrateLeavesSlotsTheDestinationWasGiven: a table gives the destination the slots while
// they are being copied to it (a recovery): the copy stops, and what the destination serves
// for them is not wiped.
func TestMigrateLeavesSlotsTheDestinationWasGiven(t *testing.T) {
	ctx := pstest.Context(t)
	c := pstest.New(t, 1, pstest.Options{Tables: migTables()})
	m := c.Migrator(ps.MigratorConfig{})
	d := &detWorker{w: 0, n: 1, rows: 100, cl: c.Client("w", ps.ClientConfig{})}
	require.NoError(t, d.batch(ctx, 0))
	cur := c.Holder.Get()
	dest, node := c.AddServer("ps-1")
	next, err := ps.NewOwnerTable(0, cur.Slots, append(append([]ps.Node(nil), cur.Nodes...), node), cur)
	require.NoError(t, err)
	var given *ps.OwnerTable
	ps.SetAfterFenceHook(dest, func(context.Context) {
		// Everything to the destination, as a recovery might decide; it serves from now on.
		var moves []ps.Move
		for s := range cur.Slots {
			moves = append(moves, ps.Move{Slot: s, From: "ps-0", To: "ps-1"})
		}
		g, err := cur.WithMoves(cur.Version+5, next.Nodes, moves)
		if err == nil {
			_, err = dest.SetOwnerTable(g)
		}
		assert.NoError(t, err)
		given = g
	})
	_, err = m.Migrate(ctx, cur, next, c.PublishTo)
	require.ErrorIs(t, err, ps.ErrMigration)
	tab, _ := dest.Table("emb")
	rows := 0
	tab.Range(func(v embedding.RowView) bool {
		if next.Owner(embedding.Slot(v.ID, cur.Slots)).ID == "ps-1" {
			rows++
		}
		return true
	})
	require.NotNil(t, given)
	assert.Positive(t, rows, "the rows the destination was given are still there")
}

// TestMigrateOverTLS: with mutual TLS the servers, the clients and the migration (server to
// server, and the migrator's calls) all speak TLS; a client without it is refused.
func TestMigrateOverTLS(t *testing.T) {
	ctx := pstest.Context(t)
	c := pstest.New(t, 1, pstest.Options{Tables: migTables(), TLS: pstest.TLS(t)})
	m := c.Migrator(ps.MigratorConfig{})
	d := &detWorker{w: 0, n: 1, rows: 100, cl: c.Client("w", ps.ClientConfig{})}
	require.NoError(t, d.batch(ctx, 0))
	cur := migrate(t, ctx, c, m, c.Holder.Get(), "ps-0", "ps-1")
	require.NotEmpty(t, cur.SlotsOf("ps-1").Members())
	require.NoError(t, d.batch(ctx, 1))

	plain, err := ps.NewClient(ps.ClientConfig{Secret: pstest.Secret(), Transport: c.Net.Host("plain"), Resolver: c.Holder, Retries: 1})
	require.NoError(t, err)
	defer plain.Close()
	vals := make([]float32, migDim)
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	assert.Error(t, plain.Pull(cctx, "emb", []uint64{1}, vals), "a client without TLS is refused")
}
