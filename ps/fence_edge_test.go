package ps_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/ps/pstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A floor never goes down: SetEpochFloor(10) then SetEpochFloor(5) still refuses epoch 7, and
// an epoch fenced above the floor stays fenced; epochs above both train.
func TestEpochFloorNeverLowers(t *testing.T) {
	c := pstest.New(t, 1, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	srv := c.Servers[0]
	cl := c.Client("w", ps.ClientConfig{})
	ids, g := randomBatch(rand.New(rand.NewPCG(41, 42)), 32, 200)
	ref := reference(t)

	srv.SetEpochFloor(10)
	srv.Fence(12)
	srv.SetEpochFloor(5)
	for _, e := range []uint64{0, 7, 9, 12} {
		cl.SetEpoch(e)
		require.ErrorIs(t, cl.Push(ctx, "emb", ids, g, 1), ps.ErrFenced, "epoch %d", e)
	}
	assert.Empty(t, clusterRows(t, c.Servers, "emb"), "nothing of a refused push landed")
	for step, e := range []uint64{10, 11, 13} {
		cl.SetEpoch(e)
		require.NoError(t, cl.Push(ctx, "emb", ids, g, uint64(step+2)), "epoch %d", e)
		applyRef(t, ref, ids, g, uint32(step+2))
	}
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"))
}

// slotsWithRows returns up to n slots that server id owns by table and that hold rows of ids.
func slotsWithRows(table *ps.OwnerTable, id string, ids []uint64, n int) []int {
	seen := map[int]bool{}
	var out []int
	for _, x := range ids {
		sl := embedding.Slot(x, table.Slots)
		if table.Owner(sl).ID == id && !seen[sl] && len(out) < n {
			seen[sl] = true
			out = append(out, sl)
		}
	}
	return out
}

// movesOf returns the moves of slots from one server to another.
func movesOf(slots []int, from, to string) []ps.Move {
	var m []ps.Move
	for _, sl := range slots {
		m = append(m, ps.Move{Slot: sl, From: from, To: to})
	}
	return m
}

// A source asked to release a migration while its table still gives it the slots (the table
// giving them to the destination is not installed yet) refuses and deletes nothing: called
// off, the migration leaves the source serving the slots with every row and every applied
// position it had. Once the table is installed, the release deletes the rows.
func TestReleaseBeforeTheTableDeletesNothing(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	src, dst := c.Server("ps-0"), c.Server("ps-1")
	cl := c.Client("w", ps.ClientConfig{Resolver: c.Holder})
	ref := reference(t)
	ids, g := randomBatch(rand.New(rand.NewPCG(43, 44)), 400, 2000)
	pos := ps.Position{Shard: 2, Start: 0, End: 400}
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(pos)))
	applyRef(t, ref, ids, g, 1)
	v1 := c.Holder.Get()
	slots := slotsWithRows(v1, "ps-0", ids, 4)
	require.Len(t, slots, 4)
	srcTab, _ := src.Table("emb")
	before := rowsOf(srcTab)

	_, err := dst.ReceiveSlots(ctx, ps.MigrationSpec{ID: 1, From: c.Node("ps-0"), Slots: slots})
	require.NoError(t, err)
	n, err := src.ReleaseMigration(1)
	require.Error(t, err, "a release while the source owns the slots")
	assert.Zero(t, n)
	assert.Equal(t, before, rowsOf(srcTab), "the refused release deleted rows")

	// Called off: the source serves the slots again, rows and applied positions intact.
	src.AbortMigration(1)
	_, err = dst.DiscardSlots(slots)
	require.NoError(t, err)
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 2, ps.At(pos)), "the resend is recognised")
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"), "the batch is held once")
	ids2, g2 := randomBatch(rand.New(rand.NewPCG(45, 46)), 400, 2000)
	require.NoError(t, cl.Push(ctx, "emb", ids2, g2, 3, ps.At(ps.Position{Shard: 2, Start: 400, End: 800})))
	applyRef(t, ref, ids2, g2, 3)
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"))

	// The control: with the table installed, the release deletes the slots' rows.
	_, err = dst.ReceiveSlots(ctx, ps.MigrationSpec{ID: 2, From: c.Node("ps-0"), Slots: slots})
	require.NoError(t, err)
	v2, err := v1.WithMoves(v1.Version+1, v1.Nodes, movesOf(slots, "ps-0", "ps-1"))
	require.NoError(t, err)
	require.NoError(t, c.PublishTo(ctx, v2))
	// Installing the table releases the migration in the background (SetOwnerTable): the
	// explicit release may find it done, or wait for it. Either way the slots' rows are gone.
	_, err = src.ReleaseMigration(2)
	require.NoError(t, err)
	moved := map[int]bool{}
	for _, sl := range slots {
		moved[sl] = true
	}
	srcTab.Range(func(v embedding.RowView) bool {
		assert.False(t, moved[embedding.Slot(v.ID, c.Slots)], "row %d of a released slot left on the source", v.ID)
		return true
	})
	assert.Equal(t, rowsOf(ref), rowsOf(serverTables(t, c.Servers, "emb")...))
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 4, ps.At(pos)), "the resend, now to the destination")
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"), "the destination has the applied positions")
}

