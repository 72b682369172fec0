package elastic

import (
	"testing"
	"time"

	"github.com/elasticps/elasticps/internal/procstat"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The slots a move has still to hand over are those whose owner in the served table is not
// the target's; none once the move has ended.
func TestMigratingNamesTheSlotsStillToMove(t *testing.T) {
	nodes := []ps.Node{{ID: "ps-0", Addr: "a:1"}, {ID: "ps-1", Addr: "a:2"}}
	cur, err := ps.NewOwnerTable(1, 32, nodes, nil)
	require.NoError(t, err)
	next, err := ps.NewOwnerTable(2, 32, append(nodes, ps.Node{ID: "ps-2", Addr: "a:3"}), cur)
	require.NoError(t, err)
	var want []int
	for sl := 0; sl < 32; sl++ {
		if cur.Owner(sl).ID != next.Owner(sl).ID {
			want = append(want, sl)
		}
	}
	require.NotEmpty(t, want)

	c := &Coordinator{clock: newPausableClock(time.Now), barrierState: barrierState{core: newCore(coreConfig{}, time.Now())}}
	assert.Nil(t, c.migrating(cur), "no move")
	finished := c.moving(2, 3)
	c.movingTo(next)
	assert.Equal(t, want, c.migrating(cur))
	assert.Empty(t, c.migrating(next), "all moved")
	finished(nil)
	assert.Nil(t, c.migrating(cur), "the move has ended")
}

// A server shares its process when the coordinator or another server runs in it too.
func TestMarkShared(t *testing.T) {
	servers := []ServerStatus{
		{ID: "a", Host: "h1", Pid: 10}, // the coordinator's
		{ID: "b", Host: "h1", Pid: 11}, // alone
		{ID: "c", Host: "h2", Pid: 11}, // the same pid on another host: alone
		{ID: "d", Host: "h2", Pid: 12}, {ID: "e", Host: "h2", Pid: 12},
		{ID: "f"}, // not read
	}
	markShared(servers, procstat.Sample{Host: "h1", Pid: 10})
	var shared []string
	for _, s := range servers {
		if s.SharedProcess {
			shared = append(shared, s.ID)
		}
	}
	assert.Equal(t, []string{"a", "d", "e"}, shared)
}
