package ps

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// A server's record of applied batches, per table and data shard, is a watermark and the few
// batches above it (the idea of Kafka's idempotent producer: a sequence per producer and
// partition, not a set of every message):
//
//   - Through: every batch of the shard that ends at or before it is applied on every slot,
//     wherever that slot's rows lie now. A push at position p proves it up to p.Start: a shard
//     is read in order, one lease at a time, from the offset the dispatcher accepted last, and
//     a worker finishes a batch (every push acknowledged) before it pushes the next, so every
//     batch of the shard before p is done when p arrives. At a checkpoint the coordinator
//     raises it to the offsets the dispatcher has accepted (FoldApplied).
//   - Batches: those above Through applied here, each with the slots it reached: the batch in
//     flight, one its worker died in the middle of, the last batch of a shard.
//
// So the record is bounded by what is in flight, not by the batches applied: a push records its
// batch and lets go of the one before.
//
// Slots restored from an older commit while the job went on (a Partial recovery:
// RestoreApplied) hold less than the shards' watermarks say: the batches applied to them since
// the commit were lost. Such a restored class keeps the commit's watermarks and every batch
// applied to its slots since, pruned only by the newest commit's data position, as a record
// of every position would: a coordinator that takes the job over from a commit before the
// batches lost replays them, and they land on those slots. Once a commit has finished every
// data epoch the lost batches could lie in, no replay can reach them, and the class ends
// (SettleApplied). Restored classes live only in memory: a commit's state is replayed from its
// own data position, which every loss it could hold back lies below.

// DataShard names a shard of a data epoch: what a server's record of applied batches is kept
// by (Position's Epoch and Shard).
type DataShard struct{ Epoch, Shard uint32 }

// AppliedShard is what a server applied of one data shard, for one table.
type AppliedShard struct {
	// Through: every batch of the shard that ends at or before Through is applied, on every
	// slot (0: none known).
	Through int64
	// Batches are the batches above Through applied here, in position order.
	Batches []AppliedBatch
}

// AppliedBatch is a batch at [Start, End) of a shard, applied to Slots (ascending).
type AppliedBatch struct {
	Start, End int64
	Slots      []uint32
}

// ErrCorruptApplied is returned by LoadApplied and DecodeApplied for a saved state that fails its
// checks.
var ErrCorruptApplied = errors.New("ps: corrupt applied state")

// appliedStripes is the number of locks an applied set is split over: pushes of different
// shards rarely wait for each other.
const appliedStripes = 64

// appliedSet is the record of one table. A push holds its shard's stripe lock from the check to
// the record, so two copies of a push never both apply.
type appliedSet struct {
	stripes [appliedStripes]struct {
		sync.Mutex
		m map[DataShard]*AppliedShard
	}
}

func newAppliedSet() *appliedSet {
	a := &appliedSet{}
	for i := range a.stripes {
		a.stripes[i].m = map[DataShard]*AppliedShard{}
	}
	return a
}

func (a *appliedSet) stripe(k DataShard) int {
	h := (uint64(k.Epoch)<<32 | uint64(k.Shard)) * 0x9e3779b97f4a7c15
	return int((h >> 32) % appliedStripes)
}

// restoredClass is slots restored from an older commit while the server served its others.
// Guarded by the ownership lock (changed under the write lock).
type restoredClass struct {
	slots []bool                         // by slot
	marks map[string]map[DataShard]int64 // by table: the commit's watermarks
	epoch uint32                         // the last data epoch a batch it lost may lie in
}

// holdsBackLocked returns, for a push of table at shard k, the watermark of a slot in a restored class
// (false: the slot follows the shard's own). Nil when there is no class.
func (s *Server) holdsBackLocked(table string, k DataShard) func(slot int) (int64, bool) {
	if len(s.own.restored) == 0 {
		return nil
	}
	classes := s.own.restored
	return func(slot int) (int64, bool) {
		for _, c := range classes {
			if slot < len(c.slots) && c.slots[slot] {
				return c.marks[table][k], true
			}
		}
		return 0, false
	}
}

