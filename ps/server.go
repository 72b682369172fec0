package ps

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/internal/rpc"
)

// Server is a parameter server: it hosts named embedding tables and dense tensors for the slots
// an owner table gives it, and serves pulls and pushes over the network. It refuses, with a
// *WrongOwnerError, every request that touches a slot it does not own, so it never serves one.
// All methods are safe for concurrent use.
type Server struct {
	cfg ServerConfig
	log *slog.Logger
	rpc *rpc.Server

	// own guards ownership and the table map: requests hold it for reading while they run, so a
	// new owner table takes effect between requests, never during one.
	own struct {
		sync.RWMutex
		table   *OwnerTable
		slots   *embedding.SlotSet
		tables  map[string]*hosted
		applied map[string]*appliedSet // by table name: the batches applied per data shard
		// restored holds the slots restored from an older commit while the others were
		// served (RestoreApplied), until a commit holds what they hold (SettleApplied).
		restored []*restoredClass
		// since holds, per owned slot, the version of the first table that gave it to this
		// server: a request routed by an older table is refused so its client refreshes.
		since []uint64
		// fenced holds the owned slots being handed to another server (fenced by a migration):
		// every request touching them is refused with ErrMoved until the next table is out.
		fenced *embedding.SlotSet
	}
	mig   migrations
	fence fences // guarded by own
	steps stepState
	// beforeApply, if set (tests), runs in every asynchronous push just before it is applied,
	// with the ownership lock held for reading.
	beforeApply atomic.Pointer[func()]
	// counted, if set (tests), runs when the barrier of a synchronous push's table counts it:
	// with the barrier's lock held, so a hold that starts later sees the push's step begun.
	counted atomic.Pointer[func(table string, worker, step uint32)]
	stats   slotStats
	started time.Time
	closed  atomic.Bool
	pool    sync.Pool // *reqScratch
}

// hosted is one table on this server.
type hosted struct {
	name   string
	t      *embedding.Table
	dense  bool
	length int      // dense: number of floats
	ids    []uint64 // dense: the row ids 0..rows-1, read only
	slot   int      // dense: the slot of its name
	bar    *barrier
	counts tableCounters
}

