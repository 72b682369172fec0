package elastic

import (
	"context"
	"sync"
)

// EventKind says what a ProgressEvent reports.
type EventKind uint8

const (
	// EventStep: batches were trained; Step is the job's step now. Step events coalesce while
	// OnProgress is busy: it sees the newest step, not necessarily every one.
	EventStep EventKind = iota + 1
	// EventCheckpoint: a snapshot was taken (its barrier came down) or a commit written, or
	// either failed (Checkpoint).
	EventCheckpoint
	// EventMove: slots moved between servers for a new server count or a rebalance, or the
	// move failed (Move).
	EventMove
	// EventRecovery: a recovery from parameter-server failures ended, or an attempt failed
	// (Recovery).
	EventRecovery
)

func (k EventKind) String() string {
	switch k {
	case EventStep:
		return "step"
	case EventCheckpoint:
		return "checkpoint"
	case EventMove:
		return "move"
	case EventRecovery:
		return "recovery"
	}
	return "unknown"
}

// ProgressEvent is one event of a job's progress, as Config.OnProgress receives it: the steps
// trained, the checkpoints, the moves of slots and the recoveries, in the order they happened.
type ProgressEvent struct {
	Kind EventKind
	// Step is the job's step (batches applied and reported, by any worker) when the event
	// happened.
	Step       uint64
	Checkpoint CheckpointEvent   // EventCheckpoint
	Move       RepartitionStatus // EventMove
	Recovery   RecoveryEvent     // EventRecovery
}

// Observe hands what ev carries to onCheckpoint (EventCheckpoint) or onRecovery
// (EventRecovery); other events, and nil functions, are skipped. A consumer of the callbacks
// Config.OnCheckpoint and OnRecovery takes progress events with it.
func (ev ProgressEvent) Observe(onCheckpoint func(CheckpointEvent), onRecovery func(RecoveryEvent)) {
	switch {
	case ev.Kind == EventCheckpoint && onCheckpoint != nil:
		onCheckpoint(ev.Checkpoint)
	case ev.Kind == EventRecovery && onRecovery != nil:
		onRecovery(ev.Recovery)
	}
}

// progress hands events to Config.OnProgress from a goroutine of its own, in order, one at a
// time: the coordinator never waits for the callback, and steps reported while it is busy fold
// into one event.
type progress struct {
	on   func(ProgressEvent)
	wake chan struct{} // a token when queue grew

	mu    sync.Mutex
	queue []ProgressEvent
}

func newProgress(on func(ProgressEvent)) *progress {
	return &progress{on: on, wake: make(chan struct{}, 1)}
}

// emit queues ev; a step folds into a step queued last.
func (p *progress) emit(ev ProgressEvent) {
	if p == nil || p.on == nil {
		return
	}
	p.mu.Lock()
	if n := len(p.queue); ev.Kind == EventStep && n > 0 && p.queue[n-1].Kind == EventStep {
		p.queue[n-1] = ev
	} else {
		p.queue = append(p.queue, ev)
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// run delivers the queued events until done closes; those queued then are dropped.
func (p *progress) run(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-p.wake:
		}
		p.mu.Lock()
		evs := p.queue
		p.queue = nil
		p.mu.Unlock()
		for _, ev := range evs {
			p.on(ev)
		}
	}
}

// inBatch reports whether a live worker holds a batch.
func (c *core) inBatch() bool {
	for _, m := range c.members {
		if m.inBatch {
			return true
		}
	}
	return false
}

// stepNow returns the job's step.
func (c *Coordinator) stepNow() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.step
}

// WaitStep waits until the job has trained step steps (batches applied and reported, by any
// worker: Status.Step) and returns the step then, at least step. It does not poll: it wakes
// at every change of the coordinator's state. It returns ErrStopped once training is over
// before the step (the job stopped, or its data is done and no batch is in flight), ctx's
// error when ctx ends first and ErrClosed when the coordinator closes. A rollback takes the
// step back to its commit's: the wait goes on.
func (c *Coordinator) WaitStep(ctx context.Context, step uint64) (uint64, error) {
	var now uint64
	err := c.await(ctx, func() (bool, error) {
		now = c.core.step
		switch {
		case now >= step:
			return true, nil
		case c.closed:
			return true, ErrClosed
		case c.superseded != nil:
			return true, c.superseded
		case c.core.stopped || c.disp.Progress().Finished && !c.core.inBatch():
			return true, ErrStopped
		}
		return false, nil
	})
	return now, err
}