// errOverlap is returned for a push whose position overlaps, without being equal to, a batch
// already applied: the shard was cut into batches at other offsets than before.
func errOverlap(p Position, from, to int64) error {
	return fmt.Errorf("position %v overlaps the applied positions [%d,%d) of its shard: a shard's batches must be replayed at the offsets they were first pushed at", p, from, to)
}

// batchAt returns the index of the batch at p (false: none), or an error when p overlaps one
// without matching it.
func (r *AppliedShard) batchAt(p Position) (int, bool, error) {
	for i, b := range r.Batches {
		if b.Start == p.Start && b.End == p.End {
			return i, true, nil
		}
		if b.Start < p.End && p.Start < b.End {
			return 0, false, errOverlap(p, b.Start, b.End)
		}
	}
	return 0, false, nil
}

// below reports whether p is applied by watermark through, or an error when p straddles it.
func below(p Position, through int64) (bool, error) {
	switch {
	case p.End <= through:
		return true, nil
	case p.Start < through:
		return false, errOverlap(p, 0, through)
	}
	return false, nil
}

// add records slots (sorted, distinct) applied at p, which batchAt accepted.
func (r *AppliedShard) add(p Position, slots []uint32) {
	i, found := slices.BinarySearchFunc(r.Batches, p.Start, func(b AppliedBatch, start int64) int { return cmp.Compare(b.Start, start) })
	if !found {
		r.Batches = slices.Insert(r.Batches, i, AppliedBatch{Start: p.Start, End: p.End})
	}
	r.Batches[i].Slots = mergeSlots(r.Batches[i].Slots, slots)
}

// raise sets Through to at least through and lets go of the batches it covers, but for the
// slots a restored class holds back below their end (held: nil when there is no class).
func (r *AppliedShard) raise(through int64, held func(slot int) (int64, bool)) {
	r.Through = max(r.Through, through)
	kept := r.Batches[:0]
	for _, b := range r.Batches {
		if b.End <= r.Through {
			if held == nil {
				continue
			}
			b.Slots = slices.DeleteFunc(b.Slots, func(sl uint32) bool {
				mark, ok := held(int(sl))
				return !ok || b.End <= mark
			})
			if len(b.Slots) == 0 {
				continue
			}
		}
		kept = append(kept, b)
	}
	clear(r.Batches[len(kept):])
	r.Batches = kept
}

// empty reports whether the record holds nothing.
func (r *AppliedShard) empty() bool { return r.Through == 0 && len(r.Batches) == 0 }

// mergeSlots returns the sorted union of a and b (both sorted and distinct).
func mergeSlots(a, b []uint32) []uint32 {
	if len(a) == 0 {
		return slices.Clone(b)
	}
	out := make([]uint32, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		switch {
		case a[i] < b[j]:
			out = append(out, a[i])
			i++
		case a[i] > b[j]:
			out = append(out, b[j])
			j++
		default:
			out = append(out, a[i])
			i, j = i+1, j+1
		}
	}
	out = append(out, a[i:]...)
	return append(out, b[j:]...)
}

