package ps_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/ps/pstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rowState is a row's weights and optimizer state, the whole of what a double apply changes.
type rowState struct{ w, st []float32 }

// rowsOf collects every row of the tables (a cluster's servers hold disjoint rows).
func rowsOf(tables ...*embedding.Table) map[uint64]rowState {
	out := map[uint64]rowState{}
	for _, t := range tables {
		t.Range(func(v embedding.RowView) bool {
			out[v.ID] = rowState{slices.Clone(v.Weights), slices.Clone(v.State)}
			return true
		})
	}
	return out
}

// clusterRows collects table name from every server of c.
func clusterRows(t *testing.T, servers []*ps.Server, name string) map[uint64]rowState {
	t.Helper()
	var tabs []*embedding.Table
	for _, s := range servers {
		tab, ok := s.Table(name)
		require.True(t, ok)
		tabs = append(tabs, tab)
	}
	return rowsOf(tabs...)
}

// applyRef applies a push to the reference as a client does: repeated ids folded into one row
// update with their gradients summed.
func applyRef(t *testing.T, ref *embedding.Table, ids []uint64, grads []float32, step uint32) {
	t.Helper()
	var uniq []uint64
	sum := map[uint64][]float32{}
	for i, id := range ids {
		g := sum[id]
		if g == nil {
			g = make([]float32, dim)
			uniq = append(uniq, id)
		}
		for j := range dim {
			g[j] += grads[i*dim+j]
		}
		sum[id] = g
	}
	var flat []float32
	for _, id := range uniq {
		flat = append(flat, sum[id]...)
	}
	require.NoError(t, ref.Apply(uniq, flat, step))
}

// A positioned batch: a pull creates the rows it touches in the reference too.
func touch(t *testing.T, ref *embedding.Table, ids []uint64) {
	t.Helper()
	require.NoError(t, ref.Lookup(ids, make([]float32, len(ids)*dim)))
}

func TestFencedEpochIsRefused(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	a := c.Client("a", ps.ClientConfig{})
	b := c.Client("b", ps.ClientConfig{})
	a.SetEpoch(1<<32 | 1)
	b.SetEpoch(1<<32 | 2)
	ref := reference(t)
	ids, g := randomBatch(rand.New(rand.NewPCG(3, 4)), 64, 500)
	require.NoError(t, a.Push(ctx, "emb", ids, g, 1))
	applyRef(t, ref, ids, g, 1)

	for _, s := range c.Servers {
		s.Fence(a.Epoch())
	}
	err := a.Push(ctx, "emb", ids, g, 2)
	require.ErrorIs(t, err, ps.ErrFenced)
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"), "a refused push changes nothing")

	require.NoError(t, b.Push(ctx, "emb", ids, g, 2), "other epochs still train")
	applyRef(t, ref, ids, g, 2)
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"))

	// A floor above b's epoch fences b, and unfenced clients (epoch 0) too.
	for _, s := range c.Servers {
		s.SetEpochFloor(2 << 32)
	}
	require.ErrorIs(t, b.Push(ctx, "emb", ids, g, 3), ps.ErrFenced)
	require.ErrorIs(t, c.Client("zero", ps.ClientConfig{}).Push(ctx, "emb", ids, g, 3), ps.ErrFenced)
	require.ErrorIs(t, a.PushDense(ctx, "nothing", []float32{1}, 3), ps.ErrUnknownTable, "dense pushes are checked after the table")
	b.SetEpoch(2<<32 | 1)
	require.NoError(t, b.Push(ctx, "emb", ids, g, 3), "a new epoch above the floor trains")
	applyRef(t, ref, ids, g, 3)
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"))
}

