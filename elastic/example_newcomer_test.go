package elastic_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// A whole job in one process: a coordinator, two parameter servers and two workers train an
// embedding table and a dense tensor on the dispatcher's data, with checkpoints while they
// train; the job goes to three servers and back to two without stopping; then it stops, its
// newest commit is restored onto three servers, and the model is checked bit for bit, by
// digest, against the job and against the commit.
func Example_wholeJob() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "elastic-example")
	defer os.RemoveAll(dir)
	store, _ := checkpoint.NewFSStorage(filepath.Join(dir, "checkpoints"))
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}

	// Record i: label i%2 and one id of 500; the dense tensor is 8 weights, declared with its
	// initial value, so no worker has to give it one.
	const records = 4000
	data := shard.IndexedSource{Data: shard.IndexedFunc(records, func(i int64, rec *shard.Record) error {
		rec.Label = float32(i % 2)
		rec.IDs = append(rec.IDs, uint64(i%500))
		rec.EndField()
		return nil
	})}
	w0 := []float32{0.1, 0.2, 0.3, 0.4, -0.1, -0.2, -0.3, -0.4}
	cfg := local.Config{Job: "whole", Servers: 2, Slots: 256,
		Tables: []ps.TableSpec{
			{Name: "item", Config: embedding.Config{Dim: 4, Seed: 7, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad, LearningRate: 0.05}}},
			{Name: "dense", Dense: 8, Initial: w0, Config: embedding.Config{Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.01}}},
		},
		Coordinator: elastic.Config{Storage: store, CheckpointEvery: 100,
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(records), ShardSize: 200, Epochs: 2}},
		Checkpoint: checkpoint.Config{ShmDir: filepath.Join(dir, "shm")},
	}
	job, err := local.Start(ctx, cfg)
	must(err)

	// A step pulls the batch's rows and the tensor, and pushes their gradients.
	step := func(ctx context.Context, b *elastic.Batch) error {
		rows, w := make([]float32, 4*len(b.IDs)), make([]float32, 8)
		if err := b.Pull(ctx, "item", b.IDs, rows); err != nil {
			return err
		}
		if err := b.PullDense(ctx, "dense", w); err != nil {
			return err
		}
		gw := make([]float32, 8)
		for i := range rows {
			rows[i] = 0.1 * (rows[i]*w[i%8] - b.Labels[i/4]) // stands in for a backward pass
			gw[i%8] += rows[i]
		}
		if err := b.PushDense(ctx, "dense", gw); err != nil {
			return err
		}
		return b.Push(ctx, "item", b.IDs, rows)
	}
	scaler, err := local.NewScaler(local.ScalerConfig{Job: job,
		Reader: func(string) shard.ReaderConfig { return shard.ReaderConfig{Source: data, BatchSize: 20} },
		Worker: func(string) (local.StepFunc, error) { return step, nil }})
	must(err)
	job.SetScaler(scaler)
	c := job.Coordinator()
	must(c.SetParallelism(ctx, 2, 2)) // two workers

	// Three servers, then two, while the workers train.
	for i, servers := range []int{3, 2} {
		_, err := c.WaitStep(ctx, uint64(100*(i+1)))
		must(err)
		must(c.SetParallelism(ctx, 2, servers))
		r := c.Repartition()
		fmt.Printf("%d -> %d servers: %d of 256 slots moved\n", r.From, r.To, r.SlotsDone)
	}
	must(scaler.Wait(ctx))
	must(c.Finish(ctx, true, 0)) // a final checkpoint, and training stops
	st := c.Status()
	once := true
	for _, e := range c.ExactlyOnce() {
		once = once && e.OK() && e.Complete
	}
	fmt.Printf("trained %d batches, every record once: %v, checkpoints while training: %v\n", st.Step, once, st.Commits > 1)

	// The model now, and the newest commit: one digest each.
	now, err := job.Digest(ctx)
	must(err)
	commit, err := job.DigestCommit(ctx, st.LastCommit)
	must(err)
	fmt.Printf("the job at step %d is its commit of step %d: %v (%s %d rows, %s %d)\n",
		now.Step, commit.Step, now.Equal(commit), commit.Tables[1].Name, commit.Tables[1].Rows, commit.Tables[0].Name, commit.Tables[0].Rows)
	must(scaler.Close())
	must(job.Close())

	// The newest commit onto three servers.
	cfg.Servers = 3
	job, err = local.Start(ctx, cfg)
	must(err)
	defer job.Close()
	resumed, _, err := job.Coordinator().Resume(ctx)
	must(err)
	restored, err := job.Digest(ctx)
	must(err)
	fmt.Printf("restored step %d onto %d servers, bit for bit: %v\n", resumed, len(job.Servers), restored.Equal(commit))
	// Output:
	// 2 -> 3 servers: 91 of 256 slots moved
	// 3 -> 2 servers: 91 of 256 slots moved
	// trained 400 batches, every record once: true, checkpoints while training: true
	// the job at step 400 is its commit of step 400: true (item 500 rows, dense 1)
	// restored step 400 onto 3 servers, bit for bit: true
}
