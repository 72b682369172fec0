package server

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
)

// Server is a ps.Server with its flash checkpointer, as the coordinator drives it: an
// elastic.ParameterServer that the coordinator calls directly when it runs in the server's
// process, and that remote.ServeServer serves to a coordinator in another. It is safe for
// concurrent use.
type Server struct {
	srv    *ps.Server
	addr   string
	ck     *checkpoint.Checkpointer
	tables map[string]checkpoint.Table // what the checkpointer saves
	inc    uint64                      // this incarnation
	closed atomic.Bool

	mu       sync.Mutex
	restored *checkpoint.Restored
	last     checkpoint.SnapshotInfo // the newest snapshot taken
	newest   uint64                  // the highest step snapshotted or restored
	leader   uint64                  // the coordinator incarnation it obeys (Lead)
	// restoring is the version of the table a Restore was for, until one that new is installed.
	restoring uint64
}

var _ elastic.ParameterServer = (*Server)(nil)

// New wraps srv, serving at addr, and opens its checkpointer with ck (Job, Storage,
// ShmDir, FullEvery, ...; Node, Slots and Tables are the server's). With ck.Storage nil the
// server takes no checkpoints. Close closes the checkpointer, not the server.
func New(srv *ps.Server, addr string, ck checkpoint.Config) (*Server, error) {
	if srv == nil {
		return nil, fmt.Errorf("%w: nil server", elastic.ErrInvalidConfig)
	}
	s := &Server{srv: srv, addr: addr, inc: rand.Uint64() | 1}
	if ck.Storage == nil {
		return s, nil
	}
	ck.Node = srv.ID()
	ck.Slots = srv.Slots()
	ck.Tables = srv.CheckpointTables()
	s.tables = ck.Tables
	c, err := checkpoint.New(ck)
	if err != nil {
		return nil, fmt.Errorf("checkpointer of %s: %w", srv.ID(), err)
	}
	s.ck = c
	return s, nil
}

// Server returns the wrapped server.
func (s *Server) Server() *ps.Server { return s.srv }

var _ elastic.Digester = (*Server)(nil)

// Digest implements elastic.Digester: ps.Server.Digest of the slots t gives the server.
func (s *Server) Digest(ctx context.Context, t *ps.OwnerTable) (checkpoint.Digest, error) {
	return s.srv.Digest(ctx, t)
}

// Node implements elastic.ParameterServer.
func (s *Server) Node() ps.Node { return ps.Node{ID: s.srv.ID(), Addr: s.addr} }

// InstallTable implements elastic.ParameterServer.
func (s *Server) InstallTable(_ context.Context, t *ps.OwnerTable) error {
	if _, err := s.srv.SetOwnerTable(t); err != nil {
		return err
	}
	s.mu.Lock()
	if cur := s.srv.OwnerTable(); cur != nil && cur.Version >= s.restoring {
		s.restoring = 0
	}
	s.mu.Unlock()
	return nil
}

// Fence implements elastic.ParameterServer.
func (s *Server) Fence(_ context.Context, floor uint64, epochs []uint64) error {
	if floor > 0 {
		s.srv.SetEpochFloor(floor)
	}
	if len(epochs) > 0 {
		s.srv.Fence(epochs...)
	}
	return nil
}

// ErrNoCheckpoints is returned by a Server's checkpoint methods when it was made without
// checkpoint storage.
var ErrNoCheckpoints = errors.New("server: server has no checkpoint storage")

// owned returns the slots t gives this server.
func (s *Server) owned(t *ps.OwnerTable) []int {
	if t == nil {
		return nil
	}
	return t.SlotsOf(s.srv.ID()).Members()
}

// Snapshot implements elastic.ParameterServer: the rows of the slots the server owns now, its dense
// tensors and the batches it applied (for those slots).
func (s *Server) Snapshot(ctx context.Context, step uint64, committed, accepted elastic.Progress) (checkpoint.SnapshotInfo, error) {
	if s.ck == nil {
		return checkpoint.SnapshotInfo{}, ErrNoCheckpoints
	}
	t := s.srv.OwnerTable()
	if t == nil {
		return checkpoint.SnapshotInfo{}, ps.ErrNoTable
	}
	s.mu.Lock()
	last := s.last
	s.mu.Unlock()
	if last.Step == step && step > 0 {
		// Taken in an earlier attempt whose other servers failed: no batch has been applied
		// since (the step would be higher), so it still holds the state of step.
		return last, nil
	}
	for _, name := range s.srv.TableNames() {
		if _, ok := s.tables[name]; !ok {
			// Saving the rest would lose it silently on a restore.
			return checkpoint.SnapshotInfo{}, fmt.Errorf("%w: server %s hosts %q, created after its checkpointer; declare it in ps.ServerConfig.Tables (TableSpec.Dense for a dense tensor) to checkpoint it", elastic.ErrInvalidConfig, s.srv.ID(), name)
		}
	}
	set := t.SlotsOf(s.srv.ID())
	s.srv.SettleApplied(func(epoch uint32) bool { return epoch < committed.Epoch })
	s.srv.PruneApplied(func(p ps.Position) bool { return !committed.Done(p) })
	s.srv.FoldApplied(accepted.Through)
	applied := s.srv.AppliedState(set.Has)
	info, err := s.ck.Snapshot(ctx, step, checkpoint.SnapshotSlots(set.Members()), checkpoint.SnapshotBlob(elastic.AppliedBlob, applied))
	if err == nil {
		s.mu.Lock()
		s.last = info
		s.newest = max(s.newest, step)
		s.mu.Unlock()
	}
	return info, err
}

