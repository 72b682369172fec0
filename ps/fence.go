package ps

import (
	"fmt"
	"math"
)

// Position is a batch's place in the training data: data epoch, shard (its index in the
// dispatcher's shard table) and the record offsets [Start, End) within the shard. A push that
// carries one (At) is applied at most once per slot: a server that already applied the batch
// to a slot skips that slot's rows, so resending a push, or replaying a batch after a worker
// failed in the middle of its pushes, never adds an update twice.
//
// The servers rely on a shard's batches coming in order, as a job's workers send them: a shard
// is leased to one worker at a time (the one before fenced), read from the offset the
// dispatcher accepted last, and a worker finishes a batch (every push acknowledged) before it
// pushes the next; a replay cuts the shard at the same offsets. A push at p thus tells a
// server that every earlier batch of its shard is done, and it keeps no record of them. A push
// that overlaps a batch applied before without matching it is refused (ErrBadRequest).
type Position struct {
	Epoch uint32
	Shard uint32
	Start int64
	End   int64
}

func (p Position) valid() bool { return p.Start >= 0 && p.End > p.Start }

func (p Position) String() string {
	return fmt.Sprintf("epoch %d shard %d [%d,%d)", p.Epoch, p.Shard, p.Start, p.End)
}

// PushOption adjusts one Push or PushDense.
type PushOption func(*pushOpts)

type pushOpts struct {
	pos    Position
	hasPos bool
}

// At marks a push with the position of its batch: the servers apply it at most once per slot
// (see Position), and the client may resend it after a lost connection. pos must have
// 0 <= Start < End.
func At(pos Position) PushOption {
	return func(o *pushOpts) { o.pos, o.hasPos = pos, true }
}

// fences is a server's refusal list: every epoch below floor, and the epochs in set. Guarded by
// the server's ownership lock (written under the write lock, so that a fence waits for the
// pushes in flight).
type fences struct {
	floor uint64
	set   map[uint64]struct{}
}

func (f *fences) refused(epoch uint64) bool {
	if epoch < f.floor {
		return true
	}
	_, ok := f.set[epoch]
	return ok
}

// Fence refuses, from when it returns, every push carrying one of epochs (ErrFenced). Pushes of
// those epochs being applied when it is called have finished by the time it returns (it takes
// the ownership lock exclusively). On a synchronous server a push is checked when its step's
// barrier counts it: a push counted before the fence is applied with its step. Epoch 0 (a client without an epoch) cannot be fenced this way:
// use SetEpochFloor.
func (s *Server) Fence(epochs ...uint64) {
	s.own.Lock()
	defer s.own.Unlock()
	if s.fence.set == nil {
		s.fence.set = map[uint64]struct{}{}
	}
	for _, e := range epochs {
		if e >= s.fence.floor && e != 0 {
			s.fence.set[e] = struct{}{}
		}
	}
}

// SetEpochFloor refuses every push whose epoch is below floor (epoch 0 included once floor >
// 0), as Fence does; a lower floor than the current one changes nothing. Fenced epochs below
// the new floor are forgotten.
func (s *Server) SetEpochFloor(floor uint64) {
	s.own.Lock()
	defer s.own.Unlock()
	if floor <= s.fence.floor {
		return
	}
	s.fence.floor = floor
	for e := range s.fence.set {
		if e < floor {
			delete(s.fence.set, e)
		}
	}
}

// fencedLocked refuses a push of epoch, or returns nil.
func (s *Server) fencedLocked(epoch uint64) error {
	if !s.fence.refused(epoch) {
		return nil
	}
	s.stats.fenced.Add(1)
	return remote(codeFenced, "server %s refuses epoch %d.%d (fenced)", s.cfg.ID, epoch>>32, epoch&math.MaxUint32)
}
