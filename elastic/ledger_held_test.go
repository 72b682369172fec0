package elastic

import (
	"testing"

	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
)

// sinceHeld against a naive model: a held batch's positions (its shard's base plus its
// offsets) leave Lost and appear in Held, once per table, where they were marked since the old
// ledger; positions marked before, batches of shards never marked and batches of other epochs
// change nothing.
func TestLedgerSinceHeldConvertsShardPositions(t *testing.T) {
	old := newLedger()
	old.mark(0, 0, 96) // committed: shard 0 of epoch 0
	l := newLedger()
	l.noteShard(0, 0)
	l.noteShard(2, 192)
	l.mark(0, 0, 96)
	l.mark(0, 192, 288) // shard 2, since the commit
	l.mark(1, 0, 40)    // epoch 1, shard 0, since the commit
	held := []heldBatch{
		{table: "emb", pos: ps.Position{Epoch: 0, Shard: 2, Start: 32, End: 64}, slots: []int{3, 7}},
		{table: "dense", pos: ps.Position{Epoch: 0, Shard: 2, Start: 32, End: 64}, slots: []int{5}},
		{table: "emb", pos: ps.Position{Epoch: 0, Shard: 0, Start: 0, End: 32}, slots: []int{1}},  // committed as trained
		{table: "emb", pos: ps.Position{Epoch: 0, Shard: 1, Start: 0, End: 32}, slots: []int{1}},  // shard never marked
		{table: "emb", pos: ps.Position{Epoch: 1, Shard: 0, Start: 32, End: 64}, slots: []int{2}}, // half marked
		{table: "emb", pos: ps.Position{Epoch: 2, Shard: 0, Start: 0, End: 32}, slots: []int{2}},  // epoch not begun
	}
	lost, n, kept := l.sinceHeld(old, held)
	assert.Equal(t, []Span{{Epoch: 0, From: 192, To: 224}, {Epoch: 0, From: 256, To: 288}, {Epoch: 1, From: 0, To: 32}}, lost)
	assert.Equal(t, int64(96), n)
	assert.Equal(t, []Span{
		{Epoch: 0, From: 224, To: 256, Table: "dense", Slots: []int{5}},
		{Epoch: 0, From: 224, To: 256, Table: "emb", Slots: []int{3, 7}},
		{Epoch: 1, From: 32, To: 40, Table: "emb", Slots: []int{2}},
	}, kept)

	// Without held batches, everything marked since is lost, as before.
	lost, n, kept = l.sinceHeld(old, nil)
	assert.Equal(t, []Span{{Epoch: 0, From: 192, To: 288}, {Epoch: 1, From: 0, To: 40}}, lost)
	assert.Equal(t, int64(136), n)
	assert.Empty(t, kept)
}
