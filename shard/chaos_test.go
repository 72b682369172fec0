package shard_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardtest"
)

// chaosWorkers runs n worker goroutines, each a succession of lives: a Reader that trains
// batches (sleeping a little per batch) and, at random, crashes (drops its reader without a
// word and comes back under the same name), stalls past its lease before finishing a batch,
// or leaves gracefully. It returns when the dispatcher has no more work. Inside a synctest
// bubble time is virtual, so the sleeps cost nothing. Every third worker sees svc without its
// combined call (shard.ReportAcquirer), so both ways of finishing a shard are exercised.
func chaosWorkers(t *testing.T, svc shard.Service, data shard.Indexed, n int, seed uint64, ttl time.Duration, chaos bool) {
	var wg sync.WaitGroup
	ctx := context.Background()
	for w := range n {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			name := fmt.Sprintf("worker-%d", w)
			mine := svc
			if w%3 == 2 {
				mine = struct{ shard.Service }{svc}
			}
			for life := 0; ; life++ {
				r, err := shard.NewReader(shard.ReaderConfig{
					Service: mine, Worker: name, Source: shard.IndexedSource{Data: data},
					BatchSize: 8 + rng.IntN(40), MaxPending: 1 + rng.IntN(3), ReportEvery: 1 + rng.IntN(2), Seed: uint64(life),
				})
				if err != nil {
					t.Error(err)
					return
				}
				over, err := chaosLife(ctx, r, rng, ttl, chaos)
				_ = r.Close()
				if err != nil {
					t.Error(err)
					return
				}
				if over {
					return
				}
				time.Sleep(time.Duration(rng.Int64N(int64(ttl)))) // down for a while
			}
		})
	}
	wg.Wait()
}

// chaosLife runs one life of a worker; it reports whether the job is over.
func chaosLife(ctx context.Context, r *shard.Reader, rng *rand.Rand, ttl time.Duration, chaos bool) (bool, error) {
	var pending []*shard.Batch
	for {
		b, err := r.Next(ctx)
		if err == io.EOF {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		pending = append(pending, b)
		time.Sleep(time.Duration(1+rng.IntN(20)) * time.Millisecond) // training
		if chaos {
			switch x := rng.IntN(1000); {
			case x < 15: // crash
				return false, nil
			case x < 25: // stall past the lease, then carry on as if nothing happened
				time.Sleep(ttl + time.Duration(rng.Int64N(int64(ttl))))
			case x < 30: // leave gracefully
				for _, b := range pending {
					if err := r.Done(ctx, b); err != nil {
						return false, err
					}
				}
				return false, r.Leave(ctx)
			}
		}
		// Finish pending batches, sometimes out of order, sometimes keeping one in flight.
		rng.Shuffle(len(pending), func(i, j int) { pending[i], pending[j] = pending[j], pending[i] })
		keep := 0
		if len(pending) > 1 && rng.IntN(2) == 0 {
			keep = 1
		}
		for len(pending) > keep {
			if err := r.Done(ctx, pending[0]); err != nil {
				return false, err
			}
			pending = pending[1:]
		}
	}
}

// TestExactlyOnceConcurrent is the invariant test with real goroutines and Readers (run it with
// -race): workers join, crash, stall and come back over several epochs while snapshots are
// taken; then each snapshot is restored into a new dispatcher and the job finished again.
func TestExactlyOnceConcurrent(t *testing.T) {
	// Whether a given seed's run repeats a combined call after a lost answer depends on goroutine
	// scheduling; over all seeds together it must happen.
	var combinedAll, repeatsAll, lostAll int
	defer func() {
		if !t.Failed() && (combinedAll == 0 || repeatsAll == 0 || lostAll == 0) {
			t.Fatalf("over every seed: combined calls %d, repeats %d, answers lost %d: the combined call was not exercised", combinedAll, repeatsAll, lostAll)
		}
	}()
	for _, seed := range []uint64{1, 2, 3, 4} {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const records = 20000
				const ttl = 2 * time.Second
				cfg := shard.Config{Dataset: shard.IndexedDataset(records), ShardSize: 150, Epochs: 3, Shuffle: true, ShuffleRecords: seed == 2,
					Seed: seed, LeaseTTL: ttl, MaxFailures: 1000, RetryAfter: 100 * time.Millisecond, Incarnation: seed}
				t0bubble := time.Now()
				d, err := shard.New(cfg) // the bubble's clock
				if err != nil {
					t.Fatal(err)
				}
				ledger := shardtest.NewLedger()
				data := labelled(records)
				// Calls get lost on the way to the dispatcher, and answers on the way back.
				flaky := shardtest.NewFlaky(ledger.Wrap(d))
				flaky.SetRandomFaults(seed, 0.02, 0.03)

				var snaps []snapPoint
				stop := make(chan struct{})
				var snapper sync.WaitGroup
				snapper.Go(func() {
					rng := rand.New(rand.NewPCG(seed, 99))
					for len(snaps) < 3 {
						select {
						case <-stop:
							return
						case <-time.After(time.Duration(1+rng.IntN(4000)) * time.Millisecond):
							b, l := ledger.Snapshot(d)
							snaps = append(snaps, snapPoint{bytes: b, ledger: l})
						}
					}
				})
				chaosWorkers(t, flaky, data, 8, seed, ttl, true)
				close(stop)
				snapper.Wait()

				p := d.Progress()
				if err := ledger.Check(p); err != nil {
					t.Fatal(err)
				}
				if !p.Finished || len(p.EpochRecords) != 3 {
					t.Fatalf("%+v", p)
				}
				var expired, stale int
				for _, w := range p.Workers {
					expired += w.Expired + w.Revoked
					stale += w.Stale
				}
				if expired == 0 || stale == 0 {
					t.Fatalf("chaos without lost leases (%d) or stale reports (%d)", expired, stale)
				}
				combined, repeats := ledger.Combined()
				combinedAll, repeatsAll, lostAll = combinedAll+combined, repeatsAll+repeats, lostAll+int(flaky.Lost())
				if len(snaps) == 0 {
					t.Fatal("no snapshot")
				}
				t.Logf("%d snapshots, %d lost leases, %d stale reports, %d combined calls (%d repeats), %d answers lost, %v virtual time",
					len(snaps), expired, stale, combined, repeats, flaky.Lost(), time.Since(t0bubble))
				for i, sp := range snaps {
					cfg2 := cfg
					cfg2.Incarnation = 100 + uint64(i)
					d2, err := shard.New(cfg2)
					if err != nil {
						t.Fatal(err)
					}
					if err := d2.Restore(sp.bytes); err != nil {
						t.Fatal(err)
					}
					flaky2 := shardtest.NewFlaky(sp.ledger.Wrap(d2))
					flaky2.SetRandomFaults(seed+uint64(i)+10, 0.02, 0.03)
					chaosWorkers(t, flaky2, data, 3, seed+uint64(i)+10, ttl, i%2 == 0)
					p2 := d2.Progress()
					if err := sp.ledger.Check(p2); err != nil {
						t.Fatalf("restore %d: %v", i, err)
					}
					for e := range p.EpochRecords {
						if p2.EpochRecords[e] != p.EpochRecords[e] {
							t.Fatalf("restore %d epoch %d: %+v vs %+v", i, e, p2.EpochRecords[e], p.EpochRecords[e])
						}
					}
				}
			})
		})
	}
}
