package ps

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/internal/rpc"
)

// Synchronous servers change owner table only between steps: every push of a step must be
// routed by one table on every server, since each server's barrier counts one push per worker.
// A Migrator (or anyone holding the servers) brings them to a step boundary in two rounds:
//
//  1. hold: each server makes the pushes of steps it has not begun wait before they are counted,
//     and reports, per table, the highest step it has begun;
//  2. hold after: each server lets in the pushes of the steps some server of the table has begun
//     (those steps need every worker on every server) and waits until they are applied.
//
// Training is then paused between two steps (pulls are still served), the owner table can
// change, and the hold ends with the version of the newest table: the waiting pushes are admitted
// only if they were routed by it, and the others are refused whole, so their clients resend
// the step, whole, by the new table. A hold nobody ends lasts ServerConfig.MigrationTTL.

// stepState is a synchronous server's part in changes of owner table.
type stepState struct {
	pushed   atomic.Bool // a push has been counted: the table changes only at a boundary
	boundary atomic.Bool // held at a step boundary: the table may change
	// Guarded by own: the version below which pushes are refused (floor), the hold under way
	// (holding), its generation (each hold has its own, so a late round or end of an earlier
	// hold changes nothing), and its timer.
	floor   uint64
	holding bool
	gen     uint64
	timer   *time.Timer
}

// barriersLocked returns the barriers of the hosted tables, by table name.
func (s *Server) barriersLocked() map[string]*hosted {
	out := map[string]*hosted{}
	for name, h := range s.own.tables {
		if h.bar != nil {
			out[name] = h
		}
	}
	return out
}

// holdSteps starts a hold (round 1), replacing one under way, and answers sync u8 | the hold's
// generation u64 | per table, the highest step begun (appendSteps). An asynchronous server
// answers sync 0 and holds nothing.
func (s *Server) holdSteps() []byte {
	if s.cfg.SyncWorkers == 0 {
		return []byte{0}
	}
	s.own.Lock()
	s.steps.gen++
	gen := s.steps.gen
	s.steps.holding = true
	s.steps.boundary.Store(false)
	if s.steps.timer != nil {
		s.steps.timer.Stop()
	}
	s.steps.timer = time.AfterFunc(s.cfg.MigrationTTL, func() {
		if s.releaseSteps(gen, 0, nil) {
			s.log.Warn("a hold of the synchronous steps was not ended; ending it", "after", s.cfg.MigrationTTL)
		}
	})
	bars := s.barriersLocked()
	s.own.Unlock()
	begun := make(map[string]int64, len(bars))
	for name, h := range bars {
		begun[name] = h.bar.hold(gen)
	}
	out := binary.LittleEndian.AppendUint64([]byte{1}, gen)
	return appendSteps(out, begun)
}

// holdStepsAfter is round 2 of hold gen: steps gives, per table, the highest step any server
// of the table has begun. A dense tensor's pushes reach only its owner, so its own steps count;
// a table steps does not name waits for its own begun steps. It fails if the hold ends first.
func (s *Server) holdStepsAfter(ctx context.Context, gen uint64, steps map[string]int64) error {
	if s.cfg.SyncWorkers == 0 {
		return nil
	}
	s.own.RLock()
	current := s.steps.holding && s.steps.gen == gen
	bars := s.barriersLocked()
	s.own.RUnlock()
	if !current {
		return migErr("server %s: %v", s.cfg.ID, errHoldEnded)
	}
	for name, h := range bars {
		step := h.bar.begunStep()
		if v, ok := steps[name]; ok && !h.dense {
			step = max(step, v)
		}
		if err := h.bar.holdAfter(ctx, gen, step); err != nil {
			return migErr("server %s, table %q: %v", s.cfg.ID, name, err)
		}
	}
	s.own.Lock()
	defer s.own.Unlock()
	if !s.steps.holding || s.steps.gen != gen {
		return migErr("server %s: %v", s.cfg.ID, errHoldEnded)
	}
	s.steps.boundary.Store(true)
	return nil
}

// releaseSteps ends hold gen, if it is the one under way, and reports whether it was; pushes
// routed by tables older than floor are refused from now on either way. boundary, if the
// servers reached one, gives per table the step they were held after.
func (s *Server) releaseSteps(gen, floor uint64, boundary map[string]int64) bool {
	if s.cfg.SyncWorkers == 0 {
		return false
	}
	s.own.Lock()
	s.steps.floor = max(s.steps.floor, floor)
	if !s.steps.holding || s.steps.gen != gen {
		s.own.Unlock()
		return false
	}
	s.steps.holding = false
	s.steps.boundary.Store(false)
	if s.steps.timer != nil {
		s.steps.timer.Stop()
		s.steps.timer = nil
	}
	bars := s.barriersLocked()
	s.own.Unlock()
	for name, h := range bars {
		step, ok := boundary[name]
		if !ok || h.dense {
			step = -1
		}
		h.bar.release(gen, step) // a barrier a later hold holds is left to it
	}
	return true
}

// syncRoutedLocked checks the table a synchronous push was routed by. Counted, a push must have
// been routed by the server's current table (and that not older than the newest a hold ended
// with). Before it waits for a hold to end (counting false), only a push routed by an older
// table is refused: a newer one may be the table the hold installs. A refusal makes the client
// resend its step, whole.
func (s *Server) syncRoutedLocked(version uint64, counting bool) error {
	cur := s.version()
	floor := s.steps.floor
	v := max(cur, floor)
	switch {
	case counting && version == cur && cur >= floor:
		s.steps.pushed.Store(true)
		return nil
	case !counting && version >= v:
		return nil
	}
	var d [12]byte
	binary.LittleEndian.PutUint64(d[:], v)
	binary.LittleEndian.PutUint32(d[8:], math.MaxUint32)
	return &rpc.RemoteError{Code: codeWrongOwner, Message: fmt.Sprintf("server %s runs synchronous steps by owner table %d, not %d", s.cfg.ID, v, version), Data: d[:]}
}

// appendSteps writes steps for round 2 and the end of a hold: count u32 | per table, by name:
// name (str) | step (i64).
func appendSteps(dst []byte, steps map[string]int64) []byte {
	names := make([]string, 0, len(steps))
	for name := range steps {
		names = append(names, name)
	}
	sort.Strings(names)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(names)))
	for _, name := range names {
		dst = appendString(dst, name)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(steps[name]))
	}
	return dst
}

// decodeSteps reads what appendSteps wrote.
func decodeSteps(b []byte) (map[string]int64, error) {
	d := decoder{b: b}
	n := d.u32()
	if d.err != nil || uint64(n)*10 > uint64(len(d.b)) {
		return nil, errShort
	}
	out := make(map[string]int64, n)
	for range n {
		name := d.str()
		step := int64(d.u64())
		if step < -1 || step > math.MaxUint32 {
			return nil, errShort
		}
		out[name] = step
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, errShort
	}
	return out, nil
}
