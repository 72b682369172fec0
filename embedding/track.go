package embedding

import "sync"

// A Tracker records which rows of a table change (are created, updated, loaded or removed) from
// the moment it is made or last reset, so a checkpoint or a migration can send only those rows.
// It costs one bit per row slot plus 8 bytes per removed id, and a few nanoseconds per changed row.
// Its methods are safe for concurrent use; copies through one tracker are serialised.
type Tracker struct {
	t      *Table
	mu     sync.Mutex // serialises copies and resets through this tracker
	closed bool       // guarded by t.trackMu
}

// NewTracker starts recording changes.
func (t *Table) NewTracker() *Tracker {
	tr := &Tracker{t: t}
	t.trackMu.Lock()
	defer t.trackMu.Unlock()
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		s.trks = append(s.trks, trackBits{tr: tr})
		s.mu.Unlock()
	}
	return tr
}

// Close stops recording and frees the tracker's memory. It is idempotent.
func (tr *Tracker) Close() error {
	t := tr.t
	t.trackMu.Lock()
	defer t.trackMu.Unlock()
	if tr.closed {
		return nil
	}
	tr.closed = true
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for k := range s.trks {
			if s.trks[k].tr == tr {
				s.trks = append(s.trks[:k], s.trks[k+1:]...)
				break
			}
		}
		s.mu.Unlock()
	}
	return nil
}

func (tr *Tracker) isClosed() bool {
	tr.t.trackMu.Lock()
	defer tr.t.trackMu.Unlock()
	return tr.closed
}

// reset forgets the recorded changes. It runs under the shard's read lock and the tracker's
// mutex: writers, which set bits, hold the shard's write lock, and other copies through the same
// tracker hold its mutex.
func (b *trackBits) reset() {
	if b != nil {
		clear(b.bits)
		b.deleted = b.deleted[:0]
	}
}

// bitsLocked returns the tracker's record in s (s locked at least for reading).
func (s *shard) bitsLocked(tr *Tracker) *trackBits {
	for k := range s.trks {
		if s.trks[k].tr == tr {
			return &s.trks[k]
		}
	}
	return nil
}

// Size returns the bytes CopyRaw needs now: an upper bound of what it writes.
func (tr *Tracker) Size() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	t := tr.t
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.RLock()
		n += t.boundLocked(s, tr)
		s.mu.RUnlock()
	}
	return n
}

// CopyRaw copies the rows changed since the tracker was made or last reset into dst as raw records
// (see Table.CopyRaw), removed ids first as deletion records, and returns the bytes written. Only
// ids for which keep returns true are copied (nil keeps all). With reset, the tracker is cleared
// in the same critical section, also of rows keep rejected. A dst smaller than Size returns
// io.ErrShortBuffer and changes nothing.
func (tr *Tracker) CopyRaw(dst []byte, keep func(id uint64) bool, reset bool) (int, error) {
	return tr.t.copyRaw(dst, tr, true, reset, keep, nil)
}

// Reset clears the record of changes.
func (tr *Tracker) Reset() error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.isClosed() {
		return ErrClosed
	}
	for i := range tr.t.shards {
		s := &tr.t.shards[i]
		s.mu.RLock()
		s.bitsLocked(tr).reset()
		s.mu.RUnlock()
	}
	return nil
}
