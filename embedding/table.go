package embedding

import (
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Table maps uint64 ids to rows of Dim float32 weights, optimizer state and metadata. It is safe
// for concurrent use by many goroutines.
type Table struct {
	cfg      Config
	dim      int
	sw       int // optimizer state words per row
	stride   int // words per row: header + dim + sw
	hashSeed uint64
	shift    uint // 64 - log2(shards)
	shards   []shard
	log      *slog.Logger
	sketch   *sketch // AdmitCount only
	scratch  sync.Pool

	rows    atomic.Int64  // live rows
	latest  atomic.Uint32 // highest step Apply has seen: the step of rows Lookup creates
	draws   atomic.Uint64
	trackMu sync.Mutex // serialises tracker registration; guards base
	base    *Tracker   // CopyRaw's change set, made by the first newBase copy
	baseMu  sync.Mutex // serialises CopyRaw's copies against the base

	evicted, expired, rejected, dropped, created atomic.Uint64
}

// New returns an empty table.
func New(cfg Config) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	t := &Table{
		cfg:      cfg,
		dim:      cfg.Dim,
		sw:       cfg.Optimizer.Kind.stateWidth(cfg.Dim),
		hashSeed: mix64(cfg.Seed ^ 0x5eed),
		shards:   make([]shard, cfg.Shards),
		log:      cfg.Logger,
	}
	t.stride = hdrWords + t.dim + t.sw
	bits := uint(0)
	for 1<<bits < cfg.Shards {
		bits++
	}
	t.shift = 64 - bits
	a := newArena()
	for i := range t.shards {
		t.shards[i].rng = mix64(t.hashSeed + uint64(i))
		t.shards[i].arena = a
	}
	// The slabs go when the shards do. Every access to a slab holds its shard's lock, so the
	// shard array is alive (and the slab mapped) until the access is over.
	runtime.AddCleanup(&t.shards[0], func(a *arena) { a.release() }, a)
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Admission.Policy == AdmitCount {
		t.sketch = newSketch(cfg.Admission.SketchWidth, cfg.Admission.SketchDepth, t.hashSeed)
	}
	return t, nil
}

// Config returns the table's configuration with defaults filled in.
func (t *Table) Config() Config { return t.cfg }

// Dim returns the number of weights per row.
func (t *Table) Dim() int { return t.dim }

// StateWidth returns the number of optimizer state values per row.
func (t *Table) StateWidth() int { return t.sw }

// Len returns the number of rows.
func (t *Table) Len() int { return int(t.rows.Load()) }

func (t *Table) hash(id uint64) uint64 { return mix64(id ^ t.hashSeed) }

func (t *Table) shardOf(h uint64) int {
	if t.shift == 64 {
		return 0
	}
	return int(h >> t.shift)
}

func (t *Table) name() string {
	if t.cfg.Name == "" {
		return "table"
	}
	return fmt.Sprintf("table %q", t.cfg.Name)
}

// scratch holds per-call working memory, pooled per table.
type scratch struct {
	h     []uint64
	order []int32
	start []int32
	miss  []int32
	rows  []int32
	sink  uint32 // keeps the cache-warming loads alive
	// Apply: duplicate folding
	keys []uint64
	grp  []int32
	next []int32
	uniq []int32
	sum  []float32
}

func (t *Table) getScratch(n int) *scratch {
	sc, _ := t.scratch.Get().(*scratch)
	if sc == nil {
		sc = &scratch{}
	}
	if cap(sc.h) < n {
		sc.h = make([]uint64, n)
		sc.order = make([]int32, n)
		sc.next = make([]int32, n)
		sc.uniq = make([]int32, 0, n)
		sc.miss = make([]int32, 0, n)
		sc.rows = make([]int32, 0, n)
	}
	sc.h, sc.order, sc.next = sc.h[:n], sc.order[:n], sc.next[:n]
	if len(sc.start) != len(t.shards)+1 {
		sc.start = make([]int32, len(t.shards)+1)
	}
	return sc
}

// groupByShard fills sc.order with positions idx[...] sorted by shard (stable) and sc.start with
// each shard's range in it. pos lists the positions to sort; sc.h must hold their hashes.
func (t *Table) groupByShard(sc *scratch, pos []int32, n int) {
	start := sc.start
	clear(start)
	if pos == nil {
		for i := 0; i < n; i++ {
			start[t.shardOf(sc.h[i])+1]++
		}
	} else {
		for _, p := range pos {
			start[t.shardOf(sc.h[p])+1]++
		}
	}
	for s := 1; s < len(start); s++ {
		start[s] += start[s-1]
	}
	// start[s] is now the beginning of shard s; use start[s+1] as a moving cursor, then shift back.
	fill := func(p int32) {
		s := t.shardOf(sc.h[p])
		sc.order[start[s]] = p
		start[s]++
	}
	if pos == nil {
		for i := 0; i < n; i++ {
			fill(int32(i))
		}
	} else {
		for _, p := range pos {
			fill(p)
		}
	}
	copy(start[1:], start[:len(start)-1])
	start[0] = 0
}

