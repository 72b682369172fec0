package elastic

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"sync"

	"github.com/elasticps/elasticps/ps"
)

// ledger counts, independently of the dispatcher, which dataset positions the model has trained
// in each epoch: a bitmap per epoch, set as each batch ends applied and reported, and a count of
// positions set twice. The coordinator saves it with every commit and restores it with it, so it
// always describes exactly the training the model holds. Safe for concurrent use.
//
// Positions are dataset-wide: offset o of shard k is position base+o, base being the shard's
// (shard.Shard.Base, the same in every epoch). The bases of the shards whose positions were
// marked are noted with them (noteShard), so that a batch's place as the servers know it
// (ps.Position: epoch, shard, offsets) converts to positions (global); they are not saved, since
// only positions marked since the ledger was made or decoded are ever converted (sinceHeld).
type ledger struct {
	mu     sync.Mutex
	epochs map[int]*epochBits
	bases  map[uint32]int64 // by shard index
}

type epochBits struct {
	words    []uint64
	covered  int64 // positions set
	dups     int64 // positions set again
	firstDup int64 // first position set twice, -1 if none
}

func newLedger() *ledger { return &ledger{epochs: map[int]*epochBits{}, bases: map[uint32]int64{}} }

// noteShard records that offset o of shard k is dataset position base+o. Call it before marking
// positions of the shard.
func (l *ledger) noteShard(k uint32, base int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.bases[k] = base
}

// global returns the positions [from, to) of p, and false when no position of p's shard was
// marked.
func (l *ledger) globalLocked(p ps.Position) (from, to int64, ok bool) {
	base, ok := l.bases[p.Shard]
	return base + p.Start, base + p.End, ok
}

// mark records that positions [from, to) of epoch were trained.
func (l *ledger) mark(epoch int, from, to int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.epochs[epoch]
	if e == nil {
		e = &epochBits{firstDup: -1}
		l.epochs[epoch] = e
	}
	if need := int((to + 63) / 64); need > len(e.words) {
		e.words = append(e.words, make([]uint64, need-len(e.words))...)
	}
	for p := from; p < to; p++ {
		w, b := p/64, uint64(1)<<(p%64)
		if e.words[w]&b != 0 {
			e.dups++
			if e.firstDup < 0 {
				e.firstDup = p
			}
			continue
		}
		e.words[w] |= b
		e.covered++
	}
}

// EpochCheck compares, for one epoch, the positions the model trained (counted by the
// coordinator's ledger as workers end their batches) with the progress the dispatcher accepted.
type EpochCheck struct {
	Epoch int
	// Records is the number of positions in the epoch (records, plus held-out and malformed
	// lines of text data, which are covered without being trained).
	Records int64
	// Accepted is what the dispatcher counted as trained (accepted reports).
	Accepted int64
	// Failed is the positions of shards the dispatcher gave up on.
	Failed int64
	// Covered is the positions the ledger saw trained at least once; Duplicates the positions
	// trained more than once (FirstDuplicate is the first, -1 if none).
	Covered, Duplicates, FirstDuplicate int64
	// Complete is set when the dispatcher finished the epoch.
	Complete bool
}

// OK reports whether every position was trained exactly once (a finished epoch) or at most once
// and exactly as the dispatcher counted (an epoch in progress).
func (e EpochCheck) OK() bool {
	if e.Duplicates != 0 || e.Covered != e.Accepted {
		return false
	}
	return !e.Complete || e.Covered+e.Failed == e.Records
}

// Violations counts the positions that break exactly-once: those trained more than once, plus
// the larger of the difference between the ledger's and the dispatcher's counts and, in a
// finished epoch, the positions neither trained nor given up (a position lost shows in both).
// It is zero exactly when OK holds.
func (e EpochCheck) Violations() int64 {
	abs := func(x int64) int64 { return max(x, -x) }
	off := abs(e.Covered - e.Accepted)
	if e.Complete {
		off = max(off, abs(e.Records-e.Covered-e.Failed))
	}
	return e.Duplicates + off
}

// String describes the check in one line.
func (e EpochCheck) String() string {
	state := "in progress"
	if e.Complete {
		state = "complete"
	}
	s := fmt.Sprintf("epoch %d (%s): %d of %d positions covered (trained, or skipped as bad lines), dispatcher counted %d, %d twice",
		e.Epoch, state, e.Covered, e.Records, e.Accepted, e.Duplicates)
	if e.Failed > 0 {
		s += fmt.Sprintf(", %d in failed shards", e.Failed)
	}
	if e.FirstDuplicate >= 0 {
		s += fmt.Sprintf(" (first: position %d)", e.FirstDuplicate)
	}
	return s
}

// check compares the ledger with the dispatcher's epoch totals.
func (l *ledger) check(epochs []epochTotals, current int, finished bool) []EpochCheck {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]EpochCheck, 0, len(epochs))
	for _, t := range epochs {
		c := EpochCheck{Epoch: t.epoch, Records: t.records, Accepted: t.done, Failed: t.failed, FirstDuplicate: -1,
			Complete: t.epoch < current || finished}
		if e := l.epochs[t.epoch]; e != nil {
			c.Covered, c.Duplicates, c.FirstDuplicate = e.covered, e.dups, e.firstDup
		}
		out = append(out, c)
	}
	return out
}

// epochTotals is the dispatcher's view of one epoch.
type epochTotals struct {
	epoch                 int
	records, done, failed int64
}

// ledgerMagic starts an encoded ledger.
const ledgerMagic = "ELPSLDG1"

var errLedger = errors.New("elastic: corrupt ledger")