// serverTables returns the table name of every server.
func serverTables(t *testing.T, servers []*ps.Server, name string) []*embedding.Table {
	t.Helper()
	var out []*embedding.Table
	for _, s := range servers {
		tab, ok := s.Table(name)
		require.True(t, ok)
		out = append(out, tab)
	}
	return out
}

// rowsInSlots returns the rows of tab whose slot is in slots.
func rowsInSlots(tab *embedding.Table, slots int, in []int) map[uint64]embedding.RowData {
	set := embedding.NewSlotSet(slots, in...)
	out := map[uint64]embedding.RowData{}
	tab.Range(func(v embedding.RowView) bool {
		if set.Contains(v.ID) {
			out[v.ID] = embedding.RowData{ID: v.ID, Weights: append([]float32(nil), v.Weights...), State: append([]float32(nil), v.State...), LastStep: v.LastStep, Freq: v.Freq}
		}
		return true
	})
	return out
}

// A destination that holds rows of the incoming slots from an earlier time (some the source
// also holds, with other values, some the source never had) ends the migration with exactly
// the source's rows of those slots.
func TestMigrationReplacesTheDestinationsStaleRows(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	src, dst := c.Server("ps-0"), c.Server("ps-1")
	cl := c.Client("w", ps.ClientConfig{Resolver: c.Holder})
	rng := rand.New(rand.NewPCG(47, 48))
	ids, g := randomBatch(rng, 400, 2000)
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1))
	v1 := c.Holder.Get()
	slots := slotsWithRows(v1, "ps-0", ids, 6)
	require.Len(t, slots, 6)
	set := embedding.NewSlotSet(v1.Slots, slots...)

	// Stale rows on the destination: ids of the slots the source holds, and others it never had.
	var stale []uint64
	for _, id := range ids {
		if set.Contains(id) && !slices.Contains(stale, id) {
			stale = append(stale, id)
		}
	}
	shared := len(stale)
	for x := uint64(1); len(stale) < 2*shared; x++ {
		if id := x * 0x51ed27; set.Contains(id) && !slices.Contains(ids, id) {
			stale = append(stale, id)
		}
	}
	dstTab, _ := dst.Table("emb")
	sg := make([]float32, len(stale)*dim)
	for i := range sg {
		sg[i] = 5
	}
	require.NoError(t, dstTab.Apply(stale, sg, 9))
	srcTab, _ := src.Table("emb")
	want := rowsInSlots(srcTab, v1.Slots, slots)
	require.Len(t, want, shared)

	_, err := dst.ReceiveSlots(ctx, ps.MigrationSpec{ID: 1, From: c.Node("ps-0"), Slots: slots})
	require.NoError(t, err)
	v2, err := v1.WithMoves(v1.Version+1, v1.Nodes, movesOf(slots, "ps-0", "ps-1"))
	require.NoError(t, err)
	require.NoError(t, c.PublishTo(ctx, v2))
	_, err = src.ReleaseMigration(1)
	require.NoError(t, err)
	assert.Equal(t, want, rowsInSlots(dstTab, v1.Slots, slots), "the destination holds exactly the source's rows")
	assert.Empty(t, rowsInSlots(srcTab, v1.Slots, slots))
}

