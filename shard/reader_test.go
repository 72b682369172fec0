package shard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardtest"
)

// labelled is an in-memory data set whose record i has label i.
func labelled(n int64) shard.Indexed {
	return shard.IndexedFunc(n, func(i int64, rec *shard.Record) error {
		rec.Label = float32(i)
		rec.Dense = append(rec.Dense, float32(i)/2)
		rec.IDs = append(rec.IDs, uint64(i))
		rec.EndField()
		return nil
	})
}

func newReader(t testing.TB, cfg shard.ReaderConfig) *shard.Reader {
	t.Helper()
	if cfg.Sleep == nil {
		cfg.Sleep = (&shardtest.Sleeper{}).Sleep
	}
	r, err := shard.NewReader(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// drain reads every batch and marks it done at once; it returns the labels seen.
func drain(t testing.TB, r *shard.Reader) []float32 {
	t.Helper()
	ctx := context.Background()
	var labels []float32
	for {
		b, err := r.Next(ctx)
		if err == io.EOF {
			return labels
		}
		if err != nil {
			t.Fatal(err)
		}
		labels = append(labels, b.Labels...)
		if err := r.Done(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReaderReadsEverythingOnce(t *testing.T) {
	for _, shuffle := range []bool{false, true} {
		d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(1000), ShardSize: 128, Epochs: 2, Shuffle: shuffle, ShuffleRecords: shuffle})
		ledger := shardtest.NewLedger()
		r := newReader(t, shard.ReaderConfig{Service: ledger.Wrap(d), Worker: "w", Source: shard.IndexedSource{Data: labelled(1000)}, BatchSize: 50})
		labels := drain(t, r)
		if len(labels) != 2000 {
			t.Fatalf("read %d", len(labels))
		}
		seen := make(map[float32]int)
		for _, l := range labels {
			seen[l]++
		}
		for i := range 1000 {
			if seen[float32(i)] != 2 {
				t.Fatalf("record %d read %d times", i, seen[float32(i)])
			}
		}
		p := d.Progress()
		if err := ledger.Check(p); err != nil || !p.Finished {
			t.Fatalf("%v %+v", err, p)
		}
		st := r.Stats()
		// 8 shards per epoch: 7 of 128 records (3 batches each) and one of 104 (3 batches).
		if st.Records != 2000 || st.Reported != 2000 || st.Leases != 16 || st.Batches != 48 || st.LostLeases != 0 {
			t.Fatalf("stats %+v", st)
		}
		if _, err := r.Next(context.Background()); err != io.EOF {
			t.Fatalf("after the end: %v", err)
		}
	}
}

func TestReaderBackPressureAndOutOfOrderDone(t *testing.T) {
	ctx := context.Background()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 100})
	r := newReader(t, shard.ReaderConfig{Service: d, Worker: "w", Source: shard.IndexedSource{Data: labelled(100)}, BatchSize: 10, MaxPending: 2})
	b1, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.Next(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("third batch with two pending: %v", err)
	}
	if err := r.Done(ctx, b2); err != nil {
		t.Fatal(err)
	}
	if got := d.Progress().EpochRecords[0].Done; got != 0 {
		t.Fatalf("reported %d before the first batch was done", got)
	}
	if err := r.Done(ctx, b1); err != nil {
		t.Fatal(err)
	}
	if got := d.Progress().EpochRecords[0].Done; got != 20 {
		t.Fatalf("reported %d, want 20", got)
	}
	if len(drain(t, r)) != 80 {
		t.Fatal("rest")
	}
}

func TestReaderRetriesUnavailableDispatcher(t *testing.T) {
	d, clock := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 50})
	flaky := shardtest.NewFlaky(d)
	sleeper := &shardtest.Sleeper{Clock: clock}
	r := newReader(t, shard.ReaderConfig{Service: flaky, Worker: "w", Source: shard.IndexedSource{Data: labelled(100)}, BatchSize: 25,
		Sleep: sleeper.Sleep, Backoff: shard.Backoff{Initial: time.Second, Max: 4 * time.Second, Jitter: 0.5}})
	flaky.FailNext(4)
	ctx := context.Background()
	b, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sleeps := sleeper.Sleeps()
	if len(sleeps) != 4 {
		t.Fatalf("sleeps %v", sleeps)
	}
	for i, max := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		if sleeps[i] > max || sleeps[i] < max/2 {
			t.Fatalf("sleep %d = %v, want in [%v, %v]", i, sleeps[i], max/2, max)
		}
	}
	flaky.FailNext(2)
	if err := r.Done(ctx, b); err != nil {
		t.Fatal(err)
	}
	if got := d.Progress().EpochRecords[0].Done; got != 25 {
		t.Fatalf("reported %d", got)
	}
	// A bounded number of retries gives up with the transport error.
	r2 := newReader(t, shard.ReaderConfig{Service: flaky, Worker: "x", Source: shard.IndexedSource{Data: labelled(100)}, MaxRetries: 2})
	flaky.SetDown(true)
	if _, err := r2.Next(ctx); !errors.Is(err, shardtest.ErrUnavailable) {
		t.Fatalf("down: %v", err)
	}
	// And a context ends the retries.
	cctx, cancel := context.WithCancel(ctx)
	r3 := newReader(t, shard.ReaderConfig{Service: flaky, Worker: "y", Source: shard.IndexedSource{Data: labelled(100)},
		Sleep: func(ctx context.Context, d time.Duration) error { cancel(); return ctx.Err() }})
	if _, err := r3.Next(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// refusing fails every call of the kinds set with an error matching shard.ErrPermanent.
type refusing struct {
	shard.Service
	acquire, report, leave bool
	calls                  int
}

var errRefused = fmt.Errorf("refused by the test: %w", shard.ErrPermanent)

func (r *refusing) Acquire(ctx context.Context, w string) (shard.Lease, error) {
	r.calls++
	if r.acquire {
		return shard.Lease{}, errRefused
	}
	return r.Service.Acquire(ctx, w)
}

func (r *refusing) Report(ctx context.Context, w string, id shard.LeaseID, off int64, done bool) error {
	r.calls++
	if r.report {
		return errRefused
	}
	return r.Service.Report(ctx, w, id, off, done)
}

func (r *refusing) Leave(ctx context.Context, w string) error {
	r.calls++
	if r.leave {
		return errRefused
	}
	return r.Service.Leave(ctx, w)
}

func TestReaderStopsOnPermanentError(t *testing.T) {
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 50})
	ctx := context.Background()
	svc := &refusing{Service: d, acquire: true}
	r := newReader(t, shard.ReaderConfig{Service: svc, Worker: "w", Source: shard.IndexedSource{Data: labelled(100)}, BatchSize: 25})
	if _, err := r.Next(ctx); !errors.Is(err, errRefused) || svc.calls != 1 {
		t.Fatalf("acquire: %v after %d calls", err, svc.calls)
	}
	svc.acquire = false
	b, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	svc.report, svc.calls = true, 0
	if err := r.Done(ctx, b); !errors.Is(err, errRefused) || svc.calls != 1 {
		t.Fatalf("report: %v after %d calls", err, svc.calls)
	}
	svc.report, svc.leave, svc.calls = false, true, 0
	if err := r.Leave(ctx); !errors.Is(err, errRefused) || svc.calls != 2 {
		t.Fatalf("leave: %v after %d calls", err, svc.calls)
	}
	if st := r.Stats(); st.Retries != 0 {
		t.Fatalf("retried %d times", st.Retries)
	}
}

