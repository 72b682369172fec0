package shard

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Dispatcher hands out the shards of one dataset to workers and tracks their progress. It is the
// in-process implementation of Service and is safe for concurrent use: every method is a short
// critical section over an I/O-free state machine. It starts no goroutines; leases expire when
// any method runs (or Expire is called) after their deadline.
type Dispatcher struct {
	clock Clock
	cfg   Config

	mu sync.Mutex
	c  *core
	// free is closed, and cleared, when a shard can be leased or the work is finished while a
	// worker waits for it (AwaitShard); nil while nobody waits.
	free chan struct{}
	// waiting, if set (tests), runs when an AwaitShard is about to block.
	waiting atomic.Pointer[func()]
}

var (
	_ Service        = (*Dispatcher)(nil)
	_ ReportAcquirer = (*Dispatcher)(nil)
	_ ShardAwaiter   = (*Dispatcher)(nil)
)

// unlock wakes the workers waiting for a shard if one can be leased now (or the work is
// finished), and releases d.mu. Every method that holds d.mu ends with it.
func (d *Dispatcher) unlock() {
	if d.free != nil && d.c.available() {
		close(d.free)
		d.free = nil
	}
	d.mu.Unlock()
}

// AwaitShard returns once a shard can be leased (a shard came back, the next epoch began, a
// stream grew) or the work is finished, at once if that is so already, and ctx's error if ctx
// ends first. It implements ShardAwaiter: a worker told to wait asks again as soon as asking
// can help. A lease that expires is noticed by the next call of any worker, so a waiter still
// bounds its wait by the WaitError's RetryAfter, which is cut to the earliest lease deadline.
func (d *Dispatcher) AwaitShard(ctx context.Context) error {
	d.mu.Lock()
	d.c.tick(d.clock.Now())
	if d.c.available() {
		d.unlock()
		return nil
	}
	if d.free == nil {
		d.free = make(chan struct{})
	}
	free := d.free
	d.unlock()
	if f := d.waiting.Load(); f != nil {
		(*f)()
	}
	select {
	case <-free:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// New returns a dispatcher for cfg at the start of epoch 0, or an error joining every problem
// of the config.
func New(cfg Config) (*Dispatcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.fill()
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Incarnation == 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("shard: draw incarnation: %w", err)
		}
		cfg.Incarnation = binary.LittleEndian.Uint64(b[:]) | 1
	}
	// Copy caller-owned slices: the dispatcher keeps them.
	cfg.Dataset.Text = append([]Shard(nil), cfg.Dataset.Text...)
	cfg.Dataset.StreamStart = append([]int64(nil), cfg.Dataset.StreamStart...)
	d := &Dispatcher{clock: cfg.Clock, cfg: cfg}
	d.c = newCore(cfg, cfg.Incarnation, cfg.Logger)
	d.c.tick(cfg.Clock.Now())
	d.c.startEpoch(0)
	return d, nil
}

// Incarnation returns the incarnation carried by every lease this dispatcher grants.
func (d *Dispatcher) Incarnation() uint64 { return d.cfg.Incarnation }

func checkWorker(worker string) error {
	if worker == "" || len(worker) > MaxWorkerName {
		return fmt.Errorf("%w: %d bytes", ErrBadWorker, len(worker))
	}
	return nil
}

// Acquire leases the next shard to the worker. It returns ErrNoMoreWork when the job is
// finished, and a *WaitError (matching ErrWait) when no shard is available now. When the worker
// already holds MaxLeasesPerWorker leases, its oldest lease is revoked first (a failure of that
// shard). ctx is only checked on entry: the call does not block.
func (d *Dispatcher) Acquire(ctx context.Context, worker string) (Lease, error) {
	if err := ctx.Err(); err != nil {
		return Lease{}, err
	}
	if err := checkWorker(worker); err != nil {
		return Lease{}, err
	}
	d.mu.Lock()
	defer d.unlock()
	d.c.tick(d.clock.Now())
	return d.c.acquire(worker)
}

// Report records that worker has trained the records of its lease's shard before offset, and
// renews the lease for another TTL. It is accepted only if the lease is the current lease of its
// shard, held by worker, and not past its deadline; otherwise it returns ErrStaleLease and
// counts nothing. An offset at or below the accepted one is a no-op (a retried or reordered
// report) that still renews the lease. When the offset reaches the shard's record count the
// shard is DONE and the lease ends. done asserts that the worker reached the end of the shard:
// it is an ErrBadOffset if offset is not the record count.
func (d *Dispatcher) Report(ctx context.Context, worker string, lease LeaseID, offset int64, done bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkWorker(worker); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.unlock()
	d.c.tick(d.clock.Now())
	return d.c.report(worker, lease, offset, done)
}

