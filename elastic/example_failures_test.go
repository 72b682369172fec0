package elastic_test

import (
	"context"
	"errors"
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

// Training goes on through failures: a worker fails (its step keeps failing, so its session
// gives the batch back and ends, and the scaler starts the worker again), and a parameter
// server is killed after a commit and restarted (the job rolls back to that commit). Every
// record is still trained exactly once.
func Example_failures() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "elastic-failures")
	defer os.RemoveAll(dir)
	store, _ := checkpoint.NewFSStorage(filepath.Join(dir, "checkpoints"))
	committed := make(chan uint64, 100)
	recovered := make(chan elastic.RecoveryEvent, 10)
	job, err := local.Start(ctx, local.Config{
		Job: "failures", Servers: 2, Slots: 256,
		Tables: []ps.TableSpec{{Name: "item", Config: embedding.Config{Dim: 4,
			Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.05}}}},
		Coordinator: elastic.Config{Storage: store, CheckpointEvery: 10, Recovery: elastic.Rollback,
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(4000), ShardSize: 200},
			OnCheckpoint: func(ev elastic.CheckpointEvent) {
				if ev.Commit && ev.Err == nil {
					committed <- ev.Step
				}
			},
			OnRecovery: func(ev elastic.RecoveryEvent) {
				if ev.Err == nil {
					recovered <- ev
				}
			}},
		Checkpoint: checkpoint.Config{ShmDir: filepath.Join(dir, "shm")},
	})
	if err != nil {
		panic(err)
	}
	defer job.Close()

	var batches, failing atomic.Int64
	var armed atomic.Bool
	step := func(ctx context.Context, b *elastic.Batch) error {
		if batches.Add(1) >= 30 && b.Worker() == "worker-1" && armed.CompareAndSwap(false, true) {
			failing.Store(3) // worker-1 fails this batch on its try and both retries
		}
		if b.Worker() == "worker-1" && failing.Add(-1) >= 0 {
			return errors.New("out of memory")
		}
		grads := make([]float32, 4*len(b.IDs))
		for i := range grads {
			grads[i] = 0.01
		}
		return b.Push(ctx, "item", b.IDs, grads)
	}
	data := shard.IndexedSource{Data: shard.IndexedFunc(4000, func(i int64, rec *shard.Record) error {
		rec.IDs = append(rec.IDs, uint64(i%97))
		rec.EndField()
		return nil
	})}
	workers, err := local.NewScaler(local.ScalerConfig{Job: job, MaxRestarts: 1,
		Reader: func(string) shard.ReaderConfig { return shard.ReaderConfig{Source: data, BatchSize: 20} },
		Worker: func(string) (local.StepFunc, error) { return step, nil }})
	if err != nil {
		panic(err)
	}
	defer workers.Close()
	if err := workers.Scale(ctx, elastic.Plan{Servers: 2, Workers: 2}); err != nil {
		panic(err)
	}

	<-committed // a commit to return to
	if err := job.KillServer(1); err != nil {
		panic(err)
	}
	if err := job.RestartServer(ctx, 1); err != nil {
		panic(err)
	}
	ev := <-recovered
	if err := workers.Wait(ctx); err != nil {
		panic(err)
	}
	restarts := 0
	for _, w := range workers.Workers() {
		restarts += w.Restarts
	}
	fmt.Printf("worker restarts: %d; %s recovered by %s\n", restarts, elastic.ServerID(1), ev.Policy)
	once := true
	for _, e := range job.Coordinator().ExactlyOnce() {
		once = once && e.OK() && e.Complete
	}
	fmt.Println("every record trained exactly once:", once)
	// Output:
	// worker restarts: 1; ps-1 recovered by rollback
	// every record trained exactly once: true
}
