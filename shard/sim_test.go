package shard_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardtest"
)

// simWorker is one worker of the deterministic simulation.
type simWorker struct {
	name    string
	alive   bool
	lease   *shard.Lease
	pos     int64         // trained through (may be ahead of what was reported)
	zombies []shard.Lease // leases it held when it crashed
	// unanswered is a combined call whose answer was lost: the worker retries it before
	// anything else.
	unanswered *lostCall
}

// lostCall is a ReportAndAcquire whose answer the worker never saw, with that answer.
type lostCall struct {
	lease   shard.Lease
	granted shard.Lease // what the call granted (ID.Seq 0: nothing)
}

// simRun drives a dispatcher with workers that train, report, crash, stall, come back as
// zombies, leave and get evicted, in an order drawn from rng. It stops when the dispatcher has
// no more work or after maxSteps. snap, when not nil, is called at random steps.
type simRun struct {
	t       *testing.T
	rng     *rand.Rand
	d       *shard.Dispatcher
	svc     shard.Service // d wrapped by the ledger
	clock   *shardtest.Clock
	ttl     time.Duration
	workers []*simWorker
	stream  *simStream
	snap    func(step int)

	stale, accepted, zombieRejected int
	// combined calls: made, answers lost, repeats that returned the lease the lost call had
	// granted, repeats that had to acquire afresh
	combined, lost, sameLease, freshLease int
}

// simStream grows a stream dataset while the simulation runs.
type simStream struct {
	ends   []int64
	limit  int64
	sealed bool
}

func (r *simRun) step(step int) {
	ctx := context.Background()
	w := r.workers[r.rng.IntN(len(r.workers))]
	switch x := r.rng.IntN(100); {
	case x < 45: // train a little and report
		if w.alive && w.unanswered != nil {
			r.retryCombined(w)
			return
		}
		if !w.alive || w.lease == nil {
			r.acquire(w)
			return
		}
		n := w.lease.Shard.Records
		w.pos = min(n, w.pos+1+r.rng.Int64N(max(n/3, 1)))
		if w.pos == n && r.rng.IntN(3) > 0 {
			r.finishCombined(w, *w.lease)
			return
		}
		err := r.svc.Report(ctx, w.name, w.lease.ID, w.pos, w.pos == n && r.rng.IntN(2) == 0)
		switch {
		case err == nil:
			r.accepted++
			if w.pos == n {
				w.lease = nil
			}
		case errors.Is(err, shard.ErrStaleLease):
			r.stale++
			w.lease = nil
		default:
			r.t.Fatalf("report: %v", err)
		}
	case x < 60:
		if w.alive && w.unanswered != nil {
			r.retryCombined(w)
		} else if w.alive && w.lease == nil {
			r.acquire(w)
		} else if !w.alive {
			w.alive = true // back from a crash, same name
			r.acquire(w)
		}
	case x < 66: // crash: the lease is kept as a zombie for later, a lost answer forgotten
		if w.alive {
			if w.lease != nil {
				w.zombies = append(w.zombies, *w.lease)
			}
			w.alive, w.lease, w.unanswered = false, nil, nil
		}
	case x < 72: // a zombie reports progress it made after its lease was lost
		if len(w.zombies) == 0 {
			return
		}
		z := w.zombies[r.rng.IntN(len(w.zombies))]
		off := min(z.Shard.Records, z.Offset+1+r.rng.Int64N(z.Shard.Records))
		var err error
		if off == z.Shard.Records && r.rng.IntN(2) == 0 {
			// Accepted if the worker, back under its name, still holds the lease: then the
			// lease it gets is one it does not know, left to expire or be revoked.
			_, err = r.svc.(shard.ReportAcquirer).ReportAndAcquire(ctx, w.name, z.ID, off)
			if errors.Is(err, shard.ErrWait) || errors.Is(err, shard.ErrNoMoreWork) {
				err = nil
			}
		} else {
			err = r.svc.Report(ctx, w.name, z.ID, off, false)
		}
		if errors.Is(err, shard.ErrStaleLease) {
			r.zombieRejected++
		} else if err != nil && !errors.Is(err, shard.ErrBadOffset) {
			r.t.Fatalf("zombie report: %v", err)
		}
	case x < 85: // time passes
		r.clock.Advance(time.Duration(r.rng.Int64N(int64(r.ttl / 3))))
	case x < 87: // a stall past the lease
		r.clock.Advance(r.ttl + time.Duration(r.rng.Int64N(int64(r.ttl))))
	case x < 89:
		r.d.Evict(w.name)
		if w.lease != nil {
			w.zombies = append(w.zombies, *w.lease)
		}
		w.lease = nil
	case x < 91:
		if err := r.svc.Leave(ctx, w.name); err != nil {
			r.t.Fatal(err)
		}
		if w.lease != nil {
			w.zombies = append(w.zombies, *w.lease)
		}
		w.lease = nil
	case x < 94:
		r.d.Expire()
	case x < 97:
		if r.stream != nil && !r.stream.sealed {
			p := r.rng.IntN(len(r.stream.ends))
			r.stream.ends[p] = min(r.stream.limit, r.stream.ends[p]+r.rng.Int64N(40))
			if err := r.d.GrowStream(p, r.stream.ends[p]); err != nil {
				r.t.Fatal(err)
			}
			if r.rng.IntN(4) == 0 {
				if err := r.d.FlushStream(); err != nil {
					r.t.Fatal(err)
				}
			}
		}
	default:
		if r.snap != nil {
			r.snap(step)
		}
	}
}

