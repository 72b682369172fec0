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
	pushed   atomic.Bool   // a push has been counted: the table changes only at a boundary
	boundary atomic.Bool   // held at a step boundary: the table may change
	floor    atomic.Uint64 // pushes routed by an older table are refused
	holding  bool          // guarded by own: new tables' barriers start held
	timer    *time.Timer   // guarded by own: ends a hold nobody ended
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

// holdSteps starts a hold (round 1) and answers sync u8 | per table, the highest step begun
// (appendSteps). An asynchronous server answers sync 0 and holds nothing.
func (s *Server) holdSteps() []byte {
	if s.cfg.SyncWorkers == 0 {
		return []byte{0}
	}
	s.own.Lock()
	s.steps.holding = true
	s.steps.boundary.Store(false)
	if s.steps.timer != nil {
		s.steps.timer.Stop()
	}
	s.steps.timer = time.AfterFunc(s.cfg.MigrationTTL, func() {
		s.log.Warn("a hold of the synchronous steps was not ended; ending it", "after", s.cfg.MigrationTTL)
		s.releaseSteps(0, nil)
	})
	bars := s.barriersLocked()
	s.own.Unlock()
	begun := make(map[string]int64, len(bars))
	for name, h := range bars {
		begun[name] = h.bar.hold()
	}
	return appendSteps([]byte{1}, begun)
}

// holdStepsAfter is round 2: steps gives, per table, the highest step any server of the table
// has begun. A dense tensor's pushes reach only its owner, so its own steps count; a table
// steps does not name waits for its own begun steps.
func (s *Server) holdStepsAfter(ctx context.Context, steps map[string]int64) error {
	if s.cfg.SyncWorkers == 0 {
		return nil
	}
	s.own.RLock()
	holding := s.steps.holding
	bars := s.barriersLocked()
	s.own.RUnlock()
	if !holding {
		return migErr("server %s holds no steps", s.cfg.ID)
	}
	for name, h := range bars {
		step := h.bar.begunStep()
		if v, ok := steps[name]; ok && !h.dense {
			step = max(step, v)
		}
		if err := h.bar.holdAfter(ctx, step); err != nil {
			return migErr("table %q: %v", name, err)
		}
	}
	s.steps.boundary.Store(true)
	return nil
}

// releaseSteps ends a hold; pushes routed by tables older than floor are refused from now on.
// boundary, if the servers reached one, gives per table the step they were held after.
func (s *Server) releaseSteps(floor uint64, boundary map[string]int64) {
	if s.cfg.SyncWorkers == 0 {
		return
	}
	for cur := s.steps.floor.Load(); floor > cur && !s.steps.floor.CompareAndSwap(cur, floor); cur = s.steps.floor.Load() {
	}
	s.own.Lock()
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
		h.bar.release(step)
	}
}

// syncRoutedLocked refuses a synchronous push routed by any table but the server's current one
// (or one older than the newest a hold ended with): the client then resends its step, whole.
func (s *Server) syncRoutedLocked(version uint64) error {
	cur := s.version()
	floor := s.steps.floor.Load()
	if version == cur && cur >= floor {
		s.steps.pushed.Store(true)
		return nil
	}
	v := max(cur, floor)
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
		out[name] = int64(d.u64())
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, errShort
	}
	return out, nil
}
