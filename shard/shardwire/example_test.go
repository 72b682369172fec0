package shardwire_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardwire"
)

// A request crosses the "network" as bytes: the server decodes it, calls the dispatcher and
// encodes the answer; the client decodes the answer back into a lease or a sentinel error.
func Example() {
	d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 60, Incarnation: 1})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	serve := func(reqBytes []byte) []byte {
		req, _, err := shardwire.DecodeAcquireRequest(reqBytes)
		if err != nil {
			return shardwire.AppendAcquireResponse(nil, shardwire.NewAcquireResponse(shard.Lease{}, err))
		}
		return shardwire.AppendAcquireResponse(nil, shardwire.NewAcquireResponse(d.Acquire(ctx, req.Worker)))
	}
	for _, worker := range []string{"w1", "w2", "w3"} {
		resp, _, err := shardwire.DecodeAcquireResponse(serve(shardwire.AppendAcquireRequest(nil, shardwire.AcquireRequest{Worker: worker})))
		if err != nil {
			panic(err)
		}
		lease, err := resp.Result()
		if err != nil {
			fmt.Printf("%s: %v (wait: %t)\n", worker, err, errors.Is(err, shard.ErrWait))
			continue
		}
		fmt.Printf("%s: lease seq %d, records [%d, %d)\n", worker, lease.ID.Seq, lease.Shard.Start, lease.Shard.End)
	}
	// Output:
	// w1: lease seq 1, records [0, 60)
	// w2: lease seq 2, records [60, 100)
	// w3: shard: no shard available yet, retry after 250ms (wait: true)
}