// finishCombined reports l done and acquires with the combined call; now and then the answer is
// lost, and the worker retries later.
func (r *simRun) finishCombined(w *simWorker, l shard.Lease) {
	r.combined++
	next, err := r.svc.(shard.ReportAcquirer).ReportAndAcquire(context.Background(), w.name, l.ID, l.Shard.Records)
	if r.rng.IntN(4) == 0 {
		if err != nil && !errors.Is(err, shard.ErrWait) && !errors.Is(err, shard.ErrNoMoreWork) && !errors.Is(err, shard.ErrStaleLease) {
			r.t.Fatalf("combined call: %v", err)
		}
		r.lost++
		lc := &lostCall{lease: l}
		if err == nil {
			lc.granted = next
		}
		w.lease, w.unanswered = nil, lc
		return
	}
	r.combinedAnswer(w, next, err)
}

// retryCombined repeats the combined call whose answer was lost. If the lost call granted a
// lease, the repeat returns it, unless it has ended since.
func (r *simRun) retryCombined(w *simWorker) {
	lc := w.unanswered
	w.unanswered = nil
	next, err := r.svc.(shard.ReportAcquirer).ReportAndAcquire(context.Background(), w.name, lc.lease.ID, lc.lease.Shard.Records)
	if lc.granted.ID.Seq != 0 && err == nil {
		if next.ID == lc.granted.ID {
			r.sameLease++
		} else {
			// Only if the lease the lost call granted has ended since (a report on it is stale).
			if err := r.d.Report(context.Background(), w.name, lc.granted.ID, 0, false); !errors.Is(err, shard.ErrStaleLease) {
				r.t.Fatalf("a repeat granted %v while the worker still holds %v, which the lost call granted (%v)", next.ID, lc.granted.ID, err)
			}
			r.freshLease++
		}
	}
	if r.rng.IntN(4) == 0 { // lost again
		r.lost++
		if err == nil {
			lc.granted = next
		}
		w.unanswered = lc
		return
	}
	r.combinedAnswer(w, next, err)
}

func (r *simRun) combinedAnswer(w *simWorker, next shard.Lease, err error) {
	switch {
	case err == nil:
		r.accepted++
		w.lease, w.pos = &next, next.Offset
	case errors.Is(err, shard.ErrWait), errors.Is(err, shard.ErrNoMoreWork):
		r.accepted++
		w.lease = nil
	case errors.Is(err, shard.ErrStaleLease):
		r.stale++
		w.lease = nil
	default:
		r.t.Fatalf("combined call: %v", err)
	}
}

func (r *simRun) acquire(w *simWorker) {
	l, err := r.svc.Acquire(context.Background(), w.name)
	switch {
	case err == nil:
		w.lease, w.pos = &l, l.Offset
	case errors.Is(err, shard.ErrWait), errors.Is(err, shard.ErrNoMoreWork):
	default:
		r.t.Fatalf("acquire: %v", err)
	}
}

