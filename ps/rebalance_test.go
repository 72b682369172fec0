package ps_test

import (
	"fmt"
	"testing"

	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func rebalanceTable(t *testing.T, n int) *ps.OwnerTable {
	var nodes []ps.Node
	for i := range n {
		nodes = append(nodes, ps.Node{ID: fmt.Sprintf("ps-%d", i), Addr: fmt.Sprintf("h%d:1", i)})
	}
	tab, err := ps.NewOwnerTable(1, 256, nodes, nil)
	require.NoError(t, err)
	return tab
}

func serverLoads(tab *ps.OwnerTable, load []float64) []float64 {
	per := make([]float64, len(tab.Nodes))
	for s, l := range load {
		per[tab.OwnerIndex(s)] += l
	}
	return per
}

func TestPlanRebalanceTakesLoadOffTheHotServer(t *testing.T) {
	tab := rebalanceTable(t, 3)
	load := make([]float64, tab.Slots)
	for s := range load {
		load[s] = 1
		if tab.Owner(s).ID == "ps-1" && s%4 == 0 {
			load[s] = 12 // a quarter of ps-1's slots are hot
		}
	}
	before := serverLoads(tab, load)
	var total float64
	for _, l := range before {
		total += l
	}
	avg := total / 3
	require.Greater(t, before[1], 1.5*avg, "ps-1 is hot")
	moves, err := ps.PlanRebalance(tab, load, 1.1, 0)
	require.NoError(t, err)
	require.NotEmpty(t, moves)
	for _, m := range moves {
		assert.Equal(t, "ps-1", m.From, "only the hot server gives slots")
	}
	next, err := tab.WithMoves(2, tab.Nodes, moves)
	require.NoError(t, err)
	after := serverLoads(next, load)
	for i, l := range after {
		assert.LessOrEqual(t, l, 1.1*avg+12, "server %d", i)
	}
	assert.Less(t, max(after[0], after[1], after[2]), before[1])
	again, err := ps.PlanRebalance(tab, load, 1.1, 0)
	require.NoError(t, err)
	assert.Equal(t, moves, again, "deterministic")
	limited, err := ps.PlanRebalance(tab, load, 1.1, 2)
	require.NoError(t, err)
	assert.Len(t, limited, 2)
}

func TestPlanRebalanceLeavesBalancedLoadAlone(t *testing.T) {
	tab := rebalanceTable(t, 4)
	load := make([]float64, tab.Slots)
	for s := range load {
		load[s] = 3
	}
	moves, err := ps.PlanRebalance(tab, load, 1.2, 0)
	require.NoError(t, err)
	assert.Empty(t, moves)
	// One slot hotter than everything else together cannot be helped by moving it.
	load[7] = 1e6
	moves, err = ps.PlanRebalance(tab, load, 1.2, 0)
	require.NoError(t, err)
	for _, m := range moves {
		assert.NotEqual(t, 7, m.Slot)
	}
	_, err = ps.PlanRebalance(tab, load[:10], 1.2, 0)
	assert.ErrorIs(t, err, ps.ErrBadConfig)
	_, err = ps.PlanRebalance(tab, load, 1, 0)
	assert.ErrorIs(t, err, ps.ErrBadConfig)
}

func TestSlotLoadsPrefersCPU(t *testing.T) {
	a := []ps.SlotRate{{Slot: 1, Busy: 0.2, AccessesPerSec: 10}, {Slot: 2, Busy: 0, AccessesPerSec: 99}}
	assert.Equal(t, []float64{0, 0.2, 0, 0}, ps.SlotLoads(4, a))
	b := []ps.SlotRate{{Slot: 3, AccessesPerSec: 5}, {Slot: 9, AccessesPerSec: 1}}
	assert.Equal(t, []float64{0, 0, 0, 5}, ps.SlotLoads(4, b), "rows per second when no CPU was measured; slots out of range ignored")
}
