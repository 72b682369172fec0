package shard

import (
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/cespare/xxhash/v2"
)

// shardState is where a shard of the current epoch is.
type shardState uint8

const (
	stTodo shardState = iota
	stDoing
	stDone
	stFailed
)

// workerState is what the dispatcher knows about one worker.
type workerState struct {
	name      string
	leases    []int32 // shard indices held, oldest first
	records   int64   // accepted records, all epochs
	rate      float64 // EWMA of records per second
	acc       int64   // records accepted since rateAt
	rateAt    int64   // unix nanos of the last rate update (0: none yet)
	firstSeen int64
	lastSeen  int64
	expired   int // leases lost by expiry
	revoked   int // leases revoked by the lease limit
	stale     int // reports rejected with ErrStaleLease

	// lastDone is the lease this worker most recently finished by its own report (Seq 0:
	// none), and lastGrant the lease the ReportAndAcquire that finished it granted (Seq 0:
	// none): a repeat of that call is answered from them.
	lastDone  LeaseID
	lastGrant LeaseID
}

// epochStats are the record totals of one epoch.
type epochStats struct {
	total, done, failed int64
}

// partState is the growth of one stream partition.
type partState struct {
	cut int64 // offsets below cut are in shards
	end int64 // offsets below end exist
}

// core is the dispatcher's state machine: no I/O, no locking, no clock of its own. Every
// transition gets the current time through tick. Dispatcher wraps it with a mutex.
type core struct {
	// Fixed at construction.
	kind           Kind
	shardSize      int64
	epochs         int
	seed           uint64
	shuffle        bool
	shuffleRecords bool
	ttl            int64 // nanoseconds
	maxFailures    int
	maxLeases      int
	retryAfter     time.Duration
	rateWindow     float64 // seconds
	incarnation    uint64
	fingerprint    uint64
	log            *slog.Logger

	now            int64  // unix nanos, never decreasing
	seq            uint64 // last lease Seq granted
	seqIncarnation uint64 // incarnation seq was counted in (differs after Restore of another's snapshot)

	// Shard table and per-shard state of the current epoch, indexed by shard index.
	shards   []Shard
	st       []shardState
	off      []int64  // accepted offset
	fails    []uint32 // failures this epoch
	leaseSeq []uint64 // Seq of the current lease, 0 when not DOING
	holder   []*workerState
	deadline []int64 // unix nanos
	prev     []int32 // expiry list (DOING shards by deadline), -1 ends
	next     []int32
	head     int32
	tail     int32

	epoch     int
	finished  bool
	fresh     []int32 // this epoch's order; fresh[freshHead:] not yet handed out
	freshHead int
	retry     []int32 // shards handed back, taken first (last in, first out)
	nTodo     int
	nDoing    int
	nDone     int
	nFailed   int
	stats     []epochStats // one per started epoch
	failed    []FailedShard

	workers map[string]*workerState

	parts  []partState
	sealed bool
}

func newCore(cfg Config, incarnation uint64, log *slog.Logger) *core {
	c := &core{
		kind:           cfg.Dataset.Kind,
		shardSize:      cfg.ShardSize,
		epochs:         cfg.Epochs,
		seed:           cfg.Seed,
		shuffle:        cfg.Shuffle && cfg.Dataset.Kind != KindStream,
		shuffleRecords: cfg.ShuffleRecords,
		ttl:            int64(cfg.LeaseTTL),
		maxFailures:    cfg.MaxFailures,
		maxLeases:      cfg.MaxLeasesPerWorker,
		retryAfter:     cfg.RetryAfter,
		rateWindow:     cfg.RateWindow.Seconds(),
		incarnation:    incarnation,
		seqIncarnation: incarnation,
		log:            log,
		head:           -1,
		tail:           -1,
		workers:        make(map[string]*workerState),
	}
	ds := cfg.Dataset
	switch ds.Kind {
	case KindIndexed:
		for start := int64(0); start < ds.Records; start += c.shardSize {
			end := min(start+c.shardSize, ds.Records)
			c.addShard(Shard{Kind: KindIndexed, Start: start, End: end, Records: end - start, Base: start})
		}
	case KindText:
		var base int64
		for _, s := range ds.Text {
			s.Base = base
			base += s.Records
			c.addShard(s)
		}
	case KindStream:
		c.parts = make([]partState, ds.Partitions)
		for p := range c.parts {
			if p < len(ds.StreamStart) {
				c.parts[p] = partState{cut: ds.StreamStart[p], end: ds.StreamStart[p]}
			}
		}
	}
	c.fingerprint = fingerprint(cfg)
	return c
}

