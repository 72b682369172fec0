package shard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/elasticps/elasticps/shard"
)

// Two workers train one in-memory dataset of 1000 records for two epochs through one
// dispatcher; every record is trained exactly once per epoch.
func Example() {
	d, err := shard.New(shard.Config{
		Dataset:   shard.IndexedDataset(1000),
		ShardSize: 100,
		Epochs:    2,
		Shuffle:   true,
		Seed:      42,
		// A worker that finds the epoch's last shards taken waits this long before asking
		// again; shards here take microseconds, so ask again soon.
		RetryAfter: time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	// Record i has label i%2 and one categorical id.
	data := shard.IndexedFunc(1000, func(i int64, rec *shard.Record) error {
		rec.Label = float32(i % 2)
		rec.IDs = append(rec.IDs, shard.FeatureIDInt(0, uint64(i%37)))
		rec.EndField()
		return nil
	})

	var mu sync.Mutex
	var trained, positives int
	var wg sync.WaitGroup
	for _, worker := range []string{"worker-a", "worker-b"} {
		wg.Go(func() {
			r, err := shard.NewReader(shard.ReaderConfig{Service: d, Worker: worker, Source: shard.IndexedSource{Data: data}, BatchSize: 32})
			if err != nil {
				panic(err)
			}
			defer r.Close()
			ctx := context.Background()
			for {
				b, err := r.Next(ctx)
				if err == io.EOF {
					return
				}
				if err != nil {
					panic(err)
				}
				mu.Lock() // "train" the batch
				trained += b.Len()
				for _, l := range b.Labels {
					positives += int(l)
				}
				mu.Unlock()
				if err := r.Done(ctx, b); err != nil {
					panic(err)
				}
			}
		})
	}
	wg.Wait()

	p := d.Progress()
	for _, e := range p.EpochRecords {
		fmt.Printf("epoch %d: %d of %d records trained, %d failed\n", e.Epoch, e.Done, e.Records, e.Failed)
	}
	fmt.Printf("finished=%t trained=%d positives=%d shards done=%d\n", p.Finished, trained, positives, p.Shards.Done)
	// Output:
	// epoch 0: 1000 of 1000 records trained, 0 failed
	// epoch 1: 1000 of 1000 records trained, 0 failed
	// finished=true trained=2000 positives=1000 shards done=10
}

// A worker reports each shard done and gets the next in a single call. Repeating a call whose
// answer was lost returns the same lease: nothing is counted twice, no lease is left behind.
func ExampleDispatcher_ReportAndAcquire() {
	d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(30), ShardSize: 10, Incarnation: 1})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	l, err := d.Acquire(ctx, "w")
	if err != nil {
		panic(err)
	}
	for {
		// ... train the records of l from l.Offset on ...
		next, err := d.ReportAndAcquire(ctx, "w", l.ID, l.Shard.Records)
		if errors.Is(err, shard.ErrNoMoreWork) { // the report was accepted; the job is over
			fmt.Printf("shard %d done, no more work\n", l.Shard.Index)
			break
		}
		if err != nil {
			panic(err)
		}
		again, _ := d.ReportAndAcquire(ctx, "w", l.ID, l.Shard.Records) // as if the answer was lost
		fmt.Printf("shard %d done, next %d (lease %d), repeat gives lease %d\n", l.Shard.Index, next.Shard.Index, next.ID.Seq, again.ID.Seq)
		l = next
	}
	p := d.Progress()
	fmt.Printf("%d leases, %d records done\n", p.Leases, p.EpochRecords[0].Done)
	// Output:
	// shard 0 done, next 1 (lease 2), repeat gives lease 2
	// shard 1 done, next 2 (lease 3), repeat gives lease 3
	// shard 2 done, no more work
	// 3 leases, 30 records done
}
