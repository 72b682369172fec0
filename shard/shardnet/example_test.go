package shardnet_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
)

// A coordinator serves its dispatcher; two workers on other hosts read the dataset through
// network clients. (The in-memory network stands in for TCP: leave Transport nil in real use.)
func Example() {
	secret := []byte("cluster secret: 32 random bytes!")
	network := memnet.New(memnet.Config{})

	d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(1000), ShardSize: 100, RetryAfter: time.Millisecond})
	if err != nil {
		panic(err)
	}
	srv, err := shardnet.NewServer(shardnet.ServerConfig{Service: d, Secret: secret})
	if err != nil {
		panic(err)
	}
	l, err := network.Host("coordinator").Listen("coordinator:7070")
	if err != nil {
		panic(err)
	}
	go srv.Serve(l)
	defer srv.Close()

	data := shard.IndexedFunc(1000, func(i int64, rec *shard.Record) error {
		rec.Label = float32(i % 2)
		return nil
	})
	var mu sync.Mutex
	trained := map[string]int{}
	var wg sync.WaitGroup
	for _, worker := range []string{"worker-a", "worker-b"} {
		wg.Go(func() {
			cli, err := shardnet.NewClient(shardnet.ClientConfig{
				Addr: "coordinator:7070", Secret: secret, Transport: network.Host(worker),
			})
			if err != nil {
				panic(err)
			}
			defer cli.Close()
			r, err := shard.NewReader(shard.ReaderConfig{Service: cli, Worker: worker, Source: shard.IndexedSource{Data: data}, BatchSize: 50})
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
				mu.Lock()
				trained[worker] += b.Len() // train the batch
				mu.Unlock()
				if err := r.Done(ctx, b); err != nil {
					panic(err)
				}
			}
		})
	}
	wg.Wait()

	p := d.Progress()
	fmt.Printf("trained %d records, dispatcher counts %d of %d, finished %t\n",
		trained["worker-a"]+trained["worker-b"], p.EpochRecords[0].Done, p.EpochRecords[0].Records, p.Finished)
	st := srv.Stats()
	// Each shard took one progress report (after its first batch) and one combined call that
	// reported it done and leased the next shard.
	fmt.Printf("%d reports, %d combined, %d malformed\n", st.Reports, st.ReportAcquires, st.Malformed)
	// Output:
	// trained 1000 records, dispatcher counts 1000 of 1000, finished true
	// 10 reports, 10 combined, 0 malformed
}