// applyOnce applies a push of position p whose distinct slots are slots: only the ids of slots
// not yet applied at p (apply gets a skip function for the others, nil when there are none),
// then records them. apply is not called when p is applied on every slot of the push. held
// gives the watermarks of restored slots (nil: none).
func (a *appliedSet) applyOnce(p Position, slots []int32, held func(slot int) (int64, bool), apply func(skip func(slot int) bool) error) error {
	k := DataShard{p.Epoch, p.Shard}
	st := &a.stripes[a.stripe(k)]
	st.Lock()
	defer st.Unlock()
	r := st.m[k]
	if r == nil {
		r = &AppliedShard{}
	}
	i, found, err := r.batchAt(p)
	if err != nil {
		return err
	}
	var prev []uint32
	if found {
		prev = r.Batches[i].Slots
	}
	done := make([]bool, len(slots))
	fresh := 0
	for j, sl := range slots {
		through := r.Through
		if held != nil {
			if mark, ok := held(int(sl)); ok {
				through = mark
			}
		}
		d, err := below(p, through)
		if err != nil {
			return err
		}
		if !d {
			_, d = slices.BinarySearch(prev, uint32(sl))
		}
		done[j] = d
		if !d {
			fresh++
		}
	}
	if fresh == 0 {
		return nil // applied before: a resend or a replay
	}
	var skip func(int) bool
	if fresh < len(slots) {
		applied := make([]uint32, 0, len(slots)-fresh)
		for j, sl := range slots {
			if done[j] {
				applied = append(applied, uint32(sl))
			}
		}
		slices.Sort(applied)
		skip = func(slot int) bool {
			_, ok := slices.BinarySearch(applied, uint32(slot))
			return ok
		}
	}
	if err := apply(skip); err != nil {
		return err
	}
	pushed := make([]uint32, 0, fresh)
	for j, sl := range slots {
		if !done[j] {
			pushed = append(pushed, uint32(sl))
		}
	}
	slices.Sort(pushed)
	r.add(p, slices.Compact(pushed))
	r.raise(p.Start, held) // every batch of the shard before p is done
	st.m[k] = r
	return nil
}

// each calls f for every shard's record of the set, holding its stripe's lock; f may change
// it. Records left empty are removed.
func (a *appliedSet) each(f func(k DataShard, r *AppliedShard)) {
	for i := range a.stripes {
		st := &a.stripes[i]
		st.Lock()
		for k, r := range st.m {
			f(k, r)
			if r.empty() {
				delete(st.m, k)
			}
		}
		st.Unlock()
	}
}