// ReportAndAcquire reports the lease's shard done (offset must be its record count) and, if the
// report is accepted, leases the worker's next shard, under one lock: nothing happens between
// the two parts. It is Report(ctx, worker, lease, offset, true) followed by Acquire(ctx,
// worker), with the outcomes and the handling of repeats described at ReportAcquirer: nil or
// ErrNoMoreWork or a *WaitError mean the report was accepted; ErrStaleLease, ErrBadOffset and
// ErrBadWorker mean nothing happened; a repeat of the call that finished the worker's last
// finished lease counts nothing and returns the lease that call granted while the worker still
// holds it. ctx is only checked on entry: the call does not block.
func (d *Dispatcher) ReportAndAcquire(ctx context.Context, worker string, lease LeaseID, offset int64) (Lease, error) {
	if err := ctx.Err(); err != nil {
		return Lease{}, err
	}
	if err := checkWorker(worker); err != nil {
		return Lease{}, err
	}
	d.mu.Lock()
	defer d.unlock()
	d.c.tick(d.clock.Now())
	return d.c.reportAcquire(worker, lease, offset)
}

// Leave is a worker's voluntary exit: its shards go back to TODO at their accepted offsets
// without counting a failure, and the worker is forgotten. Leaving twice, or as an unknown
// worker, is not an error.
func (d *Dispatcher) Leave(ctx context.Context, worker string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkWorker(worker); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.unlock()
	d.c.tick(d.clock.Now())
	d.c.evict(worker, allLeases, false)
	return nil
}

// Evict is the coordinator declaring a worker dead (membership lost it): like Leave, but each
// shard it held counts a failure and may go to FAILED.
func (d *Dispatcher) Evict(worker string) {
	d.mu.Lock()
	defer d.unlock()
	d.c.tick(d.clock.Now())
	d.c.evict(worker, allLeases, true)
}

// Granted returns the sequence number (LeaseID.Seq) of the newest lease granted, 0 before the
// first. It never goes back, across Restore too: a coordinator that declares a worker dead
// notes it, and evicts later with EvictGranted, so that what the worker took after joining
// again stays with it.
func (d *Dispatcher) Granted() uint64 {
	d.mu.Lock()
	defer d.unlock()
	return d.c.seq
}

// EvictGranted is Evict of the worker's leases granted up to seq (Granted's figure when the
// worker was declared dead); its later leases stay, and the worker is forgotten only when it
// holds none. With failure false no shard counts a failure: the worker lost them through no
// fault of theirs (say, a recovery voided the batch it was training).
func (d *Dispatcher) EvictGranted(worker string, seq uint64, failure bool) {
	d.mu.Lock()
	defer d.unlock()
	d.c.tick(d.clock.Now())
	d.c.evict(worker, seq, failure)
}

// Expire revokes the leases whose deadline has passed and returns how many. Every other
// method does this too; a coordinator calls Expire periodically so that Progress and the FAILED
// list stay current while no worker calls.
func (d *Dispatcher) Expire() int {
	d.mu.Lock()
	defer d.unlock()
	if n := d.clock.Now().UnixNano(); n > d.c.now {
		d.c.now = n
	}
	return d.c.expire()
}

// GrowStream tells the dispatcher that partition holds records up to offset end (exclusive).
// Full shards of ShardSize records are cut from the new offsets at once; a partial tail waits
// for more records, FlushStream or SealStream. An end below the current one is ErrBadPartition.
func (d *Dispatcher) GrowStream(partition int, end int64) error {
	d.mu.Lock()
	defer d.unlock()
	c := d.c
	switch {
	case c.kind != KindStream:
		return ErrNotStream
	case c.sealed:
		return ErrStreamSealed
	case partition < 0 || partition >= len(c.parts):
		return fmt.Errorf("%w: partition %d of %d", ErrBadPartition, partition, len(c.parts))
	case end < c.parts[partition].end:
		return fmt.Errorf("%w: partition %d end %d below %d", ErrBadPartition, partition, end, c.parts[partition].end)
	}
	c.tick(d.clock.Now())
	c.parts[partition].end = end
	c.cutStream(partition, false)
	return nil
}

