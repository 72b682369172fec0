package elastic_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tinySession is a session over n records of one id each, one record per batch.
func tinySession(t *testing.T, job *local.Job, n int64) *elastic.Session {
	t.Helper()
	sess, err := job.NewSession("w", shard.ReaderConfig{BatchSize: 1, Source: shard.IndexedSource{Data: shard.IndexedFunc(n,
		func(i int64, rec *shard.Record) error {
			rec.IDs = append(rec.IDs, uint64(i))
			rec.EndField()
			return nil
		})}})
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() })
	return sess
}

// allRows returns every row of every table (weights and optimizer state) over the servers.
func allRows(job *local.Job) map[string]map[uint64][]float32 {
	out := map[string]map[uint64][]float32{}
	for _, s := range job.Servers {
		for _, name := range s.Server().TableNames() {
			t, _ := s.Server().Table(name)
			if out[name] == nil {
				out[name] = map[uint64][]float32{}
			}
			t.Range(func(v embedding.RowView) bool {
				out[name][v.ID] = append(slices.Clone(v.Weights), v.State...)
				return true
			})
		}
	}
	return out
}

// Dense tensors (given their values by InitDense, trained by pushes) are checkpointed with the
// embedding tables and restored, bit for bit with their optimizer state, onto 1, 2 and 5
// servers; incremental checkpoints carry their changes too.
func TestDenseTensorsSurviveRestoreOntoAnyServerCount(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	store, err := checkpoint.NewFSStorage(filepath.Join(dir, "ck"))
	require.NoError(t, err)
	adagrad := embedding.Optimizer{Kind: embedding.Adagrad, LearningRate: 0.1}
	lengths := map[string]int{"mlp.w0": 3000, "mlp.b0": 7, "mlp.w1": 1024, "mlp.b1": 1}
	tables := []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 4, Seed: 2, Optimizer: adagrad}}}
	for name, n := range lengths {
		tables = append(tables, ps.TableSpec{Name: name, Dense: n, Config: embedding.Config{Optimizer: adagrad}})
	}
	cfg := local.Config{Job: "dense", Servers: 3, Slots: 128, Tables: tables,
		Coordinator: elastic.Config{Storage: store, Dispatcher: shard.Config{Dataset: shard.IndexedDataset(10)}},
		Checkpoint:  checkpoint.Config{ShmDir: filepath.Join(dir, "shm"), FullEvery: 2},
	}
	job, err := local.Start(ctx, cfg)
	require.NoError(t, err)
	cli, err := job.Client()
	require.NoError(t, err)
	sess := tinySession(t, job, 10)
	train := func(round int) {
		require.NoError(t, sess.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
			for name, n := range lengths {
				vals := make([]float32, n)
				for i := range vals {
					vals[i] = float32(i%13) * 0.01
				}
				if err := cli.InitDense(ctx, name, vals, adagrad); err != nil { // once: later calls change nothing
					return err
				}
				g := make([]float32, n)
				for i := range g {
					g[i] = float32((i+round)%5) - 2
				}
				if err := b.PushDense(ctx, name, g); err != nil {
					return err
				}
			}
			ids := []uint64{1, 2, 3, 1000, 99999}
			g := make([]float32, 4*len(ids))
			for i := range g {
				g[i] = float32(i+round) * 0.5
			}
			return b.Push(ctx, "emb", ids, g)
		}))
	}
	applied := func() int {
		n := 0
		for _, s := range job.Servers {
			n += s.Server().AppliedCount()
		}
		return n
	}
	// A full checkpoint, then more training and an incremental one.
	train(1)
	_, err = job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	round1 := applied()
	require.NotZero(t, round1, "no commit before the first: nothing is forgotten")
	train(2)
	round2 := applied() - round1
	step, err := job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(2), step)
	assert.Equal(t, round2, applied(), "a checkpoint forgets the positions the newest commit covers, and only those")
	want := allRows(job)
	require.Len(t, want, 1+len(lengths))
	commit, err := job.DigestCommit(ctx, step)
	require.NoError(t, err)
	live, err := job.Digest(ctx)
	require.NoError(t, err)
	require.NoError(t, commit.Compare(live), "the job's model is its commit's")
	require.Len(t, commit.Tables, 1+len(lengths))
	for name, n := range lengths {
		got := make([]float32, n)
		require.NoError(t, cli.PullDense(ctx, name, got))
		assert.NotZero(t, got[0]+got[n-1], "%s trained", name)
	}
	require.NoError(t, job.Close())

	for _, n := range []int{1, 2, 5} {
		t.Run(fmt.Sprintf("%d servers", n), func(t *testing.T) {
			c := cfg
			c.Servers = n
			job, err := local.Start(ctx, c)
			require.NoError(t, err)
			defer job.Close()
			got, _, err := job.Coordinator().Resume(ctx)
			require.NoError(t, err)
			assert.Equal(t, step, got)
			assert.Equal(t, want, allRows(job), "every table and dense tensor, weights and optimizer state")
			d, err := job.Digest(ctx)
			require.NoError(t, err)
			assert.NoError(t, commit.Compare(d), "the digest says so too")
		})
	}
}