// Lookup fills dst (len(ids)*Dim) with the weights of ids, creating rows for new ids as the
// admission policy allows. Ids without a row (not admitted) get their initial value.
func (t *Table) Lookup(ids []uint64, dst []float32) error {
	d := t.dim
	if len(dst) != len(ids)*d {
		return fmt.Errorf("%w: %s: lookup of %d ids needs %d floats, got %d", ErrLength, t.name(), len(ids), len(ids)*d, len(dst))
	}
	if len(ids) == 0 {
		return nil
	}
	sc := t.getScratch(len(ids))
	defer t.scratch.Put(sc)
	for i, id := range ids {
		sc.h[i] = t.hash(id)
	}
	t.groupByShard(sc, nil, len(ids))
	stride := t.stride
	var sink uint32
	for si := range t.shards {
		lo, hi := sc.start[si], sc.start[si+1]
		if lo == hi {
			continue
		}
		s := &t.shards[si]
		grp := sc.order[lo:hi]
		sc.miss = sc.miss[:0]
		s.mu.RLock()
		// Three passes, so the cache misses of a whole group are in flight together: index
		// entries, then the rows their tags point to, then the verified copies.
		for _, p := range grp {
			sink += s.touchIndex(sc.h[p])
		}
		for _, p := range grp {
			if r := s.candidateLocked(sc.h[p]); r >= 0 {
				sink += s.touchLocked(uint32(r), stride, hdrWords+d)
			}
		}
		for _, p := range grp {
			r := s.findLocked(ids[p], sc.h[p], stride)
			if r < 0 {
				sc.miss = append(sc.miss, p)
				continue
			}
			copy(dst[int(p)*d:int(p+1)*d], s.rowFloats(uint32(r), stride)[hdrWords:hdrWords+d])
		}
		s.mu.RUnlock()
		if len(sc.miss) > 0 {
			if err := t.lookupMissing(s, ids, sc, dst); err != nil {
				return err
			}
		}
	}
	sc.sink += sink
	return nil
}

// Peek fills dst (len(ids)*Dim) like Lookup but creates no row and counts no sighting: ids
// without a row read their initial value. Use it to evaluate a model without growing it.
func (t *Table) Peek(ids []uint64, dst []float32) error {
	d := t.dim
	if len(dst) != len(ids)*d {
		return fmt.Errorf("%w: %s: peek of %d ids needs %d floats, got %d", ErrLength, t.name(), len(ids), len(ids)*d, len(dst))
	}
	for i, id := range ids {
		h := t.hash(id)
		s := &t.shards[t.shardOf(h)]
		out := dst[i*d : (i+1)*d]
		s.mu.RLock()
		if r := s.findLocked(id, h, t.stride); r >= 0 {
			copy(out, s.rowFloats(uint32(r), t.stride)[hdrWords:hdrWords+d])
			s.mu.RUnlock()
			continue
		}
		s.mu.RUnlock()
		t.initRow(id, out)
	}
	return nil
}

// lookupMissing handles the ids of one shard that had no row under the read lock.
func (t *Table) lookupMissing(s *shard, ids []uint64, sc *scratch, dst []float32) error {
	d, stride := t.dim, t.stride
	locked := false
	defer func() {
		if locked {
			s.mu.Unlock()
		}
	}()
	for _, p := range sc.miss {
		id, h := ids[p], sc.h[p]
		out := dst[int(p)*d : int(p+1)*d]
		if !t.admitAtLookup(id) {
			t.initRow(id, out)
			continue
		}
		if !locked {
			s.mu.Lock()
			locked = true
		}
		r := s.findLocked(id, h, stride)
		if r < 0 {
			var err error
			if r, err = t.createLocked(s, id, h, t.latest.Load()); err != nil {
				return err
			}
		}
		copy(out, s.rowFloats(uint32(r), stride)[hdrWords:hdrWords+d])
	}
	return nil
}