// dropSlots removes the slots drop accepts from every batch, and batches left with none.
func (a *appliedSet) dropSlots(drop func(slot int) bool) {
	a.each(func(_ DataShard, r *AppliedShard) {
		kept := r.Batches[:0]
		for _, b := range r.Batches {
			b.Slots = slices.DeleteFunc(b.Slots, func(sl uint32) bool { return drop(int(sl)) })
			if len(b.Slots) > 0 {
				kept = append(kept, b)
			}
		}
		clear(r.Batches[len(kept):])
		r.Batches = kept
	})
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

// appliedSets returns the server's applied sets by table name, sorted.
func (s *Server) appliedSets() ([]string, []*appliedSet) {
	s.own.RLock()
	defer s.own.RUnlock()
	names := make([]string, 0, len(s.own.applied))
	for n := range s.own.applied {
		names = append(names, n)
	}
	slices.Sort(names)
	sets := make([]*appliedSet, len(names))
	for i, n := range names {
		sets[i] = s.own.applied[n]
	}
	return names, sets
}

// forgetRestoredLocked takes the slots drop accepts out of every restored class, and ends the
// classes left with none. Call with the ownership lock held for writing.
func (s *Server) forgetRestoredLocked(drop func(slot int) bool) {
	s.own.restored = slices.DeleteFunc(s.own.restored, func(c *restoredClass) bool {
		left := false
		for sl, in := range c.slots {
			if in && drop(sl) {
				c.slots[sl] = false
			}
			left = left || c.slots[sl]
		}
		return !left
	})
}

// The applied state is saved with a server's checkpoint, little-endian:
//
//	"PSAPPLD2" | tables u32 | per table: name (u16 len, bytes) | shards u32 |
//	  per shard (ascending epoch, shard): epoch u32, shard u32, through u64, batches u32 |
//	    per batch (ascending, above through, disjoint): start u64, end u64, slots u32,
//	      slots×u32 (ascending) |
//	xxhash64 of everything before
//
// Its size is bounded by the shards trained since the newest commit and the batches in flight.
const appliedMagic = "PSAPPLD2"

// AppliedState returns the batches this server applied, per table, for its checkpoint: every
// shard's watermark, and the batches above it restricted to the slots keep accepts (nil: all).
// Take it while no push is applied (at a checkpoint barrier) so it matches the rows.
func (s *Server) AppliedState(keep func(slot int) bool) []byte {
	names, sets := s.appliedSets()
	b := append([]byte(nil), appliedMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(names)))
	type shardRec struct {
		k DataShard
		r AppliedShard
	}
	var recs []shardRec
	for i, name := range names {
		recs = recs[:0]
		sets[i].each(func(k DataShard, r *AppliedShard) {
			c := AppliedShard{Through: r.Through}
			for _, bt := range r.Batches {
				if bt.End <= r.Through {
					continue // kept for a restored class only
				}
				var slots []uint32
				for _, sl := range bt.Slots {
					if keep == nil || keep(int(sl)) {
						slots = append(slots, sl)
					}
				}
				if len(slots) > 0 {
					c.Batches = append(c.Batches, AppliedBatch{Start: bt.Start, End: bt.End, Slots: slots})
				}
			}
			if !c.empty() {
				recs = append(recs, shardRec{k, c})
			}
		})
		slices.SortFunc(recs, func(x, y shardRec) int {
			return cmp.Or(cmp.Compare(x.k.Epoch, y.k.Epoch), cmp.Compare(x.k.Shard, y.k.Shard))
		})
		b = appendString(b, name)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(recs)))
		for _, sr := range recs {
			b = binary.LittleEndian.AppendUint32(b, sr.k.Epoch)
			b = binary.LittleEndian.AppendUint32(b, sr.k.Shard)
			b = binary.LittleEndian.AppendUint64(b, uint64(sr.r.Through))
			b = binary.LittleEndian.AppendUint32(b, uint32(len(sr.r.Batches)))
			for _, bt := range sr.r.Batches {
				b = binary.LittleEndian.AppendUint64(b, uint64(bt.Start))
				b = binary.LittleEndian.AppendUint64(b, uint64(bt.End))
				b = binary.LittleEndian.AppendUint32(b, uint32(len(bt.Slots)))
				for _, sl := range bt.Slots {
					b = binary.LittleEndian.AppendUint32(b, sl)
				}
			}
		}
	}
	return binary.LittleEndian.AppendUint64(b, xxhash.Sum64(b))
}

// decodeApplied reads a saved applied state, checking every length and the checksum before it
// allocates for what they announce, and that every shard's record is well formed: batches
// above the watermark, in order and disjoint, each with ascending slots.
func decodeApplied(b []byte) (map[string]map[DataShard]AppliedShard, error) {
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
	out := map[string]map[DataShard]AppliedShard{}
	for range tables {
		name := d.str()
		shards := d.u32()
		if d.err != nil || uint64(shards)*20 > uint64(len(d.b)) {
			return nil, bad("truncated table")
		}
		if _, dup := out[name]; dup {
			return nil, bad("table %q twice", name)
		}
		m := make(map[DataShard]AppliedShard, shards)
		var last DataShard
		for i := range shards {
			k := DataShard{Epoch: d.u32(), Shard: d.u32()}
			r := AppliedShard{Through: int64(d.u64())}
			n := d.u32()
			if d.err != nil || uint64(n)*20 > uint64(len(d.b)) || r.Through < 0 {
				return nil, bad("shard record of table %q", name)
			}
			if i > 0 && cmp.Or(cmp.Compare(k.Epoch, last.Epoch), cmp.Compare(k.Shard, last.Shard)) <= 0 {
				return nil, bad("shards of table %q out of order", name)
			}
			last = k
			if n > 0 {
				r.Batches = make([]AppliedBatch, n)
			}
			floor := r.Through
			for j := range r.Batches {
				bt := AppliedBatch{Start: int64(d.u64()), End: int64(d.u64())}
				ns := d.u32()
				if d.err != nil || uint64(ns)*4 > uint64(len(d.b)) || ns == 0 || bt.Start < floor || bt.End <= bt.Start {
					return nil, bad("batch of table %q, epoch %d shard %d", name, k.Epoch, k.Shard)
				}
				floor = bt.End
				bt.Slots = make([]uint32, ns)
				for x := range bt.Slots {
					bt.Slots[x] = d.u32()
					if x > 0 && bt.Slots[x] <= bt.Slots[x-1] {
						return nil, bad("slots of table %q out of order", name)
					}
				}
				r.Batches[j] = bt
			}
			if r.empty() {
				return nil, bad("empty shard record of table %q", name)
			}
			m[k] = r
		}
		out[name] = m
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, bad("trailing or missing bytes")
	}
	return out, nil
}