// FlushStream cuts the partial tail of every partition into a shard now, trading a small shard
// for latency.
func (d *Dispatcher) FlushStream() error {
	d.mu.Lock()
	defer d.unlock()
	c := d.c
	if c.kind != KindStream {
		return ErrNotStream
	}
	if c.sealed {
		return ErrStreamSealed
	}
	c.tick(d.clock.Now())
	c.cutTails()
	return nil
}

// SealStream says the stream will not grow any more: tails are cut, and once every shard is
// DONE or FAILED, Acquire returns ErrNoMoreWork. Sealing twice is not an error.
func (d *Dispatcher) SealStream() error {
	d.mu.Lock()
	defer d.unlock()
	c := d.c
	if c.kind != KindStream {
		return ErrNotStream
	}
	if c.sealed {
		return nil
	}
	c.tick(d.clock.Now())
	c.cutTails()
	c.sealed = true
	c.maybeAdvance()
	return nil
}

// ShardCounts counts the shards of the current epoch per state.
type ShardCounts struct {
	Todo, Doing, Done, Failed int
}

// EpochProgress gives the record totals of one started epoch.
type EpochProgress struct {
	Epoch   int
	Records int64 // records in the epoch (for a stream: cut so far)
	Done    int64 // records counted as trained (accepted reports)
	Failed  int64 // records of FAILED shards that were never trained
}

// WorkerProgress describes one known worker. A worker holding no lease and not seen for ten
// lease TTLs is forgotten.
type WorkerProgress struct {
	Worker   string
	Leases   int       // shards held now
	Records  int64     // records counted as trained, all epochs
	Rate     float64   // records per second, exponentially weighted over Config.RateWindow
	LastSeen time.Time // last call by or about the worker
	Expired  int       // leases lost by expiry
	Revoked  int       // leases revoked by the lease limit
	Stale    int       // reports rejected with ErrStaleLease
}

// FailedShard is a shard that reached Config.MaxFailures in an epoch. Its records from Offset
// on were not trained in that epoch.
type FailedShard struct {
	Epoch    int
	Shard    Shard
	Offset   int64
	Failures int
}

// Progress is a point-in-time picture of the dispatcher. Its slices belong to the caller.
type Progress struct {
	Epoch    int  // current epoch
	Epochs   int  // configured epochs
	Finished bool // no more work: Acquire returns ErrNoMoreWork
	Sealed   bool // stream only: SealStream was called
	Shards   ShardCounts
	// EpochRecords holds the record totals of every started epoch, oldest first.
	EpochRecords []EpochProgress
	Workers      []WorkerProgress // by name
	Failed       []FailedShard    // every FAILED shard of every epoch, in the order they failed
	Leases       uint64           // leases granted by this incarnation
	// Partitions gives the growth of each stream partition (nil for other datasets); after a
	// Restore it tells where to resume feeding GrowStream.
	Partitions []PartitionProgress
}

// PartitionProgress is the growth of one stream partition.
type PartitionProgress struct {
	Cut int64 // offsets below Cut are in shards
	End int64 // offsets below End were announced by GrowStream
}

// Progress returns the current figures.
func (d *Dispatcher) Progress() Progress {
	d.mu.Lock()
	defer d.unlock()
	c := d.c
	c.tick(d.clock.Now())
	p := Progress{
		Epoch:    c.epoch,
		Epochs:   c.epochs,
		Finished: c.finished,
		Sealed:   c.sealed,
		Shards:   ShardCounts{Todo: c.nTodo, Doing: c.nDoing, Done: c.nDone, Failed: c.nFailed},
		Failed:   append([]FailedShard(nil), c.failed...),
		Leases:   c.seq,
	}
	for _, ps := range c.parts {
		p.Partitions = append(p.Partitions, PartitionProgress{Cut: ps.cut, End: ps.end})
	}
	for e, s := range c.stats {
		p.EpochRecords = append(p.EpochRecords, EpochProgress{Epoch: e, Records: s.total, Done: s.done, Failed: s.failed})
	}
	for name, w := range c.workers {
		if len(w.leases) == 0 && c.now-w.lastSeen > 10*c.ttl {
			delete(c.workers, name) // gone without Leave or Evict
			continue
		}
		p.Workers = append(p.Workers, WorkerProgress{
			Worker: w.name, Leases: len(w.leases), Records: w.records, Rate: w.rate,
			LastSeen: time.Unix(0, w.lastSeen), Expired: w.expired, Revoked: w.revoked, Stale: w.stale,
		})
	}
	sort.Slice(p.Workers, func(i, j int) bool { return p.Workers[i].Worker < p.Workers[j].Worker })
	return p
}