// createLocked makes a row for id (absent) with its initial value, evicting a victim first when the
// row cap is reached.
func (t *Table) createLocked(s *shard, id, h uint64, step uint32) (int, error) {
	if m := t.cfg.Eviction.MaxRows; m > 0 && t.rows.Load() >= int64(m) && s.live > 0 {
		t.evictVictimLocked(s)
	}
	r, ok := s.allocLocked(t.stride)
	if !ok {
		return -1, fmt.Errorf("%w: %s: no room for another row in a shard of %d rows", ErrFull, t.name(), s.live)
	}
	w := s.rowWords(r, t.stride)
	w[0], w[1] = uint32(id), uint32(id>>32)
	w[wordStep], w[wordFreq] = step, 0
	f := s.rowFloats(r, t.stride)
	t.initRow(id, f[hdrWords:hdrWords+t.dim])
	t.initState(f[hdrWords+t.dim:])
	s.insertLocked(id, h, r, t)
	s.markLocked(r)
	t.rows.Add(1)
	t.created.Add(1)
	return int(r), nil
}

// Apply applies one optimizer step to the rows of ids with gradients grads (len(ids)*Dim). The
// gradients of an id that appears more than once are summed first. Step is the caller's training
// step, recorded as the rows' last step (for TTL and LRU); 2^32-1 is reserved and stored as
// 2^32-2. A NaN or infinite gradient rejects the whole batch with ErrNonFinite. The one error
// that can leave a batch half applied is ErrFull (a shard past MaxRowsPerShard rows).
func (t *Table) Apply(ids []uint64, grads []float32, step uint32) error {
	d := t.dim
	if len(grads) != len(ids)*d {
		return fmt.Errorf("%w: %s: apply of %d ids needs %d gradient floats, got %d", ErrLength, t.name(), len(ids), len(ids)*d, len(grads))
	}
	if i := FirstNonFinite(grads); i >= 0 {
		t.rejected.Add(1)
		return fmt.Errorf("%w: %s: gradient %d of id %d is %v", ErrNonFinite, t.name(), i%d, ids[i/d], grads[i])
	}
	if len(ids) == 0 {
		return nil
	}
	step = min(step, maxStep)
	for cur := t.latest.Load(); step > cur && !t.latest.CompareAndSwap(cur, step); cur = t.latest.Load() {
	}
	sc := t.getScratch(len(ids))
	defer t.scratch.Put(sc)
	for i, id := range ids {
		sc.h[i] = t.hash(id)
	}
	t.foldDuplicates(sc, ids)
	t.groupByShard(sc, sc.uniq, 0)
	if cap(sc.sum) < d {
		sc.sum = make([]float32, d)
	}
	// With a row cap, creating a row may evict one resolved earlier in the batch, so rows are
	// then updated as soon as they are resolved.
	late := t.cfg.Eviction.MaxRows == 0
	var sink uint32
	for si := range t.shards {
		lo, hi := sc.start[si], sc.start[si+1]
		if lo == hi {
			continue
		}
		s := &t.shards[si]
		grp := sc.order[lo:hi]
		rows := sc.rows[:0]
		s.mu.Lock()
		for _, p := range grp {
			sink += s.touchIndex(sc.h[p])
		}
		for _, p := range grp {
			if r := s.candidateLocked(sc.h[p]); r >= 0 {
				sink += s.touchLocked(uint32(r), t.stride, t.stride)
			}
		}
		for _, p := range grp {
			id := ids[p]
			r := s.findLocked(id, sc.h[p], t.stride)
			if r < 0 {
				if !t.admitAtApply(id) {
					t.dropped.Add(1)
					rows = append(rows, -1)
					continue
				}
				var err error
				if r, err = t.createLocked(s, id, sc.h[p], step); err != nil {
					s.mu.Unlock()
					return err
				}
			}
			if late {
				rows = append(rows, int32(r))
			} else {
				t.applyRowLocked(s, uint32(r), p, grads, sc, step)
			}
		}
		if late {
			for k, p := range grp {
				if r := rows[k]; r >= 0 {
					t.applyRowLocked(s, uint32(r), p, grads, sc, step)
				}
			}
		}
		s.mu.Unlock()
		sc.rows = rows
	}
	sc.sink += sink
	return nil
}

