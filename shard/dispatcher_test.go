package shard_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardtest"
)

var t0 = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

func newDispatcher(t testing.TB, cfg shard.Config) (*shard.Dispatcher, *shardtest.Clock) {
	t.Helper()
	clock := shardtest.NewClock(t0)
	if cfg.Clock == nil {
		cfg.Clock = clock
	}
	if cfg.Incarnation == 0 {
		cfg.Incarnation = 1
	}
	d, err := shard.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return d, clock
}

func mustAcquire(t testing.TB, d shard.Service, worker string) shard.Lease {
	t.Helper()
	l, err := d.Acquire(context.Background(), worker)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", worker, err)
	}
	return l
}

func TestAcquireReportDone(t *testing.T) {
	ctx := context.Background()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(25), ShardSize: 10})
	var got []shard.Shard
	for {
		l, err := d.Acquire(ctx, "w")
		if errors.Is(err, shard.ErrNoMoreWork) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if l.Offset != 0 || l.Epoch != 0 || l.TTL != 30*time.Second {
			t.Fatalf("lease %+v", l)
		}
		if err := d.Report(ctx, "w", l.ID, l.Shard.Records/2, false); err != nil {
			t.Fatal(err)
		}
		if err := d.Report(ctx, "w", l.ID, l.Shard.Records, true); err != nil {
			t.Fatal(err)
		}
		// The shard is done: the lease is over.
		if err := d.Report(ctx, "w", l.ID, l.Shard.Records, true); !errors.Is(err, shard.ErrStaleLease) {
			t.Fatalf("report after done: %v", err)
		}
		got = append(got, l.Shard)
	}
	want := [][2]int64{{0, 10}, {10, 20}, {20, 25}}
	if len(got) != len(want) {
		t.Fatalf("got %d shards", len(got))
	}
	for i, s := range got {
		if s.Start != want[i][0] || s.End != want[i][1] || s.Records != want[i][1]-want[i][0] || s.Index != i || s.Base != s.Start {
			t.Errorf("shard %d = %+v", i, s)
		}
	}
	p := d.Progress()
	if !p.Finished || p.EpochRecords[0].Done != 25 || p.Shards.Done != 3 {
		t.Fatalf("progress %+v", p)
	}
	if len(p.Workers) != 1 || p.Workers[0].Records != 25 {
		t.Fatalf("workers %+v", p.Workers)
	}
}

func TestReportFencing(t *testing.T) {
	ctx := context.Background()
	d, clock := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 100, LeaseTTL: 10 * time.Second, MaxFailures: 10})
	a := mustAcquire(t, d, "a")
	if err := d.Report(ctx, "a", a.ID, 10, false); err != nil {
		t.Fatal(err)
	}
	// Another worker cannot report on a's lease.
	if err := d.Report(ctx, "b", a.ID, 20, false); !errors.Is(err, shard.ErrStaleLease) {
		t.Fatalf("foreign report: %v", err)
	}
	// Bad offsets are rejected and keep the lease.
	for _, c := range []struct {
		off  int64
		done bool
	}{{-1, false}, {101, false}, {50, true}} {
		if err := d.Report(ctx, "a", a.ID, c.off, c.done); !errors.Is(err, shard.ErrBadOffset) {
			t.Fatalf("offset %d done %t: %v", c.off, c.done, err)
		}
	}
	// A lower offset is a no-op that renews the lease.
	clock.Advance(9 * time.Second)
	if err := d.Report(ctx, "a", a.ID, 5, false); err != nil {
		t.Fatal(err)
	}
	clock.Advance(9 * time.Second) // 18s after the grant, 9s after the renewal
	if err := d.Report(ctx, "a", a.ID, 30, false); err != nil {
		t.Fatalf("renewed lease: %v", err)
	}
	// Let it expire: the shard goes back at offset 30.
	clock.Advance(10 * time.Second)
	b := mustAcquire(t, d, "b")
	if b.Shard.Index != a.Shard.Index || b.Offset != 30 || b.ID.Seq <= a.ID.Seq {
		t.Fatalf("re-lease %+v after %+v", b, a)
	}
	// The zombie is fenced off, even at an offset the new holder has not reached.
	if err := d.Report(ctx, "a", a.ID, 60, false); !errors.Is(err, shard.ErrStaleLease) {
		t.Fatalf("zombie report: %v", err)
	}
	// Same seq from another incarnation is stale too.
	forged := b.ID
	forged.Incarnation++
	if err := d.Report(ctx, "b", forged, 60, false); !errors.Is(err, shard.ErrStaleLease) {
		t.Fatalf("foreign incarnation: %v", err)
	}
	forged = b.ID
	forged.Shard = 7
	if err := d.Report(ctx, "b", forged, 60, false); !errors.Is(err, shard.ErrStaleLease) {
		t.Fatalf("out of range shard: %v", err)
	}
	if err := d.Report(ctx, "b", b.ID, 100, true); err != nil {
		t.Fatal(err)
	}
	p := d.Progress()
	if p.EpochRecords[0].Done != 100 || !p.Finished {
		t.Fatalf("progress %+v", p)
	}
	for _, w := range p.Workers {
		switch w.Worker {
		case "a":
			if w.Records != 30 || w.Expired != 1 || w.Stale != 1 {
				t.Errorf("a: %+v", w)
			}
		case "b":
			if w.Records != 70 || w.Stale != 2 {
				t.Errorf("b: %+v", w)
			}
		}
	}
}

