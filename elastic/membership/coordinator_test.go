package membership

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/server"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var gossipTable = ps.TableSpec{Name: "emb", Config: embedding.Config{Dim: 2, Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 1}}}

// TestGossipIsAHintTheCoordinatorConfirms runs the coordinator's membership and two parameter
// servers' on three loopback addresses. Health checks and the server timeout are an hour
// apart, so only gossip can make the coordinator act within the test: a server whose gossip
// stops while it still answers is kept; one whose process is gone (it stops answering, and its
// gossip stops) is failed as soon as gossip says so.
func TestGossipIsAHintTheCoordinatorConfirms(t *testing.T) {
	ctx := context.Background()
	var locals []*server.Server
	var nodes []elastic.ParameterServer
	for i := range 2 {
		srv, err := ps.NewServer(ps.ServerConfig{ID: elastic.ServerID(i), Secret: testSecret, Slots: 64, Tables: []ps.TableSpec{gossipTable}})
		require.NoError(t, err)
		t.Cleanup(func() { srv.Close() })
		l, err := server.New(srv, fmt.Sprintf("127.0.0.%d:9000", 3+i), checkpoint.Config{})
		require.NoError(t, err)
		locals, nodes = append(locals, l), append(nodes, l)
	}
	coord, err := elastic.NewCoordinator(ctx, elastic.Config{Job: "gossip", Servers: nodes, Slots: 64, HealthEvery: time.Hour, ServerTimeout: time.Hour,
		ReplaceWait: time.Hour, Dispatcher: shard.Config{Dataset: shard.IndexedDataset(100)}})
	require.NoError(t, err)
	t.Cleanup(func() { coord.Close() })

	rec := newMemberRecorder()
	self := elastic.Member{Role: elastic.RoleCoordinator, ID: "coordinator", Incarnation: 1, Addr: "127.0.0.2:9000", Host: "host-c"}
	cfg := fastGossip("127.0.0.2", self, nil)
	cfg.OnEvent = func(ev elastic.MemberEvent) {
		coord.Observe(ev) // first, so that an event recorded has been acted on
		rec.record(ev)
	}
	cm := startMember(t, cfg)
	var sm []*Gossip
	for i, l := range locals {
		me := elastic.Member{Role: elastic.RoleServer, ID: elastic.ServerID(i), Incarnation: l.Incarnation(), Addr: l.Node().Addr, Host: fmt.Sprintf("host-%d", i)}
		sm = append(sm, startMember(t, fastGossip(fmt.Sprintf("127.0.0.%d", 3+i), me, nil, cm.LocalAddr())))
		rec.wait(t, elastic.MemberJoined, me.ID, me.Incarnation)
	}

	// ps-0's gossip dies, its server answers: gossip alone evicts nobody.
	require.NoError(t, sm[0].crash())
	rec.wait(t, elastic.MemberFailed, elastic.ServerID(0), locals[0].Incarnation())
	assert.Zero(t, coord.Status().ServerFailures, "a server that answers is kept")

	// ps-1's process is gone: it is failed at gossip's word, confirmed by a failed health call.
	require.NoError(t, locals[1].Close())
	require.NoError(t, sm[1].crash())
	rec.wait(t, elastic.MemberFailed, elastic.ServerID(1), locals[1].Incarnation())
	st := coord.Status()
	assert.Equal(t, 1, st.ServerFailures)
	servers := coord.Status().Servers
	require.Len(t, servers, 2)
	assert.True(t, strings.HasPrefix(servers[1].Reason, "gossip: failed, and no answer"), servers[1].Reason)
	assert.False(t, servers[0].Failed)
}

// A worker gossip declares failed is fenced at once if it is silent, and kept if it calls.
func TestGossipFailsASilentWorker(t *testing.T) {
	ctx := context.Background()
	srv, err := ps.NewServer(ps.ServerConfig{ID: elastic.ServerID(0), Secret: testSecret, Slots: 8, Tables: []ps.TableSpec{gossipTable}})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	l, err := server.New(srv, "127.0.0.1:1", checkpoint.Config{})
	require.NoError(t, err)
	var now atomic.Int64 // the wall clock, in seconds
	now.Store(1_700_000_000)
	clock := func() time.Time { return time.Unix(now.Load(), 0) }
	coord, err := elastic.NewCoordinator(ctx, elastic.Config{Job: "gossip", Servers: []elastic.ParameterServer{l}, Slots: 8, HealthEvery: time.Second,
		WorkerSilence: -1, Now: clock, Dispatcher: shard.Config{Dataset: shard.IndexedDataset(100)}})
	require.NoError(t, err)
	t.Cleanup(func() { coord.Close() })
	e1, err := coord.Join(ctx, "w1", 8)
	require.NoError(t, err)
	_, err = coord.Join(ctx, "w2", 8)
	require.NoError(t, err)

	now.Add(2)
	require.NoError(t, coord.Begin(ctx, "w1", e1)) // w1 calls; w2 stays silent
	coord.Observe(elastic.MemberEvent{Kind: elastic.MemberFailed, Member: elastic.Member{Role: elastic.RoleWorker, ID: "w1", Incarnation: 1}})
	coord.Observe(elastic.MemberEvent{Kind: elastic.MemberFailed, Member: elastic.Member{Role: elastic.RoleWorker, ID: "w2", Incarnation: 1}})
	require.NoError(t, coord.Settle(ctx))
	assert.Equal(t, []string{"w1"}, coord.Members())
	assert.Equal(t, 1, coord.Status().Fenced)
}
