package ps_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/ps/pstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shardBatches pushes batches of 32 records from n seeded batches onto shard k at positions
// from..., in order, and applies them to ref; it returns the next position.
func shardBatches(t *testing.T, ctx context.Context, cl *ps.Client, ref *embedding.Table, rng *rand.Rand, k uint32, from int64, n int) int64 {
	t.Helper()
	for range n {
		ids, g := randomBatch(rng, 32, 500)
		pos := ps.Position{Shard: k, Start: from, End: from + 32}
		require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(pos)))
		applyRef(t, ref, ids, g, 1)
		from += 32
	}
	return from
}

// recordSize is the applied state of every server, in bytes.
func recordSize(servers []*ps.Server) int {
	n := 0
	for _, s := range servers {
		n += len(s.AppliedState(nil))
	}
	return n
}

// The record of applied batches holds a watermark and the last batch per shard, however many
// batches were applied: ten times more batches leave it the same size. Every batch below a
// watermark replayed lands nowhere.
func TestAppliedRecordIsBoundedByWhatIsInFlight(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	cl := c.Client("w", ps.ClientConfig{})
	ref := reference(t)
	rng := rand.New(rand.NewPCG(41, 42))
	const shards = 4
	next := make([]int64, shards)
	train := func(perShard int) {
		for range perShard {
			for k := range uint32(shards) {
				next[k] = shardBatches(t, ctx, cl, ref, rng, k, next[k], 1)
			}
		}
	}
	train(20)
	size1, count1 := recordSize(c.Servers), c.Servers[0].AppliedCount()+c.Servers[1].AppliedCount()
	assert.LessOrEqual(t, count1, 2*2*shards, "a watermark and one batch per shard and server")
	train(180)
	size10, count10 := recordSize(c.Servers), c.Servers[0].AppliedCount()+c.Servers[1].AppliedCount()
	assert.Equal(t, count1, count10, "ten times the batches, the same record")
	assert.LessOrEqual(t, float64(size10), 1.2*float64(size1), "record bytes after 10x the batches")
	t.Logf("record after 20 and 200 batches per shard: %d and %d bytes, %d and %d entries", size1, size10, count1, count10)

	want := rowsOf(ref)
	require.Equal(t, want, clusterRows(t, c.Servers, "emb"))
	// Replays of every earlier batch of shard 0 (a takeover from an old commit) land nowhere.
	replay := rand.New(rand.NewPCG(41, 42))
	for i := range 200 {
		for k := range uint32(shards) {
			ids, g := randomBatch(replay, 32, 500)
			if k == 0 && i%7 == 0 {
				pos := ps.Position{Shard: k, Start: int64(32 * i), End: int64(32 * (i + 1))}
				require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(pos)))
			}
		}
	}
	assert.Equal(t, want, clusterRows(t, c.Servers, "emb"), "replayed batches applied nowhere")
}

// A batch whose worker died after pushing some of its slots on a server (and nothing on the
// other), then its replay in full, then the next batch: every row holds each batch once. The
// record keeps the half-pushed batch above the watermark, with the slots it reached, until the
// next batch of its shard proves it done.
func TestHalfPushedBatchIsCompletedOnce(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}, Slots: 64})
	ctx := pstest.Context(t)
	cl := c.Client("w", ps.ClientConfig{})
	ref := reference(t)
	rng := rand.New(rand.NewPCG(43, 44))
	next := shardBatches(t, ctx, cl, ref, rng, 3, 0, 5)

	ids, g := randomBatch(rng, 64, 500)
	pos := ps.Position{Shard: 3, Start: next, End: next + 64}
	var half []uint64
	var halfG []float32
	for i, id := range ids {
		if embedding.Slot(id, 64)%2 == 0 { // every other slot: a part of each server's
			half = append(half, id)
			halfG = append(halfG, g[i*dim:(i+1)*dim]...)
		}
	}
	require.NotEmpty(t, half)
	require.Less(t, len(half), len(ids))
	require.NoError(t, cl.Push(ctx, "emb", half, halfG, 1, ps.At(pos)), "the dying worker's part")
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(pos)), "the replay")
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(pos)), "a resend of the replay")
	applyRef(t, ref, ids, g, 1)
	touch(t, ref, ids)
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"), "the batch once")

	shardBatches(t, ctx, cl, ref, rng, 3, next+64, 2)
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(pos)), "a late replay below the watermark")
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"), "every batch once")
}

// A push that overlaps applied positions without matching a batch (the shard cut at other
// offsets) is refused instead of landing twice on the records in both.
func TestPushOverlappingTheRecordIsRefused(t *testing.T) {
	c := pstest.New(t, 1, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	cl := c.Client("w", ps.ClientConfig{})
	ref := reference(t)
	rng := rand.New(rand.NewPCG(45, 46))
	shardBatches(t, ctx, cl, ref, rng, 1, 0, 3) // watermark at 64, batch [64,96) above it
	ids, g := randomBatch(rng, 32, 500)
	for _, pos := range []ps.Position{{Shard: 1, Start: 48, End: 80}, {Shard: 1, Start: 80, End: 112}, {Shard: 1, Start: 32, End: 96}} {
		err := cl.Push(ctx, "emb", ids, g, 1, ps.At(pos))
		require.ErrorIs(t, err, ps.ErrBadRequest, "%v", pos)
	}
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"), "nothing applied")
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(ps.Position{Shard: 1, Start: 96, End: 128})), "the next batch")
}

