package shard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardtest"
)

func TestReportAndAcquire(t *testing.T) {
	ctx := context.Background()
	d, clock := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 10, LeaseTTL: 10 * time.Second})
	a := mustAcquire(t, d, "w")
	require.NoError(t, d.Report(ctx, "w", a.ID, 4, false))

	// A report the dispatcher rejects makes the whole call a no-op: no lease is granted.
	_, err := d.ReportAndAcquire(ctx, "w", a.ID, 9)
	assert.ErrorIs(t, err, shard.ErrBadOffset)
	_, err = d.ReportAndAcquire(ctx, "other", a.ID, 10)
	assert.ErrorIs(t, err, shard.ErrStaleLease)
	_, err = d.ReportAndAcquire(ctx, "", a.ID, 10)
	assert.ErrorIs(t, err, shard.ErrBadWorker)
	p := d.Progress()
	require.Equal(t, uint64(1), p.Leases)
	require.Equal(t, int64(4), p.EpochRecords[0].Done)

	// Accepted: the shard is done and the next lease comes with the answer.
	b, err := d.ReportAndAcquire(ctx, "w", a.ID, 10)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), b.ID.Seq)
	assert.NotEqual(t, a.Shard.Index, b.Shard.Index)
	p = d.Progress()
	assert.Equal(t, int64(10), p.EpochRecords[0].Done)
	assert.Equal(t, 1, p.Shards.Done)
	assert.Equal(t, 1, p.Shards.Doing)

	// The answer was lost: the repeat counts nothing and returns the same lease, renewed.
	clock.Advance(8 * time.Second)
	again, err := d.ReportAndAcquire(ctx, "w", a.ID, 10)
	require.NoError(t, err)
	assert.Equal(t, b, again)
	clock.Advance(8 * time.Second) // 16s after the grant, 8s after the repeat
	require.NoError(t, d.Report(ctx, "w", b.ID, 1, false), "the repeat renewed the lease")
	_, err = d.ReportAndAcquire(ctx, "w", a.ID, 9)
	assert.ErrorIs(t, err, shard.ErrBadOffset, "a repeat must carry the record count")
	p = d.Progress()
	assert.Equal(t, uint64(2), p.Leases)
	assert.Equal(t, int64(11), p.EpochRecords[0].Done)

	// Once the lease the first call granted is gone, a repeat acquires afresh.
	clock.Advance(11 * time.Second)
	c, err := d.ReportAndAcquire(ctx, "w", a.ID, 10)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), c.ID.Seq)
	assert.Equal(t, b.Shard.Index, c.Shard.Index, "the expired shard comes back first")
	assert.Equal(t, int64(1), c.Offset)
	_, err = d.ReportAndAcquire(ctx, "w", a.ID, 10)
	require.NoError(t, err)
	require.Equal(t, uint64(3), d.Progress().Leases, "and repeats after that return that lease")

	// A shard finished by a plain Report moves the memory on: a's repeat is stale now, and a
	// combined call on the newly finished lease only acquires.
	require.NoError(t, d.Report(ctx, "w", c.ID, 10, true))
	_, err = d.ReportAndAcquire(ctx, "w", a.ID, 10)
	assert.ErrorIs(t, err, shard.ErrStaleLease)
	e, err := d.ReportAndAcquire(ctx, "w", c.ID, 10)
	require.NoError(t, err)
	assert.Equal(t, uint64(4), e.ID.Seq)
	p = d.Progress()
	assert.Equal(t, int64(20), p.EpochRecords[0].Done)
	assert.Equal(t, 1, p.Shards.Doing)
	require.Len(t, p.Workers, 1)
	assert.Equal(t, 1, p.Workers[0].Expired)
	assert.Equal(t, 0, p.Workers[0].Revoked)

	// Leaving forgets the worker and its memory.
	require.NoError(t, d.Leave(ctx, "w"))
	_, err = d.ReportAndAcquire(ctx, "w", c.ID, 10)
	assert.ErrorIs(t, err, shard.ErrStaleLease)
}

