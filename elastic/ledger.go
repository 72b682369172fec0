package elastic

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"sync"
)

// ledger counts, independently of the dispatcher, which dataset positions the model has trained
// in each epoch: a bitmap per epoch, set as each batch ends applied and reported, and a count of
// positions set twice. The coordinator saves it with every commit and restores it with it, so it
// always describes exactly the training the model holds. Safe for concurrent use.
type ledger struct {
	mu     sync.Mutex
	epochs map[int]*epochBits
}

type epochBits struct {
	words    []uint64
	covered  int64 // positions set
	dups     int64 // positions set again
	firstDup int64 // first position set twice, -1 if none
}

func newLedger() *ledger { return &ledger{epochs: map[int]*epochBits{}} }

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

// since returns the positions marked in l and not in old, as spans in epoch and position
// order, and their count.
func (l *ledger) since(old *ledger) ([]Span, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	old.mu.Lock()
	defer old.mu.Unlock()
	keys := make([]int, 0, len(l.epochs))
	for k := range l.epochs {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	var spans []Span
	var n int64
	for _, k := range keys {
		e, o := l.epochs[k], old.epochs[k]
		open := int64(-1)
		for w, word := range e.words {
			if o != nil && w < len(o.words) {
				word &^= o.words[w]
			}
			for b := range 64 {
				p := int64(w)*64 + int64(b)
				set := word&(1<<b) != 0
				switch {
				case set && open < 0:
					open = p
				case !set && open >= 0:
					spans = append(spans, Span{Epoch: k, From: open, To: p})
					n += p - open
					open = -1
				}
			}
		}
		if open >= 0 {
			end := int64(len(e.words)) * 64
			spans = append(spans, Span{Epoch: k, From: open, To: end})
			n += end - open
		}
	}
	return spans, n
}
