package shardtest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardtest"
)

// A ledger watches the reports a zombie worker and its successor send through it: the zombie's
// late report is rejected, so every record is counted once.
func Example() {
	clock := shardtest.NewClock(time.Unix(0, 0))
	d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(10), ShardSize: 10, LeaseTTL: time.Second, Clock: clock})
	if err != nil {
		panic(err)
	}
	ledger := shardtest.NewLedger()
	svc := ledger.Wrap(d)
	ctx := context.Background()

	old, _ := svc.Acquire(ctx, "zombie")
	_ = svc.Report(ctx, "zombie", old.ID, 4, false)
	clock.Advance(2 * time.Second) // the zombie stalls past its lease
	fresh, _ := svc.Acquire(ctx, "successor")
	fmt.Println("successor starts at", fresh.Offset)
	err = svc.Report(ctx, "zombie", old.ID, 10, true)
	fmt.Println("zombie report stale:", errors.Is(err, shard.ErrStaleLease))
	_ = svc.Report(ctx, "successor", fresh.ID, 10, true)
	fmt.Println("check:", ledger.Check(d.Progress()), "counted:", ledger.Counted(0))
	// Output:
	// successor starts at 4
	// zombie report stale: true
	// check: <nil> counted: 10
}