// fingerprint identifies what a snapshot's shard numbering and orders depend on.
func fingerprint(cfg Config) uint64 {
	h := xxhash.New()
	var b []byte
	ds := cfg.Dataset
	shuffle := cfg.Shuffle && ds.Kind != KindStream
	b = fmt.Appendf(b, "kind=%d seed=%d shuffle=%t records-shuffle=%t\n", ds.Kind, cfg.Seed, shuffle, cfg.ShuffleRecords)
	switch ds.Kind {
	case KindIndexed:
		b = fmt.Appendf(b, "records=%d size=%d\n", ds.Records, cfg.ShardSize)
	case KindText:
		for _, s := range ds.Text {
			b = fmt.Appendf(b, "%q %d %d %d %d\n", s.File, s.Start, s.End, s.Records, s.Line)
			if len(b) > 1<<16 {
				_, _ = h.Write(b)
				b = b[:0]
			}
		}
	case KindStream:
		b = fmt.Appendf(b, "partitions=%d size=%d starts=%v\n", ds.Partitions, cfg.ShardSize, ds.StreamStart)
	}
	_, _ = h.Write(b)
	return h.Sum64()
}

// addShard appends a shard to the table as TODO of the current epoch (without queueing it).
func (c *core) addShard(s Shard) int32 {
	i := int32(len(c.shards))
	s.Index = int(i)
	c.shards = append(c.shards, s)
	c.st = append(c.st, stTodo)
	c.off = append(c.off, 0)
	c.fails = append(c.fails, 0)
	c.leaseSeq = append(c.leaseSeq, 0)
	c.holder = append(c.holder, nil)
	c.deadline = append(c.deadline, 0)
	c.prev = append(c.prev, -1)
	c.next = append(c.next, -1)
	return i
}

// startEpoch resets every shard to TODO for epoch e and queues them in the epoch's order.
func (c *core) startEpoch(e int) {
	c.epoch = e
	n := len(c.shards)
	var total int64
	if cap(c.fresh) < n {
		c.fresh = make([]int32, n)
	}
	c.fresh = c.fresh[:n]
	for i := range c.shards {
		c.st[i] = stTodo
		c.off[i] = 0
		c.fails[i] = 0
		c.fresh[i] = int32(i)
		total += c.shards[i].Records
	}
	if c.shuffle {
		shuffleInt32(c.fresh, epochSeed(c.seed, e))
	}
	c.freshHead = 0
	c.retry = c.retry[:0]
	c.nTodo, c.nDoing, c.nDone, c.nFailed = n, 0, 0, 0
	c.stats = append(c.stats, epochStats{total: total})
	if e > 0 {
		c.log.Info("shard: epoch started", "epoch", e, "shards", n)
	}
}

// tick moves the core's clock forward to t (never back) and expires overdue leases.
func (c *core) tick(t time.Time) {
	if n := t.UnixNano(); n > c.now {
		c.now = n
	}
	c.expire()
}

// expire revokes every lease whose deadline has passed and returns how many.
func (c *core) expire() int {
	n := 0
	for c.head >= 0 && c.deadline[c.head] <= c.now {
		s := c.head
		w := c.holder[s]
		w.expired++
		c.log.Info("shard: lease expired", "worker", w.name, "shard", s, "epoch", c.epoch, "offset", c.off[s])
		c.revoke(s, true)
		n++
	}
	return n
}