// WaitPersisted implements elastic.ParameterServer.
func (s *Server) WaitPersisted(ctx context.Context, step uint64) (checkpoint.ManifestRef, error) {
	if s.ck == nil {
		return checkpoint.ManifestRef{}, ErrNoCheckpoints
	}
	return s.ck.WaitPersisted(ctx, step)
}

// Verify implements elastic.ParameterServer.
func (s *Server) Verify(ctx context.Context, step uint64, t *ps.OwnerTable) error {
	if s.ck == nil {
		return ErrNoCheckpoints
	}
	return s.ck.Verify(ctx, step, checkpoint.RestoreSlots(s.owned(t)))
}

// Load implements elastic.ParameterServer: the rows of the slots t gives this server, and the
// applied positions of every server of the checkpoint for those slots.
func (s *Server) Load(ctx context.Context, step uint64, t *ps.OwnerTable) error {
	if s.ck == nil {
		return ErrNoCheckpoints
	}
	if name, ok := updatedTable(s.srv); ok {
		return fmt.Errorf("%w: server %s, table %s", elastic.ErrNotFresh, s.srv.ID(), name)
	}
	res, err := s.ck.Load(ctx, step, checkpoint.RestoreSlots(s.owned(t)),
		checkpoint.RestoreBlobs(func(_, name string) bool { return name == elastic.AppliedBlob }))
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.restored = res
	s.last = checkpoint.SnapshotInfo{}
	s.newest = max(s.newest, step)
	s.mu.Unlock()
	var applied [][]byte
	for _, b := range res.Blobs {
		if b.Name == elastic.AppliedBlob {
			applied = append(applied, b.Data)
		}
	}
	set := t.SlotsOf(s.srv.ID())
	return s.srv.LoadApplied(applied, set.Has)
}

// updatedTable returns a table of srv (embedding table or dense tensor) holding a row that an
// update has changed, if any. Rows created by pulls hold their initial values, which a restore
// may leave alone.
func updatedTable(srv *ps.Server) (string, bool) {
	for _, name := range srv.TableNames() {
		t, ok := srv.Table(name)
		if !ok {
			continue
		}
		updated := false
		t.Range(func(v embedding.RowView) bool {
			updated = v.Freq > 0
			return !updated
		})
		if updated {
			return name, true
		}
	}
	return "", false
}

// Restored reports the server's last Load (nil before one): where its rows came from and how
// many were loaded.
func (s *Server) Restored() *checkpoint.Restored {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restored
}

// Reserve pre-faults shared memory for snapshots of about bytes, so the first snapshots do not
// pay for page faults while training waits.
func (s *Server) Reserve(ctx context.Context, bytes int64) error {
	if s.ck == nil {
		return ErrNoCheckpoints
	}
	return s.ck.Reserve(ctx, bytes)
}

// CheckpointStats returns the checkpointer's counters (zero without checkpoints).
func (s *Server) CheckpointStats() checkpoint.Stats {
	if s.ck == nil {
		return checkpoint.Stats{}
	}
	return s.ck.Stats()
}

// Incarnation identifies this Server among the restarts of its server.
func (s *Server) Incarnation() uint64 { return s.inc }

// Health implements elastic.ParameterServer; after Close it answers elastic.ErrClosed.
func (s *Server) Health(context.Context) (elastic.ServerHealth, error) {
	if s.closed.Load() {
		return elastic.ServerHealth{}, elastic.ErrClosed
	}
	s.mu.Lock()
	h := elastic.ServerHealth{Incarnation: s.inc, Leader: s.leader, Snapshot: s.newest, Restoring: s.restoring}
	s.mu.Unlock()
	if t := s.srv.OwnerTable(); t != nil {
		h.TableVersion = t.Version
	}
	return h, nil
}

