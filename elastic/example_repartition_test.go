package elastic_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// A job on two parameter servers gets a third while its workers train, and gives it back:
// only the slots whose owner changes move, and the training never stops.
func Example_liveRepartition() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "elastic-example")
	defer os.RemoveAll(dir)
	store, _ := checkpoint.NewFSStorage(filepath.Join(dir, "checkpoints"))
	data := shard.IndexedSource{Data: shard.IndexedFunc(20000, func(i int64, rec *shard.Record) error {
		rec.Label = float32(i % 2)
		rec.IDs = append(rec.IDs, uint64(i%997))
		rec.EndField()
		return nil
	})}
	job, err := local.Start(ctx, local.Config{
		Job: "grow", Servers: 2, Slots: 256,
		Tables: []ps.TableSpec{{Name: "item", Config: embedding.Config{Dim: 4, Seed: 7,
			Optimizer: embedding.Optimizer{Kind: embedding.Adagrad, LearningRate: 0.05}}}},
		Coordinator: elastic.Config{Storage: store, CheckpointEvery: 50,
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(20000), ShardSize: 500}},
		Checkpoint: checkpoint.Config{ShmDir: filepath.Join(dir, "shm")},
	})
	if err != nil {
		panic(err)
	}
	defer job.Close()

	// Workers run as goroutines of a local.Scaler, which also starts and stops servers.
	var steps atomic.Int64
	reached := make(chan struct{})
	scaler, err := local.NewScaler(local.ScalerConfig{
		Job:    job,
		Reader: func(string) shard.ReaderConfig { return shard.ReaderConfig{Source: data, BatchSize: 20} },
		Worker: func(string) (local.StepFunc, error) {
			return func(ctx context.Context, b *elastic.Batch) error {
				if steps.Add(1) == 100 {
					close(reached)
				}
				g := make([]float32, 4*len(b.IDs))
				for i := range g {
					g[i] = b.Labels[i/4] - 0.5
				}
				return b.Push(ctx, "item", b.IDs, g)
			}, nil
		},
	})
	if err != nil {
		panic(err)
	}
	defer scaler.Close()
	job.SetScaler(scaler)
	c := job.Coordinator()
	if err := c.SetParallelism(ctx, 2, 2); err != nil {
		panic(err)
	}
	<-reached
	for _, servers := range []int{3, 2} {
		if err := c.SetParallelism(ctx, 2, servers); err != nil { // returns once the slots moved
			panic(err)
		}
		r := c.Repartition()
		fmt.Printf("%d -> %d servers: %d of 256 slots moved\n", r.From, r.To, r.SlotsDone)
	}
	if err := scaler.Wait(ctx); err != nil {
		panic(err)
	}
	once := true
	for _, e := range c.ExactlyOnce() {
		once = once && e.OK() && e.Complete
	}
	fmt.Printf("trained %d batches on %d servers; every record once: %v\n", steps.Load(), len(job.Servers), once)
	// Output:
	// 2 -> 3 servers: 91 of 256 slots moved
	// 3 -> 2 servers: 91 of 256 slots moved
	// trained 1000 batches on 2 servers; every record once: true
}
