package ps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// Position is a batch's place in the training data: data epoch, shard (its index in the
// dispatcher's shard table) and the record offsets [Start, End) within the shard. A push that
// carries one (At) is applied at most once per slot: a server that already applied the batch
// to a slot skips that slot's rows, so resending a push, or replaying a batch after a worker
// failed in the middle of its pushes, never adds an update twice.
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
	return remote(codeFenced, "server %s refuses epoch %d.%d (fenced)", s.cfg.ID, epoch>>32, epoch&math.MaxUint32)
}

// appliedStripes is the number of locks an applied set is split over: pushes of different
// positions rarely wait for each other.
const appliedStripes = 64

// appliedSet records, for one table, the slots each batch position was applied to. A push of a
// position holds its stripe's lock from the check to the record, so two copies of a push never
// both apply.
type appliedSet struct {
	stripes [appliedStripes]struct {
		sync.Mutex
		m map[Position][]uint32 // sorted slots
	}
}

func newAppliedSet() *appliedSet {
	a := &appliedSet{}
	for i := range a.stripes {
		a.stripes[i].m = map[Position][]uint32{}
	}
	return a
}

func (a *appliedSet) stripe(p Position) int {
	h := uint64(p.Epoch)<<32 ^ uint64(p.Shard) ^ uint64(p.Start)*0x9e3779b97f4a7c15 ^ uint64(p.End)*0xbf58476d1ce4e5b9
	return int((h ^ h>>29) % appliedStripes)
}

// applyOnce applies a push of position p whose distinct slots are slots: only the ids of slots
// not yet applied at p (filter makes the ids and gradients of those slots), then records them.
// apply is called with the ids and gradients to apply, or not at all when nothing is new.
func (a *appliedSet) applyOnce(p Position, slots []int32, apply func(skip func(slot int) bool) error) error {
	st := &a.stripes[a.stripe(p)]
	st.Lock()
	defer st.Unlock()
	prev := st.m[p]
	var skip func(int) bool
	if len(prev) > 0 {
		fresh := 0
		for _, sl := range slots {
			if _, ok := slices.BinarySearch(prev, uint32(sl)); !ok {
				fresh++
			}
		}
		if fresh == 0 {
			return nil // applied before: a resend or a replay
		}
		skip = func(slot int) bool {
			_, ok := slices.BinarySearch(prev, uint32(slot))
			return ok
		}
	}
	if err := apply(skip); err != nil {
		return err
	}
	merged := slices.Grow(slices.Clone(prev), len(slots))
	for _, sl := range slots {
		merged = append(merged, uint32(sl))
	}
	slices.Sort(merged)
	st.m[p] = slices.Compact(merged)
	return nil
}

// appliedLocked returns the applied set of table, creating it. Call with the ownership lock
// held for writing, or for reading when the set exists (created with the table).
func (s *Server) appliedLocked(table string) *appliedSet {
	a := s.own.applied[table]
	if a == nil {
		a = newAppliedSet()
		s.own.applied[table] = a
	}
	return a
}

// The applied state is saved with a server's checkpoint, little-endian:
//
//	"PSAPPLD1" | tables u32 | per table: name (u16 len, bytes) | entries u32 |
//	  per entry: epoch u32, shard u32, start u64, end u64, slots u32, slots×u32 (ascending) |
//	xxhash64 of everything before
const appliedMagic = "PSAPPLD1"

// ErrCorruptApplied is returned by LoadApplied for a saved state that fails its checks.
var ErrCorruptApplied = errors.New("ps: corrupt applied state")

// AppliedState returns the positions this server applied, per table, restricted to the slots
// keep accepts (nil: all), for its checkpoint. Take it while no push is applied (at a
// checkpoint barrier) so it matches the rows.
func (s *Server) AppliedState(keep func(slot int) bool) []byte {
	s.own.RLock()
	names := make([]string, 0, len(s.own.applied))
	for n := range s.own.applied {
		names = append(names, n)
	}
	sets := make([]*appliedSet, len(names))
	sort.Strings(names)
	for i, n := range names {
		sets[i] = s.own.applied[n]
	}
	s.own.RUnlock()
	b := append([]byte(nil), appliedMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(names)))
	for i, name := range names {
		b = appendString(b, name)
		at := len(b)
		b = binary.LittleEndian.AppendUint32(b, 0)
		n := 0
		a := sets[i]
		for k := range a.stripes {
			st := &a.stripes[k]
			st.Lock()
			for p, slots := range st.m {
				kept := slots
				if keep != nil {
					kept = nil
					for _, sl := range slots {
						if keep(int(sl)) {
							kept = append(kept, sl)
						}
					}
				}
				if len(kept) == 0 {
					continue
				}
				n++
				b = binary.LittleEndian.AppendUint32(b, p.Epoch)
				b = binary.LittleEndian.AppendUint32(b, p.Shard)
				b = binary.LittleEndian.AppendUint64(b, uint64(p.Start))
				b = binary.LittleEndian.AppendUint64(b, uint64(p.End))
				b = binary.LittleEndian.AppendUint32(b, uint32(len(kept)))
				for _, sl := range kept {
					b = binary.LittleEndian.AppendUint32(b, sl)
				}
			}
			st.Unlock()
		}
		binary.LittleEndian.PutUint32(b[at:], uint32(n))
	}
	return binary.LittleEndian.AppendUint64(b, xxhash.Sum64(b))
}

