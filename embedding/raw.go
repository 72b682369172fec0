package embedding

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Layout describes a table's row layout; tables with equal layouts can exchange raw records.
type Layout struct {
	Dim        int
	Optimizer  OptimizerKind
	StateWidth int
	RowBytes   int // raw record size
}

func (l Layout) String() string {
	return fmt.Sprintf("dim %d, %v, %d state values, %d-byte records", l.Dim, l.Optimizer, l.StateWidth, l.RowBytes)
}

const layoutMagic = "EPSL\x01"

// appendLayout encodes l: magic, dim u32, optimizer u8, state width u32, record size u32.
func appendLayout(dst []byte, l Layout) []byte {
	dst = append(dst, layoutMagic...)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(l.Dim))
	dst = append(dst, byte(l.Optimizer))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(l.StateWidth))
	return binary.LittleEndian.AppendUint32(dst, uint32(l.RowBytes))
}

const layoutLen = len(layoutMagic) + 13

// DecodeLayout decodes a Schema.
func DecodeLayout(b []byte) (Layout, error) {
	if len(b) != layoutLen || string(b[:len(layoutMagic)]) != layoutMagic {
		return Layout{}, fmt.Errorf("%w: bad layout encoding (%d bytes)", ErrCorrupt, len(b))
	}
	b = b[len(layoutMagic):]
	return Layout{
		Dim:        int(binary.LittleEndian.Uint32(b)),
		Optimizer:  OptimizerKind(b[4]),
		StateWidth: int(binary.LittleEndian.Uint32(b[5:])),
		RowBytes:   int(binary.LittleEndian.Uint32(b[9:])),
	}, nil
}

// Layout returns the table's row layout.
func (t *Table) Layout() Layout {
	return Layout{Dim: t.dim, Optimizer: t.cfg.Optimizer.Kind, StateWidth: t.sw, RowBytes: t.RawRowSize()}
}

// Schema returns the encoded Layout. Raw records move only between tables with equal schemas.
func (t *Table) Schema() []byte { return appendLayout(nil, t.Layout()) }

// RawRowSize is the size of one raw record: 16 header bytes (id u64, last step u32, frequency u32)
// then Dim weights and the optimizer state as float32, all little-endian. A record whose last-step
// word is 0xFFFFFFFF is a deletion record: the id was removed.
func (t *Table) RawRowSize() int { return 4 * t.stride }

// RawSize returns an upper bound of the bytes CopyRaw(changedOnly, ...) would write now. With
// changedOnly and no base copy yet it returns 0.
func (t *Table) RawSize(changedOnly bool) int {
	if changedOnly {
		tr := t.baseTracker()
		if tr == nil {
			return 0
		}
		return tr.Size()
	}
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.RLock()
		n += s.live
		s.mu.RUnlock()
	}
	return n * t.RawRowSize()
}

// CopyRaw copies raw records into dst and returns the bytes written: every row (changedOnly false)
// or only the rows changed or removed since the last base copy (changedOnly true; removals as
// deletion records, before the rows). With newBase the change set is cleared in the same critical
// section, so this copy becomes the base of later incremental copies. The copy holds every shard's
// read lock, so it is one consistent cut of the table: lookups go on, updates wait. A dst smaller
// than RawSize(changedOnly) returns io.ErrShortBuffer and changes nothing; changedOnly before any
// newBase copy returns ErrNoBase.
func (t *Table) CopyRaw(dst []byte, changedOnly, newBase bool) (int, error) {
	return t.copyRawBase(dst, changedOnly, newBase, nil)
}

// copyRawBase is CopyRaw; a full copy also stores each shard's record count in counts (nil: not
// wanted).
func (t *Table) copyRawBase(dst []byte, changedOnly, newBase bool, counts []int) (int, error) {
	if !changedOnly && !newBase {
		return t.copyRaw(dst, nil, false, false, nil, counts)
	}
	// Copies against the base run one at a time, so the first base is made exactly once.
	t.baseMu.Lock()
	defer t.baseMu.Unlock()
	if tr := t.baseTracker(); tr != nil {
		return t.copyRaw(dst, tr, changedOnly, newBase, nil, counts)
	}
	if changedOnly {
		return 0, ErrNoBase
	}
	// The first base: record changes from this copy on; a failed copy leaves no base behind.
	tr := t.NewTracker()
	n, err := t.copyRaw(dst, tr, false, true, nil, counts)
	if err != nil {
		tr.Close()
		return n, err
	}
	t.trackMu.Lock()
	t.base = tr
	t.trackMu.Unlock()
	return n, nil
}