// applyRowLocked applies the gradient of the id at position p (summed over its repeats) to row r.
func (t *Table) applyRowLocked(s *shard, r uint32, p int32, grads []float32, sc *scratch, step uint32) {
	d := t.dim
	g := grads[int(p)*d : int(p+1)*d]
	if q := sc.next[p]; q >= 0 {
		sum := sc.sum[:d]
		copy(sum, g)
		for ; q >= 0; q = sc.next[q] {
			gq := grads[int(q)*d : int(q+1)*d]
			for j := range sum {
				sum[j] += gq[j]
			}
		}
		g = sum
	}
	row := s.rowFloats(r, t.stride)
	t.update(row[hdrWords:hdrWords+d], row[hdrWords+d:], g)
	w := s.rowWords(r, t.stride)
	w[wordStep] = step
	if w[wordFreq] != math.MaxUint32 {
		w[wordFreq]++
	}
	s.markLocked(r)
}

// FirstNonFinite returns the index of the first NaN or infinite value in v, or -1. A float32 is
// not finite exactly when its exponent bits are all ones; four values are tested per step.
func FirstNonFinite(v []float32) int {
	const exp = 0x7f800000
	i := 0
	for ; i+4 <= len(v); i += 4 {
		a, b := math.Float32bits(v[i])&exp, math.Float32bits(v[i+1])&exp
		c, e := math.Float32bits(v[i+2])&exp, math.Float32bits(v[i+3])&exp
		if a == exp || b == exp || c == exp || e == exp {
			break
		}
	}
	for ; i < len(v); i++ {
		if math.Float32bits(v[i])&exp == exp {
			return i
		}
	}
	return -1
}

// foldDuplicates fills sc.uniq with the first position of each distinct id and sc.next with a
// linked list from each first position through the later positions of the same id (-1 ends).
func (t *Table) foldDuplicates(sc *scratch, ids []uint64) {
	n := len(ids)
	size := 1
	for size < 2*n {
		size <<= 1
	}
	if cap(sc.keys) < size {
		sc.keys = make([]uint64, size)
		sc.grp = make([]int32, size)
	}
	keys, grp := sc.keys[:size], sc.grp[:size]
	clear(grp)
	last := sc.order // reuse as "last position of this id's list"; overwritten by groupByShard later
	sc.uniq = sc.uniq[:0]
	mask := size - 1
	for i, id := range ids {
		sc.next[i] = -1
		for k := int(sc.h[i]) & mask; ; k = (k + 1) & mask {
			g := grp[k]
			if g == 0 {
				keys[k] = id
				grp[k] = int32(i) + 1
				last[i] = int32(i)
				sc.uniq = append(sc.uniq, int32(i))
				break
			}
			if keys[k] == id {
				first := g - 1
				sc.next[last[first]] = int32(i)
				last[first] = int32(i)
				break
			}
		}
	}
}

// RowData is a copy of one row.
type RowData struct {
	ID       uint64
	Weights  []float32
	State    []float32 // optimizer state; for Adam the last value holds the step count bits
	LastStep uint32
	Freq     uint32
}

// Row returns a copy of id's row without creating it.
func (t *Table) Row(id uint64) (RowData, bool) {
	h := t.hash(id)
	s := &t.shards[t.shardOf(h)]
	s.mu.RLock()
	defer s.mu.RUnlock()
	r := s.findLocked(id, h, t.stride)
	if r < 0 {
		return RowData{}, false
	}
	return t.rowData(s, uint32(r)), true
}

func (t *Table) rowData(s *shard, r uint32) RowData {
	f := s.rowFloats(r, t.stride)
	w := s.rowWords(r, t.stride)
	return RowData{
		ID:       uint64(w[0]) | uint64(w[1])<<32,
		Weights:  append([]float32(nil), f[hdrWords:hdrWords+t.dim]...),
		State:    append([]float32(nil), f[hdrWords+t.dim:]...),
		LastStep: w[wordStep],
		Freq:     w[wordFreq],
	}
}

// InitialWeights writes the initial weights of id into dst (len Dim) without touching the table.
func (t *Table) InitialWeights(id uint64, dst []float32) error {
	if len(dst) != t.dim {
		return fmt.Errorf("%w: %s: need %d floats, got %d", ErrLength, t.name(), t.dim, len(dst))
	}
	t.initRow(id, dst)
	return nil
}

// RowView is a row visited by Range. Its slices alias the table and are valid only during the
// callback; copy what you keep.
type RowView struct {
	ID       uint64
	Weights  []float32
	State    []float32
	LastStep uint32
	Freq     uint32
}

