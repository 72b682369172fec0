package shardtest

import (
	"context"
	"errors"
	"sync"

	"github.com/elasticps/elasticps/shard"
)

// ErrUnavailable is returned by a Flaky service while it is down or failing calls on purpose.
var ErrUnavailable = errors.New("shardtest: dispatcher unavailable")

// Flaky wraps a shard.Service and fails calls on demand, to play a dispatcher that is down,
// restarting or unreachable. The wrapped service can be swapped (a restarted dispatcher).
type Flaky struct {
	mu       sync.Mutex
	svc      shard.Service
	down     bool
	failNext int
	calls    int
	failed   int
}

var _ shard.Service = (*Flaky)(nil)

// NewFlaky wraps svc.
func NewFlaky(svc shard.Service) *Flaky { return &Flaky{svc: svc} }

// SetDown makes every call fail with ErrUnavailable (down) or pass through again.
func (f *Flaky) SetDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

// FailNext makes the next n calls fail with ErrUnavailable.
func (f *Flaky) FailNext(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext = n
}

// Swap replaces the wrapped service.
func (f *Flaky) Swap(svc shard.Service) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.svc = svc
}

// Calls returns the number of calls made and how many of them failed on purpose.
func (f *Flaky) Calls() (calls, failed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, f.failed
}

// pick returns the service to call, or nil when this call must fail.
func (f *Flaky) pick() shard.Service {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down || f.failNext > 0 {
		if f.failNext > 0 {
			f.failNext--
		}
		f.failed++
		return nil
	}
	return f.svc
}

// Acquire implements shard.Service.
func (f *Flaky) Acquire(ctx context.Context, worker string) (shard.Lease, error) {
	svc := f.pick()
	if svc == nil {
		return shard.Lease{}, ErrUnavailable
	}
	return svc.Acquire(ctx, worker)
}

// Report implements shard.Service.
func (f *Flaky) Report(ctx context.Context, worker string, lease shard.LeaseID, offset int64, done bool) error {
	svc := f.pick()
	if svc == nil {
		return ErrUnavailable
	}
	return svc.Report(ctx, worker, lease, offset, done)
}

// Leave implements shard.Service.
func (f *Flaky) Leave(ctx context.Context, worker string) error {
	svc := f.pick()
	if svc == nil {
		return ErrUnavailable
	}
	return svc.Leave(ctx, worker)
}