// Fence returns only once a push of the fenced epoch that is being applied has finished, so
// nothing of that epoch lands after it.
func TestFenceWaitsForThePushInFlight(t *testing.T) {
	c := pstest.New(t, 1, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	cl := c.Client("w", ps.ClientConfig{})
	cl.SetEpoch(7)
	srv := c.Servers[0]
	inApply, release := make(chan struct{}), make(chan struct{})
	ps.SetBeforeApplyHook(srv, func() {
		close(inApply)
		<-release
	})
	ids, g := randomBatch(rand.New(rand.NewPCG(5, 6)), 16, 100)
	pushed := make(chan error, 1)
	go func() { pushed <- cl.Push(ctx, "emb", ids, g, 1) }()
	<-inApply
	fenced := make(chan struct{})
	go func() {
		srv.Fence(7)
		close(fenced)
	}()
	select {
	case <-fenced:
		t.Fatal("Fence returned while a push of the epoch was being applied")
	case <-time.After(20 * time.Millisecond):
	}
	ps.SetBeforeApplyHook(srv, nil)
	close(release)
	<-fenced
	require.NoError(t, <-pushed, "the push in flight passed the fence check and lands")
	ref := reference(t)
	applyRef(t, ref, ids, g, 1)
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"), "it landed before Fence returned")
	require.ErrorIs(t, cl.Push(ctx, "emb", ids, g, 2), ps.ErrFenced)
}

// A batch pushed twice with its position, one after the other and concurrently, lands once; a
// batch at another position lands again.
func TestPositionIsAppliedOnce(t *testing.T) {
	c := pstest.New(t, 3, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	cl := c.Client("w", ps.ClientConfig{})
	ref := reference(t)
	rng := rand.New(rand.NewPCG(7, 8))
	ids, g := randomBatch(rng, 256, 300) // repeated ids included
	pos := ps.Position{Epoch: 0, Shard: 3, Start: 512, End: 768}
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(pos)))
	applyRef(t, ref, ids, g, 1)
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 2, ps.At(pos)), "a repeat answers success")
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"), "and changes nothing")

	var wg sync.WaitGroup
	pos2 := ps.Position{Epoch: 0, Shard: 3, Start: 768, End: 1024}
	for range 4 {
		wg.Go(func() { assert.NoError(t, cl.Push(ctx, "emb", ids, g, 3, ps.At(pos2))) })
	}
	wg.Wait()
	applyRef(t, ref, ids, g, 3)
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"), "four concurrent copies land once")

	// Dense tensors too.
	opt := embedding.Optimizer{Kind: embedding.Adagrad, LearningRate: 0.1}
	require.NoError(t, cl.InitDense(ctx, "mlp", []float32{1, 2, 3}, opt))
	for range 3 {
		require.NoError(t, cl.PushDense(ctx, "mlp", []float32{0.5, -1, 2}, 4, ps.At(pos)))
	}
	got := make([]float32, 3)
	require.NoError(t, cl.PullDense(ctx, "mlp", got))
	dref, err := embedding.New(embedding.Config{Dim: 3, Optimizer: opt})
	require.NoError(t, err)
	require.NoError(t, dref.Assign([]uint64{1}, []float32{1, 2, 3}))
	require.NoError(t, dref.Apply([]uint64{1}, []float32{0.5, -1, 2}, 4))
	want := make([]float32, 3)
	require.NoError(t, dref.Lookup([]uint64{1}, want))
	assert.Equal(t, want, got, "a dense push at one position lands once")
}