// encode returns the ledger's state.
func (l *ledger) encode() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := make([]int, 0, len(l.epochs))
	for k := range l.epochs {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	b := append([]byte(nil), ledgerMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(keys)))
	for _, k := range keys {
		e := l.epochs[k]
		b = binary.LittleEndian.AppendUint32(b, uint32(k))
		b = binary.LittleEndian.AppendUint64(b, uint64(e.dups))
		b = binary.LittleEndian.AppendUint64(b, uint64(e.firstDup))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e.words)))
		for _, w := range e.words {
			b = binary.LittleEndian.AppendUint64(b, w)
		}
	}
	return b
}

// decodeLedger reads an encoded ledger, checking every length.
func decodeLedger(b []byte) (*ledger, error) {
	if len(b) < len(ledgerMagic)+4 || string(b[:len(ledgerMagic)]) != ledgerMagic {
		return nil, fmt.Errorf("%w: bad header", errLedger)
	}
	b = b[len(ledgerMagic):]
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	l := newLedger()
	for i := uint32(0); i < n; i++ {
		if len(b) < 24 {
			return nil, fmt.Errorf("%w: truncated epoch header", errLedger)
		}
		epoch := int(binary.LittleEndian.Uint32(b))
		e := &epochBits{dups: int64(binary.LittleEndian.Uint64(b[4:])), firstDup: int64(binary.LittleEndian.Uint64(b[12:]))}
		words := binary.LittleEndian.Uint32(b[20:])
		b = b[24:]
		if uint64(len(b)) < 8*uint64(words) {
			return nil, fmt.Errorf("%w: truncated bitmap of epoch %d", errLedger, epoch)
		}
		if _, dup := l.epochs[epoch]; dup {
			return nil, fmt.Errorf("%w: epoch %d twice", errLedger, epoch)
		}
		e.words = make([]uint64, words)
		for j := range e.words {
			e.words[j] = binary.LittleEndian.Uint64(b[8*j:])
			e.covered += int64(bits.OnesCount64(e.words[j]))
		}
		b = b[8*int(words):]
		l.epochs[epoch] = e
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errLedger, len(b))
	}
	return l, nil
}

// trained returns the positions marked, over every epoch.
func (l *ledger) trained() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for _, e := range l.epochs {
		n += e.covered
	}
	return n
}

// heldBatch is a batch that a checkpoint holds applied to some slots of a table: the servers'
// applied state saved with their rows.
type heldBatch struct {
	table string
	pos   ps.Position
	slots []int // ascending
}

// sinceHeld returns the positions marked in l and not in old, but those of the batches held
// (old's checkpoint holds them applied), as spans in epoch and position order, and their
// count; and, apart, the positions marked in l and not in old that belong to a held batch, a
// Span for each held batch and table, in epoch, position and table order.
func (l *ledger) sinceHeld(old *ledger, held []heldBatch) ([]Span, int64, []Span) {
	l.mu.Lock()
	defer l.mu.Unlock()
	old.mu.Lock()
	defer old.mu.Unlock()
	keys := make([]int, 0, len(l.epochs))
	for k := range l.epochs {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	fresh := make(map[int][]uint64, len(keys)) // marked in l, not in old
	for _, k := range keys {
		e, o := l.epochs[k], old.epochs[k]
		words := slices.Clone(e.words)
		if o != nil {
			for w := range min(len(words), len(o.words)) {
				words[w] &^= o.words[w]
			}
		}
		fresh[k] = words
	}
	isSet := func(words []uint64, p int64) bool {
		return p >= 0 && p/64 < int64(len(words)) && words[p/64]&(1<<(p%64)) != 0
	}
	var kept []Span
	var clear []Span
	for _, h := range held {
		from, to, ok := l.globalLocked(h.pos)
		words := fresh[int(h.pos.Epoch)]
		if !ok || words == nil {
			continue // nothing of its shard (epoch) was marked: it was not trained since
		}
		for _, sp := range spansOf(int(h.pos.Epoch), words, from, to, isSet) {
			clear = append(clear, sp)
			sp.Table, sp.Slots = h.table, h.slots
			kept = append(kept, sp)
		}
	}
	for _, sp := range clear {
		words := fresh[sp.Epoch]
		for p := sp.From; p < sp.To; p++ {
			words[p/64] &^= 1 << (p % 64)
		}
	}
	sort.Slice(kept, func(i, j int) bool {
		a, b := kept[i], kept[j]
		if a.Epoch != b.Epoch {
			return a.Epoch < b.Epoch
		}
		if a.From != b.From {
			return a.From < b.From
		}
		return a.Table < b.Table
	})
	var spans []Span
	var n int64
	for _, k := range keys {
		words := fresh[k]
		for _, sp := range spansOf(k, words, 0, int64(len(words))*64, isSet) {
			spans = append(spans, sp)
			n += sp.To - sp.From
		}
	}
	return spans, n, kept
}

// spansOf returns the runs of positions in [from, to) that set reports set in words.
func spansOf(epoch int, words []uint64, from, to int64, set func([]uint64, int64) bool) []Span {
	var out []Span
	open := int64(-1)
	for p := from; p < to; p++ {
		if p%64 == 0 && p+64 <= to && open < 0 && (p/64 >= int64(len(words)) || words[p/64] == 0) {
			p += 63 // a word with nothing set
			continue
		}
		switch s := set(words, p); {
		case s && open < 0:
			open = p
		case !s && open >= 0:
			out = append(out, Span{Epoch: epoch, From: open, To: p})
			open = -1
		}
	}
	if open >= 0 {
		out = append(out, Span{Epoch: epoch, From: open, To: to})
	}
	return out
}
