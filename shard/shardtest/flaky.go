package shardtest

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"

	"github.com/elasticps/elasticps/shard"
)

// ErrUnavailable is returned by a Flaky service while it is down or failing calls on purpose.
var ErrUnavailable = errors.New("shardtest: dispatcher unavailable")

// Flaky wraps a shard.Service and fails calls on demand, to play a dispatcher that is down,
// restarting or unreachable. A call can fail before it reaches the wrapped service (the request
// was lost: nothing happened) or after (the answer was lost: the call took effect, the caller
// gets ErrUnavailable). The wrapped service can be swapped (a restarted dispatcher).
//
// Flaky implements shard.ReportAcquirer by passing the combined call on with
// shard.ReportAndAcquire: it combines exactly when the wrapped service does.
type Flaky struct {
	mu       sync.Mutex
	svc      shard.Service
	down     bool
	failNext int
	loseNext int
	rng      *rand.Rand // nil: no random faults
	failP    float64
	loseP    float64
	calls    int
	failed   int
	lost     int
}

var (
	_ shard.Service        = (*Flaky)(nil)
	_ shard.ReportAcquirer = (*Flaky)(nil)
)

// NewFlaky wraps svc.
func NewFlaky(svc shard.Service) *Flaky { return &Flaky{svc: svc} }

// SetDown makes every call fail with ErrUnavailable (down) or pass through again.
func (f *Flaky) SetDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

// FailNext makes the next n calls fail with ErrUnavailable before they reach the service.
func (f *Flaky) FailNext(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext = n
}

// LoseNext makes the next n calls that reach the service lose their answers: each takes effect,
// and its caller gets ErrUnavailable.
func (f *Flaky) LoseNext(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loseNext = n
}

// SetRandomFaults makes every later call fail before reaching the service with probability
// fail, and otherwise lose its answer with probability lose, drawn from a generator seeded with
// seed. Zero probabilities turn random faults off.
func (f *Flaky) SetRandomFaults(seed uint64, fail, lose float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rng, f.failP, f.loseP = nil, fail, lose
	if fail > 0 || lose > 0 {
		f.rng = rand.New(rand.NewPCG(seed, 0xf1a4))
	}
}

// Swap replaces the wrapped service.
func (f *Flaky) Swap(svc shard.Service) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.svc = svc
}

// Calls returns the number of calls made and how many of them failed on purpose before
// reaching the service.
func (f *Flaky) Calls() (calls, failed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, f.failed
}

// Lost returns the number of calls that reached the service and lost their answers.
func (f *Flaky) Lost() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lost
}

// pick returns the service to call, or nil when this call must fail, and whether the call's
// answer must be lost.
func (f *Flaky) pick() (shard.Service, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down || f.failNext > 0 || f.rng != nil && f.rng.Float64() < f.failP {
		if f.failNext > 0 {
			f.failNext--
		}
		f.failed++
		return nil, false
	}
	lose := f.loseNext > 0 || f.rng != nil && f.rng.Float64() < f.loseP
	if f.loseNext > 0 {
		f.loseNext--
	}
	if lose {
		f.lost++
	}
	return f.svc, lose
}

// Acquire implements shard.Service.
func (f *Flaky) Acquire(ctx context.Context, worker string) (shard.Lease, error) {
	svc, lose := f.pick()
	if svc == nil {
		return shard.Lease{}, ErrUnavailable
	}
	l, err := svc.Acquire(ctx, worker)
	if lose {
		return shard.Lease{}, ErrUnavailable
	}
	return l, err
}

// Report implements shard.Service.
func (f *Flaky) Report(ctx context.Context, worker string, lease shard.LeaseID, offset int64, done bool) error {
	svc, lose := f.pick()
	if svc == nil {
		return ErrUnavailable
	}
	err := svc.Report(ctx, worker, lease, offset, done)
	if lose {
		return ErrUnavailable
	}
	return err
}

// ReportAndAcquire implements shard.ReportAcquirer. When the wrapped service cannot combine,
// a call that gets through returns its error matching errors.ErrUnsupported; that answer is
// never lost.
func (f *Flaky) ReportAndAcquire(ctx context.Context, worker string, lease shard.LeaseID, offset int64) (shard.Lease, error) {
	svc, lose := f.pick()
	if svc == nil {
		return shard.Lease{}, ErrUnavailable
	}
	l, err := shard.ReportAndAcquire(ctx, svc, worker, lease, offset)
	switch {
	case lose && errors.Is(err, errors.ErrUnsupported):
		f.mu.Lock()
		f.lost--
		f.mu.Unlock()
	case lose:
		return shard.Lease{}, ErrUnavailable
	}
	return l, err
}

// Leave implements shard.Service.
func (f *Flaky) Leave(ctx context.Context, worker string) error {
	svc, lose := f.pick()
	if svc == nil {
		return ErrUnavailable
	}
	err := svc.Leave(ctx, worker)
	if lose {
		return ErrUnavailable
	}
	return err
}