func TestReaderWaitsForLastShards(t *testing.T) {
	ctx := context.Background()
	d, clock := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(10), ShardSize: 10, Epochs: 2, RetryAfter: 3 * time.Second})
	// a never calls Next again: with SeparateCalls its final report does not lease epoch 1's
	// shard (TestReaderCombinedCall shows the combined call taking it).
	a := newReader(t, shard.ReaderConfig{Service: d, Worker: "a", Source: shard.IndexedSource{Data: labelled(10)}, SeparateCalls: true})
	ba, err := a.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// b is told to wait until a is done with the epoch; its sleeper finishes a's batch.
	var waited []time.Duration
	b := newReader(t, shard.ReaderConfig{Service: d, Worker: "b", Source: shard.IndexedSource{Data: labelled(10)},
		Sleep: func(ctx context.Context, dur time.Duration) error {
			waited = append(waited, dur)
			clock.Advance(dur)
			if ba != nil {
				err := a.Done(ctx, ba)
				ba = nil
				return err
			}
			return nil
		}})
	bb, err := b.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if bb.Epoch != 1 || len(waited) != 1 || waited[0] != 3*time.Second || b.Stats().Waits != 1 {
		t.Fatalf("epoch %d waited %v", bb.Epoch, waited)
	}
}

func TestReaderSurvivesDispatcherRestart(t *testing.T) {
	ctx := context.Background()
	cfg := shard.Config{Dataset: shard.IndexedDataset(600), ShardSize: 100, Epochs: 2, Shuffle: true, Incarnation: 1}
	d, clock := newDispatcher(t, cfg)
	ledger := shardtest.NewLedger()
	flaky := shardtest.NewFlaky(ledger.Wrap(d))
	sleeper := &shardtest.Sleeper{Clock: clock}
	r := newReader(t, shard.ReaderConfig{Service: flaky, Worker: "w", Source: shard.IndexedSource{Data: labelled(600)}, BatchSize: 30, Sleep: sleeper.Sleep})
	var snap []byte
	var snapLedger *shardtest.Ledger
	batches := 0
	for {
		b, err := r.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		batches++
		switch batches {
		case 7: // checkpoint in the middle of a shard
			snap, snapLedger = ledger.Snapshot(d)
		case 15: // the coordinator dies; a new one restores the checkpoint
			flaky.SetDown(true)
			cfg.Incarnation = 2
			d2, err := shard.New(withClock(cfg, clock))
			if err != nil {
				t.Fatal(err)
			}
			if err := d2.Restore(snap); err != nil {
				t.Fatal(err)
			}
			ledger, d = snapLedger, d2
			flaky.Swap(ledger.Wrap(d2))
			flaky.SetDown(false)
			flaky.FailNext(3)
		}
		if err := r.Done(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	p := d.Progress()
	if err := ledger.Check(p); err != nil || !p.Finished {
		t.Fatalf("%v %+v", err, p)
	}
	if st := r.Stats(); st.LostLeases != 1 || st.Retries < 3 {
		t.Fatalf("stats %+v", st)
	}
}

func withClock(cfg shard.Config, c *shardtest.Clock) shard.Config {
	cfg.Clock = c
	return cfg
}

func TestReaderMalformedLines(t *testing.T) {
	ctx := context.Background()
	data := "1\n!\n3\n4\n!\n!\n"
	fsys := fstest.MapFS{"f": {Data: []byte(data)}}
	shards, err := shard.SplitText(ctx, fsys, []string{"f"}, shard.SplitConfig{RecordsPerShard: 6})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.TextDataset(shards)})
	r := newReader(t, shard.ReaderConfig{Service: d, Worker: "w", Source: shard.TextSource{FS: fsys, Parser: labelParser{}, OnError: shard.SkipMalformed}, BatchSize: 2})
	labels := drain(t, r)
	if len(labels) != 3 || r.Stats().Skipped != 3 || r.Stats().Reported != 6 || !d.Progress().Finished {
		t.Fatalf("labels %v stats %+v", labels, r.Stats())
	}
	// Under FailOnMalformed the error names the line and the shard is dropped.
	d, clock := newDispatcher(t, shard.Config{Dataset: shard.TextDataset(shards), LeaseTTL: time.Second, MaxFailures: 1})
	r = newReader(t, shard.ReaderConfig{Service: d, Worker: "w", Source: shard.TextSource{FS: fsys, Parser: labelParser{}}, BatchSize: 2})
	_, err = r.Next(ctx)
	var pe *shard.ParseError
	if !errors.As(err, &pe) || pe.Line != 2 || pe.File != "f" {
		t.Fatalf("got %v", err)
	}
	clock.Advance(time.Second)
	if _, err := r.Next(ctx); err != io.EOF {
		t.Fatalf("after the shard failed: %v", err)
	}
	if p := d.Progress(); len(p.Failed) != 1 || r.Stats().LostLeases != 1 {
		t.Fatalf("%+v", p)
	}
}