// DecodeApplied reads a state AppliedState saved: per table and data shard, the watermark and
// the batches above it with their slots. A coordinator reads the states of a checkpoint with it
// to tell which batches the checkpoint's rows already hold. It checks the state as LoadApplied
// does (ErrCorruptApplied); the result is the caller's.
func DecodeApplied(b []byte) (map[string]map[DataShard]AppliedShard, error) {
	return decodeApplied(b)
}

// mergeStates decodes states and merges them for the slots owned accepts (nil: every slot):
// per table and shard the highest watermark (a watermark holds for every slot) and the union
// of the batches' slots above it.
func mergeStates(states [][]byte, owned func(slot int) bool) (map[string]map[DataShard]*AppliedShard, error) {
	merged := map[string]map[DataShard]*AppliedShard{}
	for i, b := range states {
		m, err := decodeApplied(b)
		if err != nil {
			return nil, fmt.Errorf("applied state %d: %w", i, err)
		}
		for name, shards := range m {
			dst := merged[name]
			if dst == nil {
				dst = map[DataShard]*AppliedShard{}
				merged[name] = dst
			}
			for k, r := range shards {
				if dst[k] == nil {
					dst[k] = &AppliedShard{}
				}
				if err := mergeShard(dst[k], r, owned, true); err != nil {
					return nil, fmt.Errorf("%w: applied state %d, table %q, epoch %d shard %d: %w", ErrCorruptApplied, i, name, k.Epoch, k.Shard, err)
				}
			}
		}
	}
	return merged, nil
}

// mergeShard adds src's batches to dst for the slots owned accepts (nil: all), and with raise
// raises dst's watermark to src's. It fails when the two disagree on where a shard's batches
// begin and end.
func mergeShard(dst *AppliedShard, src AppliedShard, owned func(slot int) bool, raise bool) error {
	for _, bt := range src.Batches {
		p := Position{Start: bt.Start, End: bt.End}
		if _, _, err := dst.batchAt(p); err != nil {
			return err
		}
		slots := bt.Slots
		if owned != nil {
			slots = nil
			for _, sl := range bt.Slots {
				if owned(int(sl)) {
					slots = append(slots, sl)
				}
			}
		}
		if len(slots) > 0 {
			dst.add(p, slots)
		}
	}
	if raise {
		dst.raise(src.Through, nil)
	}
	return nil
}