func TestBadWorker(t *testing.T) {
	ctx := context.Background()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(10)})
	if _, err := d.Acquire(ctx, ""); !errors.Is(err, shard.ErrBadWorker) {
		t.Fatal(err)
	}
	if err := d.Report(ctx, strings.Repeat("x", shard.MaxWorkerName+1), shard.LeaseID{}, 0, false); !errors.Is(err, shard.ErrBadWorker) {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := d.Acquire(cctx, "w"); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

func TestLeaseLimitRevokesOldest(t *testing.T) {
	ctx := context.Background()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(40), ShardSize: 10, MaxLeasesPerWorker: 2})
	l1 := mustAcquire(t, d, "w")
	l2 := mustAcquire(t, d, "w")
	if err := d.Report(ctx, "w", l1.ID, 4, false); err != nil {
		t.Fatal(err)
	}
	// A third Acquire (the worker restarted and forgot) revokes l1; it comes back first.
	l3 := mustAcquire(t, d, "w")
	if l3.Shard.Index != l1.Shard.Index || l3.Offset != 4 {
		t.Fatalf("l3 %+v, want shard %d at 4", l3, l1.Shard.Index)
	}
	if err := d.Report(ctx, "w", l1.ID, 5, false); !errors.Is(err, shard.ErrStaleLease) {
		t.Fatalf("revoked lease: %v", err)
	}
	if err := d.Report(ctx, "w", l2.ID, 5, false); err != nil {
		t.Fatalf("l2 still held: %v", err)
	}
	p := d.Progress()
	if p.Workers[0].Revoked != 1 || p.Workers[0].Leases != 2 || p.Shards.Doing != 2 {
		t.Fatalf("progress %+v", p)
	}
}