// A shard whose remaining lines are all skipped after a full batch still reaches the caller: as
// a batch without records covering those positions, reported only when it is passed to Done,
// so a caller that counts the positions it trained sees every position the dispatcher counts.
func TestReaderHandsOutSkippedTail(t *testing.T) {
	ctx := context.Background()
	// Shard 0: two records, then two malformed lines; shard 1: malformed lines only.
	fsys := fstest.MapFS{"a": {Data: []byte("1\n2\n!\n!\n")}, "b": {Data: []byte("!\n!\n!\n")}}
	shards, err := shard.SplitText(ctx, fsys, []string{"a", "b"}, shard.SplitConfig{RecordsPerShard: 4})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.TextDataset(shards)})
	ledger := shardtest.NewLedger()
	r := newReader(t, shard.ReaderConfig{Service: ledger.Wrap(d), Worker: "w",
		Source: shard.TextSource{FS: fsys, Parser: labelParser{}, OnError: shard.SkipMalformed}, BatchSize: 2, SeparateCalls: true})
	type span struct {
		shard, records   int
		start, end, skip int64
	}
	var got []span
	covered := int64(0)
	for {
		b, err := r.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, span{b.Shard.Index, b.Len(), b.Start, b.End, b.Skipped()})
		before := d.Progress().EpochRecords[0].Done
		if before != covered {
			t.Fatalf("dispatcher counted %d positions before the batch [%d, %d) was done, want %d", before, b.Start, b.End, covered)
		}
		if err := r.Done(ctx, b); err != nil {
			t.Fatal(err)
		}
		covered += b.End - b.Start
		if after := d.Progress().EpochRecords[0].Done; after != covered {
			t.Fatalf("dispatcher counted %d positions after the batch [%d, %d) was done, want %d", after, b.Start, b.End, covered)
		}
	}
	want := []span{{0, 2, 0, 2, 0}, {0, 0, 2, 4, 2}, {1, 0, 0, 3, 3}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("batches %v, want %v", got, want)
	}
	p := d.Progress()
	if err := ledger.Check(p); err != nil || !p.Finished || covered != 7 {
		t.Fatalf("%v %+v covered %d", err, p, covered)
	}
	if st := r.Stats(); st.Batches != 3 || st.Records != 2 || st.Skipped != 5 || st.Reported != 7 {
		t.Fatalf("stats %+v", st)
	}
}

