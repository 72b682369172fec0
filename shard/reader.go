package shard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/elasticps/elasticps/internal/wait"
)

// ReaderConfig configures a Reader. The zero value of every field but Service, Worker and
// Source means its default.
type ReaderConfig struct {
	// Service hands out shards: a *Dispatcher in process, or a network client. Required. If it
	// implements ReportAcquirer, the reader finishes a shard and leases the next one with one
	// combined call whenever it needs the next shard at the moment it reports a shard done
	// (see Reader); otherwise, or once the combined call answers errors.ErrUnsupported, it
	// makes the two calls.
	Service Service
	// Worker is this worker's name, unique among the job's live workers. Required.
	Worker string
	// Source opens the records of a leased shard. Required.
	Source Source

	// BatchSize is the number of records per batch. Default 512. The last batch of a shard may
	// be smaller.
	BatchSize int
	// MaxPending is how many batches may be handed out by Next and not yet passed to Done:
	// Next blocks beyond it (back-pressure). Default 4.
	MaxPending int
	// MaxLeases is how many shards the reader holds at once: at a shard boundary, Next waits
	// until a held shard is finished (all its batches done and reported) before acquiring
	// another. Default 2: batches of the previous shard may still be in training while the next
	// shard is read. A caller that calls Done only after its next Next returns must keep the
	// batches it holds within fewer than MaxLeases shards, or Next waits until ctx ends. Must not
	// exceed the dispatcher's MaxLeasesPerWorker, or the dispatcher revokes the oldest lease and
	// its last batches count for nothing.
	MaxLeases int
	// SeparateCalls makes the final report of a shard and the next acquire two calls even when
	// the Service implements ReportAcquirer. Default false: combine them (see Reader), which
	// halves the round trips per shard but leases the next shard as soon as the shard Next reads
	// from is finished; set it if a reader may stop calling Next for long after that (without
	// Leave), so that no lease waits idle for its TTL.
	SeparateCalls bool
	// ReportEvery reports progress after this many completed batches (and always at the end of a
	// shard). Default 1. Larger means fewer dispatcher calls but more replay after a crash, and
	// the dispatcher's LeaseTTL must cover ReportEvery batches.
	ReportEvery int
	// Backoff shapes retries of failed dispatcher calls.
	Backoff Backoff
	// MaxRetries is how many consecutive failed calls the reader retries before returning the
	// error. Default 0: retry until the context ends.
	MaxRetries int
	// Seed seeds the backoff jitter (mixed with Worker). Default 0.
	Seed uint64
	// Sleep waits between retries and while the dispatcher says to wait; it must return early
	// with ctx's error when ctx ends. Default: a timer.
	Sleep func(ctx context.Context, d time.Duration) error
	// Logger receives lost leases and retried errors. Default: discard.
	Logger *slog.Logger
}

func (c *ReaderConfig) fill() {
	if c.BatchSize == 0 {
		c.BatchSize = 512
	}
	if c.MaxPending == 0 {
		c.MaxPending = 4
	}
	if c.MaxLeases == 0 {
		c.MaxLeases = 2
	}
	if c.ReportEvery == 0 {
		c.ReportEvery = 1
	}
	c.Backoff.fill()
}

// Validate reports every problem of the configuration at once, joined with ErrInvalidConfig.
func (c ReaderConfig) Validate() error {
	c.fill()
	var errs []error
	if c.Service == nil {
		errs = append(errs, errors.New("Service is required"))
	}
	if err := checkWorker(c.Worker); err != nil {
		errs = append(errs, fmt.Errorf("Worker: %w", err))
	}
	if c.Source == nil {
		errs = append(errs, errors.New("Source is required"))
	}
	if c.BatchSize < 0 || c.BatchSize > 1<<24 {
		errs = append(errs, fmt.Errorf("BatchSize %d out of range [1, %d]", c.BatchSize, 1<<24))
	}
	if c.MaxPending < 0 || c.MaxPending > 1<<16 {
		errs = append(errs, fmt.Errorf("MaxPending %d out of range [1, %d]", c.MaxPending, 1<<16))
	}
	if c.MaxLeases < 0 || c.MaxLeases > 1024 {
		errs = append(errs, fmt.Errorf("MaxLeases %d out of range [1, 1024]", c.MaxLeases))
	}
	if c.ReportEvery < 0 {
		errs = append(errs, fmt.Errorf("ReportEvery %d is negative", c.ReportEvery))
	}
	if c.MaxRetries < 0 {
		errs = append(errs, fmt.Errorf("MaxRetries %d is negative", c.MaxRetries))
	}
	errs = append(errs, c.Backoff.validate()...)
	if len(errs) == 0 {
		return nil
	}
	return errors.Join(append([]error{ErrInvalidConfig}, errs...)...)
}