// A synchronous server checks a push's epoch when its step's barrier counts it: a fenced
// epoch is refused and never counted, so the step waits for the worker's push under its new
// epoch.
func TestSyncServerRefusesFencedEpoch(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}, SyncWorkers: 2})
	ctx := pstest.Context(t)
	w0 := c.Client("w0", ps.ClientConfig{Sync: true, Worker: 0})
	w1 := c.Client("w1", ps.ClientConfig{Sync: true, Worker: 1})
	w0.SetEpoch(1<<32 | 1)
	w1.SetEpoch(1<<32 | 2)
	counted := make(chan uint32, 16)
	for _, s := range c.Servers {
		s.Fence(1<<32 | 1)
		ps.SetCountedHook(s, func(_ string, worker, _ uint32) { counted <- worker })
	}
	rng := rand.New(rand.NewPCG(49, 50))
	ids0, g0 := randomBatch(rng, 40, 100)
	ids1, g1 := randomBatch(rng, 40, 100)
	pushed := make(chan error, 1)
	go func() { pushed <- w0.Push(ctx, "emb", ids0, g0, 1) }()
	select {
	case err := <-pushed:
		require.ErrorIs(t, err, ps.ErrFenced)
	case w := <-counted:
		t.Fatalf("a push of a fenced epoch was counted (worker %d)", w)
	}
	assert.Empty(t, clusterRows(t, c.Servers, "emb"))

	w0.SetEpoch(1<<32 | 3)
	done := make(chan error, 1)
	go func() { done <- w0.Push(ctx, "emb", ids0, g0, 1) }()
	require.NoError(t, w1.Push(ctx, "emb", ids1, g1, 1))
	require.NoError(t, <-done)
	ref := reference(t)
	applyRef(t, ref, ids0, g0, 1)
	applyRef(t, ref, ids1, g1, 1)
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"))
}

// A synchronous server whose steps a hold ended with table version floor (a repartition)
// takes no newer table in the middle of a step, floor+1 included: a step's pushes must all be
// routed by one table.
func TestSyncServerRefusesTableAboveFloorMidStep(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}, SyncWorkers: 2})
	ctx := pstest.Context(t)
	m := c.Migrator(ps.MigratorConfig{})
	v1 := c.Holder.Get()
	c.AddServer("ps-2")
	next, err := ps.NewOwnerTable(0, v1.Slots, []ps.Node{c.Node("ps-0"), c.Node("ps-1"), c.Node("ps-2")}, v1)
	require.NoError(t, err)
	floor, err := m.Migrate(ctx, v1, next, c.PublishTo) // the hold ends with the floor at its table
	require.NoError(t, err)

	w0 := c.Client("w0", ps.ClientConfig{Sync: true, Worker: 0, Resolver: c.Holder})
	w1 := c.Client("w1", ps.ClientConfig{Sync: true, Worker: 1, Resolver: c.Holder})
	counted := make(chan struct{}, 16)
	for _, s := range c.Servers {
		ps.SetCountedHook(s, func(string, uint32, uint32) { counted <- struct{}{} })
	}
	var ids []uint64
	for x := uint64(0); len(ids) < 60; x++ {
		ids = append(ids, x*0x9e3779b97f4a7c15)
	}
	g := make([]float32, len(ids)*dim)
	for i := range g {
		g[i] = 0.25
	}
	pushed := make(chan error, 1)
	go func() { pushed <- w0.Push(ctx, "emb", ids, g, 1) }()
	for range c.Servers {
		<-counted // worker 0's push is counted everywhere: step 1 is under way
	}
	above, err := floor.WithMoves(floor.Version+1, floor.Nodes, nil)
	require.NoError(t, err)
	for _, s := range c.Servers {
		_, err := s.SetOwnerTable(above)
		require.ErrorIs(t, err, ps.ErrBadConfig, "%s took table %d (floor %d) in the middle of a step", s.ID(), above.Version, floor.Version)
		assert.Equal(t, floor.Version, s.OwnerTable().Version)
	}
	require.NoError(t, w1.Push(ctx, "emb", ids, g, 1))
	require.NoError(t, <-pushed)
}