// CopyRawSlots copies every row whose id keep accepts (nil: every row), like CopyRaw without a
// tracker: one consistent cut, shards in parallel (keep is called from several goroutines at
// once). dst needs room only for the rows copied: a dst too small returns io.ErrShortBuffer,
// changes nothing and returns as n the bytes the copy needs (rows may be added before the next
// try).
func (t *Table) CopyRawSlots(dst []byte, keep func(id uint64) bool) (int, error) {
	if keep == nil {
		return t.copyRaw(dst, nil, false, false, nil, nil)
	}
	return t.copyPicked(dst, nil, nil, keep, false)
}

// CopyRawDelta copies, in one consistent cut like CopyRaw, what an incremental copy needs when
// the set of rows it covers changes: every live row whose id whole accepts (rows the reader of
// the copy does not hold yet, such as those of slots a server gained), and the rows changed or
// removed since the last base copy whose id changed accepts and whole rejects (removals as
// deletion records, before the rows of their shard). A nil changed accepts every id; a nil
// whole accepts none, which makes it CopyRaw(dst, true, newBase) restricted to changed. With
// newBase the change set is cleared in the same critical section, also of rows neither filter
// accepts, so this copy becomes the base of later incremental copies.
//
// Shards are picked and copied in parallel, so the filters must be safe for concurrent use.
// dst needs room for about the records copied: a dst too small returns io.ErrShortBuffer,
// changes nothing and returns as n a bound of the bytes the copy needs (rows may be added before
// the next try). The bound counts the removed ids changed accepts, the changed rows whatever
// their id (filtering them would mean reading each row twice), and the rows whole accepts.
// Before any base copy it returns ErrNoBase.
func (t *Table) CopyRawDelta(dst []byte, changed, whole func(id uint64) bool, newBase bool) (int, error) {
	t.baseMu.Lock()
	defer t.baseMu.Unlock()
	tr := t.baseTracker()
	if tr == nil {
		return 0, ErrNoBase
	}
	return t.copyPicked(dst, tr, changed, whole, newBase)
}

// picked is what one shard contributes to copyPicked: deletion records, then rows, at most room
// bytes. rows lists the rows by index when they were picked by a pass over every row; else the
// changed rows are found and filtered as they are copied.
type picked struct {
	dels   []uint64
	rows   []uint32
	listed bool
	room   int
}

// copyPicked copies, with every shard read-locked (and tr's mutex held), the deletion records
// and rows each shard picks (see pickShardLocked), shards in parallel each into the room of its
// bound, then closes the gaps; with reset it clears tr's record of changes. A dst smaller than
// the bounds returns their sum and io.ErrShortBuffer.
func (t *Table) copyPicked(dst []byte, tr *Tracker, changed, whole func(uint64) bool, reset bool) (int, error) {
	unlock, err := t.lockCut(tr)
	if err != nil {
		return 0, err
	}
	defer unlock()
	picks := make([]picked, len(t.shards))
	t.parallelShards(func(i int) { picks[i] = t.pickShardLocked(&t.shards[i], tr, changed, whole) })
	off := make([]int, len(t.shards)+1)
	for i, p := range picks {
		off[i+1] = off[i] + p.room
	}
	if total := off[len(t.shards)]; total > len(dst) {
		return total, io.ErrShortBuffer
	}
	got := make([]int, len(t.shards))
	t.parallelShards(func(i int) {
		got[i] = t.putPickedLocked(&t.shards[i], tr, picks[i], changed, dst[off[i]:off[i+1]])
	})
	o := 0
	for i := range t.shards {
		if o != off[i] {
			copy(dst[o:o+got[i]], dst[off[i]:off[i]+got[i]])
		}
		o += got[i]
	}
	if reset && tr != nil {
		for i := range t.shards {
			t.shards[i].bitsLocked(tr).reset()
		}
	}
	return o, nil
}