// decodeApplied reads a saved applied state, checking every length and the checksum before it
// allocates for what they announce.
func decodeApplied(b []byte) (map[string]map[Position][]uint32, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrCorruptApplied, fmt.Sprintf(format, a...))
	}
	if len(b) < len(appliedMagic)+4+8 || string(b[:len(appliedMagic)]) != appliedMagic {
		return nil, bad("bad header")
	}
	body := b[:len(b)-8]
	if xxhash.Sum64(body) != binary.LittleEndian.Uint64(b[len(b)-8:]) {
		return nil, bad("checksum mismatch")
	}
	d := decoder{b: body[len(appliedMagic):]}
	tables := d.u32()
	out := map[string]map[Position][]uint32{}
	for range tables {
		name := d.str()
		entries := d.u32()
		if d.err != nil || uint64(entries)*28 > uint64(len(d.b)) {
			return nil, bad("truncated table")
		}
		if _, dup := out[name]; dup {
			return nil, bad("table %q twice", name)
		}
		m := make(map[Position][]uint32, entries)
		for range entries {
			p := Position{Epoch: d.u32(), Shard: d.u32(), Start: int64(d.u64()), End: int64(d.u64())}
			n := d.u32()
			if d.err != nil || uint64(n)*4 > uint64(len(d.b)) || !p.valid() || n == 0 {
				return nil, bad("entry of table %q", name)
			}
			slots := make([]uint32, n)
			for i := range slots {
				slots[i] = d.u32()
				if i > 0 && slots[i] <= slots[i-1] {
					return nil, bad("slots of table %q out of order", name)
				}
			}
			if _, dup := m[p]; dup {
				return nil, bad("position %v of table %q twice", p, name)
			}
			m[p] = slots
		}
		out[name] = m
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, bad("trailing or missing bytes")
	}
	return out, nil
}

// DecodeApplied reads a state AppliedState saved: per table, the positions applied and, for
// each, the slots (ascending) it was applied to. A coordinator reads the states of a checkpoint
// with it to tell which batches the checkpoint's rows already hold. It checks the state as
// LoadApplied does (ErrCorruptApplied); the result is the caller's.
func DecodeApplied(b []byte) (map[string]map[Position][]uint32, error) {
	return decodeApplied(b)
}

// LoadApplied replaces the server's applied positions for the slots owned accepts (nil: every
// slot) with those of the saved states (from one or several servers' checkpoints: a restore onto
// another number of servers merges them); positions applied to other slots are kept. Every state
// is checked first: on an error nothing changes.
func (s *Server) LoadApplied(states [][]byte, owned func(slot int) bool) error {
	merged := map[string]map[Position][]uint32{}
	for i, b := range states {
		m, err := decodeApplied(b)
		if err != nil {
			return fmt.Errorf("applied state %d: %w", i, err)
		}
		for name, entries := range m {
			dst := merged[name]
			if dst == nil {
				dst = map[Position][]uint32{}
				merged[name] = dst
			}
			for p, slots := range entries {
				for _, sl := range slots {
					if owned == nil || owned(int(sl)) {
						dst[p] = append(dst[p], sl)
					}
				}
			}
		}
	}
	all := func(int) bool { return true }
	if owned == nil {
		owned = all
	}
	s.own.Lock()
	defer s.own.Unlock()
	for _, h := range s.own.tables {
		s.appliedLocked(h.name)
	}
	for _, a := range s.own.applied {
		a.dropSlots(owned)
	}
	for name, entries := range merged {
		a := s.appliedLocked(name)
		for p, slots := range entries {
			if len(slots) == 0 {
				continue
			}
			st := &a.stripes[a.stripe(p)]
			st.Lock() // ClearSlots and PruneApplied hold only the stripe's lock
			slots = append(slots, st.m[p]...)
			slices.Sort(slots)
			st.m[p] = slices.Compact(slots)
			st.Unlock()
		}
	}
	return nil
}

// PruneApplied forgets the applied positions keep rejects: batches that can never be replayed
// (say, of data epochs a committed checkpoint has finished). Entries accumulate between prunes:
// one per table per batch pushed to this server, holding the batch's slots here.
func (s *Server) PruneApplied(keep func(Position) bool) int {
	s.own.RLock()
	sets := make([]*appliedSet, 0, len(s.own.applied))
	for _, a := range s.own.applied {
		sets = append(sets, a)
	}
	s.own.RUnlock()
	n := 0
	for _, a := range sets {
		for k := range a.stripes {
			st := &a.stripes[k]
			st.Lock()
			for p := range st.m {
				if !keep(p) {
					delete(st.m, p)
					n++
				}
			}
			st.Unlock()
		}
	}
	return n
}

// AppliedCount returns the number of applied positions the server remembers, over its tables.
func (s *Server) AppliedCount() int {
	s.own.RLock()
	defer s.own.RUnlock()
	n := 0
	for _, a := range s.own.applied {
		for k := range a.stripes {
			st := &a.stripes[k]
			st.Lock()
			n += len(st.m)
			st.Unlock()
		}
	}
	return n
}