func TestLeaveAndEvict(t *testing.T) {
	ctx := context.Background()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(10), ShardSize: 10, MaxFailures: 1})
	l := mustAcquire(t, d, "a")
	if err := d.Report(ctx, "a", l.ID, 3, false); err != nil {
		t.Fatal(err)
	}
	if err := d.Leave(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := d.Leave(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// Leave is no failure even with MaxFailures 1.
	l = mustAcquire(t, d, "b")
	if l.Offset != 3 {
		t.Fatalf("after leave: %+v", l)
	}
	if err := d.Report(ctx, "b", l.ID, 6, false); err != nil {
		t.Fatal(err)
	}
	d.Evict("b")
	p := d.Progress()
	if !p.Finished || p.Shards.Failed != 1 || len(p.Failed) != 1 || p.Failed[0].Offset != 6 || p.EpochRecords[0].Failed != 4 || p.EpochRecords[0].Done != 6 {
		t.Fatalf("after evict: %+v", p)
	}
	if _, err := d.Acquire(ctx, "c"); !errors.Is(err, shard.ErrNoMoreWork) {
		t.Fatalf("acquire after failure: %v", err)
	}
}

func TestMaxFailures(t *testing.T) {
	ctx := context.Background()
	d, clock := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(20), ShardSize: 10, MaxFailures: 3, LeaseTTL: time.Second, Epochs: 2})
	// Shard order is the table order: the first Acquire gets shard 0, which keeps failing.
	for i := range 3 {
		l := mustAcquire(t, d, "w")
		if l.Shard.Index != 0 || l.Offset != int64(i) {
			t.Fatalf("attempt %d: %+v", i, l)
		}
		if err := d.Report(ctx, "w", l.ID, int64(i+1), false); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Second)
	}
	if n := d.Expire(); n != 1 {
		t.Fatalf("expired %d", n)
	}
	p := d.Progress()
	if p.Shards.Failed != 1 || p.Failed[0].Failures != 3 || p.Failed[0].Offset != 3 || p.Failed[0].Epoch != 0 {
		t.Fatalf("progress %+v", p)
	}
	l := mustAcquire(t, d, "w")
	if l.Shard.Index != 1 || l.Epoch != 0 {
		t.Fatalf("%+v", l)
	}
	if err := d.Report(ctx, "w", l.ID, 10, true); err != nil {
		t.Fatal(err)
	}
	// Epoch 1 starts with fresh failure counts.
	l = mustAcquire(t, d, "w")
	if l.Epoch != 1 || l.Offset != 0 {
		t.Fatalf("%+v", l)
	}
	p = d.Progress()
	want := shard.EpochProgress{Epoch: 0, Records: 20, Done: 13, Failed: 7}
	if p.EpochRecords[0] != want || p.Epoch != 1 || p.Shards.Failed != 0 {
		t.Fatalf("progress %+v", p)
	}
}

func TestWaitAndEpochBarrier(t *testing.T) {
	ctx := context.Background()
	d, clock := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(10), ShardSize: 10, Epochs: 2, LeaseTTL: 5 * time.Second, RetryAfter: 2 * time.Second})
	a := mustAcquire(t, d, "a")
	_, err := d.Acquire(ctx, "b")
	var we *shard.WaitError
	if !errors.As(err, &we) || !errors.Is(err, shard.ErrWait) || we.RetryAfter != 2*time.Second {
		t.Fatalf("wait: %v", err)
	}
	clock.Advance(4 * time.Second)
	_, err = d.Acquire(ctx, "b")
	if !errors.As(err, &we) || we.RetryAfter != time.Second {
		t.Fatalf("wait capped by deadline: %v", err)
	}
	if err := d.Report(ctx, "a", a.ID, 10, true); err != nil {
		t.Fatal(err)
	}
	b := mustAcquire(t, d, "b")
	if b.Epoch != 1 {
		t.Fatalf("%+v", b)
	}
}

// A worker that finds no shard at an epoch's end is told to come back when the shards being
// trained are estimated done at their holders' speeds, not after the whole RetryAfter.
func TestWaitEndsWhenTheEpochIsEstimatedDone(t *testing.T) {
	ctx := context.Background()
	d, clock := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(2000), ShardSize: 1000, Epochs: 2, LeaseTTL: time.Minute, RetryAfter: 2 * time.Second})
	a, b := mustAcquire(t, d, "a"), mustAcquire(t, d, "b")
	clock.Advance(time.Second)
	// b trains at 800 records a second: 200 of its 1000 are left, a quarter of a second.
	if err := d.Report(ctx, "b", b.ID, 800, false); err != nil {
		t.Fatal(err)
	}
	if err := d.Report(ctx, "a", a.ID, 1000, true); err != nil {
		t.Fatal(err)
	}
	_, err := d.Acquire(ctx, "a")
	var we *shard.WaitError
	if !errors.As(err, &we) || we.RetryAfter != 250*time.Millisecond {
		t.Fatalf("wait until b is estimated done: %v", err)
	}
	// Near the end the estimate is floored, so that a worker does not spin on a lagging report.
	clock.Advance(240 * time.Millisecond)
	if err := d.Report(ctx, "b", b.ID, 995, false); err != nil {
		t.Fatal(err)
	}
	_, err = d.Acquire(ctx, "a")
	if !errors.As(err, &we) || we.RetryAfter != 10*time.Millisecond {
		t.Fatalf("the floor: %v", err)
	}
	if err := d.Report(ctx, "b", b.ID, 1000, true); err != nil {
		t.Fatal(err)
	}
	if l := mustAcquire(t, d, "a"); l.Epoch != 1 {
		t.Fatalf("%+v", l)
	}
}