func (c *core) unlink(s int32) {
	p, n := c.prev[s], c.next[s]
	if p >= 0 {
		c.next[p] = n
	} else {
		c.head = n
	}
	if n >= 0 {
		c.prev[n] = p
	} else {
		c.tail = p
	}
	c.prev[s], c.next[s] = -1, -1
}

func (c *core) pushBack(s int32) {
	c.prev[s], c.next[s] = c.tail, -1
	if c.tail >= 0 {
		c.next[c.tail] = s
	} else {
		c.head = s
	}
	c.tail = s
}

func (c *core) worker(name string) *workerState {
	w := c.workers[name]
	if w == nil {
		w = &workerState{name: name, firstSeen: c.now}
		c.workers[name] = w
	}
	return w
}

// popTodo takes the next shard to hand out: a handed-back shard first, else the epoch's order.
func (c *core) popTodo() (int32, bool) {
	if n := len(c.retry); n > 0 {
		s := c.retry[n-1]
		c.retry = c.retry[:n-1]
		return s, true
	}
	if c.freshHead < len(c.fresh) {
		s := c.fresh[c.freshHead]
		c.freshHead++
		if c.freshHead >= 4096 && 2*c.freshHead >= len(c.fresh) {
			// A stream appends to fresh for ever: drop the consumed prefix now and then.
			c.fresh = c.fresh[:copy(c.fresh, c.fresh[c.freshHead:])]
			c.freshHead = 0
		}
		return s, true
	}
	return 0, false
}

// available reports whether acquire would grant a lease or end the work (to a worker under
// its lease limit).
func (c *core) available() bool {
	return c.finished || len(c.retry) > 0 || c.freshHead < len(c.fresh)
}

func (c *core) acquire(name string) (Lease, error) {
	w := c.worker(name)
	w.lastSeen = c.now
	if w.rateAt == 0 {
		w.rateAt = c.now
	}
	if !c.finished && len(w.leases) >= c.maxLeases {
		s := w.leases[0]
		w.revoked++
		c.log.Info("shard: lease revoked, worker over its lease limit", "worker", name, "shard", s, "epoch", c.epoch)
		c.revoke(s, true)
	}
	if c.finished {
		return Lease{}, ErrNoMoreWork
	}
	s, ok := c.popTodo()
	if !ok {
		return Lease{}, &WaitError{RetryAfter: c.waitHint()}
	}
	c.seq++
	c.st[s] = stDoing
	c.nTodo--
	c.nDoing++
	c.leaseSeq[s] = c.seq
	c.holder[s] = w
	c.deadline[s] = c.now + c.ttl
	c.pushBack(s)
	w.leases = append(w.leases, s)
	return c.leaseOf(s), nil
}

// leaseOf describes the current lease of shard s (DOING).
func (c *core) leaseOf(s int32) Lease {
	l := Lease{
		ID:     LeaseID{Incarnation: c.incarnation, Seq: c.leaseSeq[s], Shard: uint32(s)},
		Epoch:  c.epoch,
		Shard:  c.shards[s],
		Offset: c.off[s],
		TTL:    time.Duration(c.ttl),
	}
	if c.shuffleRecords {
		l.ShuffleSeed = recordSeed(c.seed, c.epoch, int(s))
	}
	return l
}

// holds reports whether id is the current lease of its shard and held by the named worker.
func (c *core) holds(name string, id LeaseID) bool {
	s := int32(id.Shard)
	return id.Incarnation == c.incarnation && id.Shard < uint32(len(c.shards)) &&
		c.st[s] == stDoing && c.leaseSeq[s] == id.Seq && c.holder[s].name == name
}