// A dense tensor the servers were not told about cannot be checkpointed: InitDense refuses to
// create it on the fly, and says to declare it in the field the program lists its tables in.
func TestUndeclaredDenseTensorIsRefusedAtInit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	store, err := checkpoint.NewFSStorage(filepath.Join(dir, "ck"))
	require.NoError(t, err)
	job, err := local.Start(ctx, local.Config{Job: "undeclared", Servers: 2, Slots: 64,
		Tables:      []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 4}}},
		Coordinator: elastic.Config{Storage: store, Dispatcher: shard.Config{Dataset: shard.IndexedDataset(4)}},
		Checkpoint:  checkpoint.Config{ShmDir: filepath.Join(dir, "shm")}})
	require.NoError(t, err)
	defer job.Close()
	cli, err := job.Client()
	require.NoError(t, err)
	err = cli.InitDense(ctx, "mlp.x", []float32{1, 2}, embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.1})
	require.ErrorIs(t, err, ps.ErrUnknownTable)
	assert.Contains(t, err.Error(), `"mlp.x"`)
	assert.Contains(t, err.Error(), "local.Config.Tables")
	sess := tinySession(t, job, 4)
	require.NoError(t, sess.Step(ctx, func(ctx context.Context, b *elastic.Batch) error { return nil }))
	_, err = job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err, "nothing undeclared to lose")
}

// A dense tensor declared with its initial value holds it from the start on a job's servers:
// no worker calls InitDense (which changes nothing), its first checkpoint holds it, and a
// restore brings it back.
func TestDenseTensorDeclaredWithItsInitialValue(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	store, err := checkpoint.NewFSStorage(filepath.Join(dir, "ck"))
	require.NoError(t, err)
	initial := make([]float32, 1500)
	for i := range initial {
		initial[i] = float32(i) * 0.5
	}
	sgd := embedding.Optimizer{Kind: embedding.SGD, LearningRate: 1}
	cfg := local.Config{Job: "initial", Servers: 3, Slots: 64,
		Tables:      []ps.TableSpec{{Name: "w", Dense: 1500, Initial: initial, Config: embedding.Config{Optimizer: sgd}}},
		Coordinator: elastic.Config{Storage: store, Dispatcher: shard.Config{Dataset: shard.IndexedDataset(4)}},
		Checkpoint:  checkpoint.Config{ShmDir: filepath.Join(dir, "shm")}}
	job, err := local.Start(ctx, cfg)
	require.NoError(t, err)
	defer job.Close()
	sess := tinySession(t, job, 4)
	got := make([]float32, 1500)
	g := make([]float32, 1500)
	g[1499] = 1
	require.NoError(t, sess.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
		if err := b.PullDense(ctx, "w", got); err != nil {
			return err
		}
		return b.PushDense(ctx, "w", g)
	}))
	assert.Equal(t, initial, got, "the declared value, with no InitDense")
	cli, err := job.Client()
	require.NoError(t, err)
	require.NoError(t, cli.InitDense(ctx, "w", make([]float32, 1500), sgd))
	require.NoError(t, cli.PullDense(ctx, "w", got))
	want := slices.Clone(initial)
	want[1499]--
	assert.Equal(t, want, got, "trained, and InitDense changed nothing")
	step, err := job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, job.Close())

	job = resumeOn(ctx, t, cfg, 2, step)
	cli, err = job.Client()
	require.NoError(t, err)
	require.NoError(t, cli.PullDense(ctx, "w", got))
	assert.Equal(t, want, got, "restored, not the initial value")
	_, err = local.Start(ctx, local.Config{Job: "bad", Tables: []ps.TableSpec{{Name: "w", Dense: 3, Initial: []float32{1}}},
		Coordinator: elastic.Config{Dispatcher: shard.Config{Dataset: shard.IndexedDataset(4)}}})
	assert.ErrorIs(t, err, ps.ErrBadConfig, "an initial value of another size")
}