func TestReaderLeave(t *testing.T) {
	ctx := context.Background()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 100, MaxFailures: 1})
	r := newReader(t, shard.ReaderConfig{Service: d, Worker: "a", Source: shard.IndexedSource{Data: labelled(100)}, BatchSize: 10, ReportEvery: 5})
	for range 3 {
		b, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Done(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if got := d.Progress().EpochRecords[0].Done; got != 0 {
		t.Fatalf("ReportEvery 5 reported after 3: %d", got)
	}
	if err := r.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(ctx); err != io.EOF {
		t.Fatalf("after leave: %v", err)
	}
	b := newReader(t, shard.ReaderConfig{Service: d, Worker: "b", Source: shard.IndexedSource{Data: labelled(100)}})
	if got := len(drain(t, b)); got != 70 {
		t.Fatalf("b read %d, want the 70 left", got)
	}
	if p := d.Progress(); len(p.Failed) != 0 || !p.Finished {
		t.Fatalf("%+v", p)
	}
}

func TestReaderConfigValidate(t *testing.T) {
	err := shard.ReaderConfig{BatchSize: -1, Backoff: shard.Backoff{Jitter: 2}}.Validate()
	if !errors.Is(err, shard.ErrInvalidConfig) {
		t.Fatal(err)
	}
	for _, want := range []string{"Service", "Worker", "Source", "BatchSize", "Jitter"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %s in %v", want, err)
		}
	}
}

