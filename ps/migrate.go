package ps

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/internal/wait"
)

// A slot migration moves the rows (weights and optimizer state), dense tensors and applied
// positions of a set of slots from their owner A to a server B while both keep serving:
//
//  1. open: A starts tracking changes of the slots' rows (a Tracker per table);
//  2. base: B copies the slots' rows from A shard by shard, in chunks;
//  3. catch-up: B copies the rows changed meanwhile, in rounds, until a round is small;
//  4. fence: A refuses every request touching the slots (ErrMoved) once those in flight are
//     done, and hands B the positions applied to them;
//  5. final: B copies the last changes; B now holds exactly what A holds for the slots;
//  6. the coordinator publishes an owner table giving the slots to B (B serves them from then);
//  7. release: A deletes its rows of the slots, which it no longer owns.
//
// Steps 1–5 are one call to B (Server.ReceiveSlots, or the migrate RPC), which pulls from A
// over the servers' own RPC port. Until step 6 nothing has changed for clients except the
// fence, so a failure before it aborts the migration: A lifts the fence and B forgets what it
// received, and the slots stay with A.
//
// The migrate RPC's request is: op u8 | migration id u64 | op's fields; see the op constants.
const (
	// opOpen: to (str) | slots u32 + u32 each. Answers the tables: count u32 | per table:
	// name (str), dense u8, schema (u32 length, bytes).
	opOpen byte = iota + 1
	// opCopy: table (str) | shard u32 | row u32 | changed u8 | budget u32: a chunk of the
	// slots' rows from that place on (changed: of the rows changed since the last changed copy,
	// whole shards from shard on). Answers the next place (shard u32 | row u32) | raw records.
	opCopy
	// opFence: answers the applied state of the slots (AppliedState).
	opFence
	// opRelease: answers the rows deleted, u64.
	opRelease
	// opAbort: answers nothing.
	opAbort
	// opReceive, sent to the destination: the MigrationSpec as JSON. Answers MigrationStats as
	// JSON.
	opReceive
	// opDiscard, sent to the destination after a failed migration: slots u32 + u32 each.
	opDiscard
	// opHold (migration id 0): start holding synchronous steps (see holdSteps).
	opHold
	// opHoldAfter (migration id 0): hold generation u64 | count u32 | per table: name (str) |
	// step i64; answers once the steps are applied (see holdStepsAfter).
	opHoldAfter
	// opUnhold (migration id 0): hold generation u64 | floor version u64 | the steps held
	// after, as for opHoldAfter (count 0 when no boundary was reached); ends the hold.
	opUnhold
)

// migrations is a server's part in the migrations under way.
type migrations struct {
	// afterFence and afterCopy, if set (tests), run on the destination just after it fenced
	// the source, and at the end of a copy phase.
	afterFence, afterCopy atomic.Pointer[func(context.Context)]

	wg  sync.WaitGroup // background releases
	mu  sync.Mutex
	out map[uint64]*outMigration // as the source, by migration id
	// ended remembers the ids of migrations ended here (the newest endedKeep), so that a
	// late open of one is refused; endedFIFO is their order.
	ended     map[uint64]bool
	endedFIFO []uint64
	// releasing holds the migrations whose rows a release is deleting, each closed when it is
	// done, so that another release of one returns only once its rows are gone.
	releasing map[uint64]chan struct{}
	peers     *rpc.Client // as the destination: calls to sources, made on first use
}

// outMigration is a migration of slots away from this server.
type outMigration struct {
	mu     sync.Mutex // serialises copies
	id     uint64
	to     string
	slots  *embedding.SlotSet
	list   []int
	trk    map[string]*embedding.Tracker // per table with rows in the slots
	fenced bool                          // guarded by migrations.mu
	buf    []byte
	idle   *time.Timer // ends the migration once unused for the TTL, before its fence
}

func (m *outMigration) close() {
	if m.idle != nil {
		m.idle.Stop()
	}
	for _, tr := range m.trk {
		tr.Close()
	}
}

// touch restarts the idle timer: the migration is in use.
func (s *Server) touch(m *outMigration) {
	if m.idle != nil {
		m.idle.Reset(s.cfg.MigrationTTL)
	}
}

// expire ends migration id if it was never fenced: nobody copied from it for the TTL (its
// destination or its coordinator died), and its trackers would slow every write forever. A
// fenced migration is not expired: its destination may hold the final copy, about to be given
// the slots; it ends by its release, when a table gives the slots away (SetOwnerTable), or by
// an abort (its coordinator's, or a new coordinator's: AbortMigrations).
func (s *Server) expire(id uint64) {
	s.own.Lock()
	defer s.own.Unlock()
	s.mig.mu.Lock()
	m := s.mig.out[id]
	live := m != nil && !m.fenced
	s.mig.mu.Unlock()
	if live {
		s.log.Warn("migration unused for its time to live: ended", "migration", id, "to", m.to, "ttl", s.cfg.MigrationTTL)
		s.endMigrationLocked(m)
	}
}