func TestShuffleDeterministic(t *testing.T) {
	order := func(seed uint64) [][]int {
		d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(64), ShardSize: 4, Epochs: 3, Shuffle: true, Seed: seed, ShuffleRecords: true})
		var out [][]int
		for {
			l, err := d.Acquire(context.Background(), "w")
			if err != nil {
				break
			}
			if l.ShuffleSeed == 0 {
				t.Fatal("ShuffleRecords without a seed")
			}
			for len(out) <= l.Epoch {
				out = append(out, nil)
			}
			out[l.Epoch] = append(out[l.Epoch], l.Shard.Index)
			if err := d.Report(context.Background(), "w", l.ID, l.Shard.Records, true); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	a, b, c := order(7), order(7), order(8)
	if len(a) != 3 {
		t.Fatalf("epochs %d", len(a))
	}
	same := func(x, y []int) bool {
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	for e := range a {
		if !same(a[e], b[e]) {
			t.Fatalf("epoch %d: same seed, different order", e)
		}
		seen := make(map[int]bool)
		for _, s := range a[e] {
			seen[s] = true
		}
		if len(seen) != 16 || len(a[e]) != 16 {
			t.Fatalf("epoch %d is not a permutation: %v", e, a[e])
		}
	}
	if same(a[0], a[1]) || same(a[0], c[0]) {
		t.Fatal("orders do not vary with epoch and seed")
	}
	// Pin the order: it must not change across releases (a restored snapshot relies on it).
	if got := shard.RecordOrder(42, 8); !sameInt32(got, []int32{4, 3, 2, 0, 7, 6, 1, 5}) {
		t.Fatalf("RecordOrder(42, 8) = %v", got)
	}
}

func sameInt32(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestConfigValidateReportsAll(t *testing.T) {
	cfg := shard.Config{
		Dataset:     shard.Dataset{Kind: shard.KindStream, Partitions: 0},
		ShardSize:   -1,
		Epochs:      2,
		LeaseTTL:    -time.Second,
		MaxFailures: -1,
	}
	err := cfg.Validate()
	if !errors.Is(err, shard.ErrInvalidConfig) {
		t.Fatalf("got %v", err)
	}
	for _, want := range []string{"ShardSize", "LeaseTTL", "MaxFailures", "Partitions", "Epochs must be 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
	if _, err := shard.New(cfg); !errors.Is(err, shard.ErrInvalidConfig) {
		t.Fatalf("New: %v", err)
	}
	if err := (shard.Config{}).Validate(); err == nil {
		t.Fatal("no dataset accepted")
	}
	bad := shard.TextDataset([]shard.Shard{{Kind: shard.KindText, File: "f", Start: 0, End: 3, Records: 4, Line: 1}})
	if err := (shard.Config{Dataset: bad}).Validate(); err == nil {
		t.Fatal("impossible text shard accepted")
	}
	if err := shard.DefaultConfig(shard.IndexedDataset(1)).Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestStream(t *testing.T) {
	ctx := context.Background()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.StreamDataset(2), ShardSize: 10})
	if _, err := d.Acquire(ctx, "w"); !errors.Is(err, shard.ErrWait) {
		t.Fatalf("empty stream: %v", err)
	}
	if err := d.GrowStream(0, 25); err != nil {
		t.Fatal(err)
	}
	if err := d.GrowStream(1, 5); err != nil {
		t.Fatal(err)
	}
	if err := d.GrowStream(1, 4); !errors.Is(err, shard.ErrBadPartition) {
		t.Fatal(err)
	}
	if err := d.GrowStream(2, 4); !errors.Is(err, shard.ErrBadPartition) {
		t.Fatal(err)
	}
	var got []shard.Shard
	drain := func() {
		for {
			l, err := d.Acquire(ctx, "w")
			if err != nil {
				return
			}
			got = append(got, l.Shard)
			if err := d.Report(ctx, "w", l.ID, l.Shard.Records, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	drain()
	if len(got) != 2 || got[0].Start != 0 || got[1].Start != 10 || got[1].Partition != 0 {
		t.Fatalf("full shards only: %+v", got)
	}
	if err := d.FlushStream(); err != nil {
		t.Fatal(err)
	}
	drain()
	if len(got) != 4 {
		t.Fatalf("after flush %+v", got)
	}
	if err := d.GrowStream(1, 30); err != nil {
		t.Fatal(err)
	}
	if err := d.SealStream(); err != nil {
		t.Fatal(err)
	}
	if err := d.GrowStream(1, 40); !errors.Is(err, shard.ErrStreamSealed) {
		t.Fatal(err)
	}
	drain()
	if _, err := d.Acquire(ctx, "w"); !errors.Is(err, shard.ErrNoMoreWork) {
		t.Fatalf("sealed and drained: %v", err)
	}
	p := d.Progress()
	if p.EpochRecords[0].Records != 55 || p.EpochRecords[0].Done != 55 || !p.Finished {
		t.Fatalf("%+v", p)
	}
	ix, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(3)})
	if err := ix.GrowStream(0, 1); !errors.Is(err, shard.ErrNotStream) {
		t.Fatal(err)
	}
}

func TestWorkerRate(t *testing.T) {
	ctx := context.Background()
	d, clock := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(10000), ShardSize: 10000})
	l := mustAcquire(t, d, "w")
	for i := int64(1); i <= 10; i++ {
		clock.Advance(time.Second)
		if err := d.Report(ctx, "w", l.ID, 100*i, false); err != nil {
			t.Fatal(err)
		}
	}
	w := d.Progress().Workers[0]
	if w.Rate < 99 || w.Rate > 101 || !w.LastSeen.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("%+v", w)
	}
	// A worker gone without a word is forgotten after ten TTLs.
	clock.Advance(400 * time.Second)
	if p := d.Progress(); len(p.Workers) != 0 || p.Shards.Todo != 1 {
		t.Fatalf("%+v", p)
	}
}

