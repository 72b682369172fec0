package elastic_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/elastictest"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// The small multi-epoch run of the epoch-end measurements: 800 records in 4 shards, 10 epochs,
// batches of 10, two workers.
const (
	smallRecords = 800
	smallEpochs  = 10
)

// smallRun trains the small run with two workers whose batches take about compute each, and
// returns each worker's steps and the run's wall time. A worker that finds no shard at an
// epoch's end waits for one: on small data it does so at every epoch. In process (local) a
// waiting worker is woken when the next epoch's shards are out; over the network (elastictest:
// the dispatcher reached through shardnet) it waits as the dispatcher says, RetryAfter at most.
func smallRun(tb testing.TB, network bool, retryAfter, compute time.Duration) ([]int, time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tables := []ps.TableSpec{{Name: "e", Config: embedding.Config{Dim: 8, Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.1}}}}
	coord := elastic.Config{Dispatcher: shard.Config{Dataset: shard.IndexedDataset(smallRecords), ShardSize: smallRecords / 4,
		Epochs: smallEpochs, RetryAfter: retryAfter}}
	var session func(name string, rc shard.ReaderConfig) (*elastic.Session, error)
	if network {
		job, err := elastictest.Start(ctx, elastictest.Config{Tables: tables, Coordinator: coord})
		if err != nil {
			tb.Fatal(err)
		}
		defer job.Close()
		session = job.Session
	} else {
		job, err := local.Start(ctx, local.Config{Job: "small", Slots: 64, Tables: tables, Coordinator: coord})
		if err != nil {
			tb.Fatal(err)
		}
		defer job.Close()
		session = job.NewSession
	}
	data := shard.IndexedSource{Data: shard.IndexedFunc(smallRecords, func(i int64, rec *shard.Record) error {
		rec.IDs = append(rec.IDs, uint64(i%300))
		rec.EndField()
		return nil
	})}
	steps := make([]int, 2)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range steps {
		s, err := session(fmt.Sprint("worker-", w), shard.ReaderConfig{Source: data, BatchSize: 10})
		if err != nil {
			tb.Fatal(err)
		}
		wg.Go(func() {
			defer s.Close()
			for {
				err := s.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
					time.Sleep(compute) // stands in for a model's forward and backward pass
					return b.Push(ctx, "e", b.IDs, make([]float32, 8*len(b.IDs)))
				})
				if errors.Is(err, io.EOF) {
					return
				}
				if err != nil {
					tb.Error(err)
					return
				}
				steps[w]++
			}
		})
	}
	wg.Wait()
	return steps, time.Since(start)
}

// BenchmarkEpochEnds measures what waiting for shards at epoch ends costs two workers on small
// data (800 batches of 1 ms over 10 epochs): the steps of the worker that trained least and of
// the one that trained most (400 each is even), and the run's time, in process and over the
// network, for the default shard.Config.RetryAfter and for fixed ones.
func BenchmarkEpochEnds(b *testing.B) {
	for _, network := range []bool{false, true} {
		for _, ra := range []time.Duration{0, time.Second, 250 * time.Millisecond, 100 * time.Millisecond, 10 * time.Millisecond} {
			name := "default"
			if ra > 0 {
				name = ra.String()
			}
			where := "in-process"
			if network {
				where = "network"
			}
			b.Run(where+"/RetryAfter="+name, func(b *testing.B) {
				var least, most, total float64
				for b.Loop() {
					steps, took := smallRun(b, network, ra, time.Millisecond)
					least += float64(slices.Min(steps))
					most += float64(slices.Max(steps))
					total += took.Seconds()
				}
				n := float64(b.N)
				b.ReportMetric(least/n, "steps-least")
				b.ReportMetric(most/n, "steps-most")
				b.ReportMetric(1000*total/n, "ms/run")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