// AbortMigrations ends every migration of slots away from this server: those whose slots it
// still owns are called off (their fence lifted), the others released (their rows dropped). A
// coordinator that takes the job over calls it: the migrations of its predecessors will not be
// finished. It returns the migrations ended.
func (s *Server) AbortMigrations() int {
	s.mig.mu.Lock()
	ids := make([]uint64, 0, len(s.mig.out))
	for id := range s.mig.out {
		ids = append(ids, id)
	}
	s.mig.mu.Unlock()
	for _, id := range ids {
		if _, err := s.ReleaseMigration(id); err != nil {
			s.AbortMigration(id) // it still owns the slots
		}
	}
	if len(ids) > 0 {
		s.log.Warn("ended the migrations of slots away from this server", "migrations", len(ids))
	}
	return len(ids)
}

// releaseGivenLocked releases, in the background, the migrations whose slots the server's
// table no longer gives it: a table that gives them away is their success, whoever published
// it. Call with the ownership lock held.
func (s *Server) releaseGivenLocked() {
	s.mig.mu.Lock()
	var done []uint64
	for id, m := range s.mig.out {
		given := true
		for _, sl := range m.list {
			if s.own.slots.Has(sl) {
				given = false
				break
			}
		}
		if given {
			done = append(done, id)
		}
	}
	s.mig.mu.Unlock()
	if len(done) == 0 || s.closed.Load() {
		return
	}
	s.mig.wg.Add(1)
	go func() {
		defer s.mig.wg.Done()
		for _, id := range done {
			if _, err := s.ReleaseMigration(id); err != nil {
				s.log.Warn("could not release a migration whose slots went away", "migration", id, "err", err)
			}
		}
	}()
}

func (s *Server) closeMigrations() {
	s.mig.wg.Wait()
	s.mig.mu.Lock()
	defer s.mig.mu.Unlock()
	for id, m := range s.mig.out {
		m.close()
		delete(s.mig.out, id)
	}
	if s.mig.peers != nil {
		s.mig.peers.Close()
	}
}

// movedLocked builds the refusal of a fenced slot; the data is the server's version, the slot
// and the destination's ID.
func (s *Server) movedLocked(slot int) error {
	s.stats.moved.Add(1)
	to := ""
	s.mig.mu.Lock()
	for _, m := range s.mig.out {
		if m.fenced && m.slots.Has(slot) {
			to = m.to
		}
	}
	s.mig.mu.Unlock()
	v := s.version()
	d := binary.LittleEndian.AppendUint64(nil, v)
	d = binary.LittleEndian.AppendUint32(d, uint32(slot))
	d = append(d, to...)
	return &rpc.RemoteError{Code: codeMoved, Message: fmt.Sprintf("server %s is handing slot %d to %s (version %d)", s.cfg.ID, slot, to, v), Data: d}
}

func migErr(format string, a ...any) error { return remote(codeMigration, format, a...) }

func (s *Server) handleMigrate(ctx context.Context, req []byte, resp *rpc.Buffer) error {
	if len(req) < 9 {
		return remote(codeBadRequest, "malformed migration request")
	}
	op, id := req[0], binary.LittleEndian.Uint64(req[1:])
	d := decoder{b: req[9:]}
	switch op {
	case opOpen:
		to := d.str()
		slots := d.slots(s.cfg.Slots)
		if d.err != nil || len(d.b) != 0 {
			return remote(codeBadRequest, "malformed migration open")
		}
		tabs, err := s.openMigration(id, to, slots)
		if err != nil {
			return err
		}
		resp.Write(tabs)
		return nil
	case opCopy:
		table := d.str()
		from := embedding.Cursor{Shard: int(d.u32()), Row: d.u32()}
		changed, budget := d.bytes(1), int(d.u32())
		if d.err != nil || len(d.b) != 0 {
			return remote(codeBadRequest, "malformed migration copy")
		}
		return s.copyMigration(id, table, from, changed[0] == 1, budget, resp)
	case opFence:
		st, err := s.fenceMigration(id)
		if err != nil {
			return err
		}
		resp.Write(st)
		return nil
	case opRelease:
		n, err := s.ReleaseMigration(id)
		if err != nil {
			return err
		}
		resp.Write(binary.LittleEndian.AppendUint64(nil, uint64(n)))
		return nil
	case opAbort:
		s.AbortMigration(id)
		return nil
	case opReceive:
		var spec MigrationSpec
		if err := json.Unmarshal(d.b, &spec); err != nil {
			return remote(codeBadRequest, "malformed migration spec: %v", err)
		}
		spec.ID = id
		st, err := s.ReceiveSlots(ctx, spec)
		if err != nil {
			var re *rpc.RemoteError
			if errors.As(err, &re) {
				return err
			}
			return migErr("%v", err)
		}
		return json.NewEncoder(resp).Encode(st)
	case opDiscard:
		slots := d.slots(s.cfg.Slots)
		if d.err != nil || len(d.b) != 0 {
			return remote(codeBadRequest, "malformed migration discard")
		}
		if _, err := s.DiscardSlots(slots); err != nil {
			return migErr("%v", err)
		}
		return nil
	case opHold:
		if len(d.b) != 0 {
			return remote(codeBadRequest, "malformed hold")
		}
		resp.Write(s.holdSteps())
		return nil
	case opHoldAfter:
		gen := d.u64()
		steps, err := decodeSteps(d.b)
		if d.err != nil || err != nil {
			return remote(codeBadRequest, "malformed hold after")
		}
		return s.holdStepsAfter(ctx, gen, steps)
	case opUnhold:
		gen, floor := d.u64(), d.u64()
		steps, err := decodeSteps(d.b)
		if d.err != nil || err != nil {
			return remote(codeBadRequest, "malformed unhold")
		}
		s.releaseSteps(gen, floor, steps)
		return nil
	}
	return remote(codeBadRequest, "unknown migration op %d", op)
}

