package ps

import (
	"context"
	"fmt"
	"sync"
)

// barrier holds one table's synchronous pushes until every worker has pushed the step, then
// applies them in worker order, so the result does not depend on arrival order. A push returns
// only once its step is applied, so a worker's next pull already sees the whole step.
type barrier struct {
	workers int

	mu      sync.Mutex
	started bool
	applied uint32                 // last applied step, valid once started
	pending map[uint32]*stepPushes // steps still collecting
	closed  bool
}

type stepPushes struct {
	got   []bool
	ids   [][]uint64
	grads [][]float32
	n     int
	done  chan struct{}
	err   error
}

func newBarrier(workers int) *barrier {
	return &barrier{workers: workers, pending: map[uint32]*stepPushes{}}
}

// push records worker's push for step and waits until the step is applied, returning the apply
// error to every worker of the step.
func (b *barrier) push(ctx context.Context, worker, step uint32, ids []uint64, grads []float32, apply func([]uint64, []float32, uint32) error) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return remote(codeClosed, "server closed")
	}
	if int(worker) >= b.workers {
		b.mu.Unlock()
		return remote(codeBadRequest, "worker %d of %d", worker, b.workers)
	}
	if b.started && step <= b.applied {
		b.mu.Unlock()
		return remote(codeBadRequest, "step %d is already applied", step)
	}
	sp := b.pending[step]
	if sp == nil {
		sp = &stepPushes{got: make([]bool, b.workers), ids: make([][]uint64, b.workers), grads: make([][]float32, b.workers), done: make(chan struct{})}
		b.pending[step] = sp
	}
	if sp.got[worker] {
		b.mu.Unlock()
		return remote(codeBadRequest, "worker %d pushed step %d twice", worker, step)
	}
	sp.got[worker] = true
	sp.ids[worker] = append([]uint64(nil), ids...)
	sp.grads[worker] = append([]float32(nil), grads...)
	sp.n++
	if sp.n == b.workers {
		for w := range sp.ids {
			if err := apply(sp.ids[w], sp.grads[w], step); err != nil && sp.err == nil {
				sp.err = fmt.Errorf("worker %d: %w", w, err)
			}
		}
		delete(b.pending, step)
		b.started = true
		b.applied = max(b.applied, step)
		close(sp.done)
	}
	b.mu.Unlock()
	select {
	case <-sp.done:
		return sp.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *barrier) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	for step, sp := range b.pending {
		sp.err = remote(codeClosed, "server closed before step %d was complete", step)
		close(sp.done)
		delete(b.pending, step)
	}
}