// loadAppliedLocked puts the merged states into the server's record for the slots owned
// accepts: their batches are replaced, and with raise each shard's watermark becomes the
// highest of its own and the states' (without, the batches are kept whatever the watermark:
// a restored class holds them). Call with the ownership lock held for writing. Every shard is
// checked before anything changes.
func (s *Server) loadAppliedLocked(merged map[string]map[DataShard]*AppliedShard, owned func(slot int) bool, raise bool) error {
	for _, h := range s.own.tables {
		s.appliedLocked(h.name)
	}
	type update struct {
		a *appliedSet
		k DataShard
		r *AppliedShard
	}
	var updates []update
	for name, shards := range merged {
		a := s.appliedLocked(name)
		for k, r := range shards {
			next := &AppliedShard{}
			st := &a.stripes[a.stripe(k)]
			st.Lock()
			if cur := st.m[k]; cur != nil {
				next.Through = cur.Through
				for _, bt := range cur.Batches {
					kept := slices.DeleteFunc(slices.Clone(bt.Slots), func(sl uint32) bool { return owned(int(sl)) })
					if len(kept) > 0 {
						next.Batches = append(next.Batches, AppliedBatch{Start: bt.Start, End: bt.End, Slots: kept})
					}
				}
			}
			st.Unlock()
			if err := mergeShard(next, *r, nil, raise); err != nil {
				return fmt.Errorf("%w: table %q, epoch %d shard %d: %w", ErrCorruptApplied, name, k.Epoch, k.Shard, err)
			}
			updates = append(updates, update{a, k, next})
		}
	}
	for _, a := range s.own.applied {
		a.dropSlots(owned)
	}
	for _, u := range updates {
		st := &u.a.stripes[u.a.stripe(u.k)]
		st.Lock()
		if u.r.empty() {
			delete(st.m, u.k)
		} else {
			st.m[u.k] = u.r
		}
		st.Unlock()
	}
	return nil
}

// orAll returns f, or a function accepting every slot when f is nil.
func orAll(f func(slot int) bool) func(slot int) bool {
	if f == nil {
		return func(int) bool { return true }
	}
	return f
}

// LoadApplied replaces the server's applied batches for the slots owned accepts (nil: every
// slot) with those of the saved states (from one or several servers' checkpoints: a restore
// onto another number of servers merges them; a move's source: the slots it hands over);
// batches applied to other slots are kept. A watermark holds for every slot, so each shard
// keeps the highest of its own and the states' (ClearSlots of every slot forgets the server's
// own first). For rows restored from an older commit while the server serves other slots, use
// RestoreApplied. Every state is checked first: on an error nothing changes.
func (s *Server) LoadApplied(states [][]byte, owned func(slot int) bool) error {
	owned = orAll(owned)
	merged, err := mergeStates(states, owned)
	if err != nil {
		return err
	}
	s.own.Lock()
	defer s.own.Unlock()
	if err := s.loadAppliedLocked(merged, owned, true); err != nil {
		return err
	}
	s.forgetRestoredLocked(owned) // what the states say of them is what they hold
	return nil
}

// RestoreApplied is LoadApplied for rows of the slots owned accepts restored from a commit while
// the job goes on from where it is (a Partial recovery): the batches applied to them since the
// commit were lost, so those slots keep the commit's watermarks, not the shards', and a record
// of every batch applied to them from now on (a restored class), until SettleApplied ends it.
// A coordinator that takes the job over from a commit before the lost batches replays them,
// and they land on those slots.
func (s *Server) RestoreApplied(states [][]byte, owned func(slot int) bool) error {
	merged, err := mergeStates(states, owned)
	if err != nil {
		return err
	}
	s.own.Lock()
	defer s.own.Unlock()
	if err := s.loadAppliedLocked(merged, owned, false); err != nil {
		return err
	}
	s.forgetRestoredLocked(owned)
	c := &restoredClass{slots: make([]bool, s.cfg.Slots), marks: map[string]map[DataShard]int64{}}
	// The data epoch may have moved on by one since the last batch this server or the commit
	// saw, and a batch of it may have reached only the failed server.
	for _, a := range s.own.applied {
		a.each(func(k DataShard, _ *AppliedShard) { c.epoch = max(c.epoch, k.Epoch+1) })
	}
	any := false
	for sl := range c.slots {
		c.slots[sl] = owned(sl)
		any = any || c.slots[sl]
	}
	for name, shards := range merged {
		for k, r := range shards {
			c.epoch = max(c.epoch, k.Epoch+1)
			if r.Through > 0 {
				if c.marks[name] == nil {
					c.marks[name] = map[DataShard]int64{}
				}
				c.marks[name][k] = r.Through
			}
		}
	}
	if any {
		s.own.restored = append(s.own.restored, c)
	}
	return nil
}