// slots reads a slot list (count u32, then u32 each, every one below n).
func (d *decoder) slots(n int) []int {
	c := d.u32()
	if d.err != nil || uint64(c)*4 > uint64(len(d.b)) {
		d.err = errShort
		return nil
	}
	out := make([]int, c)
	for i := range out {
		out[i] = int(d.u32())
		if out[i] >= n {
			d.err = errShort
			return nil
		}
	}
	return out
}

func appendSlots(dst []byte, slots []int) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(slots)))
	for _, sl := range slots {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(sl))
	}
	return dst
}

// openMigration starts tracking the slots' rows for a migration to server to, and describes
// the tables B must copy.
func (s *Server) openMigration(id uint64, to string, slots []int) ([]byte, error) {
	if len(slots) == 0 {
		return nil, migErr("migration %d moves no slot", id)
	}
	set := embedding.NewSlotSet(s.cfg.Slots, slots...)
	s.own.RLock()
	defer s.own.RUnlock()
	for _, sl := range slots {
		if !s.own.slots.Has(sl) {
			return nil, migErr("server %s does not own slot %d", s.cfg.ID, sl)
		}
		if s.own.fenced.Has(sl) {
			return nil, migErr("server %s is already handing slot %d over", s.cfg.ID, sl)
		}
	}
	s.mig.mu.Lock()
	defer s.mig.mu.Unlock()
	if m, dup := s.mig.out[id]; dup {
		if m.to != to || !slices.Equal(m.list, slices.Sorted(slices.Values(slots))) {
			return nil, migErr("migration %d is open already, for other slots", id)
		}
		s.touch(m)
		return s.describeLocked(m), nil // the handover's open: the same tables
	}
	if s.mig.ended[id] {
		return nil, migErr("migration %d has ended", id) // an abort overtook the open
	}
	for _, m := range s.mig.out {
		for _, sl := range slots {
			if m.slots.Has(sl) {
				return nil, migErr("slot %d is in migration %d already", sl, m.id)
			}
		}
	}
	m := &outMigration{id: id, to: to, slots: set, list: slices.Sorted(slices.Values(slots)), trk: map[string]*embedding.Tracker{}}
	for name, h := range s.own.tables {
		if !h.dense || set.Has(h.slot) {
			m.trk[name] = h.t.NewTracker() // before any copy: every later change is recorded
		}
	}
	m.idle = time.AfterFunc(s.cfg.MigrationTTL, func() { s.expire(id) })
	s.mig.out[id] = m
	return s.describeLocked(m), nil
}

// describeLocked lists the tables migration m copies: name, dense flag and schema each
// (s.own held).
func (s *Server) describeLocked(m *outMigration) []byte {
	names := make([]string, 0, len(m.trk))
	for name := range m.trk {
		names = append(names, name)
	}
	sort.Strings(names)
	out := binary.LittleEndian.AppendUint32(nil, uint32(len(names)))
	for _, name := range names {
		h := s.own.tables[name]
		out = appendString(out, name)
		dense := byte(0)
		if h.dense {
			dense = 1
		}
		out = append(out, dense)
		schema := h.t.Schema()
		out = binary.LittleEndian.AppendUint32(out, uint32(len(schema)))
		out = append(out, schema...)
	}
	return out
}

func (s *Server) outMigration(id uint64) (*outMigration, error) {
	s.mig.mu.Lock()
	defer s.mig.mu.Unlock()
	m := s.mig.out[id]
	if m == nil {
		return nil, migErr("server %s has no migration %d", s.cfg.ID, id)
	}
	return m, nil
}