// run steps until the dispatcher is finished. Past maxSteps the chaos stops and workers simply
// drain the remaining work.
func (r *simRun) run(maxSteps int) {
	for step := 0; step < maxSteps && !r.d.Progress().Finished; step++ {
		r.step(step)
	}
	if r.stream != nil && !r.stream.sealed {
		for p := range r.stream.ends {
			if err := r.d.GrowStream(p, r.stream.limit); err != nil {
				r.t.Fatal(err)
			}
		}
		if err := r.d.SealStream(); err != nil {
			r.t.Fatal(err)
		}
		r.stream.sealed = true
	}
	ctx := context.Background()
	for guard := 0; !r.d.Progress().Finished; guard++ {
		if guard > 1_000_000 {
			r.t.Fatal("drain does not finish")
		}
		w := r.workers[guard%len(r.workers)]
		w.alive = true
		if w.unanswered != nil {
			r.retryCombined(w)
			continue
		}
		if w.lease == nil {
			r.acquire(w)
			if w.lease == nil {
				r.clock.Advance(r.ttl / 4) // everything left is leased to crashed workers
				continue
			}
		}
		if guard%2 == 0 {
			r.finishCombined(w, *w.lease)
			continue
		}
		err := r.svc.Report(ctx, w.name, w.lease.ID, w.lease.Shard.Records, true)
		if err != nil && !errors.Is(err, shard.ErrStaleLease) {
			r.t.Fatal(err)
		}
		w.lease = nil
	}
}

func newSimWorkers(n int) []*simWorker {
	ws := make([]*simWorker, n)
	for i := range ws {
		ws[i] = &simWorker{name: fmt.Sprintf("w%02d", i), alive: true}
	}
	return ws
}

type snapPoint struct {
	step   int
	bytes  []byte
	ledger *shardtest.Ledger
}