// A worker declared dead and evicted late, after it joined again, keeps the leases it took
// after the declaration; only the earlier ones go back, counting a failure or not as asked.
func TestEvictGrantedSparesLaterLeases(t *testing.T) {
	ctx := context.Background()
	for _, failure := range []bool{true, false} {
		d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(40), ShardSize: 10, MaxFailures: 1, LeaseTTL: time.Minute})
		if g := d.Granted(); g != 0 {
			t.Fatalf("granted before any lease: %d", g)
		}
		old := mustAcquire(t, d, "w")
		if err := d.Report(ctx, "w", old.ID, 4, false); err != nil {
			t.Fatal(err)
		}
		mark := d.Granted() // w is declared dead here
		if mark != old.ID.Seq {
			t.Fatalf("granted %d, the lease has %d", mark, old.ID.Seq)
		}
		later := mustAcquire(t, d, "w") // w joined again
		d.EvictGranted("w", mark, failure)

		if err := d.Report(ctx, "w", later.ID, 1, false); err != nil {
			t.Fatalf("failure=%t: the lease taken after the declaration was evicted: %v", failure, err)
		}
		if err := d.Report(ctx, "w", old.ID, 5, false); !errors.Is(err, shard.ErrStaleLease) {
			t.Fatalf("failure=%t: the earlier lease survived the eviction: %v", failure, err)
		}
		p := d.Progress()
		if failure && (p.Shards.Failed != 1 || p.Failed[0].Offset != 4) {
			t.Fatalf("failure=true: the evicted shard did not count its failure: %+v", p)
		}
		if !failure && (p.Shards.Failed != 0 || p.Shards.Todo != 3) {
			t.Fatalf("failure=false: the evicted shard is not back to do: %+v", p)
		}
		if len(p.Workers) != 1 || p.Workers[0].Leases != 1 {
			t.Fatalf("failure=%t: the worker holding a lease was forgotten: %+v", failure, p.Workers)
		}
		d.EvictGranted("w", d.Granted(), failure)
		if p := d.Progress(); len(p.Workers) != 0 {
			t.Fatalf("failure=%t: a worker left with no lease is still known: %+v", failure, p.Workers)
		}
	}
}