// A single goroutine may keep a batch in flight across a shard boundary (MaxLeases 2); with
// MaxLeases 1 the reader waits at the boundary until the previous shard's batches are done.
func TestReaderShardBoundary(t *testing.T) {
	ctx := context.Background()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(20), ShardSize: 10})
	r := newReader(t, shard.ReaderConfig{Service: d, Worker: "w", Source: shard.IndexedSource{Data: labelled(20)}, BatchSize: 6, MaxPending: 2})
	b1, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := r.Next(ctx) // the end of the first shard
	if err != nil || b2.End != 10 {
		t.Fatalf("%v %+v", err, b2)
	}
	if err := r.Done(ctx, b1); err != nil {
		t.Fatal(err)
	}
	b3, err := r.Next(ctx) // b2 still in flight: the second shard starts anyway
	if err != nil || b3.Shard.Index == b2.Shard.Index {
		t.Fatalf("%v %+v", err, b3)
	}
	if err := r.Done(ctx, b2); err != nil {
		t.Fatal(err)
	}
	if err := r.Done(ctx, b3); err != nil {
		t.Fatal(err)
	}
	if p := d.Progress(); p.Shards.Done != 1 || p.EpochRecords[0].Done != 16 {
		t.Fatalf("%+v", p)
	}

	d, _ = newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(20), ShardSize: 10})
	r = newReader(t, shard.ReaderConfig{Service: d, Worker: "w", Source: shard.IndexedSource{Data: labelled(20)}, BatchSize: 10, MaxPending: 2, MaxLeases: 1})
	b1, err = r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.Next(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("boundary with MaxLeases 1 and a batch in flight: %v", err)
	}
	first := b1.Shard.Index
	done := make(chan error)
	go func() { done <- r.Done(ctx, b1) }()
	b2, err = r.Next(ctx) // returns once the Done above has finished the first shard
	if err != nil || b2.Start != 0 || b2.Shard.Index == first {
		t.Fatalf("%v %+v", err, b2)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A reader told to wait at an epoch's end asks again as soon as the next epoch's shards are
// out, not when its wait is over: here the wait would never end.
func TestReaderWakesWhenTheNextEpochBegins(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(20), ShardSize: 10, Epochs: 2, RetryAfter: time.Hour})
	other := mustAcquire(t, d, "other") // shard 0 of epoch 0
	slept, blocked := make(chan struct{}, 1), make(chan struct{}, 1)
	shard.SetWaitingHook(d, func() { blocked <- struct{}{} })
	r := newReader(t, shard.ReaderConfig{Service: d, Worker: "w", Source: shard.IndexedSource{Data: labelled(20)}, BatchSize: 10,
		Sleep: func(ctx context.Context, _ time.Duration) error {
			slept <- struct{}{}
			<-ctx.Done() // an hour: only a wake ends it
			return ctx.Err()
		}})
	b, err := r.Next(ctx) // shard 1 of epoch 0
	require.NoError(t, err)
	require.NoError(t, r.Done(ctx, b))
	next := make(chan *shard.Batch, 1)
	go func() {
		b, err := r.Next(ctx)
		assert.NoError(t, err)
		next <- b
	}()
	<-slept   // no shard until "other" is done with its own
	<-blocked // and the reader waits to be told
	require.NoError(t, d.Report(ctx, "other", other.ID, 10, true))
	b = <-next
	require.NotNil(t, b)
	assert.Equal(t, 1, b.Epoch)
	assert.EqualValues(t, 1, r.Stats().Waits)
}

// AwaitShard returns at once when a shard can be leased, when one comes back, and when the work
// ends; it honours its context.
func TestAwaitShard(t *testing.T) {
	ctx := context.Background()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(10), ShardSize: 10})
	require.NoError(t, d.AwaitShard(ctx), "a shard is there")
	mustAcquire(t, d, "a")
	short, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, d.AwaitShard(short), context.Canceled)
	blocked := make(chan struct{}, 1)
	shard.SetWaitingHook(d, func() { blocked <- struct{}{} })
	woke := make(chan error, 1)
	go func() { woke <- d.AwaitShard(ctx) }()
	<-blocked
	require.NoError(t, d.Leave(ctx, "a"), "the shard goes back")
	require.NoError(t, <-woke)
	l := mustAcquire(t, d, "b")
	go func() { woke <- d.AwaitShard(ctx) }()
	<-blocked
	require.NoError(t, d.Report(ctx, "b", l.ID, 10, true), "the work is finished")
	require.NoError(t, <-woke)
	assert.ErrorIs(t, shard.AwaitShard(ctx, struct{ shard.Service }{d}), errors.ErrUnsupported, "a wrapper without it")
}
