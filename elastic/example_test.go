package elastic_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// An in-process job: a coordinator, two parameter servers on loopback TCP, two workers training
// a one-table model, a checkpoint, and a resume of the job onto a single server.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "elastic-example")
	defer os.RemoveAll(dir)
	store, _ := checkpoint.NewFSStorage(filepath.Join(dir, "checkpoints"))

	// Record i has label i%2 and one categorical id.
	data := shard.IndexedSource{Data: shard.IndexedFunc(2000, func(i int64, rec *shard.Record) error {
		rec.Label = float32(i % 2)
		rec.IDs = append(rec.IDs, uint64(i%97))
		rec.EndField()
		return nil
	})}
	cfg := local.Config{
		Job: "example", Servers: 2, Slots: 256,
		Tables: []ps.TableSpec{{Name: "item", Config: embedding.Config{Dim: 4, Seed: 7,
			Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.05}}}},
		Coordinator: elastic.Config{Storage: store, CheckpointEvery: 20,
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(2000), ShardSize: 250}},
		Checkpoint: checkpoint.Config{ShmDir: filepath.Join(dir, "shm")},
	}
	job, err := local.Start(ctx, cfg)
	if err != nil {
		panic(err)
	}

	// Two workers: each step pulls the batch's rows, computes a gradient and pushes it.
	var wg sync.WaitGroup
	for w := range 2 {
		s, err := job.NewSession(fmt.Sprintf("worker-%d", w), shard.ReaderConfig{Source: data, BatchSize: 25})
		if err != nil {
			panic(err)
		}
		wg.Go(func() {
			defer s.Close()
			for {
				err := s.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
					rows := make([]float32, 4*len(b.IDs))
					if err := b.Pull(ctx, "item", b.IDs, rows); err != nil {
						return err
					}
					for i := range rows {
						rows[i] = 0.1 * (rows[i] - b.Labels[i/4]) // stands in for a backward pass
					}
					return b.Push(ctx, "item", b.IDs, rows)
				})
				if errors.Is(err, io.EOF) {
					return
				}
				if err != nil {
					panic(err)
				}
			}
		})
	}
	wg.Wait()
	step, err := job.Coordinator().Checkpoint(ctx) // the final checkpoint
	if err != nil {
		panic(err)
	}
	row := func(job *local.Job) []float32 {
		cli, _ := job.Client()
		r := make([]float32, 4)
		if err := cli.Pull(ctx, "item", []uint64{42}, r, ps.ReadOnly()); err != nil {
			panic(err)
		}
		return r
	}
	before := row(job)
	fmt.Printf("trained %d batches; committed step %d\n", job.Coordinator().Status().Step, step)
	job.Close()

	// The same job on one server: every slot is restored onto it.
	cfg.Servers = 1
	job, err = local.Start(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer job.Close()
	resumed, _, err := job.Coordinator().Resume(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("resumed at step %d on %d server; row 42 restored exactly: %v\n", resumed, len(job.Servers), slices.Equal(before, row(job)))
	// Output:
	// trained 80 batches; committed step 80
	// resumed at step 80 on 1 server; row 42 restored exactly: true
}
