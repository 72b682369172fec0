package ps

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// barrier holds one table's synchronous pushes until every worker has pushed the step, then
// applies them in worker order, so the result does not depend on arrival order. A push returns
// only once its step is applied, so a worker's next pull already sees the whole step.
//
// A barrier can be held (for a change of owner table): pushes of steps after a limit wait
// before they are counted, and are admitted (their table version checked) only once the hold
// ends, so a step runs under one table on every server.
type barrier struct {
	workers int

	mu      sync.Mutex
	started bool
	applied uint32                 // last applied step, valid once started
	begun   int64                  // highest step with a push counted, -1 before the first
	pending map[uint32]*stepPushes // steps still collecting
	closed  bool
	held    bool
	holdGen uint64        // the hold this barrier is held by
	limit   int64         // while held, pushes of later steps wait
	changed chan struct{} // closed (and replaced) when a step is applied or the hold changes
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
	return &barrier{workers: workers, begun: -1, pending: map[uint32]*stepPushes{}, changed: make(chan struct{})}
}

// signalLocked wakes everyone waiting for a change.
func (b *barrier) signalLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// waitLocked releases the lock until the next change or ctx's end, and takes it again.
func (b *barrier) waitLocked(ctx context.Context) error {
	ch := b.changed
	b.mu.Unlock()
	var err error
	select {
	case <-ch:
	case <-ctx.Done():
		err = ctx.Err()
	}
	b.mu.Lock()
	return err
}

// push records worker's push for step and waits until the step is applied, returning the apply
// error to every worker of the step. admit, if set, checks the push (with the barrier locked):
// with false before it waits for a hold to end, with true when it may be counted. Its error
// refuses the push, which then counts for nothing.
func (b *barrier) push(ctx context.Context, worker, step uint32, ids []uint64, grads []float32, admit func(counting bool) error, apply func([]uint64, []float32, uint32) error) error {
	b.mu.Lock()
	for b.held && int64(step) > b.limit && !b.closed {
		// A push routed by an old table is refused rather than held: held, it could keep a
		// step that its client would send elsewhere from completing. It is checked again each
		// time it wakes, since one hold may end and the next begin before it runs.
		if admit != nil {
			if err := admit(false); err != nil {
				b.mu.Unlock()
				return err
			}
		}
		if err := b.waitLocked(ctx); err != nil {
			b.mu.Unlock()
			return err
		}
	}
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
	if sp != nil && sp.got[worker] {
		b.mu.Unlock()
		return remote(codeBadRequest, "worker %d pushed step %d twice", worker, step)
	}
	if admit != nil {
		if err := admit(true); err != nil {
			b.mu.Unlock()
			return err
		}
	}
	if sp == nil {
		sp = &stepPushes{got: make([]bool, b.workers), ids: make([][]uint64, b.workers), grads: make([][]float32, b.workers), done: make(chan struct{})}
		b.pending[step] = sp
	}
	sp.got[worker] = true
	sp.ids[worker] = append([]uint64(nil), ids...)
	sp.grads[worker] = append([]float32(nil), grads...)
	sp.n++
	b.begun = max(b.begun, int64(step))
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
		b.signalLocked()
	}
	b.mu.Unlock()
	select {
	case <-sp.done:
		return sp.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// hold starts hold gen: pushes of steps that have not begun wait. It returns the highest step
// begun (-1: none).
func (b *barrier) hold(gen uint64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held, b.holdGen, b.limit = true, gen, b.begun
	b.signalLocked()
	return b.begun
}

// holdAfter lets pushes of steps up to step in (the steps some server has begun) and keeps
// later ones waiting, and returns once every step up to step is applied here. step < 0 waits
// for nothing. It fails, changing nothing, if hold gen has ended (the barrier is not held by it).
func (b *barrier) holdAfter(ctx context.Context, gen uint64, step int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.held || b.holdGen != gen {
		return errHoldEnded
	}
	b.limit = step
	b.signalLocked()
	for {
		switch {
		case b.closed:
			return remote(codeClosed, "server closed")
		case !b.held || b.holdGen != gen:
			return errHoldEnded
		}
		collecting := false
		for s := range b.pending {
			collecting = collecting || int64(s) <= step
		}
		if step < 0 || (!collecting && b.started && int64(b.applied) >= step) {
			return nil
		}
		if err := b.waitLocked(ctx); err != nil {
			return fmt.Errorf("step %d not complete (applied %d, begun %d): %w", step, b.applied, b.begun, err)
		}
	}
}

// begunStep returns the highest step with a push counted (-1: none).
func (b *barrier) begunStep() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.begun
}

// release ends hold gen (nothing if the barrier is not held by it): the pushes waiting are
// admitted (or refused) in turn. boundary >= 0 is the step the job was held after: a server
// that had none of the steps up to it (it joined the table at this boundary) never will, and
// its first step is a later one.
func (b *barrier) release(gen uint64, boundary int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.held || b.holdGen != gen {
		return
	}
	if boundary >= 0 && (!b.started || int64(b.applied) < boundary) {
		for step, sp := range b.pending {
			if int64(step) <= boundary {
				sp.err = remote(codeBadRequest, "step %d was run without this server", step)
				close(sp.done)
				delete(b.pending, step)
			}
		}
		b.started, b.applied = true, uint32(boundary)
	}
	b.held = false
	b.signalLocked()
}

// errHoldEnded is a hold's second round finding the hold over (ended or replaced).
var errHoldEnded = errors.New("the hold of the steps has ended")

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
	b.signalLocked()
}