// Lead implements elastic.ParameterServer. In one process the coordinators of a job follow one
// another (each closed before the next starts), so only the remote calls (ServeServer) are checked
// against the leader; Lead itself is checked everywhere.
func (s *Server) Lead(_ context.Context, inc uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if inc < s.leader {
		return fmt.Errorf("%w: server %s follows coordinator incarnation %d, not %d", elastic.ErrSuperseded, s.srv.ID(), s.leader, inc)
	}
	if inc > s.leader {
		s.srv.AbortMigrations() // an earlier coordinator's migrations will not be finished
	}
	s.leader = inc
	return nil
}

// Obeys refuses a call of coordinator incarnation coord when a later one leads the server (0: a
// call that does not say, such as Health, or a coordinator that has not led yet). A transport
// that serves the server to other processes (package remote) checks every call with it.
func (s *Server) Obeys(coord uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if coord != 0 && coord < s.leader || coord == 0 && s.leader != 0 {
		return fmt.Errorf("%w: server %s follows coordinator incarnation %d, the call is from %d", elastic.ErrSuperseded, s.srv.ID(), s.leader, coord)
	}
	return nil
}

// Table implements elastic.ParameterServer.
func (s *Server) Table(context.Context) (*ps.OwnerTable, error) {
	if s.closed.Load() {
		return nil, elastic.ErrClosed
	}
	return s.srv.OwnerTable(), nil
}

// Admit implements elastic.ParameterServer: calls on a Server always reach its own incarnation.
func (s *Server) Admit(uint64) {}

// Restore implements elastic.ParameterServer. The rows come from shared memory only where this
// server's region (ShmDir, on its host) holds the very segments the commit names for each node:
// their ids are random to the process that sealed them, so a region matches only on the host
// of the process that took the commit. A replacement on another host, even one with a region
// of the same job, node and step left by an earlier process, reads storage; it needs no host id
// for that (the gossiped Member.Host is for placing a replacement where the region is).
func (s *Server) Restore(ctx context.Context, step uint64, t *ps.OwnerTable, mode elastic.RestoreMode) error {
	if t == nil {
		return fmt.Errorf("%w: nil owner table", elastic.ErrInvalidConfig)
	}
	if step > 0 && s.ck == nil {
		return ErrNoCheckpoints
	}
	want := t.SlotsOf(s.srv.ID())
	if mode == elastic.RestoreForget {
		var lost []int
		for sl := range t.Slots {
			if !want.Has(sl) {
				lost = append(lost, sl)
			}
		}
		_, err := s.srv.DiscardSlots(lost) // only those its own table does not give it either
		return err
	}
	var target func(slot int) bool
	switch mode {
	case elastic.RestoreAll:
		target = func(int) bool { return true }
	case elastic.RestoreNew:
		cur := s.srv.OwnerTable()
		if cur == nil {
			target = want.Has
		} else {
			have := cur.SlotsOf(s.srv.ID())
			target = func(slot int) bool { return want.Has(slot) && !have.Has(slot) }
		}
	default:
		return fmt.Errorf("%w: restore mode %d", elastic.ErrInvalidConfig, mode)
	}
	var slots []int
	for _, slot := range want.Members() {
		if target(slot) {
			slots = append(slots, slot)
		}
	}
	s.mu.Lock()
	s.restoring = max(s.restoring, t.Version) // until t is installed, whatever happens here
	s.mu.Unlock()
	s.srv.ClearSlots(target)
	s.mu.Lock()
	s.last = checkpoint.SnapshotInfo{}
	s.newest = max(s.newest, step)
	s.mu.Unlock()
	if step == 0 {
		if mode == elastic.RestoreNew {
			return s.srv.RestoreApplied(nil, target) // they start afresh: nothing applied
		}
		return nil
	}
	res, err := s.ck.Load(ctx, step, checkpoint.RestoreSlots(slots),
		checkpoint.RestoreBlobs(func(_, name string) bool { return name == elastic.AppliedBlob }))
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.restored = res
	s.mu.Unlock()
	var applied [][]byte
	for _, b := range res.Blobs {
		if b.Name == elastic.AppliedBlob {
			applied = append(applied, b.Data)
		}
	}
	if mode == elastic.RestoreNew {
		// The job goes on from where it is, not from the commit: the restored slots hold
		// less than what is done of the data says.
		return s.srv.RestoreApplied(applied, target)
	}
	return s.srv.LoadApplied(applied, target)
}

// Close closes the checkpointer; Health answers elastic.ErrClosed from then on. Idempotent.
func (s *Server) Close() error {
	s.closed.Store(true)
	if s.ck == nil {
		return nil
	}
	return s.ck.Close()
}
