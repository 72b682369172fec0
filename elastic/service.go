package elastic

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// ledgerService is the coordinator's dispatcher as workers reach it (Coordinator.Service). A
// worker's call is a sign of life (one waiting for shards at an epoch's end is not silent).
// Every progress report the dispatcher accepts marks, in the same critical section, the dataset
// positions it newly covers in the exactly-once ledger. A position therefore counts when, and
// only when, the data position saved with a checkpoint moves past it; the ledger is kept apart
// from the dispatcher's own bookkeeping, so a position accepted twice (across leases, epochs or
// a restore) or never accepted in a finished epoch shows in ExactlyOnce.
type ledgerService struct {
	c *Coordinator

	// mu orders reports with the snapshot of the dispatcher and the ledger (Coordinator.snapshot),
	// and guards the ledger.
	mu       sync.Mutex
	ledger   *ledger
	leases   map[shard.LeaseID]leaseMark
	accepted map[ps.DataShard]int64 // offsets accepted per shard of the current data epochs
}

// leaseMark is what the ledger knows of a lease granted through the service.
type leaseMark struct {
	worker string
	shard  uint32
	epoch  int
	base   int64 // dataset index of the shard's first position
	offset int64 // positions before it are marked
}

var (
	_ shard.Service        = (*ledgerService)(nil)
	_ shard.ReportAcquirer = (*ledgerService)(nil)
	_ shard.ShardAwaiter   = (*ledgerService)(nil)
)

func newLedgerService(c *Coordinator) *ledgerService {
	return &ledgerService{c: c, ledger: newLedger(), leases: map[shard.LeaseID]leaseMark{}, accepted: map[ps.DataShard]int64{}}
}

func (s *ledgerService) grantedLocked(worker string, l shard.Lease) {
	s.leases[l.ID] = leaseMark{worker: worker, shard: l.ID.Shard, epoch: l.Epoch, base: l.Shard.Base, offset: l.Offset}
}

// acceptedLocked marks the positions of lease id up to offset.
func (s *ledgerService) acceptedLocked(id shard.LeaseID, offset int64, done bool) {
	m, ok := s.leases[id]
	if !ok {
		return
	}
	if offset > m.offset {
		s.ledger.noteShard(m.shard, m.base)
		s.ledger.mark(m.epoch, m.base+m.offset, m.base+offset)
		m.offset = offset
		s.leases[id] = m
		k := ps.DataShard{Epoch: uint32(m.epoch), Shard: m.shard}
		s.accepted[k] = max(s.accepted[k], offset)
	}
	if done {
		delete(s.leases, id)
	}
}

// errDispatcherClosed answers the dispatcher calls that reach a closed coordinator: its
// dispatcher is gone with it, and retrying cannot help (an in-process job whose coordinator restarts
// sends them to the next one).
var errDispatcherClosed = fmt.Errorf("%w: its dispatcher is gone with it (%w)", ErrClosed, shard.ErrPermanent)

// closed refuses the calls that reach a closed coordinator.
func (s *ledgerService) closed() error {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.c.closed {
		return errDispatcherClosed
	}
	return nil
}

// Acquire implements shard.Service.
func (s *ledgerService) Acquire(ctx context.Context, worker string) (shard.Lease, error) {
	if err := s.closed(); err != nil {
		return shard.Lease{}, err
	}
	s.c.heardFrom(worker)
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.c.disp.Acquire(ctx, worker)
	if err == nil {
		s.grantedLocked(worker, l)
	}
	return l, err
}

// Report implements shard.Service.
func (s *ledgerService) Report(ctx context.Context, worker string, lease shard.LeaseID, offset int64, done bool) error {
	if err := s.closed(); err != nil {
		return err
	}
	s.c.heardFrom(worker)
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.c.disp.Report(ctx, worker, lease, offset, done)
	switch {
	case err == nil:
		s.acceptedLocked(lease, offset, done)
	case errors.Is(err, shard.ErrStaleLease):
		delete(s.leases, lease)
	}
	return err
}

// ReportAndAcquire implements shard.ReportAcquirer.
func (s *ledgerService) ReportAndAcquire(ctx context.Context, worker string, lease shard.LeaseID, offset int64) (shard.Lease, error) {
	if err := s.closed(); err != nil {
		return shard.Lease{}, err
	}
	s.c.heardFrom(worker)
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.c.disp.ReportAndAcquire(ctx, worker, lease, offset)
	var wait *shard.WaitError
	switch {
	case err == nil:
		s.acceptedLocked(lease, offset, true)
		s.grantedLocked(worker, l)
	case errors.Is(err, shard.ErrNoMoreWork), errors.As(err, &wait):
		s.acceptedLocked(lease, offset, true)
	case errors.Is(err, shard.ErrStaleLease):
		delete(s.leases, lease)
	}
	return l, err
}

// AwaitShard implements shard.ShardAwaiter: the dispatcher's, ended by the coordinator's
// Close too. A worker waiting in it holds no lock.
func (s *ledgerService) AwaitShard(ctx context.Context) error {
	if err := s.closed(); err != nil {
		return err
	}
	ctx, cancel := s.c.untilClosed(ctx)
	defer cancel()
	err := s.c.disp.AwaitShard(ctx)
	if cerr := s.closed(); err != nil && cerr != nil {
		return cerr
	}
	return err
}

// Leave implements shard.Service.
func (s *ledgerService) Leave(ctx context.Context, worker string) error {
	if err := s.closed(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.c.disp.Leave(ctx, worker)
	if err == nil {
		s.forgetLocked(worker)
	}
	return err
}

// forgetLocked drops the leases of worker (it left or was evicted).
func (s *ledgerService) forgetLocked(worker string) {
	for id, m := range s.leases {
		if m.worker == worker {
			delete(s.leases, id)
		}
	}
}

// evict evicts worker from the dispatcher: its leases granted up to granted go back at their
// reported offsets, each counting a failure of its shard when failure is set.
func (s *ledgerService) evict(worker string, granted uint64, failure bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evictLocked(worker, granted, failure)
}

func (s *ledgerService) evictLocked(worker string, granted uint64, failure bool) {
	s.c.disp.EvictGranted(worker, granted, failure)
	for id, m := range s.leases {
		if m.worker == worker && id.Seq <= granted {
			delete(s.leases, id)
		}
	}
}

// snapshot returns the dispatcher's and the ledger's states, taken together, and how far the
// data is done at that moment.
func (s *ledgerService) snapshot() (disp, ledger []byte, done Progress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	done.Epoch = uint32(s.c.disp.Progress().Epoch)
	for k := range s.accepted {
		if k.Epoch < done.Epoch {
			delete(s.accepted, k) // a finished epoch is done as a whole
		}
	}
	done.Offsets = maps.Clone(s.accepted)
	return s.c.disp.Snapshot(), s.ledger.encode(), done
}

// restore replaces the dispatcher's and the ledger's states; every lease ends.
func (s *ledgerService) restore(disp []byte, l *ledger) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.c.disp.Restore(disp); err != nil {
		return err
	}
	s.ledger = l
	clear(s.leases)
	clear(s.accepted)
	return nil
}
