package elastic

import (
	"testing"

	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A recovery moves only the failed servers' slots, even when the table it starts from is
// unbalanced on purpose (a move under way, a rebalance), and keeps the placement whole when
// every failed server was replaced.
func TestRecoveryTableMovesOnlyTheLostSlots(t *testing.T) {
	nodes := []ps.Node{{ID: "ps-0", Addr: "a:1"}, {ID: "ps-1", Addr: "b:1"}, {ID: "ps-2", Addr: "c:1"}}
	base, err := ps.NewOwnerTable(1, 512, nodes[:2], nil)
	require.NoError(t, err)
	// A quarter of the way to three servers: ps-2 owns a few slots only.
	target, err := ps.NewOwnerTable(0, 512, nodes, base)
	require.NoError(t, err)
	moves := base.Moves(target)
	old, err := base.WithMoves(2, nodes, moves[:len(moves)/4])
	require.NoError(t, err)

	replaced := []ps.Node{nodes[0], {ID: "ps-1", Addr: "b:2"}, nodes[2]}
	got, err := recoveryTable(old, replaced)
	require.NoError(t, err)
	assert.True(t, got.SamePlacement(old), "all replaced: nothing moves")
	assert.Equal(t, uint64(3), got.Version)
	assert.Equal(t, "b:2", got.Nodes[got.IndexOf("ps-1")].Addr)

	survivors := []ps.Node{nodes[0], nodes[2]}
	got, err = recoveryTable(old, survivors)
	require.NoError(t, err)
	for s := range old.Slots {
		if o := old.Owner(s).ID; o != "ps-1" {
			assert.Equal(t, o, got.Owner(s).ID, "slot %d of a live server moved", s)
		} else {
			assert.NotEqual(t, "ps-1", got.Owner(s).ID)
		}
	}
}
