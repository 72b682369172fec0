package elastic

import (
	"context"
	"net"
	"testing"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testJob is two parameter servers on loopback and their coordinator, as an in-process job
// (package local) runs them, without the package's cycle.
type testJob struct {
	Servers []*LocalServer
	coord   *Coordinator
	secret  []byte
}

func (j *testJob) Coordinator() *Coordinator { return j.coord }

// NewSession returns a worker's session of the job, closed with the test.
func (j *testJob) NewSession(t *testing.T, worker string, rc shard.ReaderConfig) *Session {
	cli, err := ps.NewClient(ps.ClientConfig{Secret: j.secret, Resolver: j.coord})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	rc.Service = j.coord.Service()
	s, err := NewSession(SessionConfig{Worker: worker, Control: j.coord, Client: cli, Reader: rc})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// twoServerJob starts a job of two servers and a 64-slot table, closed with the test.
func twoServerJob(t *testing.T, name string) *testJob {
	j := &testJob{secret: []byte("the cluster secret of the tests.")}
	store := checkpoint.NewMemStorage()
	var servers []ParameterServer
	for i := range 2 {
		srv, err := ps.NewServer(ps.ServerConfig{ID: ServerID(i), Secret: j.secret, Slots: 64,
			Tables: []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 2}}}})
		require.NoError(t, err)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		served := make(chan struct{})
		go func() { defer close(served); srv.Serve(l) }()
		t.Cleanup(func() { srv.Close(); <-served })
		ls, err := NewLocalServer(srv, l.Addr().String(), checkpoint.Config{Job: name, Storage: store, ShmDir: t.TempDir()})
		require.NoError(t, err)
		t.Cleanup(func() { ls.Close() })
		j.Servers, servers = append(j.Servers, ls), append(servers, ls)
	}
	c, err := NewCoordinator(context.Background(), Config{Job: name, Servers: servers, Slots: 64, Storage: store,
		Dispatcher: shard.Config{Dataset: shard.IndexedDataset(100)}})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	j.coord = c
	return j
}

// A server left on an older owner table (its install of the job's table failed) gets the
// job's table before it snapshots: by its own table it would save slots it gave away.
func TestSnapshotBringsServersToTheJobsTable(t *testing.T) {
	ctx := context.Background()
	job := twoServerJob(t, "sync")
	c := job.Coordinator()
	cur := c.holder.Get()
	slot := cur.SlotsOf("ps-0").Members()[0]
	next, err := cur.WithMoves(cur.Version+1, cur.Nodes, []ps.Move{{Slot: slot, From: "ps-0", To: "ps-1"}})
	require.NoError(t, err)
	c.holder.Set(next)
	_, err = job.Servers[1].Server().SetOwnerTable(next) // ps-0's install "failed"
	require.NoError(t, err)

	// A step to checkpoint: one batch through a session.
	sess := job.NewSession(t, "w", shard.ReaderConfig{Source: shard.IndexedSource{Data: shard.IndexedFunc(100, func(i int64, rec *shard.Record) error {
		rec.IDs = append(rec.IDs, uint64(i))
		rec.EndField()
		return nil
	})}, BatchSize: 10})
	require.NoError(t, sess.Step(ctx, func(ctx context.Context, b *Batch) error {
		return b.Push(ctx, "emb", b.IDs, make([]float32, 2*len(b.IDs)))
	}))
	_, err = c.Checkpoint(ctx)
	require.NoError(t, err)
	for _, s := range job.Servers {
		assert.Equal(t, next.Version, s.Server().OwnerTable().Version, "%s has the job's table", s.Node().ID)
	}
}

// A move's owner table is published only if it follows the job's (its version is the job's
// plus one): one made from a table a recovery has replaced since, or from a stale one, is
// refused with ps.ErrNotPublished and changes nothing, on the coordinator or on any server.
func TestMoveTableMustFollowTheJobs(t *testing.T) {
	ctx := context.Background()
	job := twoServerJob(t, "moves")
	c := job.Coordinator()
	cur := c.holder.Get()
	slot := cur.SlotsOf("ps-0").Members()[0]
	moves := []ps.Move{{Slot: slot, From: "ps-0", To: "ps-1"}}
	for _, v := range []uint64{cur.Version + 2, cur.Version + 9} {
		next, err := cur.WithMoves(v, cur.Nodes, moves)
		require.NoError(t, err)
		err = c.publishMove(ctx, next)
		require.ErrorIs(t, err, ps.ErrNotPublished, "version %d after %d", v, cur.Version)
		assert.Same(t, cur, c.holder.Get(), "the job's table changed")
		for _, s := range job.Servers {
			assert.Equal(t, cur.Version, s.Server().OwnerTable().Version, "%s installed a refused table", s.Node().ID)
		}
	}
	older, err := ps.NewOwnerTable(cur.Version, cur.Slots, cur.Nodes, nil)
	require.NoError(t, err)
	require.ErrorIs(t, c.publishMove(ctx, older), ps.ErrNotPublished, "a table of the job's own version")

	next, err := cur.WithMoves(cur.Version+1, cur.Nodes, moves)
	require.NoError(t, err)
	require.NoError(t, c.publishMove(ctx, next))
	assert.Same(t, next, c.holder.Get())
	for _, s := range job.Servers {
		assert.Equal(t, next.Version, s.Server().OwnerTable().Version, "%s has the job's table", s.Node().ID)
	}
}
