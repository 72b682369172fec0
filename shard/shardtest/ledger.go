package shardtest

import (
	"context"
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

// leaseTrack follows one lease seen by the ledger.
type leaseTrack struct {
	lease    shard.Lease
	accepted int64   // offset accepted so far
	order    []int32 // visiting order when shuffled
}

// Ledger counts, for every epoch and record, how many times an accepted report covered it:
// the exactly-once invariant says every count is one (or zero for the untrained tail of a
// FAILED shard). It watches a Service through Wrap; a lease's report covers the records from
// the offset accepted before it to the offset it reports.
//
// Snapshot pairs a dispatcher snapshot with a copy of the ledger taken at the same instant (the
// ledger's lock is held across every wrapped Report), so a restore can be checked too.
type Ledger struct {
	mu      sync.Mutex
	counts  map[recordKey]uint32
	epochs  map[int]int64 // records counted per epoch
	leases  map[shard.LeaseID]*leaseTrack
	dups    []string
	reports int
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
		counts:  maps.Clone(l.counts),
		epochs:  maps.Clone(l.epochs),
		leases:  make(map[shard.LeaseID]*leaseTrack),
		dups:    append([]string(nil), l.dups...),
		reports: l.reports,
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

// Check verifies the exactly-once invariant against the dispatcher's figures: no record was
// counted twice, every epoch's counted records equal the records the dispatcher counts as done,
// and every epoch before the current one (every epoch, once finished) has each record either
// done or lost in a FAILED shard.
func (l *Ledger) Check(p shard.Progress) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.dups) > 0 {
		return fmt.Errorf("%d records trained twice, first: %s", len(l.dups), l.dups[0])
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

// Wrap returns a Service that forwards to svc and counts every accepted report.
func (l *Ledger) Wrap(svc shard.Service) shard.Service { return &ledgerService{l: l, svc: svc} }

type ledgerService struct {
	l   *Ledger
	svc shard.Service
}

func (s *ledgerService) Acquire(ctx context.Context, worker string) (shard.Lease, error) {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	lease, err := s.svc.Acquire(ctx, worker)
	if err == nil {
		t := &leaseTrack{lease: lease, accepted: lease.Offset}
		if lease.ShuffleSeed != 0 {
			t.order = shard.RecordOrder(lease.ShuffleSeed, lease.Shard.Records)
		}
		s.l.leases[lease.ID] = t
	}
	return lease, err
}

func (s *ledgerService) Report(ctx context.Context, worker string, id shard.LeaseID, offset int64, done bool) error {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	err := s.svc.Report(ctx, worker, id, offset, done)
	if err != nil {
		return err
	}
	t := s.l.leases[id]
	if t == nil {
		s.l.dups = append(s.l.dups, fmt.Sprintf("report accepted for lease %v the ledger never saw granted", id))
		return nil
	}
	s.l.reports++
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
		s.l.counts[k]++
		s.l.epochs[t.lease.Epoch]++
		if s.l.counts[k] > 1 && len(s.l.dups) < 100 {
			s.l.dups = append(s.l.dups, fmt.Sprintf("epoch %d partition %d record %d (lease %v, worker %s)", k.epoch, k.partition, k.index, id, worker))
		}
	}
	t.accepted = max(t.accepted, offset)
	if t.accepted == sh.Records {
		delete(s.l.leases, id)
	}
	return nil
}

func (s *ledgerService) Leave(ctx context.Context, worker string) error {
	return s.svc.Leave(ctx, worker)
}