// pickShardLocked returns what copyPicked copies of shard s (read-locked): the removed ids
// changed accepts (nil: every id) and whole rejects; with whole, the live rows whose id it
// accepts and, with tr, the changed live rows whose id changed accepts, found by a pass over
// every row; else, with tr, room for every changed row, filtered as they are copied.
func (t *Table) pickShardLocked(s *shard, tr *Tracker, changed, whole func(uint64) bool) picked {
	var p picked
	var b *trackBits
	if tr != nil {
		b = s.bitsLocked(tr)
	}
	if b != nil {
		for _, id := range b.deleted {
			if (changed == nil || changed(id)) && (whole == nil || !whole(id)) {
				p.dels = append(p.dels, id)
			}
		}
	}
	rec := t.RawRowSize()
	if whole == nil {
		if b != nil {
			n := 0
			for _, w := range b.bits {
				n += bits.OnesCount64(w)
			}
			p.room = (len(p.dels) + n) * rec
		} else {
			p.room = len(p.dels) * rec
		}
		return p
	}
	p.listed = true
	stride := t.stride
	for r := uint32(0); r < s.hi; r++ {
		w := s.rowWords(r, stride)
		if w[wordStep] == freeMark {
			continue
		}
		id := uint64(w[0]) | uint64(w[1])<<32
		if whole(id) {
			p.rows = append(p.rows, r)
		} else if b != nil && int(r>>6) < len(b.bits) && b.bits[r>>6]&(1<<(r&63)) != 0 &&
			(changed == nil || changed(id)) {
			p.rows = append(p.rows, r)
		}
	}
	p.room = (len(p.dels) + len(p.rows)) * rec
	return p
}

// putPickedLocked writes shard s's deletion records and rows that p picked into dst (p.room
// bytes) and returns the bytes written.
func (t *Table) putPickedLocked(s *shard, tr *Tracker, p picked, changed func(uint64) bool, dst []byte) int {
	stride := t.stride
	rec := 4 * stride
	o := 0
	if len(p.dels) > 0 {
		del := make([]uint32, stride)
		del[wordStep] = freeMark
		for _, id := range p.dels {
			del[0], del[1] = uint32(id), uint32(id>>32)
			o += putWords(dst[o:o+rec], del)
		}
	}
	if p.listed {
		for _, r := range p.rows {
			o += putWords(dst[o:o+rec], s.rowWords(r, stride))
		}
		return o
	}
	if tr == nil {
		return o
	}
	b := s.bitsLocked(tr)
	if b == nil {
		return o
	}
	start := o
	forRuns(b.bits, s.hi, func(lo, hi uint32) { o += t.putLiveRowsLocked(s, lo, hi, dst[o:]) })
	if changed == nil {
		return o
	}
	// Filter the copies in a second pass: testing each row's id between the copies made the copy
	// of rows not in cache a third slower, and the rows left out are few.
	k := start
	for r := start; r < o; r += rec {
		if changed(binary.LittleEndian.Uint64(dst[r:])) {
			if k != r {
				copy(dst[k:k+rec], dst[r:r+rec])
			}
			k += rec
		}
	}
	return k
}

// lockCut takes tr's mutex (when tr is set) and every shard's read lock, so that a copy is one
// consistent cut of the table and of tr's record of changes; the func it returns releases them.
// A closed tr gives ErrClosed.
func (t *Table) lockCut(tr *Tracker) (func(), error) {
	if tr != nil {
		tr.mu.Lock()
		if tr.isClosed() {
			tr.mu.Unlock()
			return nil, ErrClosed
		}
	}
	for i := range t.shards {
		t.shards[i].mu.RLock()
	}
	return func() {
		for i := range t.shards {
			t.shards[i].mu.RUnlock()
		}
		if tr != nil {
			tr.mu.Unlock()
		}
	}, nil
}

// baseTracker returns CopyRaw's tracker, or nil before the first base copy.
func (t *Table) baseTracker() *Tracker {
	t.trackMu.Lock()
	defer t.trackMu.Unlock()
	return t.base
}

func (t *Table) copyRaw(dst []byte, tr *Tracker, changedOnly, reset bool, keep func(uint64) bool, counts []int) (int, error) {
	unlock, err := t.lockCut(tr)
	if err != nil {
		return 0, err
	}
	defer unlock()
	var n int
	if !changedOnly && keep == nil {
		n, err = t.copyAllLocked(dst, counts)
	} else {
		n, err = t.copySelectedLocked(dst, tr, changedOnly, keep)
	}
	if err == nil && reset && tr != nil {
		for i := range t.shards {
			t.shards[i].bitsLocked(tr).reset()
		}
	}
	return n, err
}

// copyAllLocked copies every live row, shards in parallel into precomputed places, and stores
// each shard's record count in counts unless it is nil.
func (t *Table) copyAllLocked(dst []byte, counts []int) (int, error) {
	rec := t.RawRowSize()
	off := make([]int, len(t.shards)+1)
	for i := range t.shards {
		off[i+1] = off[i] + t.shards[i].live*rec
		if counts != nil {
			counts[i] = t.shards[i].live
		}
	}
	total := off[len(t.shards)]
	if total > len(dst) {
		return 0, io.ErrShortBuffer
	}
	t.parallelShards(func(i int) {
		s := &t.shards[i]
		t.copyShardLocked(s, dst[off[i]:off[i+1]])
	})
	return total, nil
}