// FoldApplied raises the watermarks to the accepted offsets and drops the batches below: the
// saved state then holds a number per shard. PruneApplied forgets what a commit covers.
func TestFoldAndPruneApplied(t *testing.T) {
	c := pstest.New(t, 1, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	cl := c.Client("w", ps.ClientConfig{})
	ref := reference(t)
	rng := rand.New(rand.NewPCG(47, 48))
	for k := range uint32(3) {
		shardBatches(t, ctx, cl, ref, rng, k, 0, 4)
	}
	srv := c.Servers[0]
	require.Equal(t, 6, srv.AppliedCount(), "a watermark and a batch per shard")
	srv.FoldApplied(func(k ps.DataShard) int64 { return []int64{128, 96, 0}[k.Shard] })
	assert.Equal(t, 5, srv.AppliedCount(), "shard 0 folded whole, shard 1 below its last batch")
	state, err := ps.DecodeApplied(srv.AppliedState(nil))
	require.NoError(t, err)
	assert.Equal(t, ps.AppliedShard{Through: 128}, state["emb"][ps.DataShard{Shard: 0}])
	assert.Equal(t, int64(96), state["emb"][ps.DataShard{Shard: 1}].Through)
	assert.Len(t, state["emb"][ps.DataShard{Shard: 2}].Batches, 1)

	n := srv.PruneApplied(func(p ps.Position) bool { return p.Shard != 0 })
	assert.Equal(t, 1, n)
	assert.Equal(t, 4, srv.AppliedCount())
	ids, g := randomBatch(rng, 32, 500)
	require.NoError(t, cl.Push(ctx, "emb", ids, g, 1, ps.At(ps.Position{Shard: 0, Start: 128, End: 160})))
	applyRef(t, ref, ids, g, 1)
	assert.Equal(t, rowsOf(ref), clusterRows(t, c.Servers, "emb"))
}

// Slots restored from a commit while the server serves its others (a Partial recovery) keep the
// commit's watermarks: the batches applied since the commit, replayed (a takeover from that
// commit), land on them only, once, and so does every batch after the restore. Once the class
// has ended, they follow the shard's watermark.
func TestRestoredSlotsKeepTheCommitsWatermarks(t *testing.T) {
	const slots = 16
	c := pstest.New(t, 1, pstest.Options{Tables: []ps.TableSpec{spec("emb")}, Slots: slots})
	ctx := pstest.Context(t)
	cl := c.Client("w", ps.ClientConfig{})
	srv := c.Servers[0]
	tab, _ := srv.Table("emb")
	low := func(slot int) bool { return slot < slots/2 }
	type batch struct {
		ids []uint64
		g   []float32
		pos ps.Position
	}
	rng := rand.New(rand.NewPCG(49, 50))
	var batches []batch
	for i := range 10 {
		ids, g := randomBatch(rng, 32, 300)
		batches = append(batches, batch{ids, g, ps.Position{Shard: 2, Start: int64(32 * i), End: int64(32 * (i + 1))}})
	}
	push := func(b batch) { require.NoError(t, cl.Push(ctx, "emb", b.ids, b.g, 1, ps.At(b.pos))) }
	for _, b := range batches[:4] {
		push(b)
	}
	// The commit: rows and record after four batches.
	raw := make([]byte, tab.RawSize(false))
	nraw, err := tab.CopyRaw(raw, false, false)
	require.NoError(t, err)
	state := srv.AppliedState(nil)
	for _, b := range batches[4:8] {
		push(b)
	}
	// The low slots' server fails: they come back from the commit, on this server.
	srv.ClearSlots(low)
	_, err = tab.LoadRaw(raw[:nraw], func(id uint64) bool { return low(embedding.Slot(id, slots)) })
	require.NoError(t, err)
	require.NoError(t, srv.RestoreApplied([][]byte{state}, low))
	// A takeover from the commit replays batches 4..7: they land on the restored slots only.
	for _, b := range batches[4:8] {
		push(b)
	}
	ref := reference(t)
	for _, b := range batches[:8] {
		applyRef(t, ref, b.ids, b.g, 1)
	}
	assert.Equal(t, rowsOf(ref), rowsOf(tab), "the lost batches landed on the restored slots, once")
	// Training goes on; every batch since the commit replayed once more lands nowhere.
	push(batches[8])
	applyRef(t, ref, batches[8].ids, batches[8].g, 1)
	for _, b := range batches[3:9] {
		push(b)
	}
	assert.Equal(t, rowsOf(ref), rowsOf(tab), "every batch once on every slot")

	// The class ends once the data epoch is done in a commit: the low slots follow the
	// shard's watermark, and a replay lands nowhere.
	srv.SettleApplied(func(uint32) bool { return true })
	push(batches[9])
	applyRef(t, ref, batches[9].ids, batches[9].g, 1)
	for _, b := range batches[4:9] {
		push(b)
	}
	assert.Equal(t, rowsOf(ref), rowsOf(tab), "replays after the class ended land nowhere")
	assert.True(t, slices.ContainsFunc(batches[4].ids, func(id uint64) bool { return low(embedding.Slot(id, slots)) }), "the test replays onto restored slots")
}