// The answer to a push is lost after the server applied it: the client resends a positioned
// push, which the server recognises, and reports success; the rows hold it once. An unpositioned
// push in the same plight is reported failed, never resent, and also held once.
func TestLostAnswerIsResentOnce(t *testing.T) {
	for _, positioned := range []bool{true, false} {
		c := pstest.New(t, 1, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
		ctx := pstest.Context(t)
		cl := c.Client("w", ps.ClientConfig{Retries: 3, RetryBackoff: time.Millisecond})
		ref := reference(t)
		ids, g := randomBatch(rand.New(rand.NewPCG(9, 10)), 32, 100)
		require.NoError(t, cl.Pull(ctx, "emb", ids, make([]float32, len(ids)*dim)), "connect")
		touch(t, ref, ids)
		var opts []ps.PushOption
		if positioned {
			opts = append(opts, ps.At(ps.Position{Shard: 1, Start: 0, End: 32}))
		}
		before := c.Servers[0].Stats(false).Pushes
		c.Net.SetDrop("ps-0", "w", true) // the server's answers are lost
		done := make(chan error, 1)
		go func() { done <- cl.Push(ctx, "emb", ids, g, 1, opts...) }()
		for c.Servers[0].Stats(false).Pushes == before {
			time.Sleep(time.Millisecond) // until the server has applied the push
		}
		c.Net.SetDrop("ps-0", "w", false) // the connection is reset
		err := <-done
		if positioned {
			require.NoError(t, err, "the resent push is recognised")
		} else {
			require.Error(t, err, "a push that may have been applied is never reported as done")
		}
		applyRef(t, ref, ids, g, 1)
		assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"), "positioned %v: applied once", positioned)
		c.Close()
	}
}

// A batch reached two of three servers before its worker died. The servers' rows and applied
// positions are saved, restored onto one and onto two servers, and the batch is replayed
// there: every row holds it exactly once.
func TestAppliedStateSurvivesARestoreOntoOtherServers(t *testing.T) {
	c := pstest.New(t, 3, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	cl := c.Client("w", ps.ClientConfig{Retries: 1, RetryBackoff: time.Millisecond})
	ref := reference(t)
	rng := rand.New(rand.NewPCG(11, 12))
	early, ge := randomBatch(rng, 128, 400)
	require.NoError(t, cl.Push(ctx, "emb", early, ge, 1, ps.At(ps.Position{Shard: 0, Start: 0, End: 128})))
	applyRef(t, ref, early, ge, 1)

	ids, g := randomBatch(rng, 256, 400)
	pos := ps.Position{Shard: 0, Start: 128, End: 384}
	c.Net.SetDrop("w", "ps-2", true) // what the worker sends ps-2 is lost
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	require.Error(t, cl.Push(dctx, "emb", ids, g, 2, ps.At(pos)), "ps-2 never got its part")
	cancel()
	c.Net.SetDrop("w", "ps-2", false)

	// Save every server's rows of its slots and its applied positions.
	owners := c.Holder.Get()
	var raws, states [][]byte
	for _, s := range c.Servers {
		set := owners.SlotsOf(s.ID())
		tab, _ := s.Table("emb")
		raw := make([]byte, tab.RawSize(false))
		n, err := tab.CopyRaw(raw, false, false)
		require.NoError(t, err)
		raws = append(raws, raw[:n])
		states = append(states, s.AppliedState(set.Has))
	}
	applyRef(t, ref, ids, g, 2)
	touch(t, ref, ids)

	for _, n := range []int{1, 2} {
		nc := pstest.New(t, n, pstest.Options{Tables: []ps.TableSpec{spec("emb")}, Slots: c.Slots})
		table := nc.Holder.Get()
		for _, s := range nc.Servers {
			set := table.SlotsOf(s.ID())
			tab, _ := s.Table("emb")
			for _, raw := range raws {
				_, err := tab.LoadRaw(raw, func(id uint64) bool { return set.Has(embedding.Slot(id, table.Slots)) })
				require.NoError(t, err)
			}
			require.NoError(t, s.LoadApplied(states, set.Has))
		}
		ncl := nc.Client("w", ps.ClientConfig{})
		require.NoError(t, ncl.Pull(ctx, "emb", ids, make([]float32, len(ids)*dim)))
		require.NoError(t, ncl.Push(ctx, "emb", ids, g, 2, ps.At(pos)), "the replay")
		assert.Equal(t, rowsOf(ref), clusterRows(t, nc.Servers, "emb"), "%d servers: every row holds the batch once", n)
		require.NoError(t, ncl.Push(ctx, "emb", early, ge, 1, ps.At(ps.Position{Shard: 0, Start: 0, End: 128})))
		assert.Equal(t, rowsOf(ref), clusterRows(t, nc.Servers, "emb"), "%d servers: an early batch replayed changes nothing", n)
	}
}

func TestLoadAppliedRefusesCorruptState(t *testing.T) {
	c := pstest.New(t, 1, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	cl := c.Client("w", ps.ClientConfig{})
	ids, g := randomBatch(rand.New(rand.NewPCG(1, 1)), 8, 50)
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(ps.Position{Start: 0, End: 8})))
	st := c.Servers[0].AppliedState(nil)
	require.Equal(t, 1, c.Servers[0].AppliedCount())
	bad := slices.Clone(st)
	bad[len(bad)/2] ^= 1
	require.ErrorIs(t, c.Servers[0].LoadApplied([][]byte{st, bad}, nil), ps.ErrCorruptApplied)
	assert.Equal(t, 1, c.Servers[0].AppliedCount(), "a refused load changes nothing")
	assert.Equal(t, 1, c.Servers[0].PruneApplied(func(ps.Position) bool { return false }))
	assert.Zero(t, c.Servers[0].AppliedCount())
}

// A client with a stale owner table (it has not pulled since the table changed) pushes non-zero
// gradients over slots that moved: the refused parts are resent to their new owners, and only
// those; every row holds the batch once.
func TestStaleClientPushLandsOnce(t *testing.T) {
	c := pstest.New(t, 3, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	cl := c.Client("w", ps.ClientConfig{Resolver: c.Holder})
	_, err := cl.OwnerTable(ctx) // cache version 1
	require.NoError(t, err)
	v1 := c.Holder.Get()
	var nodes []ps.Node
	for _, n := range v1.Nodes {
		if n.ID != "ps-2" {
			nodes = append(nodes, n)
		}
	}
	v2, err := ps.NewOwnerTable(2, v1.Slots, nodes, v1)
	require.NoError(t, err)
	c.Publish(v2) // ps-2's slots move to ps-0 and ps-1
	ids, g := randomBatch(rand.New(rand.NewPCG(21, 22)), 300, 1000)
	moved := 0
	for _, id := range ids {
		if v1.Owner(embedding.Slot(id, v1.Slots)).ID == "ps-2" {
			moved++
		}
	}
	require.Positive(t, moved, "the batch has ids whose slot moved")
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1))
	ref := reference(t)
	applyRef(t, ref, ids, g, 1)
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"))
}