// parallelShards runs fn for every shard index on up to GOMAXPROCS goroutines.
func (t *Table) parallelShards(fn func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), len(t.shards))
	if workers <= 1 {
		for i := range t.shards {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(t.shards); i = int(next.Add(1) - 1) {
				fn(i)
			}
		}()
	}
	wg.Wait()
}

func (t *Table) copyShardLocked(s *shard, dst []byte) {
	t.putLiveRowsLocked(s, 0, s.hi, dst)
}

// putLiveRowsLocked writes the live rows among rows [lo, hi) of shard s (read-locked) to dst and
// returns the bytes written. Consecutive live rows of one chunk lie together in the slab and go
// in one copy: a shard without free rows (every free row is on its free list) copies whole
// chunks, others split them at the free rows.
func (t *Table) putLiveRowsLocked(s *shard, lo, hi uint32, dst []byte) int {
	stride := t.stride
	holes := len(s.free) > 0
	o := 0
	for lo < hi {
		c := lo >> chunkShift
		end := min(hi, (c+1)<<chunkShift)
		words := s.words[c]
		a, b := int(lo&chunkMask), int((end-1)&chunkMask)+1 // rows [a, b) of the chunk
		if !holes {
			o += putWords(dst[o:], words[a*stride:b*stride])
			lo = end
			continue
		}
		for a < b {
			for a < b && words[a*stride+wordStep] == freeMark {
				a++
			}
			e := a
			for e < b && words[e*stride+wordStep] != freeMark {
				e++
			}
			o += putWords(dst[o:], words[a*stride:e*stride])
			a = e
		}
		lo = end
	}
	return o
}

// forRuns calls fn(lo, hi) for each run [lo, hi) of consecutive set bits of b below limit, in
// order.
func forRuns(b []uint64, limit uint32, fn func(lo, hi uint32)) {
	var lo uint32
	open := false
	for wi, w := range b {
		base := uint32(wi) * 64
		if base >= limit {
			break
		}
		for k := uint32(0); k < 64; {
			if open {
				k += uint32(bits.TrailingZeros64(^(w >> k))) // ones from bit k on
				if k < 64 {
					if hi := min(base+k, limit); lo < hi {
						fn(lo, hi)
					}
					open = false
				}
				continue
			}
			z := bits.TrailingZeros64(w >> k) // zeros from bit k on (64: none set)
			if z == 64 {
				break
			}
			k += uint32(z)
			lo, open = base+k, true
		}
	}
	if open && lo < limit {
		fn(lo, min(uint32(len(b))*64, limit))
	}
}

func (t *Table) copySelectedLocked(dst []byte, tr *Tracker, changedOnly bool, keep func(uint64) bool) (int, error) {
	if !changedOnly {
		tr = nil
	}
	bound := make([]int, len(t.shards))
	total := 0
	for i := range t.shards {
		bound[i] = t.boundLocked(&t.shards[i], tr)
		total += bound[i]
	}
	if total > len(dst) {
		return 0, io.ErrShortBuffer
	}
	if keep == nil {
		// Shards in parallel, each into the room of its bound; then close the gaps left by rows
		// freed after they changed (rare, so the moves are short or none).
		off := make([]int, len(t.shards)+1)
		for i := range t.shards {
			off[i+1] = off[i] + bound[i]
		}
		got := make([]int, len(t.shards))
		t.parallelShards(func(i int) {
			got[i] = t.copyShardSelectedLocked(&t.shards[i], dst[off[i]:off[i+1]], tr, nil)
		})
		o := 0
		for i := range t.shards {
			if o != off[i] {
				copy(dst[o:o+got[i]], dst[off[i]:off[i]+got[i]])
			}
			o += got[i]
		}
		return o, nil
	}
	o := 0
	for i := range t.shards {
		o += t.copyShardSelectedLocked(&t.shards[i], dst[o:o+bound[i]], tr, keep)
	}
	return o, nil
}

// boundLocked is the most bytes shard s contributes to a copy: its live rows, or with a tracker its
// changed rows and removed ids.
func (t *Table) boundLocked(s *shard, tr *Tracker) int {
	if tr == nil {
		return s.live * t.RawRowSize()
	}
	b := s.bitsLocked(tr)
	if b == nil {
		return 0
	}
	n := len(b.deleted)
	for _, w := range b.bits {
		n += bits.OnesCount64(w)
	}
	return n * t.RawRowSize()
}