// TestExactlyOnceSimulation is the invariant test in a single goroutine: seeded, so any failure
// replays. It checks exactly-once training over several epochs, then restores every snapshot
// taken along the way into a new dispatcher instance and checks the continuation too.
func TestExactlyOnceSimulation(t *testing.T) {
	cases := []struct {
		name        string
		cfg         shard.Config
		stream      bool
		maxFailures int
	}{
		{name: "indexed-shuffled", cfg: shard.Config{Dataset: shard.IndexedDataset(3000), ShardSize: 97, Epochs: 3, Shuffle: true, ShuffleRecords: true, MaxFailures: 1000, MaxLeasesPerWorker: 2}},
		{name: "indexed-failures", cfg: shard.Config{Dataset: shard.IndexedDataset(2000), ShardSize: 50, Epochs: 2, Shuffle: true, MaxFailures: 2}},
		{name: "stream", cfg: shard.Config{Dataset: shard.StreamDataset(3), ShardSize: 64, MaxFailures: 1000}, stream: true},
		{name: "text", cfg: shard.Config{Dataset: shard.TextDataset(fakeTextShards(40, 33)), Epochs: 2, ShuffleRecords: true, MaxFailures: 1000}},
	}
	// The combined call's figures over every run: calls, answers lost, repeats the ledger saw,
	// repeats that returned the lease the lost call had granted, and repeats that acquired
	// afresh because that lease had ended.
	var total struct{ combined, lost, repeats, sameLease, freshLease int }
	defer func() {
		t.Logf("combined calls %+v", total)
		if !t.Failed() && (total.combined == 0 || total.lost == 0 || total.repeats == 0 || total.sameLease == 0 || total.freshLease == 0) {
			t.Errorf("the combined call was not exercised: %+v", total)
		}
	}()
	for ci, tc := range cases {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("%s/seed%d", tc.name, seed), func(t *testing.T) {
				cfg := tc.cfg
				cfg.Seed = seed
				cfg.LeaseTTL = 10 * time.Second
				cfg.Incarnation = 100 + seed
				d, clock := newDispatcher(t, cfg)
				ledger := shardtest.NewLedger()
				rng := rand.New(rand.NewPCG(seed, uint64(ci)))
				var snaps []snapPoint
				r := &simRun{t: t, rng: rng, d: d, svc: ledger.Wrap(d), clock: clock, ttl: cfg.LeaseTTL, workers: newSimWorkers(9)}
				if tc.stream {
					r.stream = &simStream{ends: make([]int64, 3), limit: 1500}
				}
				r.snap = func(step int) {
					if len(snaps) < 8 {
						b, l := ledger.Snapshot(d)
						snaps = append(snaps, snapPoint{step: step, bytes: b, ledger: l})
					}
				}
				r.run(6000)
				final := d.Progress()
				if err := ledger.Check(final); err != nil {
					t.Fatal(err)
				}
				if !final.Finished {
					t.Fatal("not finished")
				}
				if r.zombieRejected == 0 || r.stale == 0 {
					t.Fatalf("the chaos did not exercise fencing: %d zombie reports rejected, %d stale", r.zombieRejected, r.stale)
				}
				_, repeats := ledger.Combined()
				total.combined += r.combined
				total.lost += r.lost
				total.repeats += repeats
				total.sameLease += r.sameLease
				total.freshLease += r.freshLease
				if len(snaps) == 0 {
					t.Fatal("no snapshot taken")
				}
				var failedTotal int64
				for _, e := range final.EpochRecords {
					failedTotal += e.Failed
				}
				for i, sp := range snaps {
					cfg2 := cfg
					cfg2.Incarnation = 1000 + uint64(i)
					d2, clock2 := newDispatcher(t, cfg2)
					if err := d2.Restore(sp.bytes); err != nil {
						t.Fatalf("restore snapshot %d: %v", i, err)
					}
					// Nobody holds anything after a restore, and leases of the old run are stale.
					p2 := d2.Progress()
					if p2.Shards.Doing != 0 {
						t.Fatalf("restored with %d DOING", p2.Shards.Doing)
					}
					if err := sp.ledger.Check(p2); err != nil {
						t.Fatalf("snapshot %d: %v", i, err)
					}
					for _, w := range r.workers {
						for _, z := range w.zombies {
							if err := d2.Report(context.Background(), w.name, z.ID, z.Shard.Records, true); !errors.Is(err, shard.ErrStaleLease) {
								t.Fatalf("lease of the old incarnation accepted after restore: %v", err)
							}
							if _, err := d2.ReportAndAcquire(context.Background(), w.name, z.ID, z.Shard.Records); !errors.Is(err, shard.ErrStaleLease) {
								t.Fatalf("combined call on a lease of the old incarnation accepted after restore: %v", err)
							}
						}
					}
					r2 := &simRun{t: t, rng: rand.New(rand.NewPCG(seed, 1000+uint64(i))), d: d2, svc: sp.ledger.Wrap(d2), clock: clock2, ttl: cfg.LeaseTTL, workers: newSimWorkers(5)}
					if tc.stream {
						r2.stream = &simStream{ends: streamEnds(p2), limit: 1500, sealed: p2.Sealed}
					}
					r2.run(2000)
					p3 := d2.Progress()
					if err := sp.ledger.Check(p3); err != nil {
						t.Fatalf("after restoring snapshot %d (step %d): %v", i, sp.step, err)
					}
					if failedTotal == 0 {
						// Without failures both runs train everything once: the continuation
						// replays exactly what the first run trained after the snapshot.
						for e := range final.EpochRecords {
							if p3.EpochRecords[e] != final.EpochRecords[e] {
								t.Fatalf("epoch %d: restored run %+v, first run %+v", e, p3.EpochRecords[e], final.EpochRecords[e])
							}
						}
					}
				}
			})
		}
	}
}

// streamEnds returns the partition ends a restored stream continues to grow from.
func streamEnds(p shard.Progress) []int64 {
	ends := make([]int64, len(p.Partitions))
	for i, pp := range p.Partitions {
		ends[i] = pp.End
	}
	return ends
}

// fakeTextShards returns a text shard table without files: the dispatcher never reads files.
func fakeTextShards(n int, records int64) []shard.Shard {
	out := make([]shard.Shard, n)
	for i := range out {
		out[i] = shard.Shard{Kind: shard.KindText, File: fmt.Sprintf("part-%d.tsv", i/7), Start: int64(i%7) * records * 10, End: int64(i%7+1) * records * 10, Records: records - int64(i%3), Line: int64(i%7)*records + 1}
	}
	return out
}