// copyMigration answers one chunk of a table's rows in the migration's slots: all of them
// (changed false) or those changed since the previous changed copy.
func (s *Server) copyMigration(id uint64, table string, from embedding.Cursor, changed bool, budget int, resp *rpc.Buffer) error {
	m, err := s.outMigration(id)
	if err != nil {
		return err
	}
	s.touch(m)
	s.own.RLock()
	h := s.own.tables[table]
	s.own.RUnlock()
	tr := m.trk[table]
	if h == nil || tr == nil {
		return migErr("migration %d copies no table %q", id, table)
	}
	slots := m.slots
	if h.dense {
		slots = nil // a dense tensor moves whole with its name's slot
	}
	budget = min(max(budget, 1), maxChunkBytes) // the room is allocated before it is filled
	m.mu.Lock()
	defer m.mu.Unlock()
	next := embedding.Cursor{Shard: h.t.Shards()}
	if changed {
		out := append(m.buf[:0], make([]byte, 8)...)
		var err error
		out, next.Shard, err = h.t.AppendRawShards(out, from.Shard, budget, embedding.ExportOptions{Slots: slots, Changed: tr, Reset: true})
		if err != nil {
			return migErr("migration %d, table %q: %v", id, table, err)
		}
		putCursor(out, next)
		resp.Write(out)
		if cap(out) <= 64<<20 {
			m.buf = out[:0]
		}
		return nil
	}
	// A base copy stops within a row of its budget: its rows go straight into the response.
	room := resp.Extend(8 + budget + h.t.RawRowSize())
	out, next := h.t.AppendRawRows(room[:8], from, budget, slots)
	putCursor(out, next)
	if len(out) > len(room) || (len(out) > 0 && &out[0] != &room[0]) {
		resp.Truncate(resp.Len() - len(room))
		resp.Write(out) // grown past the room after all: copied
		return nil
	}
	resp.Truncate(resp.Len() - len(room) + len(out))
	return nil
}

// putCursor writes a copy's next place in the first 8 bytes of its answer.
func putCursor(out []byte, next embedding.Cursor) {
	binary.LittleEndian.PutUint32(out, uint32(next.Shard))
	binary.LittleEndian.PutUint32(out[4:], next.Row)
}

// fenceMigration makes the server refuse the migration's slots from now on and returns the
// positions applied to them. Requests in flight finish first, so nothing changes the slots
// afterwards.
func (s *Server) fenceMigration(id uint64) ([]byte, error) {
	m, err := s.outMigration(id)
	if err != nil {
		return nil, err
	}
	return s.fenceOf(m)
}

// fenceOf fences migration m, unless it ended since it was looked up.
func (s *Server) fenceOf(m *outMigration) ([]byte, error) {
	id := m.id
	s.touch(m)
	s.own.Lock()
	for _, sl := range m.list {
		if !s.own.slots.Has(sl) {
			s.own.Unlock()
			return nil, migErr("server %s no longer owns slot %d", s.cfg.ID, sl)
		}
	}
	s.mig.mu.Lock()
	if s.mig.out[id] != m { // ended (aborted) since it was looked up
		s.mig.mu.Unlock()
		s.own.Unlock()
		return nil, migErr("migration %d has ended", id)
	}
	for _, sl := range m.list {
		s.own.fenced.Add(sl)
	}
	m.fenced = true
	s.mig.mu.Unlock()
	s.own.Unlock()
	return s.AppliedState(m.slots.Has), nil
}

// ReleaseMigration ends migration id as a success on its source: the server deletes its rows,
// dense tensors and applied positions of the slots, stops tracking them and lifts the fence. It
// refuses while its owner table still gives it any of the slots (the table that gives them to
// their new owner must be installed first), and returns the rows deleted. A migration it does
// not know counts as released; one that another call is releasing, once its rows are deleted.
func (s *Server) ReleaseMigration(id uint64) (int, error) {
	s.own.Lock() // migrations end under it: what is read here holds until it is released
	s.mig.mu.Lock()
	m, busy := s.mig.out[id], s.mig.releasing[id]
	s.mig.mu.Unlock()
	if m == nil {
		s.own.Unlock()
		if busy != nil {
			<-busy
		}
		return 0, nil
	}
	for _, sl := range m.list {
		if s.own.slots.Has(sl) {
			s.own.Unlock()
			return 0, migErr("server %s still owns slot %d of migration %d", s.cfg.ID, sl, id)
		}
	}
	var tables []*hosted
	for name, h := range s.own.tables {
		if _, moved := m.trk[name]; moved {
			tables = append(tables, h)
		}
	}
	sets := make([]*appliedSet, 0, len(s.own.applied))
	for _, a := range s.own.applied {
		sets = append(sets, a)
	}
	done := make(chan struct{})
	s.mig.mu.Lock()
	if s.mig.releasing == nil {
		s.mig.releasing = map[uint64]chan struct{}{}
	}
	s.mig.releasing[id] = done
	s.mig.mu.Unlock()
	defer func() {
		s.mig.mu.Lock()
		delete(s.mig.releasing, id)
		s.mig.mu.Unlock()
		close(done)
	}()
	s.endMigrationLocked(m)
	s.forgetRestoredLocked(m.slots.Has)
	s.own.Unlock()
	// No request touches the slots any more (the server does not own them): delete without
	// holding up the others.
	n := 0
	for _, h := range tables {
		if h.dense {
			n += deleteDense(h)
			continue
		}
		n += h.t.DeleteSlots(m.slots)
	}
	for _, a := range sets {
		a.dropSlots(m.slots.Has)
	}
	return n, nil
}