// putWords writes w little-endian at the start of dst and returns the bytes written.
func putWords(dst []byte, w []uint32) int {
	n := 4 * len(w)
	if n == 0 {
		return 0
	}
	if nativeLittleEndian() {
		copy(dst[:n], unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), n))
		return n
	}
	for i, v := range w {
		binary.LittleEndian.PutUint32(dst[4*i:], v)
	}
	return n
}

// getWords reads len(w) little-endian words from src.
func getWords(w []uint32, src []byte) {
	if nativeLittleEndian() {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), 4*len(w)), src)
		return
	}
	for i := range w {
		w[i] = binary.LittleEndian.Uint32(src[4*i:])
	}
}

func nativeLittleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// LoadRaw applies raw records in order: rows are inserted or replace the existing row (weights,
// state and metadata, bit-exact); deletion records remove the id. Records whose id keep rejects
// are skipped (nil keeps all). Admission and the row cap do not apply. It returns the number of
// records applied. Input that is not a whole number of records returns ErrCorrupt and changes
// nothing. Shards are loaded in parallel, each goroutine letting others run after each shard
// (runtime.Gosched), so that a bulk load (a migration's chunk) does not keep requests beside it
// waiting for a CPU.
func (t *Table) LoadRaw(src []byte, keep func(id uint64) bool) (int, error) {
	rec := t.RawRowSize()
	if len(src)%rec != 0 {
		return 0, fmt.Errorf("%w: %s: %d bytes is not a whole number of %d-byte records", ErrCorrupt, t.name(), len(src), rec)
	}
	n := len(src) / rec
	hs := make([]uint64, 0, n)
	ks := make([]int32, 0, n)
	for k := 0; k < n; k++ {
		id := binary.LittleEndian.Uint64(src[k*rec:])
		if keep != nil && !keep(id) {
			continue
		}
		hs = append(hs, t.hash(id))
		ks = append(ks, int32(k))
	}
	start := make([]int, len(t.shards)+1)
	for _, h := range hs {
		start[t.shardOf(h)+1]++
	}
	for i := range t.shards {
		if c := start[i+1]; c > 0 {
			s := &t.shards[i]
			s.mu.RLock()
			full := s.live+c > MaxRowsPerShard
			s.mu.RUnlock()
			if full {
				return 0, fmt.Errorf("%w: %s: loading %d rows into a shard", ErrFull, t.name(), c)
			}
		}
		start[i+1] += start[i]
	}
	order := make([]int32, len(ks))
	cur := append([]int(nil), start...)
	for j, h := range hs {
		s := t.shardOf(h)
		order[cur[s]] = int32(j)
		cur[s]++
	}
	stride := t.stride
	var rowsDelta atomic.Int64
	var failed atomic.Value
	t.parallelShards(func(i int) {
		if start[i] == start[i+1] {
			return
		}
		defer runtime.Gosched()
		s := &t.shards[i]
		s.mu.Lock()
		defer s.mu.Unlock()
		s.reserveIndexLocked(t, s.live+start[i+1]-start[i])
		if c := start[i+1] - start[i]; c >= chunkRows/2 {
			// Whole slab chunks for many new rows at once: growing the last chunk row by row
			// would copy it at every doubling.
			s.reserveRowsLocked(int(s.hi)+c-len(s.free), stride)
		}
		var delta int64
		for _, j := range order[start[i]:start[i+1]] {
			b := src[int(ks[j])*rec : int(ks[j]+1)*rec]
			id := binary.LittleEndian.Uint64(b)
			h := hs[j]
			r, at := s.probeLocked(id, h, stride)
			if binary.LittleEndian.Uint32(b[8:]) == freeMark {
				if r >= 0 {
					s.removeLocked(id, h, uint32(r), t)
					delta--
				}
				continue
			}
			if r < 0 {
				nr, ok := s.allocLocked(stride)
				if !ok {
					failed.Store(fmt.Errorf("%w: %s", ErrFull, t.name()))
					break
				}
				r = int(nr)
				getWords(s.rowWords(nr, stride), b)
				s.insertAtLocked(id, h, nr, at, t)
				delta++
			} else {
				getWords(s.rowWords(uint32(r), stride), b)
			}
			s.markLocked(uint32(r))
		}
		rowsDelta.Add(delta)
	})
	t.rows.Add(rowsDelta.Load())
	if err, _ := failed.Load().(error); err != nil {
		return 0, err
	}
	return len(ks), nil
}