// After an accepted report the acquire part may find no shard: the error says so, and the
// report stays accepted.
func TestReportAndAcquireWithoutNextShard(t *testing.T) {
	ctx := context.Background()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(20), ShardSize: 10, Epochs: 2, RetryAfter: 2 * time.Second})
	a := mustAcquire(t, d, "a")
	b := mustAcquire(t, d, "b")

	_, err := d.ReportAndAcquire(ctx, "a", a.ID, 10)
	var we *shard.WaitError
	require.ErrorAs(t, err, &we)
	assert.Equal(t, 2*time.Second, we.RetryAfter)
	assert.Equal(t, int64(10), d.Progress().EpochRecords[0].Done)
	_, err = d.ReportAndAcquire(ctx, "a", a.ID, 10) // a repeat: still nothing to hand out
	require.ErrorIs(t, err, shard.ErrWait)

	// b finishes the epoch: its combined call leases the first shard of the next one.
	next, err := d.ReportAndAcquire(ctx, "b", b.ID, 10)
	require.NoError(t, err)
	assert.Equal(t, 1, next.Epoch)
	p := d.Progress()
	assert.Equal(t, int64(20), p.EpochRecords[0].Done)
	assert.Equal(t, 1, p.Epoch)

	// a's repeat now finds that shard's sibling: nothing was granted by the call that waited.
	other, err := d.ReportAndAcquire(ctx, "a", a.ID, 10)
	require.NoError(t, err)
	assert.Equal(t, 1, other.Epoch)
	assert.NotEqual(t, next.Shard.Index, other.Shard.Index)

	_, err = d.ReportAndAcquire(ctx, "b", next.ID, 10)
	require.ErrorIs(t, err, shard.ErrWait)
	_, err = d.ReportAndAcquire(ctx, "a", other.ID, 10)
	require.ErrorIs(t, err, shard.ErrNoMoreWork)
	_, err = d.ReportAndAcquire(ctx, "a", other.ID, 10)
	require.ErrorIs(t, err, shard.ErrNoMoreWork, "a repeat after the end")
	p = d.Progress()
	assert.True(t, p.Finished)
	assert.Equal(t, int64(20), p.EpochRecords[1].Done)
}

// The acquire part obeys the lease limit like Acquire, but the report part frees a slot first:
// a worker at its limit that finishes a shard with the combined call loses nothing.
func TestReportAndAcquireAtLeaseLimit(t *testing.T) {
	ctx := context.Background()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 10, MaxLeasesPerWorker: 2})
	a := mustAcquire(t, d, "w")
	mustAcquire(t, d, "w")
	_, err := d.ReportAndAcquire(ctx, "w", a.ID, 10)
	require.NoError(t, err)
	p := d.Progress()
	require.Len(t, p.Workers, 1)
	assert.Equal(t, 2, p.Workers[0].Leases)
	assert.Equal(t, 0, p.Workers[0].Revoked)
}