// AbortMigration ends migration id as a failure on its source: the server lifts the fence and
// keeps serving the slots. A migration it does not know is ignored.
func (s *Server) AbortMigration(id uint64) {
	s.mig.mu.Lock()
	m := s.mig.out[id]
	if m == nil {
		s.mig.endedLocked(id) // an open still on its way is refused
	}
	s.mig.mu.Unlock()
	if m == nil {
		return
	}
	s.own.Lock()
	defer s.own.Unlock()
	s.endMigrationLocked(m)
}

func (s *Server) endMigrationLocked(m *outMigration) {
	for _, sl := range m.list {
		s.own.fenced.Remove(sl)
	}
	s.mig.mu.Lock()
	delete(s.mig.out, m.id)
	s.mig.endedLocked(m.id)
	s.mig.mu.Unlock()
	m.close()
}

// endedKeep is how many ended migration ids a server remembers.
const endedKeep = 1024

// endedLocked records that migration id ended (ms.mu held).
func (ms *migrations) endedLocked(id uint64) {
	if ms.ended == nil {
		ms.ended = map[uint64]bool{}
	}
	if ms.ended[id] {
		return
	}
	ms.ended[id] = true
	ms.endedFIFO = append(ms.endedFIFO, id)
	if len(ms.endedFIFO) > endedKeep {
		delete(ms.ended, ms.endedFIFO[0])
		ms.endedFIFO = ms.endedFIFO[1:]
	}
}

// Phases of a migration a destination can be asked for (MigrationSpec.Phase).
const (
	// PhaseCopy copies the slots' rows and catches up with their writes; the source goes on
	// serving them. A PhaseHandover of the same migration must follow.
	PhaseCopy = "copy"
	// PhaseHandover catches up once more, fences the slots on the source and copies the last
	// changes: the destination then holds exactly what the source does, and the slots are
	// refused until a table gives them to the destination. Its caller times it so that the
	// table goes out at once.
	PhaseHandover = "handover"
)

// MigrationSpec describes a migration to the server that receives the slots.
type MigrationSpec struct {
	// Phase is PhaseCopy, PhaseHandover, or empty for both in one call.
	Phase string
	// ID identifies the migration on both servers; unique among the migrations under way.
	ID uint64
	// From is the slots' current owner.
	From Node
	// Slots are the slots to move.
	Slots []int
	// MaxRounds bounds the catch-up rounds before the fence. Default 8.
	MaxRounds int
	// SmallRound ends the catch-up once a round copies fewer bytes: the final copy, made while
	// the slots are fenced, is then about that small. Default 1 MiB.
	SmallRound int
	// ChunkBytes is the size a copied chunk aims at. Default 4 MiB.
	ChunkBytes int
	// Bandwidth caps the bytes per second this migration copies; 0 means no cap.
	Bandwidth int64
}

// maxChunkBytes bounds MigrationSpec.ChunkBytes well below the frame cap.
const maxChunkBytes = 64 << 20

// chunkSlack is what a chunk's frame holds beside its records: the cursor and the tag, with room
// to spare.
const chunkSlack = 64

// chunkBudget is the budget a destination asks a base copy for, given ChunkBytes and the record
// size. A base chunk overshoots its budget by less than a record, so the budget leaves that
// much room: a chunk (its 8-byte cursor, its records and the frame's tag) fits in chunkBytes,
// and a chunk of the default size in a pooled frame buffer on both ends, which spares
// allocating and clearing 4 MiB per chunk.
func chunkBudget(chunkBytes, rec int) int { return max(chunkBytes-chunkSlack-rec, 1) }

