package elastic

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardtest"
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

// fakeServer is a parameter server that does at once whatever it is asked and answers health
// calls as incarnation 1, until it is cut off; then every health call fails, and is signalled
// on calls.
type fakeServer struct {
	node  ps.Node
	mu    sync.Mutex
	down  bool
	calls chan struct{}
}

var _ ParameterServer = (*fakeServer)(nil)

func (f *fakeServer) Node() ps.Node                                        { return f.node }
func (f *fakeServer) InstallTable(context.Context, *ps.OwnerTable) error   { return nil }
func (f *fakeServer) Fence(context.Context, uint64, []uint64) error        { return nil }
func (f *fakeServer) Verify(context.Context, uint64, *ps.OwnerTable) error { return nil }
func (f *fakeServer) Load(context.Context, uint64, *ps.OwnerTable) error   { return nil }
func (f *fakeServer) Admit(uint64)                                         {}
func (f *fakeServer) Lead(context.Context, uint64) error                   { return nil }
func (f *fakeServer) Table(context.Context) (*ps.OwnerTable, error)        { return nil, nil }
func (f *fakeServer) WaitPersisted(context.Context, uint64) (checkpoint.ManifestRef, error) {
	return checkpoint.ManifestRef{}, nil
}
func (f *fakeServer) Snapshot(context.Context, uint64, Progress, Progress) (checkpoint.SnapshotInfo, error) {
	return checkpoint.SnapshotInfo{}, nil
}
func (f *fakeServer) Restore(context.Context, uint64, *ps.OwnerTable, RestoreMode) error {
	return nil
}

func (f *fakeServer) Health(context.Context) (ServerHealth, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.down {
		return ServerHealth{Incarnation: 1}, nil
	}
	select {
	case f.calls <- struct{}{}:
	default:
	}
	return ServerHealth{}, errors.New("connection refused")
}

// cut makes f stop answering.
func (f *fakeServer) cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = true
}

// watch returns a channel that signals the health calls from now on.
func (f *fakeServer) watch() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = make(chan struct{}, 16)
	return f.calls
}

// Every decision of a recovery that depends on elapsed time reads Config.Now: a server that
// stops answering is failed once ServerTimeout has passed on that clock, not before, and the
// recovery waits for its replacement until ReplaceWait has passed on it, however often it
// looks; the times it reports are the clock's.
func TestRecoveryDecidesOnTheInjectedClock(t *testing.T) {
	ctx := context.Background()
	clock := shardtest.NewClock(time.Unix(1_700_000_000, 0))
	servers := []*fakeServer{{node: ps.Node{ID: "ps-0", Addr: "a:1"}}, {node: ps.Node{ID: "ps-1", Addr: "b:1"}}}
	recovered := make(chan RecoveryEvent, 1)
	c, err := NewCoordinator(ctx, Config{Job: "clock", Servers: []ParameterServer{servers[0], servers[1]}, Slots: 16,
		Recovery: Partial, HealthEvery: 5 * time.Millisecond, ServerTimeout: 5 * time.Second, ReplaceWait: 30 * time.Second,
		Now: clock.Now, OnRecovery: func(ev RecoveryEvent) { recovered <- ev }, Dispatcher: shard.Config{Dataset: shard.IndexedDataset(100)}})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	failedAt := clock.Now().Add(6 * time.Second)

	servers[1].cut()
	clock.Advance(4 * time.Second)
	c.probe([]string{"ps-1"}, "", time.Second)
	assert.Zero(t, c.Status().ServerFailures, "silent for 4s of the clock: not failed yet")
	clock.Advance(2 * time.Second)
	c.probe([]string{"ps-1"}, "", time.Second)
	st := c.Status()
	require.Equal(t, 1, st.ServerFailures, "silent for 6s of the clock: failed at once")
	assert.Equal(t, "recovering", st.Phase)
	assert.True(t, strings.HasPrefix(st.Servers[1].Reason, "no answer for 6s"), st.Servers[1].Reason)

	// The recovery probes ps-1's node again and again; the clock stands still, so it waits.
	calls := servers[1].watch()
	for range 3 {
		<-calls
	}
	assert.Equal(t, "recovering", c.Status().Phase)
	select {
	case ev := <-recovered:
		t.Fatalf("recovered before ReplaceWait passed: %+v", ev)
	default:
	}

	clock.Advance(31 * time.Second)
	ev := <-recovered
	require.NoError(t, ev.Err)
	assert.Equal(t, Partial, ev.Policy)
	assert.Equal(t, map[string]string{"ps-1": st.Servers[1].Reason}, ev.Failed)
	assert.Empty(t, ev.Replaced, "the survivors took ps-1's slots")
	assert.Equal(t, failedAt, ev.Detected)
	assert.Equal(t, 31*time.Second, ev.Replacement)
	assert.Equal(t, 31*time.Second, ev.Duration)
	st = c.Status()
	assert.Equal(t, "training", st.Phase)
	require.Len(t, st.Servers, 1)
	assert.Equal(t, "ps-0", st.Servers[0].ID)
}
