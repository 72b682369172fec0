package local_test

import (
	"context"
	"fmt"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// A job of two parameter servers in this process trains 512 records with two workers that a
// Scaler runs, started by the coordinator's SetParallelism; every record is trained exactly
// once. A plan with another server count is refused by the scaler itself: the coordinator
// changes it with a live repartition.
func Example() {
	ctx := context.Background()
	job, err := local.Start(ctx, local.Config{Job: "example", Servers: 2, Slots: 16,
		Tables: []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 4}}},
		Coordinator: elastic.Config{
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(512), ShardSize: 64}}})
	if err != nil {
		panic(err)
	}
	defer job.Close()

	data := shard.IndexedSource{Data: shard.IndexedFunc(512, func(i int64, rec *shard.Record) error {
		rec.IDs = append(rec.IDs, uint64(i%50))
		rec.EndField()
		return nil
	})}
	step := func(ctx context.Context, b *elastic.Batch) error {
		return b.Push(ctx, "emb", b.IDs, make([]float32, 4*len(b.IDs)))
	}
	scaler, err := local.NewScaler(local.ScalerConfig{Job: job,
		Reader: func(string) shard.ReaderConfig { return shard.ReaderConfig{Source: data, BatchSize: 32} },
		Worker: func(string) (local.StepFunc, error) { return step, nil }})
	if err != nil {
		panic(err)
	}
	defer scaler.Close()
	job.SetScaler(scaler)

	if err := job.Coordinator().SetParallelism(ctx, 2, 2); err != nil {
		panic(err)
	}
	if err := scaler.Wait(ctx); err != nil {
		panic(err)
	}
	var batches uint64
	for _, w := range scaler.Workers() {
		fmt.Println(w.ID, "running:", w.Running, "error:", w.Err)
		batches += w.Steps
	}
	fmt.Println("batches:", batches)
	for _, e := range job.Coordinator().ExactlyOnce() {
		fmt.Println("every record once:", e.OK())
	}
	fmt.Println(scaler.Scale(ctx, elastic.Plan{Servers: 3, Workers: 2}) != nil, scaler.Plan())
	// Output:
	// worker-0 running: false error: <nil>
	// worker-1 running: false error: <nil>
	// batches: 16
	// every record once: true
	// true 2 servers, 2 workers
}