// NewServer returns a server hosting cfg.Tables. It owns no slot until SetOwnerTable.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, log: cfg.Logger, started: time.Now()}
	s.own.tables = map[string]*hosted{}
	s.own.applied = map[string]*appliedSet{}
	s.own.slots = embedding.NewSlotSet(cfg.Slots)
	s.own.since = make([]uint64, cfg.Slots)
	s.own.fenced = embedding.NewSlotSet(cfg.Slots)
	s.mig.out = map[uint64]*outMigration{}
	s.stats.init(cfg.Slots)
	for _, spec := range cfg.Tables {
		if err := s.CreateTable(spec); err != nil {
			return nil, err
		}
	}
	r, err := rpc.NewServer(rpc.ServerConfig{
		Secret: cfg.Secret, Logger: s.log, MaxConcurrent: cfg.MaxConcurrent, Compression: cfg.Compression,
		MaxFrameSize: 256 << 20, Protection: cfg.Protection, TLS: cfg.serverTLS(),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	s.rpc = r
	for m, h := range map[uint16]rpc.Handler{
		methodPull: s.handlePull, methodPush: s.handlePush, methodPullDense: s.handlePullDense,
		methodPushDense: s.handlePushDense, methodInitDense: s.handleInitDense,
		methodStats: s.handleStats, methodTable: s.handleTable, methodMigrate: s.handleMigrate,
	} {
		if err := r.Register(m, h); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// ID returns the server's ID.
func (s *Server) ID() string { return s.cfg.ID }

// Slots returns the job's slot count the server was configured with.
func (s *Server) Slots() int { return s.cfg.Slots }

// Serve serves requests on l until Close. It returns nil after Close.
func (s *Server) Serve(l net.Listener) error {
	err := s.rpc.Serve(l)
	if s.closed.Load() {
		return nil
	}
	return err
}

// Close stops serving, cancelling requests in flight, and waits for them. It is idempotent.
func (s *Server) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	err := s.rpc.Close()
	s.closeMigrations()
	// Collect the barriers first: a completing step holds its barrier while it takes own.
	var bars []*barrier
	s.own.Lock()
	if s.steps.timer != nil {
		s.steps.timer.Stop()
	}
	s.own.Unlock()
	s.own.RLock()
	for _, h := range s.own.tables {
		if h.bar != nil {
			bars = append(bars, h.bar)
		}
	}
	s.own.RUnlock()
	for _, b := range bars {
		b.close()
	}
	return err
}

// CreateTable adds an embedding table, or a dense tensor (spec.Dense > 0) holding
// spec.Initial if set. Adding a name that exists is an error.
func (s *Server) CreateTable(spec TableSpec) error {
	if err := validTableName(spec.Name); err != nil {
		return fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	if err := spec.checkInitial(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	var h *hosted
	if spec.Dense > 0 {
		d, err := s.newDense(spec.Name, spec.Dense, spec.Config.Optimizer)
		if err != nil {
			return fmt.Errorf("dense tensor %q: %w", spec.Name, err)
		}
		if spec.Initial != nil {
			if err := d.assignDense(spec.Initial); err != nil {
				return fmt.Errorf("dense tensor %q: %w", spec.Name, err)
			}
		}
		h = d
	} else {
		t, err := embedding.New(spec.Config)
		if err != nil {
			return fmt.Errorf("table %q: %w", spec.Name, err)
		}
		h = &hosted{name: spec.Name, t: t, bar: s.newBarrier()}
	}
	s.own.Lock()
	defer s.own.Unlock()
	if _, dup := s.own.tables[spec.Name]; dup {
		return fmt.Errorf("%w: table %q exists", ErrBadConfig, spec.Name)
	}
	s.holdNewLocked(h)
	s.own.tables[spec.Name] = h
	s.appliedLocked(spec.Name)
	return nil
}

// CheckpointTables returns the tables a checkpoint of this server holds, by name: every
// embedding table and every declared dense tensor (TableSpec.Dense) it hosts now. A dense
// tensor's rows have ids in the slot of its name, so a checkpoint places it with its name.
func (s *Server) CheckpointTables() map[string]checkpoint.Table {
	s.own.RLock()
	defer s.own.RUnlock()
	out := make(map[string]checkpoint.Table, len(s.own.tables))
	for name, h := range s.own.tables {
		out[name] = h.t
	}
	return out
}

func (s *Server) newBarrier() *barrier {
	if s.cfg.SyncWorkers == 0 {
		return nil
	}
	return newBarrier(s.cfg.SyncWorkers)
}

// SetOwnerTable makes t the server's owner table. Requests in flight finish under the old table
// first. A slot t gives the server that the previous table did not is served only to requests
// routed by t or a newer table. It reports false, changing nothing, for a table older than the current one. A different
// table with the current version is an error, and so is a change of table on a synchronous
// server that has counted a push, unless it is held at a step boundary (a synchronous step must
// run under one table on every server; see Migrator).
func (s *Server) SetOwnerTable(t *OwnerTable) (bool, error) {
	if t == nil {
		return false, fmt.Errorf("%w: nil owner table", ErrBadConfig)
	}
	if t.Slots != s.cfg.Slots {
		return false, fmt.Errorf("%w: owner table has %d slots, server %d", ErrBadConfig, t.Slots, s.cfg.Slots)
	}
	set := t.SlotsOf(s.cfg.ID)
	s.own.Lock()
	defer s.own.Unlock()
	if cur := s.own.table; cur != nil {
		switch {
		case t.Version < cur.Version:
			return false, nil
		case t.Version == cur.Version && t.Equal(cur):
			return true, nil
		case t.Version == cur.Version:
			return false, fmt.Errorf("%w: a different owner table with the current version %d", ErrBadConfig, t.Version)
		case s.cfg.SyncWorkers > 0 && s.steps.pushed.Load() && !s.steps.boundary.Load() && t.Version > s.steps.floor:
			// (A table no newer than the floor can come any time: every push routed by an
			// older one is refused, so no step is under way by one.)
			return false, fmt.Errorf("%w: a synchronous server changes its owner table (version %d) only at a step boundary", ErrBadConfig, cur.Version)
		}
	}
	for _, sl := range set.Members() {
		if !s.own.slots.Has(sl) {
			s.own.since[sl] = t.Version
		}
	}
	s.own.table, s.own.slots = t, set
	s.releaseGivenLocked()
	return true, nil
}

// OwnerTable returns the server's current owner table (nil before the first).
func (s *Server) OwnerTable() *OwnerTable {
	s.own.RLock()
	defer s.own.RUnlock()
	return s.own.table
}

// Table returns the embedding table (or dense tensor's table) called name.
func (s *Server) Table(name string) (*embedding.Table, bool) {
	s.own.RLock()
	defer s.own.RUnlock()
	h, ok := s.own.tables[name]
	if !ok {
		return nil, false
	}
	return h.t, true
}

// TableNames returns the names of the hosted tables and dense tensors, sorted.
func (s *Server) TableNames() []string {
	s.own.RLock()
	defer s.own.RUnlock()
	names := make([]string, 0, len(s.own.tables))
	for n := range s.own.tables {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func remote(code uint32, format string, a ...any) error {
	return &rpc.RemoteError{Code: code, Message: fmt.Sprintf(format, a...)}
}

func (s *Server) version() uint64 {
	if s.own.table == nil {
		return 0
	}
	return s.own.table.Version
}

// wrongOwner builds the refusal of slot; the data is the server's version.
func (s *Server) wrongOwnerLocked(slot int) error {
	s.stats.wrongOwner.Add(1)
	v := s.version()
	var d [12]byte
	binary.LittleEndian.PutUint64(d[:], v)
	binary.LittleEndian.PutUint32(d[8:], uint32(slot))
	return &rpc.RemoteError{Code: codeWrongOwner, Message: fmt.Sprintf("server %s does not own slot %d (version %d)", s.cfg.ID, slot, v), Data: d[:]}
}

// reqScratch is per-request working memory.
type reqScratch struct {
	floats []float32
	count  []uint32 // per slot, for stats
	slots  []int32  // slots with a count
}

func (s *Server) scratch() *reqScratch {
	sc, _ := s.pool.Get().(*reqScratch)
	if sc == nil {
		sc = &reqScratch{count: make([]uint32, s.cfg.Slots)}
	}
	return sc
}

// putScratch returns sc to the pool with its per-slot counts cleared, whatever path the request
// took.
func (s *Server) putScratch(sc *reqScratch) {
	for _, x := range sc.slots {
		sc.count[x] = 0
	}
	sc.slots = sc.slots[:0]
	s.pool.Put(sc)
}

func (sc *reqScratch) floatsN(n int) []float32 {
	if cap(sc.floats) < n {
		sc.floats = make([]float32, n)
	}
	return sc.floats[:n]
}

// servesLocked returns nil when a request routed by an owner table of version may touch slot:
// the server owns it, is not handing it over, and owned it already at that version.
func (s *Server) servesLocked(slot int, version uint64) error {
	switch {
	case !s.own.slots.Has(slot) || s.own.since[slot] > version:
		return s.wrongOwnerLocked(slot)
	case s.own.fenced.Has(slot):
		return s.movedLocked(slot)
	}
	return nil
}

// checkIDsLocked verifies that this server serves every id's slot to a request routed by table
// version (servesLocked) and counts ids per slot. A slot is checked when the request first
// touches it; later ids of the same slot are only counted.
func (s *Server) checkIDsLocked(ids []uint64, version uint64, sc *reqScratch) error {
	S := s.cfg.Slots
	for _, id := range ids {
		slot := slotOf(id, S)
		if sc.count[slot] == 0 {
			if err := s.servesLocked(slot, version); err != nil {
				return err
			}
			sc.slots = append(sc.slots, int32(slot))
		}
		sc.count[slot]++
	}
	return nil
}

// lookupTable resolves a request's table; dense says which kind the method expects.
func (s *Server) lookupTableLocked(name string, dense bool) (*hosted, error) {
	h, ok := s.own.tables[name]
	if !ok || h.dense != dense {
		kind := "table"
		if dense {
			kind = "dense tensor"
		}
		return nil, remote(codeUnknownTable, "server %s hosts no %s %q", s.cfg.ID, kind, name)
	}
	return h, nil
}

func (s *Server) handlePull(ctx context.Context, req []byte, resp *rpc.Buffer) error {
	r, err := decodeTableReq(req, true)
	if err != nil {
		return remote(codeBadRequest, "malformed pull")
	}
	start := time.Now()
	s.own.RLock()
	defer s.own.RUnlock()
	h, err := s.lookupTableLocked(r.table, false)
	if err != nil {
		return err
	}
	d := h.t.Dim()
	if int(r.dim) != d {
		return remote(codeBadRequest, "table %q has dimension %d, request %d", r.table, d, r.dim)
	}
	sc := s.scratch()
	defer s.putScratch(sc)
	if err := s.checkIDsLocked(r.ids, r.version, sc); err != nil {
		return err
	}
	if len(r.floats) != 0 {
		return remote(codeBadRequest, "pull carries %d stray bytes", len(r.floats))
	}
	if r.flags&^flagReadOnly != 0 {
		return remote(codeBadRequest, "unknown pull flags %#x", r.flags)
	}
	lookup := h.t.Lookup
	if r.flags&flagReadOnly != 0 {
		lookup = h.t.Peek
	}
	out := resp.Extend(4 * d * len(r.ids))
	if dst := floatView(out); dst != nil {
		err = lookup(r.ids, dst)
	} else {
		tmp := sc.floatsN(d * len(r.ids))
		if err = lookup(r.ids, tmp); err == nil {
			putFloats(out, tmp)
		}
	}
	if err != nil {
		return remote(codeBadRequest, "%v", err)
	}
	s.stats.record(h, sc, len(r.ids), time.Since(start), false)
	return nil
}

func (s *Server) handlePush(ctx context.Context, req []byte, resp *rpc.Buffer) error {
	r, err := decodeTableReq(req, true)
	if err != nil {
		return remote(codeBadRequest, "malformed push")
	}
	start := time.Now()
	s.own.RLock()
	h, err := s.lookupTableLocked(r.table, false)
	if err != nil {
		s.own.RUnlock()
		return err
	}
	d := h.t.Dim()
	if r.n > 0 && int(r.dim) != d { // an empty synchronous push carries no dimension
		s.own.RUnlock()
		return remote(codeBadRequest, "table %q has dimension %d, request %d", r.table, d, r.dim)
	}
	if r.flags&^flagPosition != 0 {
		s.own.RUnlock()
		return remote(codeBadRequest, "unknown push flags %#x", r.flags)
	}
	sc := s.scratch()
	defer s.putScratch(sc)
	if h.bar != nil {
		s.own.RUnlock()
		return s.pushSync(ctx, h, r, sc, start)
	}
	if err := s.fencedLocked(r.epoch); err != nil {
		s.own.RUnlock()
		return err
	}
	if err := s.checkIDsLocked(r.ids, r.version, sc); err != nil {
		s.own.RUnlock()
		return err
	}
	grads, err := s.gradsOf(r, len(r.ids)*d, sc)
	if err != nil {
		s.own.RUnlock()
		return err
	}
	if f := s.beforeApply.Load(); f != nil {
		(*f)()
	}
	if r.flags&flagPosition != 0 {
		held := s.holdsBackLocked(r.table, DataShard{r.pos.Epoch, r.pos.Shard})
		err = s.own.applied[r.table].applyOnce(r.pos, sc.slots, held, func(skip func(int) bool) error {
			ids, g := r.ids, grads
			if skip != nil {
				ids, g = withoutSlots(ids, g, d, s.cfg.Slots, skip)
			}
			return h.t.Apply(ids, g, rowStep(r.step))
		})
	} else {
		err = h.t.Apply(r.ids, grads, rowStep(r.step))
	}
	s.own.RUnlock()
	if err != nil {
		return applyErr(err)
	}
	s.stats.record(h, sc, len(r.ids), time.Since(start), true)
	return nil
}

// pushSync hands a synchronous push to its table's barrier, which holds it until its step is
// complete (and, while the servers are held for a change of table, until the hold ends). The
// push is checked (epoch, table version, slots) when the barrier counts it. The barrier copies
// what it keeps.
func (s *Server) pushSync(ctx context.Context, h *hosted, r tableReq, sc *reqScratch, start time.Time) error {
	grads, err := s.gradsOf(r, len(r.ids)*h.t.Dim(), sc)
	if err != nil {
		return err
	}
	admit := s.syncAdmit(r, func() error { return s.checkIDsLocked(r.ids, r.version, sc) })
	err = h.bar.push(ctx, r.worker, syncStep(r.step), r.ids, grads, admit, func(ids []uint64, g []float32, step uint32) error {
		return s.applyLocking(h, ids, g, step)
	})
	if err == nil {
		s.stats.record(h, sc, len(r.ids), time.Since(start), true)
	}
	return err
}

// syncAdmit returns a synchronous push's check for its barrier: the table it was routed by
// (also before it waits for a hold to end), then, when it is counted, its epoch and, under the
// ownership lock, slotsLocked.
func (s *Server) syncAdmit(r tableReq, slotsLocked func() error) func(counting bool) error {
	return func(counting bool) error {
		s.own.RLock()
		defer s.own.RUnlock()
		if err := s.syncRoutedLocked(r.version, counting); err != nil || !counting {
			return err
		}
		if err := s.fencedLocked(r.epoch); err != nil {
			return err
		}
		if err := slotsLocked(); err != nil {
			return err
		}
		if f := s.counted.Load(); f != nil {
			(*f)(r.table, r.worker, syncStep(r.step))
		}
		return nil
	}
}

// holdNewLocked holds the barrier of a table being added while the server's steps are held.
// The barrier is not shared yet, so taking its lock under the ownership lock is safe.
func (s *Server) holdNewLocked(h *hosted) {
	if h.bar != nil && s.steps.holding {
		h.bar.hold(s.steps.gen)
	}
}

// rowStep is the step stamped on rows (the tables count steps in 32 bits; later steps saturate).
func rowStep(step uint64) uint32 { return uint32(min(step, math.MaxUint32)) }

// syncStep is the step a synchronous barrier counts in.
func syncStep(step uint64) uint32 { return uint32(min(step, math.MaxUint32)) }

// withoutSlots returns the ids (and their dim-wide gradient rows) whose slot skip rejects.
func withoutSlots(ids []uint64, grads []float32, dim, slots int, skip func(int) bool) ([]uint64, []float32) {
	var outIDs []uint64
	var outG []float32
	for i, id := range ids {
		if skip(slotOf(id, slots)) {
			continue
		}
		outIDs = append(outIDs, id)
		outG = append(outG, grads[i*dim:(i+1)*dim]...)
	}
	return outIDs, outG
}

// applyLocking applies a completed synchronous step, under the ownership lock.
func (s *Server) applyLocking(h *hosted, ids []uint64, g []float32, step uint32) error {
	s.own.RLock()
	defer s.own.RUnlock()
	return applyErr(h.t.Apply(ids, g, step))
}

func applyErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, embedding.ErrNonFinite):
		return remote(codeNonFinite, "%v", err)
	default:
		return remote(codeBadRequest, "%v", err)
	}
}

// gradsOf returns the request's floats (n of them) as []float32, copying only when unaligned.
func (s *Server) gradsOf(r tableReq, n int, sc *reqScratch) ([]float32, error) {
	if len(r.floats) != 4*n {
		return nil, remote(codeBadRequest, "%d gradient bytes for %d floats", len(r.floats), n)
	}
	if v := floatView(r.floats); v != nil {
		return v, nil
	}
	g := sc.floatsN(n)
	getFloats(g, r.floats)
	return g, nil
}

func (s *Server) handleTable(ctx context.Context, req []byte, resp *rpc.Buffer) error {
	s.own.RLock()
	t := s.own.table
	s.own.RUnlock()
	if t == nil {
		return nil
	}
	resp.Write(AppendOwnerTable(nil, t))
	return nil
}