// renew moves the deadline of shard s (DOING) to a TTL from now.
func (c *core) renew(s int32) {
	c.deadline[s] = c.now + c.ttl
	c.unlink(s)
	c.pushBack(s)
}

func (c *core) report(name string, id LeaseID, offset int64, done bool) error {
	s := int32(id.Shard)
	if !c.holds(name, id) {
		if w := c.workers[name]; w != nil {
			w.stale++
			w.lastSeen = c.now
		}
		return fmt.Errorf("%w: %v of worker %q is not current", ErrStaleLease, id, name)
	}
	records := c.shards[s].Records
	if offset < 0 || offset > records || (done && offset != records) {
		return fmt.Errorf("%w: offset %d (done=%t) for shard %d of %d records", ErrBadOffset, offset, done, s, records)
	}
	w := c.holder[s]
	w.lastSeen = c.now
	if delta := offset - c.off[s]; delta > 0 {
		c.off[s] = offset
		c.stats[len(c.stats)-1].done += delta
		w.records += delta
		c.observeRate(w, delta)
	}
	if c.off[s] == records {
		c.unlink(s)
		c.dropLease(w, s)
		c.st[s] = stDone
		c.nDoing--
		c.nDone++
		w.lastDone, w.lastGrant = id, LeaseID{}
		c.maybeAdvance()
		return nil
	}
	c.renew(s)
	return nil
}

// reportAcquire is report(done) followed, if accepted, by acquire; or, for a repeat of the
// call that finished the worker's last finished lease, the answer that call would give now.
func (c *core) reportAcquire(name string, id LeaseID, offset int64) (Lease, error) {
	if w := c.workers[name]; w != nil && w.lastDone.Seq != 0 && id == w.lastDone {
		s := int32(id.Shard)
		if records := c.shards[s].Records; offset != records {
			return Lease{}, fmt.Errorf("%w: offset %d (done=true) for shard %d of %d records", ErrBadOffset, offset, s, records)
		}
		w.lastSeen = c.now
		if g := w.lastGrant; g.Seq != 0 && c.holds(name, g) {
			c.renew(int32(g.Shard))
			return c.leaseOf(int32(g.Shard)), nil
		}
		l, err := c.acquire(name)
		w.lastGrant = l.ID
		return l, err
	}
	if err := c.report(name, id, offset, true); err != nil {
		return Lease{}, err
	}
	l, err := c.acquire(name)
	c.workers[name].lastGrant = l.ID
	return l, err
}

// minEstimatedWait is the least wait waitHint suggests from its estimate of when the shards
// being trained are done, which lags behind the reports it is made of.
const minEstimatedWait = 10 * time.Millisecond

// waitHint is how long a worker that finds no shard to lease should wait before it asks again:
// RetryAfter, cut to the earliest lease deadline (its shard may come back then) and, for data
// that is not a stream, to when the shards being trained are estimated done at their holders'
// speeds (then the epoch ends and the next one's shards are leased), so that a worker waiting at
// an epoch's end does not sleep through the start of the next.
func (c *core) waitHint() time.Duration {
	wait := c.retryAfter
	if c.head < 0 {
		return max(wait, time.Millisecond)
	}
	wait = min(wait, time.Duration(c.deadline[c.head]-c.now))
	if c.kind != KindStream {
		left := map[*workerState]int64{} // records each holder has left to train
		for s := c.head; s >= 0; s = c.next[s] {
			left[c.holder[s]] += c.shards[s].Records - c.off[s]
		}
		var done float64 // seconds until the last holder is estimated done
		for w, n := range left {
			if w.rate <= 0 {
				done = math.Inf(1) // no estimate yet
				break
			}
			done = max(done, float64(n)/w.rate)
		}
		if est := time.Duration(done * 1e9); done < math.Inf(1) && est < wait {
			wait = max(est, minEstimatedWait)
		}
	}
	return max(wait, time.Millisecond)
}

