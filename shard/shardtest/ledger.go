package shardtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/elasticps/elasticps/shard"
)

// recordKey names one record of one epoch.
type recordKey struct {
	epoch     int
	partition int // streams only
	index     int64
}

// leaseTrack follows one lease seen by the ledger. Tracks of finished leases are kept, so that
// a repeated combined call on one is recognised.
type leaseTrack struct {
	lease    shard.Lease
	worker   string
	accepted int64   // offset accepted so far
	order    []int32 // visiting order when shuffled
}

// Ledger counts, for every epoch and record, how many times an accepted report covered it:
// the exactly-once invariant says every count is one (or zero for the untrained tail of a
// FAILED shard). It watches a Service through Wrap; a lease's report covers the records from
// the offset accepted before it to the offset it reports.
//
// Snapshot pairs a dispatcher snapshot with a copy of the ledger taken at the same instant (the
// ledger's lock is held across every wrapped call), so a restore can be checked too.
//
// The wrapped service's combined call (shard.ReportAcquirer) counts its report part whenever its
// answer says the report was accepted (nil, shard.ErrNoMoreWork or shard.ErrWait), and
// registers the lease it grants. A lease granted again, or a report accepted for a lease the
// ledger never saw granted or saw granted to another worker, is an error Check reports.
type Ledger struct {
	mu       sync.Mutex
	counts   map[recordKey]uint32
	epochs   map[int]int64 // records counted per epoch
	leases   map[shard.LeaseID]*leaseTrack
	dups     []string
	reports  int
	combined int // accepted combined calls
	repeats  int // accepted combined calls on a lease already finished
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{counts: make(map[recordKey]uint32), epochs: make(map[int]int64), leases: make(map[shard.LeaseID]*leaseTrack)}
}

// Clone returns an independent copy of the ledger's counts (without its leases: leases do not
// survive a Restore).
func (l *Ledger) Clone() *Ledger {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cloneLocked()
}

func (l *Ledger) cloneLocked() *Ledger {
	return &Ledger{
		counts:   maps.Clone(l.counts),
		epochs:   maps.Clone(l.epochs),
		leases:   make(map[shard.LeaseID]*leaseTrack),
		dups:     append([]string(nil), l.dups...),
		reports:  l.reports,
		combined: l.combined,
		repeats:  l.repeats,
	}
}

// Snapshot takes d's snapshot and a copy of the ledger at the same instant.
func (l *Ledger) Snapshot(d *shard.Dispatcher) ([]byte, *Ledger) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return d.Snapshot(), l.cloneLocked()
}

// Counted returns the records counted in epoch.
func (l *Ledger) Counted(epoch int) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epochs[epoch]
}

// Count returns how many accepted reports covered a record (partition is 0 except for streams).
func (l *Ledger) Count(epoch, partition int, index int64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.counts[recordKey{epoch, partition, index}])
}

// Reports returns the number of accepted reports seen.
func (l *Ledger) Reports() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reports
}

// Combined returns the number of combined calls whose report part was accepted, and how many
// of them repeated a call that had already finished its lease (a retry after a lost answer).
func (l *Ledger) Combined() (calls, repeats int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.combined, l.repeats
}

// Check verifies the exactly-once invariant against the dispatcher's figures: no record was
// counted twice, every epoch's counted records equal the records the dispatcher counts as done,
// and every epoch before the current one (every epoch, once finished) has each record either
// done or lost in a FAILED shard.
func (l *Ledger) Check(p shard.Progress) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.dups) > 0 {
		return fmt.Errorf("%d violations (records trained twice, leases granted twice), first: %s", len(l.dups), l.dups[0])
	}
	for _, e := range p.EpochRecords {
		if got := l.epochs[e.Epoch]; got != e.Done {
			return fmt.Errorf("epoch %d: ledger counted %d records, dispatcher %d", e.Epoch, got, e.Done)
		}
		if (e.Epoch < p.Epoch || p.Finished) && e.Done+e.Failed != e.Records {
			return fmt.Errorf("epoch %d finished with %d done + %d failed of %d records", e.Epoch, e.Done, e.Failed, e.Records)
		}
	}
	for e := range l.epochs {
		if e >= len(p.EpochRecords) && l.epochs[e] > 0 {
			return fmt.Errorf("ledger counted records in epoch %d, dispatcher is in epoch %d", e, p.Epoch)
		}
	}
	return nil
}