// ReaderStats are a reader's counters.
type ReaderStats struct {
	Leases     int64 // shards acquired
	LostLeases int64 // shards lost (ErrStaleLease, or dropped after a read error)
	Batches    int64 // batches handed out (empty ones included: see Next)
	Records    int64 // records handed out
	Skipped    int64 // malformed lines skipped (SkipMalformed)
	Reported   int64 // offsets accepted by the dispatcher (records and skipped lines)
	Combined   int64 // shards finished by ReportAndAcquire (the next lease came with the report)
	Retries    int64 // failed dispatcher calls retried
	Waits      int64 // WaitError answers waited out
}

// span is a batch handed out: shard offsets [start, end).
type span struct {
	start, end int64
	done       bool
}

// held is a lease the reader holds.
type held struct {
	lease     Lease
	cursor    Cursor // owned by Next
	readPos   int64  // where the next batch starts
	exhausted bool   // every record was handed out
	pending   []span // handed out, not yet part of doneTo, in offset order
	doneTo    int64  // every offset below is done
	reported  int64  // accepted by the dispatcher
	since     int    // batches done since the last report
	lost      bool
}

// Reader is the worker side: it acquires shards from a Service, reads them through a Source,
// hands batches to the training loop and reports progress as batches are done.
//
// A record counts as trained when the report covering its batch is accepted, so call Done only
// after the batch's updates are applied (acknowledged by the parameter servers). Batches may be
// done out of order: the reader reports the contiguous prefix. Every position it reports lies in
// a batch handed out by Next and passed to Done, including positions of lines the Source skipped
// (a batch may consist of nothing else; see Next), so a caller can account for every position
// the dispatcher counts.
//
// When the Service implements ReportAcquirer (and SeparateCalls is not set), the final report of
// a shard also leases the next shard (one round trip instead of two) if the reader needs that
// shard next: the shard being finished is the one Next reads from (so the next Next opens a new
// shard), or Next is waiting for room under MaxLeases, or Next finds a finished shard whose
// final report has not gone through yet. The lease waits in the reader for the next Next (a
// reader that then stops without Leave leaves it to expire, like the shard it reads). A reader
// whose training lags behind its reading (Next has moved to the next shard before the last
// batch of the previous one is done) makes the two calls separately, so that no lease waits
// idle. After an Acquire that ended without an answer (ctx ended, MaxRetries), the next shard
// comes from Acquire, which collects a late answer from a network Service rather than leaving
// its lease orphaned.
//
// Next must not be called concurrently with itself; Done and Stats may be called from other
// goroutines at any time (a pipeline reads in one goroutine and trains in another). Close after
// Next and Done have returned. The Reader starts no goroutines.
type Reader struct {
	cfg   ReaderConfig
	slots chan struct{} // one per pending batch

	nextMu   sync.Mutex // Next is single-flight
	reportMu sync.Mutex // reports go out one at a time, in offset order
	rec      Record     // scratch, owned by Next

	mu      sync.Mutex
	cur     *held
	held    []*held
	changed chan struct{} // closed (and replaced) when a lease stops being held or ready changes
	free    []*Batch
	stats   ReaderStats
	rng     rng
	eof     bool
	closed  bool

	ra        ReportAcquirer // the combined call; nil without it (or after ErrUnsupported)
	aw        ShardAwaiter   // wakes a wait for a shard; nil without it (or after ErrUnsupported)
	ready     *readyLease    // what a combined call brought for the next open
	combining bool           // a combined call decided in finishSpan is in flight
	roomWait  bool           // open waits for a held shard to finish
	abandoned bool           // an acquire ended without an answer: the next lease comes from Acquire
}

// readyLease is the acquire part of a combined call, kept for the next open.
type readyLease struct {
	lease Lease
	eof   bool // ErrNoMoreWork
}