// TestReportAndAcquireMatchesTwoCalls is a differential check: a random sequence of calls made
// on two dispatchers, one finishing shards with ReportAndAcquire and the other with
// Report(done) and then Acquire when the report is accepted, gives the same answers and the
// same progress (repeats, which differ on purpose, are left out).
func TestReportAndAcquireMatchesTwoCalls(t *testing.T) {
	ctx := context.Background()
	outcomes := map[string]int{} // "call: error class" over every seed
	reportOK := func(err error) bool {
		return err == nil || errors.Is(err, shard.ErrWait) || errors.Is(err, shard.ErrNoMoreWork)
	}
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			cfg := shard.Config{Dataset: shard.IndexedDataset(700), ShardSize: 30, Epochs: 2, Shuffle: true, Seed: seed,
				LeaseTTL: 10 * time.Second, MaxFailures: 3, MaxLeasesPerWorker: 2}
			one, clockOne := newDispatcher(t, cfg)
			two, clockTwo := newDispatcher(t, cfg)
			rng := rand.New(rand.NewPCG(seed, 7))
			workers := []string{"a", "b", "c", "d"}
			var leases []shard.Lease // every lease granted, any worker
			mine := map[string][]shard.Lease{}
			finishedBy := map[shard.LeaseID]string{} // a combined call by that worker would be a repeat
			var last shard.Lease                     // the lease picked for the current step
			pick := func(w string) (shard.Lease, bool) {
				if own := mine[w]; len(own) > 0 && rng.IntN(5) > 0 {
					last = own[rng.IntN(len(own))]
					return last, true
				}
				if len(leases) == 0 {
					return shard.Lease{}, false
				}
				last = leases[rng.IntN(len(leases))]
				return last, true
			}
			same := func(what, w string, l1, l2 shard.Lease, e1, e2 error) {
				t.Helper()
				require.Equal(t, l1, l2, what)
				require.Equal(t, errClass(e1), errClass(e2), "%s: %v vs %v", what, e1, e2)
				outcomes[what+": "+errClass(e1)]++
				if errors.Is(e1, shard.ErrStaleLease) || what == "report and acquire" && reportOK(e1) {
					mine[w] = slices.DeleteFunc(mine[w], func(x shard.Lease) bool { return x.ID == last.ID })
				}
				if e1 == nil && l1.ID.Seq != 0 {
					leases = append(leases, l1)
					mine[w] = append(mine[w], l1)
				}
			}
			for step := 0; step < 3000 && !one.Progress().Finished; step++ {
				w := workers[rng.IntN(len(workers))]
				switch x := rng.IntN(100); {
				case x < 25:
					l1, e1 := one.Acquire(ctx, w)
					l2, e2 := two.Acquire(ctx, w)
					same("acquire", w, l1, l2, e1, e2)
				case x < 45:
					l, ok := pick(w)
					if !ok {
						continue
					}
					off := rng.Int64N(l.Shard.Records + 1)
					e1 := one.Report(ctx, w, l.ID, off, false)
					e2 := two.Report(ctx, w, l.ID, off, false)
					if e1 == nil && off == l.Shard.Records {
						finishedBy[l.ID] = w
					}
					same("report", w, shard.Lease{}, shard.Lease{}, e1, e2)
				case x < 90:
					l, ok := pick(w)
					if !ok || finishedBy[l.ID] == w {
						continue
					}
					off := l.Shard.Records
					if rng.IntN(10) == 0 {
						off-- // a bad offset now and then
					}
					l1, e1 := one.ReportAndAcquire(ctx, w, l.ID, off)
					var l2 shard.Lease
					e2 := two.Report(ctx, w, l.ID, off, true)
					if e2 == nil {
						l2, e2 = two.Acquire(ctx, w)
					}
					if reportOK(e1) {
						finishedBy[l.ID] = w
					}
					same("report and acquire", w, l1, l2, e1, e2)
				case x < 96:
					dt := time.Duration(rng.Int64N(int64(3 * time.Second)))
					clockOne.Advance(dt)
					clockTwo.Advance(dt)
				case x < 98:
					one.Evict(w)
					two.Evict(w)
				default:
					same("leave", w, shard.Lease{}, shard.Lease{}, one.Leave(ctx, w), two.Leave(ctx, w))
				}
			}
			p1, p2 := one.Progress(), two.Progress()
			require.Equal(t, p1, p2)
			require.True(t, p1.Finished)
		})
	}
	for _, class := range []string{"nil", shard.ErrWait.Error(), shard.ErrNoMoreWork.Error(), shard.ErrStaleLease.Error(), shard.ErrBadOffset.Error()} {
		assert.Positive(t, outcomes["report and acquire: "+class], "combined calls answered %s", class)
	}
	t.Log(outcomes)
}

// errClass names the sentinel an error matches, for comparing outcomes.
func errClass(err error) string {
	for _, s := range []error{shard.ErrNoMoreWork, shard.ErrWait, shard.ErrStaleLease, shard.ErrBadOffset, shard.ErrBadWorker} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	if err != nil {
		return "other: " + err.Error()
	}
	return "nil"
}

// A wrapper passes the combined call on only when what it wraps can make it.
func TestReportAndAcquireFunc(t *testing.T) {
	ctx := context.Background()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(20), ShardSize: 10})
	a := mustAcquire(t, d, "w")
	hidden := struct{ shard.Service }{d}
	_, err := shard.ReportAndAcquire(ctx, hidden, "w", a.ID, 10)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	require.Equal(t, int64(0), d.Progress().EpochRecords[0].Done, "nothing happened")
	flaky := shardtest.NewFlaky(hidden)
	_, err = flaky.ReportAndAcquire(ctx, "w", a.ID, 10)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	flaky.Swap(d)
	b, err := flaky.ReportAndAcquire(ctx, "w", a.ID, 10)
	require.NoError(t, err)
	require.Equal(t, uint64(2), b.ID.Seq)
}

