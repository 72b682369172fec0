package elastic_test

import (
	"context"
	"io"
	"math"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// twinConfig is a job of two identical tables, a and b, that every batch pushes alike: a
// model is consistent when they are equal. Record i holds id i alone, so that no two batches
// of an epoch touch one row and both tables see each row's updates in the same order.
func twinConfig(dir string, records int64) local.Config {
	store, _ := checkpoint.NewFSStorage(filepath.Join(dir, "ck"))
	emb := embedding.Config{Dim: 4, Seed: 3, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad, LearningRate: 0.1}}
	return local.Config{Job: "twins", Servers: 2, Slots: 64,
		Tables: []ps.TableSpec{{Name: "a", Config: emb}, {Name: "b", Config: emb}},
		Coordinator: elastic.Config{Storage: store, CheckpointEvery: 20,
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(records), ShardSize: 40, Epochs: 2}},
		Checkpoint: checkpoint.Config{ShmDir: filepath.Join(dir, "shm")}}
}

func twinStep(ctx context.Context, b *elastic.Batch) error {
	g := make([]float32, 4*len(b.IDs))
	for i := range g {
		g[i] = float32(b.IDs[i/4]%7) - 3 + b.Labels[i/4]
	}
	if err := b.Push(ctx, "a", b.IDs, g); err != nil {
		return err
	}
	return b.Push(ctx, "b", b.IDs, g)
}

// twinWorkers trains the twin tables on records records (record i holds id i) with two
// sessions of job, and returns a channel closed once both are done.
func twinWorkers(ctx context.Context, t *testing.T, job *local.Job, records int64) <-chan struct{} {
	t.Helper()
	data := shard.IndexedSource{Data: shard.IndexedFunc(records, func(i int64, rec *shard.Record) error {
		rec.Label = float32(i % 2)
		rec.IDs = append(rec.IDs, uint64(i))
		rec.EndField()
		return nil
	})}
	var wg sync.WaitGroup
	for _, w := range []string{"w0", "w1"} {
		s, err := job.NewSession(w, shard.ReaderConfig{Source: data, BatchSize: 5})
		require.NoError(t, err)
		wg.Go(func() {
			defer s.Close()
			for {
				if err := s.Step(ctx, twinStep); err != nil {
					assert.ErrorIs(t, err, io.EOF)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

// resumeOn starts the job of cfg again on servers servers, resumes it from its newest commit,
// which must be of step, and closes it at the end of the test.
func resumeOn(ctx context.Context, t *testing.T, cfg local.Config, servers int, step uint64) *local.Job {
	t.Helper()
	cfg.Servers = servers
	job, err := local.Start(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { job.Close() })
	resumed, _, err := job.Coordinator().Resume(ctx)
	require.NoError(t, err)
	require.Equal(t, step, resumed)
	return job
}

// assertTwins checks that d's tables a and b are equal.
func assertTwins(t *testing.T, d checkpoint.Digest) {
	t.Helper()
	require.Len(t, d.Tables, 2)
	a, b := d.Tables[0], d.Tables[1]
	assert.Equal(t, a.Rows, b.Rows, "step %d", d.Step)
	assert.Equal(t, a.Sum, b.Sum, "step %d: a batch half applied", d.Step)
}

// A job's digest, taken while two workers train, never sees a batch half applied; at the end
// it is its newest commit's, and stays so while the job goes 2 -> 3 -> 2 servers live and when
// the commit is restored onto 3 servers; one bit of one weight makes them differ.
func TestDigestOfTheJobIsItsCommitsOnAnyServerCount(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := twinConfig(t.TempDir(), 400)
	job, err := local.Start(ctx, cfg)
	require.NoError(t, err)
	defer job.Close()
	trained := twinWorkers(ctx, t, job, 400)
	digests := 0
	for done := false; !done; digests++ {
		select {
		case <-trained:
			done = true
		default:
		}
		d, err := job.Digest(ctx)
		require.NoError(t, err)
		assertTwins(t, d)
	}
	t.Logf("%d digests while training", digests)

	require.NoError(t, job.Coordinator().WaitCommits(ctx)) // a loaded machine's backlog first
	step, err := job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	want, err := job.DigestCommit(ctx, step)
	require.NoError(t, err)
	assert.Equal(t, step, want.Step)
	assert.EqualValues(t, 400, want.Tables[0].Rows)
	assertTwins(t, want)
	check := func(what string, servers int) {
		t.Helper()
		d, err := job.Digest(ctx)
		require.NoError(t, err)
		require.NoError(t, want.Compare(d), what)
		assert.Equal(t, step, d.Step, what)
		assert.Len(t, job.Coordinator().Status().Servers, servers, what)
	}
	check("the job at its commit", 2)

	added, err := job.StartServers(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, job.Coordinator().AddServers(ctx, added...))
	check("2 -> 3 servers", 3)
	require.NoError(t, job.Coordinator().RemoveServers(ctx, "ps-2"))
	require.NoError(t, job.StopServers(ctx, []string{"ps-2"}))
	check("3 -> 2 servers", 2)
	require.NoError(t, job.Close())

	job = resumeOn(ctx, t, cfg, 3, step)
	check("restored onto 3 servers", 3)

	// One bit of one weight of one row, on the server that owns it.
	s := job.Servers[0].Server()
	tab, _ := s.Table("a")
	var id uint64
	var w []float32
	tab.Range(func(v embedding.RowView) bool {
		id, w = v.ID, append([]float32(nil), v.Weights...)
		return !s.OwnerTable().SlotsOf(s.ID()).Contains(v.ID)
	})
	w[0] = math.Float32frombits(math.Float32bits(w[0]) ^ 1)
	require.NoError(t, tab.Assign([]uint64{id}, w))
	d, err := job.Digest(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"table a: 400 rows each, their values differ"}, want.Diff(d))
}