// SettleApplied ends the restored classes whose lost batches the newest commit can no longer
// replay: done reports whether that commit has finished a data epoch. Their slots follow the
// shards' watermarks again.
func (s *Server) SettleApplied(done func(epoch uint32) bool) {
	s.own.Lock()
	n := len(s.own.restored)
	s.own.restored = slices.DeleteFunc(s.own.restored, func(c *restoredClass) bool { return done(c.epoch) })
	settled := len(s.own.restored) < n
	s.own.Unlock()
	if settled {
		s.eachApplied(func(_ string, _ DataShard, r *AppliedShard, held func(int) (int64, bool)) {
			r.raise(r.Through, held) // the batches kept for the ended classes only
		})
	}
}

// eachApplied calls f for every shard's record of every table, with the watermarks of its
// restored slots (nil: none), holding the ownership lock for reading and the stripe's lock.
func (s *Server) eachApplied(f func(table string, k DataShard, r *AppliedShard, held func(int) (int64, bool))) {
	s.own.RLock()
	defer s.own.RUnlock()
	for name, a := range s.own.applied {
		a.each(func(k DataShard, r *AppliedShard) { f(name, k, r, s.holdsBackLocked(name, k)) })
	}
}

// PruneApplied forgets what the server recorded of the positions keep rejects: batches that can
// never be replayed (say, of data epochs a committed checkpoint has finished). A shard's
// watermark counts as the position [0, Through). It returns the watermarks and batches
// forgotten.
func (s *Server) PruneApplied(keep func(Position) bool) int {
	n := 0
	s.eachApplied(func(_ string, k DataShard, r *AppliedShard, _ func(int) (int64, bool)) {
		if r.Through > 0 && !keep(Position{Epoch: k.Epoch, Shard: k.Shard, Start: 0, End: r.Through}) {
			r.Through = 0
			n++
		}
		before := len(r.Batches)
		r.Batches = slices.DeleteFunc(r.Batches, func(b AppliedBatch) bool {
			return !keep(Position{Epoch: k.Epoch, Shard: k.Shard, Start: b.Start, End: b.End})
		})
		n += before - len(r.Batches)
	})
	// A restored class's watermark that keep rejects holds back nothing a replay can reach.
	s.own.Lock()
	defer s.own.Unlock()
	for _, c := range s.own.restored {
		for _, marks := range c.marks {
			for k, mark := range marks {
				if !keep(Position{Epoch: k.Epoch, Shard: k.Shard, Start: 0, End: mark}) {
					delete(marks, k)
					n++
				}
			}
		}
	}
	return n
}

// FoldApplied raises each shard's watermark to through(shard), the offset up to which every
// batch of it is done on every server (the offsets a job's dispatcher has accepted: a worker
// reports a batch once all its pushes are acknowledged), letting go of the batches below. A
// coordinator calls it at a checkpoint barrier, so the record it saves holds only what is in
// flight. Restored slots keep their own watermarks.
func (s *Server) FoldApplied(through func(DataShard) int64) {
	s.eachApplied(func(_ string, k DataShard, r *AppliedShard, held func(int) (int64, bool)) {
		r.raise(through(k), held)
	})
}

// AppliedCount returns how much of its record of applied batches the server holds, over its
// tables: the shards with a watermark, the batches recorded and the watermarks of restored
// slots.
func (s *Server) AppliedCount() int {
	n := 0
	s.eachApplied(func(_ string, _ DataShard, r *AppliedShard, _ func(int) (int64, bool)) {
		n += len(r.Batches)
		if r.Through > 0 {
			n++
		}
	})
	s.own.RLock()
	defer s.own.RUnlock()
	for _, c := range s.own.restored {
		for _, marks := range c.marks {
			n += len(marks)
		}
	}
	return n
}