// counting counts the calls a Reader makes; it passes the combined call on.
type counting struct {
	shard.Service
	acquires, reports, combined atomic.Int64
}

func (c *counting) Acquire(ctx context.Context, w string) (shard.Lease, error) {
	c.acquires.Add(1)
	return c.Service.Acquire(ctx, w)
}

func (c *counting) Report(ctx context.Context, w string, id shard.LeaseID, off int64, done bool) error {
	c.reports.Add(1)
	return c.Service.Report(ctx, w, id, off, done)
}

func (c *counting) ReportAndAcquire(ctx context.Context, w string, id shard.LeaseID, off int64) (shard.Lease, error) {
	c.combined.Add(1)
	return shard.ReportAndAcquire(ctx, c.Service, w, id, off)
}

func (c *counting) counts() [3]int64 {
	return [3]int64{c.acquires.Load(), c.reports.Load(), c.combined.Load()}
}

// A reader that trains each batch before asking for the next finishes every shard with the
// combined call: one Acquire for the whole job, one call per shard boundary.
func TestReaderCombinedCall(t *testing.T) {
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(1000), ShardSize: 100, Epochs: 2, Shuffle: true})
	ledger := shardtest.NewLedger()
	svc := &counting{Service: ledger.Wrap(d)}
	r := newReader(t, shard.ReaderConfig{Service: svc, Worker: "w", Source: shard.IndexedSource{Data: labelled(1000)}, BatchSize: 40})
	require.Len(t, drain(t, r), 2000)
	p := d.Progress()
	require.NoError(t, ledger.Check(p))
	require.True(t, p.Finished)
	// 20 shards of 3 batches (40, 40, 20): 2 progress reports each, then the combined call;
	// the last one is answered ErrNoMoreWork, so the reader ends without asking again.
	assert.Equal(t, [3]int64{1, 40, 20}, svc.counts())
	st := r.Stats()
	assert.Equal(t, shard.ReaderStats{Leases: 20, Batches: 60, Records: 2000, Reported: 2000, Combined: 20}, st)
	calls, repeats := ledger.Combined()
	assert.Equal(t, [2]int{20, 0}, [2]int{calls, repeats})

	// The same reader on a Service without the combined call makes both calls.
	d, _ = newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(1000), ShardSize: 100})
	plain := &counting{Service: struct{ shard.Service }{d}}
	r = newReader(t, shard.ReaderConfig{Service: plain, Worker: "w", Source: shard.IndexedSource{Data: labelled(1000)}, BatchSize: 40})
	require.Len(t, drain(t, r), 1000)
	assert.Equal(t, [3]int64{11, 30, 1}, plain.counts(), "one combined call answered ErrUnsupported, then only reports and acquires")
	assert.Equal(t, int64(0), r.Stats().Combined)

	// And with SeparateCalls it does not try.
	d, _ = newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(1000), ShardSize: 100})
	svc = &counting{Service: d}
	r = newReader(t, shard.ReaderConfig{Service: svc, Worker: "w", Source: shard.IndexedSource{Data: labelled(1000)}, BatchSize: 40, SeparateCalls: true})
	require.Len(t, drain(t, r), 1000)
	assert.Equal(t, [3]int64{11, 30, 0}, svc.counts())
}

// The answers of combined calls are lost on the way back: the reader retries, the dispatcher
// recognises the repeats, and no shard is granted that the reader does not know about.
func TestReaderCombinedCallRetriesLostAnswers(t *testing.T) {
	ctx := context.Background()
	d, clock := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(600), ShardSize: 100, Epochs: 2, Shuffle: true, ShuffleRecords: true})
	ledger := shardtest.NewLedger()
	flaky := shardtest.NewFlaky(ledger.Wrap(d))
	r := newReader(t, shard.ReaderConfig{Service: flaky, Worker: "w", Source: shard.IndexedSource{Data: labelled(600)}, BatchSize: 50,
		Sleep: (&shardtest.Sleeper{Clock: clock}).Sleep})
	records := 0
	for {
		b, err := r.Next(ctx)
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		records += b.Len()
		if b.End == b.Shard.Records {
			flaky.LoseNext(2) // the combined call and its first retry lose their answers
		}
		require.NoError(t, r.Done(ctx, b))
	}
	require.Equal(t, 1200, records)
	p := d.Progress()
	require.NoError(t, ledger.Check(p))
	require.True(t, p.Finished)
	assert.Equal(t, uint64(12), p.Leases, "one lease per shard: no repeat granted another")
	require.Len(t, p.Workers, 1)
	assert.Equal(t, 0, p.Workers[0].Revoked+p.Workers[0].Expired+p.Workers[0].Stale)
	calls, repeats := ledger.Combined()
	assert.Equal(t, 36, calls)
	assert.Equal(t, 24, repeats)
	assert.Equal(t, 24, flaky.Lost())
	st := r.Stats()
	assert.Equal(t, int64(12), st.Combined)
	assert.Equal(t, int64(24), st.Retries)
	assert.Equal(t, int64(0), st.LostLeases)
}