// Range calls fn for every row, one shard at a time under that shard's read lock, until fn returns
// false. fn must not call methods of t that write (Lookup of a new id, Apply, Delete, ...).
func (t *Table) Range(fn func(RowView) bool) {
	stride := t.stride
	for si := range t.shards {
		s := &t.shards[si]
		s.mu.RLock()
		for r := uint32(0); r < s.hi; r++ {
			w := s.rowWords(r, stride)
			if w[wordStep] == freeMark {
				continue
			}
			f := s.rowFloats(r, stride)
			v := RowView{
				ID: uint64(w[0]) | uint64(w[1])<<32, LastStep: w[wordStep], Freq: w[wordFreq],
				Weights: f[hdrWords : hdrWords+t.dim], State: f[hdrWords+t.dim:],
			}
			if !fn(v) {
				s.mu.RUnlock()
				return
			}
		}
		s.mu.RUnlock()
	}
}

// Delete removes id's row and reports whether it existed.
func (t *Table) Delete(id uint64) bool {
	h := t.hash(id)
	s := &t.shards[t.shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.findLocked(id, h, t.stride)
	if r < 0 {
		return false
	}
	s.removeLocked(id, h, uint32(r), t)
	t.rows.Add(-1)
	return true
}

// Reserve allocates room for rows rows (spread over the shards, with a margin for uneven
// spreading) and touches every page of it, so that filling the table, or restoring it, does not
// stop on page faults. Memory already in use is kept. MemoryBytes counts the reserved room.
func (t *Table) Reserve(rows int) {
	per := rows/len(t.shards) + rows/len(t.shards)/16 + 64
	t.parallelShards(func(i int) {
		s := &t.shards[i]
		s.mu.Lock()
		s.reserveRowsLocked(per, t.stride)
		s.reserveIndexLocked(t, per)
		s.mu.Unlock()
	})
}

// Stats are counters since the table was made.
type Stats struct {
	Rows            int
	Created         uint64 // rows created (including re-created after eviction)
	Evicted         uint64 // rows removed by the row cap
	Expired         uint64 // rows removed by TTL
	RejectedBatches uint64 // Apply calls refused for a non-finite gradient
	DroppedGrads    uint64 // gradients of ids without a row that admission kept out
	MemoryBytes     int64
}

// Stats returns the table's counters.
func (t *Table) Stats() Stats {
	return Stats{
		Rows: t.Len(), Created: t.created.Load(), Evicted: t.evicted.Load(), Expired: t.expired.Load(),
		RejectedBatches: t.rejected.Load(), DroppedGrads: t.dropped.Load(), MemoryBytes: t.MemoryBytes(),
	}
}

// MemoryBytes returns the heap bytes the table holds: row slabs (including unused capacity),
// index, free lists, change trackers and the admission sketch.
func (t *Table) MemoryBytes() int64 {
	n := int64(len(t.shards)) * int64(unsafe.Sizeof(shard{}))
	for i := range t.shards {
		// The write lock: a checkpoint copy resets its tracker's record (trks) under the read
		// lock and the tracker's mutex, which this does not hold.
		s := &t.shards[i]
		s.mu.Lock()
		n += s.memoryBytesLocked()
		s.mu.Unlock()
	}
	if t.sketch != nil {
		n += int64(len(t.sketch.c)) * 4
	}
	return n
}

// PayloadBytesPerRow is the bytes of weights and optimizer state in one row; MemoryBytes/Len minus
// this is the per-row overhead.
func (t *Table) PayloadBytesPerRow() int { return 4 * (t.dim + t.sw) }

// Assign sets the weights of ids to weights (len(ids)*Dim), creating rows as needed (admission
// does not apply). A new row starts with its initial optimizer state; an existing row keeps its
// state. It marks the rows changed but does not count as an update (frequency and last step are
// unchanged). Non-finite weights are refused with ErrNonFinite and nothing is changed.
func (t *Table) Assign(ids []uint64, weights []float32) error {
	d := t.dim
	if len(weights) != len(ids)*d {
		return fmt.Errorf("%w: %s: assign of %d ids needs %d floats, got %d", ErrLength, t.name(), len(ids), len(ids)*d, len(weights))
	}
	if i := FirstNonFinite(weights); i >= 0 {
		return fmt.Errorf("%w: %s: weight %d of id %d is %v", ErrNonFinite, t.name(), i%d, ids[i/d], weights[i])
	}
	for i, id := range ids {
		h := t.hash(id)
		s := &t.shards[t.shardOf(h)]
		s.mu.Lock()
		r := s.findLocked(id, h, t.stride)
		if r < 0 {
			var err error
			if r, err = t.createLocked(s, id, h, t.latest.Load()); err != nil {
				s.mu.Unlock()
				return err
			}
		}
		copy(s.rowFloats(uint32(r), t.stride)[hdrWords:hdrWords+d], weights[i*d:(i+1)*d])
		s.markLocked(uint32(r))
		s.mu.Unlock()
	}
	return nil
}