// NewReader returns a reader, or an error joining every problem of the config.
func NewReader(cfg ReaderConfig) (*Reader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.fill()
	if cfg.Sleep == nil {
		cfg.Sleep = wait.Sleep
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Reader{
		cfg:     cfg,
		slots:   make(chan struct{}, cfg.MaxPending),
		changed: make(chan struct{}),
		rng:     rng{s: cfg.Seed ^ xxhash.Sum64String(cfg.Worker)},
	}
	if !cfg.SeparateCalls {
		r.ra, _ = cfg.Service.(ReportAcquirer)
	}
	r.aw, _ = cfg.Service.(ShardAwaiter)
	return r, nil
}

// Stats returns the reader's counters.
// BatchSize is the number of records per batch (ReaderConfig.BatchSize, defaulted).
func (r *Reader) BatchSize() int { return r.cfg.BatchSize }

func (r *Reader) Stats() ReaderStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Next returns the next batch, acquiring shards as needed. It blocks while MaxPending batches
// are out (until Done), at a shard boundary while MaxLeases shards are held, and while the
// dispatcher is unavailable or has no shard yet (retrying with backoff). It returns io.EOF when
// the dispatcher has no more work, ctx's error when ctx ends, and a read or parse error (for
// example a *ParseError under FailOnMalformed) after dropping the shard, which is then lost to
// this worker: its lease expires and the dispatcher counts a failure.
//
// A batch may hold no records (Len 0): when all that is left of a shard is lines the Source
// skipped (malformed lines under SkipMalformed, or records a Source leaves out, such as a
// held-out split), the batch covers those positions [Start, End) and nothing else. Pass it to
// Done like any other batch; its positions count as trained when that report is accepted, so
// every position the dispatcher counts arrives in some batch the caller passed to Done.
func (r *Reader) Next(ctx context.Context) (*Batch, error) {
	r.nextMu.Lock()
	defer r.nextMu.Unlock()
	r.mu.Lock()
	closed, eof := r.closed, r.eof
	r.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if eof {
		return nil, io.EOF
	}
	select {
	case r.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	b, err := r.next(ctx)
	if err != nil {
		<-r.slots
	}
	return b, err
}

func (r *Reader) next(ctx context.Context) (*Batch, error) {
	r.mu.Lock()
	h := r.cur
	if h != nil && (h.exhausted || h.lost) {
		if !h.exhausted {
			_ = h.cursor.Close()
		}
		r.cur, h = nil, nil
	}
	r.mu.Unlock()
	if h == nil {
		var err error
		if h, err = r.open(ctx); err != nil {
			return nil, err
		}
	}
	b, err := r.fill(h)
	if err != nil {
		r.drop(h, "read error", err)
		return nil, err
	}
	// A batch without records (the rest of the shard was skipped lines) is handed out too:
	// its positions count as trained when the caller passes it to Done, like any other batch's,
	// so a caller that keeps its own account of the positions it trained sees them.
	return b, nil
}

// open waits for room under MaxLeases, acquires a shard and opens it. A finished shard whose
// final report has not gone through is reported first when that costs no extra call (it is
// combined with the acquire) or must be made anyway (no room, or a lease is already waiting);
// then the lease a combined call brought is taken, or one is acquired.
func (r *Reader) open(ctx context.Context) (*held, error) {
	for {
		r.mu.Lock()
		n, ch, rl := len(r.held), r.changed, r.ready
		var unreported *held // finished but its final report failed earlier
		for _, x := range r.held {
			if x.exhausted && len(x.pending) == 0 && x.doneTo > x.reported {
				unreported = x
			}
		}
		combine := r.ra != nil && !r.abandoned && rl == nil
		wait := false
		switch {
		case r.combining: // a combined call in flight brings the lease, or a reason to acquire
			wait = true
		case unreported != nil && (combine || rl != nil || n >= r.cfg.MaxLeases):
			r.mu.Unlock()
			if err := r.report(ctx, unreported, unreported.lease.Shard.Records, true, combine); err != nil {
				return nil, err
			}
			continue
		case rl != nil:
			r.ready = nil
			if rl.eof {
				r.eof = true
				r.mu.Unlock()
				return nil, io.EOF
			}
			r.mu.Unlock()
			return r.start(ctx, rl.lease)
		case n >= r.cfg.MaxLeases: // wait for a held shard to finish (its final report may bring the lease)
			wait = true
		}
		if !wait {
			r.mu.Unlock()
			break
		}
		r.roomWait = true
		r.mu.Unlock()
		var err error
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		}
		r.mu.Lock()
		r.roomWait = false
		r.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	lease, err := r.acquire(ctx)
	if err != nil {
		if errors.Is(err, ErrNoMoreWork) {
			r.mu.Lock()
			r.eof = true
			r.mu.Unlock()
			return nil, io.EOF
		}
		return nil, err
	}
	return r.start(ctx, lease)
}

// start opens a leased shard and makes it the one Next reads.
func (r *Reader) start(ctx context.Context, lease Lease) (*held, error) {
	cursor, err := r.cfg.Source.Open(ctx, lease)
	if err != nil {
		r.mu.Lock()
		r.stats.LostLeases++
		r.mu.Unlock()
		r.cfg.Logger.Warn("shard: cannot open shard; leaving it to expire", "worker", r.cfg.Worker, "shard", lease.Shard.Index, "err", err)
		return nil, fmt.Errorf("shard: open shard %d: %w", lease.Shard.Index, err)
	}
	h := &held{lease: lease, cursor: cursor, readPos: lease.Offset, doneTo: lease.Offset, reported: lease.Offset}
	r.mu.Lock()
	r.stats.Leases++
	r.held = append(r.held, h)
	r.cur = h
	r.mu.Unlock()
	return h, nil
}

// acquire asks for a shard until it gets one, the job is over, or ctx ends. When it gives up
// otherwise, a request may still be on its way, so the next lease must come from Acquire too
// (see Reader).
func (r *Reader) acquire(ctx context.Context) (Lease, error) {
	lease, err := r.acquireLoop(ctx)
	r.mu.Lock()
	r.abandoned = err != nil && !errors.Is(err, ErrNoMoreWork)
	r.mu.Unlock()
	return lease, err
}

func (r *Reader) acquireLoop(ctx context.Context) (Lease, error) {
	failures := 0
	for {
		lease, err := r.cfg.Service.Acquire(ctx, r.cfg.Worker)
		if err == nil {
			return lease, nil
		}
		var wait *WaitError
		switch {
		case errors.Is(err, ErrNoMoreWork), errors.Is(err, ErrBadWorker), errors.Is(err, ErrPermanent), isCtxErr(err) && ctx.Err() != nil:
			return Lease{}, err
		case errors.As(err, &wait):
			failures = 0
			r.count(func(s *ReaderStats) { s.Waits++ })
			if err := r.waitShard(ctx, wait.RetryAfter); err != nil {
				return Lease{}, err
			}
		default:
			if err := r.retryWait(ctx, &failures, "acquire", err); err != nil {
				return Lease{}, err
			}
		}
	}
}

// waitShard waits d, as the dispatcher told, or less: until the Service says a shard can be
// leased, when it can (ShardAwaiter). It returns ctx's error when ctx ends.
func (r *Reader) waitShard(ctx context.Context, d time.Duration) error {
	r.mu.Lock()
	aw := r.aw
	r.mu.Unlock()
	if aw == nil {
		return r.cfg.Sleep(ctx, d)
	}
	wctx, wake := context.WithCancel(ctx)
	defer wake()
	awaited := make(chan error, 1)
	go func() {
		err := aw.AwaitShard(wctx)
		if err == nil {
			wake() // a shard is free: the sleep ends now
		}
		awaited <- err
	}()
	_ = r.cfg.Sleep(wctx, d) // it ends early when woken
	wake()
	if errors.Is(<-awaited, errors.ErrUnsupported) {
		r.mu.Lock()
		r.aw = nil // a wrapper of a Service without it: sleep from now on
		r.mu.Unlock()
	}
	return ctx.Err()
}

// retryWait counts a failed call and sleeps before the retry, or returns the error to give up.
func (r *Reader) retryWait(ctx context.Context, failures *int, op string, err error) error {
	*failures++
	if r.cfg.MaxRetries > 0 && *failures > r.cfg.MaxRetries {
		return fmt.Errorf("shard: %s failed %d times: %w", op, *failures, err)
	}
	r.mu.Lock()
	r.stats.Retries++
	d := r.cfg.Backoff.wait(*failures, &r.rng)
	r.mu.Unlock()
	r.cfg.Logger.Debug("shard: dispatcher call failed, retrying", "worker", r.cfg.Worker, "op", op, "wait", d, "err", err)
	return r.cfg.Sleep(ctx, d)
}

func (r *Reader) count(f func(*ReaderStats)) {
	r.mu.Lock()
	f(&r.stats)
	r.mu.Unlock()
}

// fill reads up to BatchSize records of h into a new batch and registers it as pending.
func (r *Reader) fill(h *held) (*Batch, error) {
	b := r.batch()
	b.Lease, b.Epoch, b.Shard, b.Start = h.lease.ID, h.lease.Epoch, h.lease.Shard, h.readPos
	exhausted := false
	for b.Len() < r.cfg.BatchSize {
		err := h.cursor.Next(&r.rec)
		if err == io.EOF {
			exhausted = true
			break
		}
		if err == nil {
			err = b.Append(&r.rec)
		}
		if err != nil {
			r.recycle(b)
			return nil, err
		}
	}
	if !exhausted {
		b.End = b.RecordOffsets[b.Len()-1] + 1
		// A full batch that ends on the shard's last position exhausts it too: finish the shard
		// now rather than with an empty batch later.
		exhausted = b.End == h.lease.Shard.Records
	}
	if exhausted {
		b.End = h.lease.Shard.Records
		_ = h.cursor.Close()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	h.readPos = b.End
	h.exhausted = exhausted
	h.pending = append(h.pending, span{start: b.Start, end: b.End})
	r.stats.Batches++
	r.stats.Records += int64(b.Len())
	r.stats.Skipped += b.Skipped()
	return b, nil
}

// drop gives up a lease after a read error: it is no longer held or reported.
func (r *Reader) drop(h *held, why string, err error) {
	_ = h.cursor.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !h.lost {
		h.lost = true
		r.stats.LostLeases++
		r.unholdLocked(h)
	}
	r.cfg.Logger.Warn("shard: dropping shard", "worker", r.cfg.Worker, "shard", h.lease.Shard.Index, "why", why, "err", err)
}

// unholdLocked forgets h and wakes a Next waiting for room under MaxLeases.
func (r *Reader) unholdLocked(h *held) {
	for i, x := range r.held {
		if x == h {
			r.held = append(r.held[:i], r.held[i+1:]...)
			r.signalLocked()
			return
		}
	}
}

// signalLocked wakes a Next waiting in open.
func (r *Reader) signalLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *Reader) batch() *Batch {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b *Batch
	if n := len(r.free); n > 0 {
		b, r.free = r.free[n-1], r.free[:n-1]
	} else {
		b = new(Batch)
	}
	b.Reset()
	return b
}

func (r *Reader) recycle(b *Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.free) < r.cfg.MaxPending+1 {
		r.free = append(r.free, b)
	}
}

// Done tells the reader the batch is trained (its updates applied). Once every batch before it
// in the shard is done too, the reader reports the progress, retrying with backoff while the
// dispatcher is unavailable. A lease found stale is dropped silently: its records go to the
// next holder from the last accepted offset. Done returns ctx's error if ctx ends before the
// report goes through (the progress is reported with a later batch), or an ErrBadOffset from
// the dispatcher. The batch must not be used after Done.
func (r *Reader) Done(ctx context.Context, b *Batch) error {
	defer func() {
		select {
		case <-r.slots:
		default: // a batch done twice: nothing more to free
		}
	}()
	start, end, id := b.Start, b.End, b.Lease
	r.recycle(b)
	r.mu.Lock()
	var h *held
	for _, x := range r.held {
		if x.lease.ID == id {
			h = x
			break
		}
	}
	r.mu.Unlock()
	if h == nil {
		return nil // lost or unknown lease: nothing to report
	}
	return r.finishSpan(ctx, h, start, end)
}

// finishSpan marks [start, end) of h done and reports if it is time to.
func (r *Reader) finishSpan(ctx context.Context, h *held, start, end int64) error {
	r.mu.Lock()
	for i := range h.pending {
		if h.pending[i].start == start && h.pending[i].end == end {
			h.pending[i].done = true
			break
		}
	}
	k := 0
	for k < len(h.pending) && h.pending[k].done {
		h.doneTo = h.pending[k].end
		k++
	}
	h.pending = append(h.pending[:0], h.pending[k:]...)
	h.since++
	complete := h.exhausted && len(h.pending) == 0
	due := h.doneTo > h.reported && (h.since >= r.cfg.ReportEvery || complete)
	offset := h.doneTo
	// Combine the final report with the next acquire when Next needs a shard now: h is the
	// shard it reads (so its next call opens another), or it waits for room.
	combine := due && complete && offset == h.lease.Shard.Records && r.ra != nil && !r.abandoned &&
		!r.eof && !r.closed && r.ready == nil && !r.combining && (r.cur == h || r.roomWait)
	if combine {
		r.combining = true
	}
	r.mu.Unlock()
	if !due {
		return nil
	}
	if !combine {
		return r.report(ctx, h, offset, complete, false)
	}
	defer func() {
		r.mu.Lock()
		r.combining = false
		r.signalLocked()
		r.mu.Unlock()
	}()
	return r.report(ctx, h, offset, complete, true)
}

// report sends progress of h through offset, retrying transport errors. With combine, a final
// report goes as ReportAndAcquire, and its acquire part is kept in r.ready for open.
func (r *Reader) report(ctx context.Context, h *held, offset int64, complete, combine bool) error {
	r.reportMu.Lock()
	defer r.reportMu.Unlock()
	failures := 0
	for {
		r.mu.Lock()
		lost, reported, ra := h.lost, h.reported, r.ra
		r.mu.Unlock()
		if lost || offset <= reported {
			return nil
		}
		done := complete && offset == h.lease.Shard.Records
		combined := combine && done && ra != nil
		var next Lease
		var err error
		if combined {
			next, err = ra.ReportAndAcquire(ctx, r.cfg.Worker, h.lease.ID, offset)
		} else {
			err = r.cfg.Service.Report(ctx, r.cfg.Worker, h.lease.ID, offset, done)
		}
		switch {
		case combined && errors.Is(err, errors.ErrUnsupported):
			r.mu.Lock()
			r.ra = nil
			r.mu.Unlock()
			r.cfg.Logger.Info("shard: the service cannot report and acquire in one call; using two", "worker", r.cfg.Worker, "err", err)
		case err == nil || combined && reportAccepted(err):
			r.mu.Lock()
			r.stats.Reported += offset - h.reported
			h.reported = offset
			h.since = 0
			if combined {
				r.stats.Combined++
				switch {
				case err == nil:
					r.ready = &readyLease{lease: next}
				case errors.Is(err, ErrNoMoreWork):
					r.ready = &readyLease{eof: true}
				}
			}
			if offset == h.lease.Shard.Records {
				r.unholdLocked(h)
			}
			r.mu.Unlock()
			return nil
		case errors.Is(err, ErrStaleLease):
			r.mu.Lock()
			if !h.lost {
				h.lost = true
				r.stats.LostLeases++
				r.unholdLocked(h)
			}
			r.mu.Unlock()
			r.cfg.Logger.Info("shard: lease lost", "worker", r.cfg.Worker, "lease", h.lease.ID.String(), "reported", reported, "done", offset)
			return nil
		case errors.Is(err, ErrBadOffset), errors.Is(err, ErrBadWorker), errors.Is(err, ErrPermanent), isCtxErr(err) && ctx.Err() != nil:
			return err
		default:
			if err := r.retryWait(ctx, &failures, "report", err); err != nil {
				return err
			}
		}
	}
}

// Leave reports the progress already done, then hands every held shard back to the dispatcher
// (Service.Leave, no failure counted; a lease a combined call brought goes back too) and ends
// the reader: Next returns io.EOF afterwards.
func (r *Reader) Leave(ctx context.Context) error {
	r.mu.Lock()
	hs := append([]*held(nil), r.held...)
	r.mu.Unlock()
	for _, h := range hs {
		r.mu.Lock()
		offset, complete := h.doneTo, h.exhausted && len(h.pending) == 0
		r.mu.Unlock()
		if err := r.report(ctx, h, offset, complete, false); err != nil {
			return err
		}
	}
	failures := 0
	for {
		err := r.cfg.Service.Leave(ctx, r.cfg.Worker)
		if err == nil {
			break
		}
		if errors.Is(err, ErrBadWorker) || errors.Is(err, ErrPermanent) || isCtxErr(err) && ctx.Err() != nil {
			return err
		}
		if err := r.retryWait(ctx, &failures, "leave", err); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range r.held {
		h.lost = true
	}
	r.held = nil
	r.ready = nil // its lease went back with the others
	r.eof = true
	r.signalLocked()
	return nil
}

// Close releases the open shard's cursor. It does not talk to the dispatcher: held leases (and
// a lease a combined call brought that Next has not opened yet) expire unless Leave was called.
// Idempotent; Next returns ErrClosed afterwards.
func (r *Reader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	var err error
	if r.cur != nil && !r.cur.exhausted {
		err = r.cur.cursor.Close()
	}
	r.cur = nil
	return err
}