// In synchronous mode a worker's second push of a step and a push of a step already applied are
// refused; every step is applied once, in worker order.
func TestSyncModeRefusesDuplicateAndLatePushes(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}, SyncWorkers: 2})
	ctx := pstest.Context(t)
	w0 := c.Client("w0", ps.ClientConfig{Sync: true, Worker: 0})
	w1 := c.Client("w1", ps.ClientConfig{Sync: true, Worker: 1})
	rng := rand.New(rand.NewPCG(31, 32))
	ids0, g0 := randomBatch(rng, 40, 100)
	ids1, g1 := randomBatch(rng, 40, 100)
	// Two copies of w0's push of step 1 race; then w1 completes the step.
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- w0.Push(ctx, "emb", ids0, g0, 1) }()
	}
	require.NoError(t, w1.Push(ctx, "emb", ids1, g1, 1))
	e1, e2 := <-errs, <-errs
	assert.True(t, e1 != nil || e2 != nil, "a second push of a step is refused")
	for _, err := range []error{e1, e2} {
		if err != nil {
			assert.ErrorIs(t, err, ps.ErrBadRequest)
		}
	}
	late := w1.Push(ctx, "emb", ids1, g1, 1)
	require.Error(t, late, "a push of an applied step is refused")
	assert.ErrorIs(t, late, ps.ErrBadRequest)
	ref := reference(t)
	applyRef(t, ref, ids0, g0, 1)
	applyRef(t, ref, ids1, g1, 1)
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"), "step 1 applied once")
}

// ClearSlots drops the rows and applied positions of the given slots only, and LoadApplied for
// some slots leaves the positions of the others alone: what a server adopting a failed server's
// slots relies on.
func TestClearSlotsAndLoadAppliedPerSlot(t *testing.T) {
	c := pstest.New(t, 1, pstest.Options{Tables: []ps.TableSpec{spec("emb")}, Slots: 16})
	ctx := pstest.Context(t)
	cl := c.Client("w", ps.ClientConfig{})
	srv := c.Servers[0]
	ids, g := randomBatch(rand.New(rand.NewPCG(3, 4)), 64, 500)
	pos := ps.Position{Shard: 1, Start: 0, End: 64}
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(pos)))
	saved := srv.AppliedState(nil)
	low := func(slot int) bool { return slot < 8 }
	tab, _ := srv.Table("emb")
	before := rowsOf(tab)

	deleted := srv.ClearSlots(low)
	after := rowsOf(tab)
	require.Positive(t, deleted)
	assert.Equal(t, len(before)-deleted, len(after))
	for id, r := range before {
		if low(embedding.Slot(id, 16)) {
			assert.NotContains(t, after, id)
		} else {
			assert.Equal(t, r, after[id], "row %d of a kept slot", id)
		}
	}
	// The replay applies to the cleared slots only: the kept slots remember the position.
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(pos)))
	for id := range before {
		if !low(embedding.Slot(id, 16)) {
			assert.Equal(t, before[id], rowsOf(tab)[id], "kept row %d not applied twice", id)
		}
	}

	// Loading the saved positions for the low slots gives them back, keeping the high ones'.
	srv.ClearSlots(low)
	require.NoError(t, srv.LoadApplied([][]byte{saved}, low))
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(pos)))
	now := rowsOf(tab)
	for id, r := range before {
		if low(embedding.Slot(id, 16)) {
			assert.NotContains(t, now, id, "row %d: the position is known again, nothing applied", id)
		} else {
			assert.Equal(t, r, now[id], "row %d: its slot's positions were kept", id)
		}
	}
}