// Wrap returns a Service that forwards to svc and counts every accepted report. It implements
// shard.ReportAcquirer too, passing the combined call on with shard.ReportAndAcquire.
func (l *Ledger) Wrap(svc shard.Service) shard.Service { return &ledgerService{l: l, svc: svc} }

type ledgerService struct {
	l   *Ledger
	svc shard.Service
}

var (
	_ shard.ReportAcquirer = (*ledgerService)(nil)
	_ shard.ShardAwaiter   = (*ledgerService)(nil)
)

// AwaitShard passes the wait on (shard.AwaitShard); it counts nothing.
func (s *ledgerService) AwaitShard(ctx context.Context) error { return shard.AwaitShard(ctx, s.svc) }

func (s *ledgerService) Acquire(ctx context.Context, worker string) (shard.Lease, error) {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	lease, err := s.svc.Acquire(ctx, worker)
	if err == nil {
		s.l.grantLocked(worker, lease, false)
	}
	return lease, err
}

func (s *ledgerService) Report(ctx context.Context, worker string, id shard.LeaseID, offset int64, done bool) error {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	err := s.svc.Report(ctx, worker, id, offset, done)
	if err == nil {
		s.l.countLocked(worker, id, offset)
	}
	return err
}

func (s *ledgerService) ReportAndAcquire(ctx context.Context, worker string, id shard.LeaseID, offset int64) (shard.Lease, error) {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	lease, err := shard.ReportAndAcquire(ctx, s.svc, worker, id, offset)
	if err == nil || errors.Is(err, shard.ErrNoMoreWork) || errors.Is(err, shard.ErrWait) {
		s.l.combined++
		if t := s.l.leases[id]; t != nil && t.accepted == t.lease.Shard.Records {
			s.l.repeats++
		}
		s.l.countLocked(worker, id, offset)
	}
	if err == nil {
		s.l.grantLocked(worker, lease, true)
	}
	return lease, err
}

func (s *ledgerService) Leave(ctx context.Context, worker string) error {
	return s.svc.Leave(ctx, worker)
}

// grantLocked registers a granted lease. A combined call may return a lease it granted before
// (a repeat), to the same worker.
func (l *Ledger) grantLocked(worker string, lease shard.Lease, combined bool) {
	if t := l.leases[lease.ID]; t != nil {
		if !combined || t.worker != worker || t.lease.Shard != lease.Shard || t.lease.Epoch != lease.Epoch {
			l.violationLocked(fmt.Sprintf("lease %v granted again (to %s, first to %s)", lease.ID, worker, t.worker))
		}
		return
	}
	t := &leaseTrack{lease: lease, worker: worker, accepted: lease.Offset}
	if lease.ShuffleSeed != 0 {
		t.order = shard.RecordOrder(lease.ShuffleSeed, lease.Shard.Records)
	}
	l.leases[lease.ID] = t
}

// countLocked counts the records an accepted report of worker covers.
func (l *Ledger) countLocked(worker string, id shard.LeaseID, offset int64) {
	t := l.leases[id]
	if t == nil || t.worker != worker {
		l.violationLocked(fmt.Sprintf("report of %s accepted for lease %v the ledger never saw granted to it", worker, id))
		return
	}
	l.reports++
	sh := t.lease.Shard
	for pos := t.accepted; pos < offset; pos++ {
		rec := pos
		if t.order != nil {
			rec = int64(t.order[pos])
		}
		k := recordKey{epoch: t.lease.Epoch, index: sh.Global(rec)}
		if sh.Kind == shard.KindStream {
			k.partition = sh.Partition
		}
		l.counts[k]++
		l.epochs[t.lease.Epoch]++
		if l.counts[k] > 1 {
			l.violationLocked(fmt.Sprintf("epoch %d partition %d record %d (lease %v, worker %s)", k.epoch, k.partition, k.index, id, worker))
		}
	}
	t.accepted = max(t.accepted, offset)
	if t.accepted == sh.Records {
		t.order = nil // finished: kept only to recognise repeats
	}
}

func (l *Ledger) violationLocked(what string) {
	if len(l.dups) < 100 {
		l.dups = append(l.dups, what)
	}
}