// validate reports every problem of the tuning fields.
func (sp MigrationSpec) validate() error {
	var errs []error
	if sp.MaxRounds < 0 {
		errs = append(errs, fmt.Errorf("MaxRounds %d is negative", sp.MaxRounds))
	}
	if sp.SmallRound < 0 {
		errs = append(errs, fmt.Errorf("SmallRound %d is negative", sp.SmallRound))
	}
	if sp.ChunkBytes < 0 || sp.ChunkBytes > maxChunkBytes {
		errs = append(errs, fmt.Errorf("ChunkBytes %d not in 0..%d", sp.ChunkBytes, maxChunkBytes))
	}
	if sp.Bandwidth < 0 {
		errs = append(errs, fmt.Errorf("Bandwidth %d is negative", sp.Bandwidth))
	}
	if sp.Phase != "" && sp.Phase != PhaseCopy && sp.Phase != PhaseHandover {
		errs = append(errs, fmt.Errorf("unknown Phase %q", sp.Phase))
	}
	return errors.Join(errs...)
}

func (sp MigrationSpec) withDefaults() MigrationSpec {
	if sp.MaxRounds == 0 {
		sp.MaxRounds = 8
	}
	if sp.SmallRound == 0 {
		sp.SmallRound = 1 << 20
	}
	if sp.ChunkBytes == 0 {
		sp.ChunkBytes = 4 << 20
	}
	return sp
}

// MigrationStats reports one migration as its destination saw it.
type MigrationStats struct {
	// Rows and Bytes count the records copied: the base, every catch-up round and the final
	// copy (a row changed during the migration counts each time it was copied).
	Rows, Bytes int64
	// BaseRows counts the rows of the base copy.
	BaseRows int64
	// Rounds is the catch-up rounds made before the fence.
	Rounds int
	// FinalRows counts the records of the copy made while the slots were fenced.
	FinalRows int64
	// Fenced is the time from the fence to the end of the final copy: how long clients of
	// the slots waited, not counting the publication of the next owner table.
	Fenced time.Duration
	// Duration is the whole migration.
	Duration time.Duration
}

// ReceiveSlots carries out migration spec as its destination: it copies the slots' rows, dense
// tensors and applied positions from spec.From while that server keeps serving them, fences
// them there for the final copy, and returns once this server holds exactly what the source
// holds for them. It serves them only once an owner table gives them to it. On failure the
// source lifts its fence, this server forgets what it received, and the error wraps
// ErrMigration.
func (s *Server) ReceiveSlots(ctx context.Context, spec MigrationSpec) (MigrationStats, error) {
	start := time.Now()
	var st MigrationStats
	if err := spec.validate(); err != nil {
		return st, fmt.Errorf("%w: migration %d: %w", ErrMigration, spec.ID, err)
	}
	spec = spec.withDefaults()
	if len(spec.Slots) == 0 {
		return st, fmt.Errorf("%w: migration %d moves no slot", ErrMigration, spec.ID)
	}
	set := embedding.NewSlotSet(s.cfg.Slots)
	for _, sl := range spec.Slots {
		if sl < 0 || sl >= s.cfg.Slots {
			return st, fmt.Errorf("%w: slot %d not in 0..%d", ErrMigration, sl, s.cfg.Slots-1)
		}
		set.Add(sl)
	}
	s.own.RLock()
	for _, sl := range spec.Slots {
		if s.own.slots.Has(sl) {
			s.own.RUnlock()
			return st, fmt.Errorf("%w: server %s owns slot %d already", ErrMigration, s.cfg.ID, sl)
		}
	}
	s.own.RUnlock()
	peers, err := s.peerClient()
	if err != nil {
		return st, err
	}
	r := &receiver{s: s, peers: peers, spec: spec, set: set, st: &st, start: start}
	if err := r.run(ctx); err != nil {
		// Best effort, also when ctx is done: the source must not stay fenced.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		r.call(actx, opAbort, nil)
		s.DiscardSlots(spec.Slots) // not the slots a table gave this server meanwhile
		return st, fmt.Errorf("%w: migration %d of %d slots from %s: %w", ErrMigration, spec.ID, len(spec.Slots), spec.From.ID, err)
	}
	st.Duration = time.Since(start)
	return st, nil
}

// DiscardSlots forgets what this server holds for those of slots it does not own: what a failed
// or abandoned migration brought it. Slots it owns are left alone (a table may have given them
// to it meanwhile). It returns the rows deleted.
func (s *Server) DiscardSlots(slots []int) (int, error) {
	set := embedding.NewSlotSet(s.cfg.Slots)
	for _, sl := range slots {
		if sl < 0 || sl >= s.cfg.Slots {
			return 0, fmt.Errorf("%w: server %s has no slot %d", ErrMigration, s.cfg.ID, sl)
		}
		set.Add(sl)
	}
	drop := func(sl int) bool { return set.Has(sl) && !s.Owns(sl) }
	n := s.ClearSlots(drop)
	// ClearSlots keeps dense tensors for a restore to replace; a failed migration's copy of
	// one goes too.
	s.own.RLock()
	var dense []*hosted
	for _, h := range s.own.tables {
		if h.dense && set.Has(h.slot) && !s.own.slots.Has(h.slot) {
			dense = append(dense, h)
		}
	}
	s.own.RUnlock()
	for _, h := range dense {
		n += deleteDense(h)
	}
	return n, nil
}