// observeRate folds n newly accepted records into the worker's speed estimate.
func (c *core) observeRate(w *workerState, n int64) {
	w.acc += n
	dt := float64(c.now-w.rateAt) / 1e9
	if dt <= 0 {
		return
	}
	inst := float64(w.acc) / dt
	if w.rate == 0 {
		w.rate = inst
	} else {
		alpha := 1 - math.Exp(-dt/c.rateWindow)
		w.rate += alpha * (inst - w.rate)
	}
	w.acc = 0
	w.rateAt = c.now
}

// dropLease forgets shard s in the worker's lease list and clears the shard's lease.
func (c *core) dropLease(w *workerState, s int32) {
	for i, x := range w.leases {
		if x == s {
			w.leases = append(w.leases[:i], w.leases[i+1:]...)
			break
		}
	}
	c.holder[s] = nil
	c.leaseSeq[s] = 0
}

// revoke takes shard s (DOING) away from its holder. It goes back to TODO at its accepted
// offset, or to FAILED when failure is set and the shard has now failed maxFailures times.
func (c *core) revoke(s int32, failure bool) {
	c.unlink(s)
	c.dropLease(c.holder[s], s)
	c.nDoing--
	if failure {
		c.fails[s]++
		if int(c.fails[s]) >= c.maxFailures {
			c.st[s] = stFailed
			c.nFailed++
			rest := c.shards[s].Records - c.off[s]
			c.stats[len(c.stats)-1].failed += rest
			c.failed = append(c.failed, FailedShard{Epoch: c.epoch, Shard: c.shards[s], Offset: c.off[s], Failures: int(c.fails[s])})
			c.log.Warn("shard: shard failed", "shard", s, "epoch", c.epoch, "offset", c.off[s], "failures", c.fails[s], "records_lost", rest)
			c.maybeAdvance()
			return
		}
	}
	c.st[s] = stTodo
	c.nTodo++
	c.retry = append(c.retry, s)
}

// allLeases is an evict bound above every lease: Leave and Evict take them all.
const allLeases = ^uint64(0)

// evict revokes the leases of worker name granted up to seq, each counting a failure with
// failure, and forgets the worker once it holds none.
func (c *core) evict(name string, seq uint64, failure bool) {
	w := c.workers[name]
	if w == nil {
		return
	}
	for i := 0; i < len(w.leases); {
		if s := w.leases[i]; c.leaseSeq[s] <= seq {
			c.revoke(s, failure) // drops it from w.leases
			continue
		}
		i++
	}
	if len(w.leases) == 0 {
		delete(c.workers, name)
	}
}

// maybeAdvance starts the next epoch, or finishes, when the current epoch has no TODO or DOING
// shard left.
func (c *core) maybeAdvance() {
	if c.finished || c.nTodo > 0 || c.nDoing > 0 {
		return
	}
	if c.kind == KindStream {
		if c.sealed {
			c.finished = true
			c.log.Info("shard: stream finished")
		}
		return
	}
	if c.epoch+1 < c.epochs {
		c.startEpoch(c.epoch + 1)
		return
	}
	c.finished = true
	c.log.Info("shard: all epochs finished", "epochs", c.epochs)
}

// cutTails cuts the partial tail of every partition into a shard.
func (c *core) cutTails() {
	for p := range c.parts {
		c.cutStream(p, true)
	}
}

// cutStream cuts partition p into shards: full shards only, or also the partial tail.
func (c *core) cutStream(p int, tail bool) {
	ps := &c.parts[p]
	for ps.end-ps.cut >= c.shardSize || (tail && ps.end > ps.cut) {
		end := min(ps.cut+c.shardSize, ps.end)
		s := c.addShard(Shard{Kind: KindStream, Partition: p, Start: ps.cut, End: end, Records: end - ps.cut, Base: ps.cut})
		ps.cut = end
		c.fresh = append(c.fresh, s)
		c.nTodo++
		c.stats[len(c.stats)-1].total += c.shards[s].Records
	}
}