// With MaxLeases 1, Next waits at the shard boundary until the last batch is done; that Done
// finishes the shard with the combined call and hands the next lease to the waiting Next.
func TestReaderCombinesForAWaitingNext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(20), ShardSize: 10})
		svc := &counting{Service: d}
		r := newReader(t, shard.ReaderConfig{Service: svc, Worker: "w", Source: shard.IndexedSource{Data: labelled(20)}, BatchSize: 10, MaxPending: 2, MaxLeases: 1})
		b1, err := r.Next(ctx)
		require.NoError(t, err)
		next := make(chan *shard.Batch)
		go func() {
			b, err := r.Next(ctx)
			assert.NoError(t, err)
			next <- b
		}()
		synctest.Wait() // Next waits for room
		require.Equal(t, [3]int64{1, 0, 0}, svc.counts())
		first := b1.Shard.Index
		require.NoError(t, r.Done(ctx, b1))
		b2 := <-next
		assert.NotEqual(t, first, b2.Shard.Index)
		assert.Equal(t, [3]int64{1, 0, 1}, svc.counts())
		require.NoError(t, r.Done(ctx, b2))
		_, err = r.Next(ctx)
		require.ErrorIs(t, err, io.EOF)
		assert.Equal(t, [3]int64{1, 0, 2}, svc.counts())
	})
}

// After an Acquire that ended without an answer the next lease comes from Acquire (which
// collects a late answer over the network); a finished shard whose final report failed is
// reported by the combined call once that is allowed again.
func TestReaderAfterAbandonedAcquire(t *testing.T) {
	ctx := context.Background()
	d, clock := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(400), ShardSize: 100})
	ledger := shardtest.NewLedger()
	flaky := shardtest.NewFlaky(ledger.Wrap(d))
	svc := &counting{Service: flaky}
	r := newReader(t, shard.ReaderConfig{Service: svc, Worker: "w", Source: shard.IndexedSource{Data: labelled(400)}, BatchSize: 100, MaxRetries: 1,
		Sleep: (&shardtest.Sleeper{Clock: clock}).Sleep})
	a, err := r.Next(ctx) // a whole shard
	require.NoError(t, err)
	flaky.SetDown(true)
	_, err = r.Next(ctx)
	require.ErrorIs(t, err, shardtest.ErrUnavailable)
	require.Error(t, r.Done(ctx, a), "the final report fails too") // plain: Next is not waiting
	flaky.SetDown(false)
	require.Equal(t, [3]int64{3, 2, 0}, svc.counts())

	b, err := r.Next(ctx) // Acquire, not the combined call: a's report waits
	require.NoError(t, err)
	assert.Equal(t, [3]int64{4, 2, 0}, svc.counts())
	assert.Equal(t, int64(0), d.Progress().EpochRecords[0].Done)
	require.NoError(t, r.Done(ctx, b)) // b is the shard Next reads: combined
	assert.Equal(t, [3]int64{4, 2, 1}, svc.counts())
	c, err := r.Next(ctx) // c came with b's report; a is reported before it is opened
	require.NoError(t, err)
	assert.Equal(t, [3]int64{4, 3, 1}, svc.counts())
	assert.Equal(t, int64(200), d.Progress().EpochRecords[0].Done)
	require.NoError(t, r.Done(ctx, c))
	require.Len(t, drain(t, r), 100)
	p := d.Progress()
	require.NoError(t, ledger.Check(p))
	require.True(t, p.Finished)
	assert.Equal(t, [3]int64{4, 3, 3}, svc.counts())
}