// deleteDense deletes the rows of dense tensor h and returns how many there were.
func deleteDense(h *hosted) int {
	n := 0
	for _, rid := range h.ids {
		if h.t.Delete(rid) {
			n++
		}
	}
	return n
}

// Owns reports whether the server's owner table gives it slot.
func (s *Server) Owns(slot int) bool {
	s.own.RLock()
	defer s.own.RUnlock()
	return s.own.slots.Has(slot)
}

func (s *Server) peerClient() (*rpc.Client, error) {
	s.mig.mu.Lock()
	defer s.mig.mu.Unlock()
	if s.closed.Load() {
		return nil, ErrClosed
	}
	if s.mig.peers == nil {
		rc := rpc.ClientConfig{Secret: s.cfg.Secret, Logger: s.log, ConnsPerAddr: 1, MaxFrameSize: 256 << 20, Protection: s.cfg.Protection, TLS: s.cfg.clientTLS()}
		if s.cfg.Transport != nil {
			rc.Transport = s.cfg.Transport
		}
		c, err := rpc.NewClient(rc)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
		s.mig.peers = c
	}
	return s.mig.peers, nil
}

// receiver is the destination's side of one migration.
type receiver struct {
	s     *Server
	peers *rpc.Client
	spec  MigrationSpec
	set   *embedding.SlotSet
	st    *MigrationStats
	start time.Time
	tabs  []receivedTable
	sent  int64 // bytes copied, for the bandwidth cap
}

type receivedTable struct {
	name  string
	t     *embedding.Table
	dense bool // moves whole with its name's slot
}

func (r *receiver) call(ctx context.Context, op byte, body []byte) ([]byte, error) {
	req := append([]byte{op}, binary.LittleEndian.AppendUint64(nil, r.spec.ID)...)
	resp, err := r.peers.Call(ctx, r.spec.From.Addr, methodMigrate, append(req, body...))
	if err != nil {
		return nil, mapErr(r.spec.From.Addr, err)
	}
	return resp, nil
}

func (r *receiver) run(ctx context.Context) error {
	switch r.spec.Phase {
	case PhaseCopy:
		return r.copyPhase(ctx)
	case PhaseHandover:
		if err := r.open(ctx); err != nil {
			return err
		}
		return r.handover(ctx)
	}
	if err := r.copyPhase(ctx); err != nil {
		return err
	}
	return r.handover(ctx)
}

// open opens the migration on the source (again, for a handover: the source answers the same
// tables) and checks its tables against this server's.
func (r *receiver) open(ctx context.Context) error {
	open := appendString(nil, r.s.cfg.ID)
	open = appendSlots(open, r.spec.Slots)
	resp, err := r.call(ctx, opOpen, open)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	err = r.tables(resp)
	r.peers.Release(resp)
	return err
}

// copyPhase copies the base and catches up in rounds, while the source serves the slots.
func (r *receiver) copyPhase(ctx context.Context) error {
	// Rows left from an earlier time this server owned the slots must not survive.
	r.s.DiscardSlots(r.spec.Slots)
	if err := r.open(ctx); err != nil {
		return err
	}
	n, err := r.copyAll(ctx, false)
	if err != nil {
		return fmt.Errorf("base copy: %w", err)
	}
	r.st.BaseRows = n
	if err := r.catchUp(ctx); err != nil {
		return err
	}
	if f := r.s.mig.afterCopy.Load(); f != nil {
		(*f)(ctx)
	}
	return nil
}

// catchUp copies the rows changed since the last copy, in rounds, until a round copies less
// than SmallRound or MaxRounds were made.
func (r *receiver) catchUp(ctx context.Context) error {
	for round := 0; round < r.spec.MaxRounds; round++ {
		before := r.st.Bytes
		if _, err := r.copyAll(ctx, true); err != nil {
			return fmt.Errorf("catch-up round %d: %w", r.st.Rounds+1, err)
		}
		r.st.Rounds++
		if r.st.Bytes-before < int64(r.spec.SmallRound) {
			break
		}
	}
	return nil
}

