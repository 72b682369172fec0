package shardnet_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardtest"
)

// TestReadersSurviveRestartAndPartition runs Readers on four hosts against a dispatcher served
// on a fifth, over an in-memory network. Midway the coordinator host crashes; a new process
// restores the last snapshot into a dispatcher of a new incarnation and serves it on the same
// address. Later one worker is cut off for longer than the lease TTL, then the partition heals.
// Throughout, readers finish shards with the combined call, and the answers of every fifth such
// call come after the client gave up (lost on the way back), so readers retry them. Every
// record is counted exactly once per epoch (a ledger of accepted reports, taken with the
// snapshot), nothing fails, no lease is orphaned (revoked for the lease limit), and the readers
// needed nothing but their own retries. Time is virtual (synctest), so the outage, the partition
// and the late answers cost no wall time.
func TestReadersSurviveRestartAndPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			records = 24000
			addr    = "coord:7070"
			ttl     = 5 * time.Second
		)
		nw := memnet.New(memnet.Config{})
		cfg := shard.Config{
			Dataset: shard.IndexedDataset(records), ShardSize: 200, Epochs: 2, Shuffle: true, Seed: 7,
			LeaseTTL: ttl, MaxFailures: 1000, RetryAfter: 50 * time.Millisecond, Incarnation: 1,
		}
		d1, err := shard.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ledger1 := shardtest.NewLedger()
		note := newNotifier()
		late := func(call int64) bool { return call%5 == 0 }
		slow1 := &lateAnswers{Service: ledger1.Wrap(d1), delay: time.Second, late: late}
		srv1 := serve(t, nw, "coord", addr, note.wrap(slow1))

		data := labelled(records)
		var total counters
		stats := make([]func() shard.ReaderStats, 4)
		var ready, wg sync.WaitGroup
		for w := range stats {
			name := fmt.Sprintf("w%d", w)
			ready.Add(1)
			wg.Go(func() {
				cli := newClient(t, nw, name, addr, 500*time.Millisecond)
				defer cli.Close()
				r, err := shard.NewReader(shard.ReaderConfig{
					Service: cli, Worker: name, Source: shard.IndexedSource{Data: data}, BatchSize: 40,
					Backoff: shard.Backoff{Initial: 20 * time.Millisecond, Max: 400 * time.Millisecond}, Seed: uint64(w),
				})
				if err != nil {
					t.Error(err)
					ready.Done()
					return
				}
				defer r.Close()
				stats[w] = r.Stats
				ready.Done()
				ctx := context.Background()
				for {
					b, err := r.Next(ctx)
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Error(name, err)
						return
					}
					time.Sleep(2 * time.Millisecond) // training
					if err := r.Done(ctx, b); err != nil {
						t.Error(name, err)
						return
					}
				}
				total.add(r.Stats())
			})
		}
		ready.Wait()

		// Phase 1: train, take a snapshot (with the ledger as of then), train some more.
		note.waitFor(t, "progress before the snapshot", func() bool { return ledger1.Counted(0) >= 6000 })
		snap, ledger2 := ledger1.Snapshot(d1)
		note.waitFor(t, "progress after the snapshot", func() bool { return ledger1.Counted(0) >= 9000 })

		// The coordinator crashes: connections reset, dials fail. Readers retry meanwhile.
		nw.Kill("coord")
		_ = srv1.stop() // the process is gone; its Serve ended with the listener or with Close
		retriesBefore := sumRetries(stats)
		time.Sleep(3 * time.Second)
		if sumRetries(stats) == retriesBefore {
			t.Fatal("no reader retried during the outage")
		}

		// A new process restores the snapshot into a new incarnation on the same address.
		nw.Restart("coord")
		cfg.Incarnation = 2
		d2, err := shard.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := d2.Restore(snap); err != nil {
			t.Fatal(err)
		}
		replayFrom := ledger2.Counted(0)
		slow2 := &lateAnswers{Service: ledger2.Wrap(d2), delay: time.Second, late: late}
		srv2 := serve(t, nw, "coord", addr, note.wrap(slow2))
		note.waitFor(t, "progress after the restart", func() bool { return ledger2.Counted(0) >= replayFrom+6000 })

		// One worker is cut off for longer than its leases live; others take its shards over.
		nw.Partition("w1", "coord")
		w1Retries := stats[1]().Retries
		time.Sleep(2 * ttl)
		if stats[1]().Retries == w1Retries {
			t.Fatal("w1 did not retry during its partition")
		}
		nw.Heal("w1", "coord")

		wg.Wait()
		if err := srv2.stop(); err != nil {
			t.Fatalf("serve: %v", err)
		}
		p := d2.Progress()
		if err := ledger2.Check(p); err != nil {
			t.Fatal(err)
		}
		if !p.Finished || len(p.Failed) != 0 || len(p.EpochRecords) != 2 {
			t.Fatalf("finished %t, %d failed shards, %d epochs", p.Finished, len(p.Failed), len(p.EpochRecords))
		}
		for _, e := range p.EpochRecords {
			if e.Done != records || ledger2.Counted(e.Epoch) != records {
				t.Fatalf("epoch %d: %d done, %d counted of %d", e.Epoch, e.Done, ledger2.Counted(e.Epoch), records)
			}
		}
		var expired, revoked int
		for _, w := range p.Workers {
			expired += w.Expired
			revoked += w.Revoked
		}
		if expired == 0 || total.LostLeases == 0 || total.Retries == 0 {
			t.Fatalf("expired leases %d, lost leases %d, retries %d: the faults did not bite", expired, total.LostLeases, total.Retries)
		}
		combined, repeats := ledger2.Combined()
		held := slow1.held.Load() + slow2.held.Load()
		if total.Combined == 0 || repeats == 0 || held == 0 {
			t.Fatalf("combined calls %d (%d by the readers), repeats %d, answers held back %d: the combined call was not exercised", combined, total.Combined, repeats, held)
		}
		if revoked != 0 {
			t.Fatalf("%d leases revoked for the lease limit: a retry left a lease behind", revoked)
		}
		if total.Records < 2*records {
			t.Fatalf("readers handed out %d records, fewer than the %d counted", total.Records, 2*records)
		}
		t.Logf("%d records handed out for %d, %d leases (%d lost, %d by the combined call), %d retries, %d leases expired on the new dispatcher, %d answers held back, %d repeats",
			total.Records, 2*records, total.Leases, total.LostLeases, total.Combined, total.Retries, expired, held, repeats)
	})
}

func sumRetries(stats []func() shard.ReaderStats) int64 {
	var n int64
	for _, s := range stats {
		n += s().Retries
	}
	return n
}