// handover fences the slots on the source, copies the last changes and the applied
// positions: from then on this server holds exactly what the source holds for them. It is not
// paced: clients wait for it.
func (r *receiver) handover(ctx context.Context) error {
	r.spec.Bandwidth = 0
	if r.spec.Phase == PhaseHandover {
		// The writes since the copy phase, while the slots are still served, in rounds until
		// one is small: what the fenced copy then has to move is about that small.
		if err := r.catchUp(ctx); err != nil {
			return err
		}
	}
	fenced := time.Now()
	applied, err := r.call(ctx, opFence, nil)
	if err != nil {
		return fmt.Errorf("fence: %w", err)
	}
	if f := r.s.mig.afterFence.Load(); f != nil {
		(*f)(ctx)
	}
	state := append([]byte(nil), applied...)
	r.peers.Release(applied)
	if r.st.FinalRows, err = r.copyAll(ctx, true); err != nil {
		return fmt.Errorf("final copy: %w", err)
	}
	if err := r.s.LoadApplied([][]byte{state}, r.set.Has); err != nil {
		return fmt.Errorf("applied positions: %w", err)
	}
	r.st.Fenced = time.Since(fenced)
	return nil
}

// tables checks the source's table list against this server's tables.
func (r *receiver) tables(resp []byte) error {
	d := decoder{b: resp}
	n := int(d.u32())
	r.s.own.RLock()
	defer r.s.own.RUnlock()
	for i := 0; i < n && d.err == nil; i++ {
		name := d.str()
		dense := d.bytes(1)
		schema := d.bytes(int(d.u32()))
		if d.err != nil {
			break
		}
		h := r.s.own.tables[name]
		if h == nil || h.dense != (dense[0] == 1) || string(h.t.Schema()) != string(schema) {
			return fmt.Errorf("table %q differs between %s and %s", name, r.spec.From.ID, r.s.cfg.ID)
		}
		r.tabs = append(r.tabs, receivedTable{name: name, t: h.t, dense: h.dense})
	}
	if d.err != nil || len(d.b) != 0 {
		return fmt.Errorf("%w: migration table list", ErrCorrupt)
	}
	return nil
}

// copyAll copies every table's rows of the slots (changed: only those changed since the last
// changed copy) and loads them, returning the records copied.
func (r *receiver) copyAll(ctx context.Context, changed bool) (int64, error) {
	var rows int64
	for _, tb := range r.tabs {
		rec := tb.t.RawRowSize()
		budget := chunkBudget(r.spec.ChunkBytes, rec)
		for from := (embedding.Cursor{}); from.Shard < tb.t.Shards(); {
			body := appendString(nil, tb.name)
			body = binary.LittleEndian.AppendUint32(body, uint32(from.Shard))
			body = binary.LittleEndian.AppendUint32(body, from.Row)
			flag := byte(0)
			if changed {
				flag = 1
			}
			body = append(body, flag)
			body = binary.LittleEndian.AppendUint32(body, uint32(budget))
			resp, err := r.call(ctx, opCopy, body)
			if err != nil {
				return rows, err
			}
			if len(resp) < 8 || (len(resp)-8)%rec != 0 {
				r.peers.Release(resp)
				return rows, fmt.Errorf("%w: migration chunk of %d bytes", ErrCorrupt, len(resp))
			}
			next := embedding.Cursor{Shard: int(binary.LittleEndian.Uint32(resp)), Row: binary.LittleEndian.Uint32(resp[4:])}
			if next.Shard < from.Shard || next.Shard == from.Shard && next.Row <= from.Row || next.Shard > tb.t.Shards() {
				r.peers.Release(resp)
				return rows, fmt.Errorf("%w: migration chunk goes from %v to %v", ErrCorrupt, from, next)
			}
			data := resp[8:]
			keep := r.set.Contains
			if tb.dense {
				keep = nil
			}
			err = r.load(tb.t, data, keep)
			rows += int64(len(data) / rec)
			r.st.Rows += int64(len(data) / rec)
			r.st.Bytes += int64(len(data))
			r.peers.Release(resp)
			if err != nil {
				return rows, fmt.Errorf("load %q: %w", tb.name, err)
			}
			from = next
			if err := r.pace(ctx, len(data)); err != nil {
				return rows, err
			}
		}
	}
	return rows, nil
}

// load loads records of the migration's slots, none of which this server may own: a table
// that gave it one meanwhile (a recovery) ends the migration, whose rows would overwrite the
// ones it serves. The ownership lock is held for reading, so no table is installed meanwhile.
func (r *receiver) load(t *embedding.Table, data []byte, keep func(uint64) bool) error {
	r.s.own.RLock()
	defer r.s.own.RUnlock()
	for _, sl := range r.spec.Slots {
		if r.s.own.slots.Has(sl) {
			return fmt.Errorf("server %s was given slot %d during the migration", r.s.cfg.ID, sl)
		}
	}
	_, err := t.LoadRaw(data, keep)
	return err
}

// pace sleeps as long as the bandwidth cap asks after n more bytes.
func (r *receiver) pace(ctx context.Context, n int) error {
	r.sent += int64(n)
	if r.spec.Bandwidth <= 0 {
		return ctx.Err()
	}
	due := r.start.Add(time.Duration(float64(r.sent) / float64(r.spec.Bandwidth) * float64(time.Second)))
	return wait.Sleep(ctx, time.Until(due))
}
