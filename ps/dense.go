package ps

import (
	"context"
	"encoding/binary"
	"math"
	"time"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/internal/rpc"
)

// A dense tensor of length L is stored as an embedding table of ceil(L/D) rows of D = min(L,
// denseRow) floats, so it shares the tables' optimizers, checkpoints and moves. The whole tensor
// lives on the owner of the slot of its name, and its rows have ids of that slot (the first
// rows ids, counting from 0, whose embedding.Slot is the name's): anything that places rows by
// the slot of their id (a checkpoint, a restore onto another number of servers, a slot moving)
// places the tensor with its name.
const denseRow = 1024

func denseShape(length int) (dim, rows int) {
	dim = min(length, denseRow)
	return dim, (length + dim - 1) / dim
}

// denseIDs returns the row ids of a dense tensor of rows rows in slot (of slots).
func denseIDs(slot, slots, rows int) []uint64 {
	ids := make([]uint64, 0, rows)
	for id := uint64(0); len(ids) < rows; id++ {
		if embedding.Slot(id, slots) == slot {
			ids = append(ids, id)
		}
	}
	return ids
}

// newDense makes the table of a dense tensor of length floats, zero until assigned.
func (s *Server) newDense(name string, length int, opt embedding.Optimizer) (*hosted, error) {
	dim, rows := denseShape(length)
	t, err := embedding.New(embedding.Config{
		Name: name, Dim: dim, Shards: 1, Optimizer: opt, Init: embedding.Init{Kind: embedding.InitZeros},
	})
	if err != nil {
		return nil, err
	}
	slot := s.denseSlot(name)
	return &hosted{name: name, t: t, dense: true, length: length, ids: denseIDs(slot, s.cfg.Slots, rows), slot: slot, bar: s.newBarrier()}, nil
}

// assignDense gives the dense tensor h the values vals (its length), in its rows.
func (h *hosted) assignDense(vals []float32) error {
	dim, rows := denseShape(h.length)
	padded := make([]float32, dim*rows)
	copy(padded, vals)
	return h.t.Assign(h.ids, padded)
}

// optimizer block in an init request: kind u32 then 8 float32 (lr, eps, initial accumulator,
// beta1, beta2, beta, l1, l2).
const optBlock = 36

func appendOptimizer(dst []byte, o embedding.Optimizer) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(o.Kind))
	for _, v := range []float32{o.LearningRate, o.Eps, o.InitialAccumulator, o.Beta1, o.Beta2, o.Beta, o.L1, o.L2} {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	return dst
}

func decodeOptimizer(b []byte) embedding.Optimizer {
	f := func(i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4+4*i:])) }
	return embedding.Optimizer{
		Kind: embedding.OptimizerKind(binary.LittleEndian.Uint32(b)), LearningRate: f(0), Eps: f(1),
		InitialAccumulator: f(2), Beta1: f(3), Beta2: f(4), Beta: f(5), L1: f(6), L2: f(7),
	}
}

// checkDenseLocked verifies that this server serves the tensor's slot to a request routed by
// table version.
func (s *Server) checkDenseLocked(name string, version uint64) error {
	return s.servesLocked(s.denseSlot(name), version)
}

func (s *Server) denseSlot(name string) int { return nameSlot(name, s.cfg.Slots) }

// handleInitDense creates a dense tensor with initial values and an optimizer if it does not
// exist yet; a tensor that exists is left as it is (the first worker to start initialises it).
func (s *Server) handleInitDense(ctx context.Context, req []byte, resp *rpc.Buffer) error {
	r, err := decodeTableReq(req, false)
	if err != nil || len(r.floats) != optBlock+4*r.n || r.n < 1 {
		return remote(codeBadRequest, "malformed dense init")
	}
	if k := binary.LittleEndian.Uint32(r.floats); k > math.MaxUint8 {
		return remote(codeBadRequest, "dense %q: unknown optimizer kind %d", r.table, k)
	}
	if err := validTableName(r.table); err != nil {
		return remote(codeBadRequest, "%v", err)
	}
	s.own.Lock()
	defer s.own.Unlock()
	if err := s.checkDenseLocked(r.table, r.version); err != nil {
		return err
	}
	h, ok := s.own.tables[r.table]
	switch {
	case ok && (!h.dense || h.length != r.n):
		return remote(codeBadRequest, "%q exists with another shape", r.table)
	case ok && h.t.Len() > 0:
		return nil // initialised by an earlier caller, or restored
	case !ok && s.cfg.DeclaredIn != "":
		return remote(codeUnknownTable, "server %s hosts no dense tensor %q: declare it in %s (TableSpec.Dense), so that it is checkpointed", s.cfg.ID, r.table, s.cfg.DeclaredIn)
	case !ok:
		if h, err = s.newDense(r.table, r.n, decodeOptimizer(r.floats)); err != nil {
			return remote(codeBadRequest, "dense %q: %v", r.table, err)
		}
	}
	vals := make([]float32, r.n)
	getFloats(vals, r.floats[optBlock:])
	if err := h.assignDense(vals); err != nil {
		return remote(codeBadRequest, "dense %q: %v", r.table, err)
	}
	if !ok {
		s.holdNewLocked(h)
	}
	s.own.tables[r.table] = h
	s.appliedLocked(r.table)
	return nil
}

func (s *Server) handlePullDense(ctx context.Context, req []byte, resp *rpc.Buffer) error {
	r, err := decodeTableReq(req, false)
	if err != nil {
		return remote(codeBadRequest, "malformed dense pull")
	}
	start := time.Now()
	s.own.RLock()
	defer s.own.RUnlock()
	if err := s.checkDenseLocked(r.table, r.version); err != nil {
		return err
	}
	h, err := s.lookupTableLocked(r.table, true)
	if err != nil {
		return err
	}
	if r.n != h.length {
		return remote(codeBadRequest, "dense %q has %d values, request %d", r.table, h.length, r.n)
	}
	dim, rows := denseShape(h.length)
	sc := s.scratch()
	defer s.putScratch(sc)
	all := sc.floatsN(dim * rows)
	if err := h.t.Lookup(h.ids, all); err != nil {
		return remote(codeBadRequest, "%v", err)
	}
	putFloats(resp.Extend(4*h.length), all[:h.length])
	s.stats.denseDone(h, rows, start, false)
	return nil
}

func (s *Server) handlePushDense(ctx context.Context, req []byte, resp *rpc.Buffer) error {
	r, err := decodeTableReq(req, false)
	if err != nil {
		return remote(codeBadRequest, "malformed dense push")
	}
	start := time.Now()
	s.own.RLock()
	if err := s.checkDenseLocked(r.table, r.version); err != nil {
		s.own.RUnlock()
		return err
	}
	h, err := s.lookupTableLocked(r.table, true)
	if err != nil {
		s.own.RUnlock()
		return err
	}
	if r.flags&^flagPosition != 0 {
		s.own.RUnlock()
		return remote(codeBadRequest, "unknown push flags %#x", r.flags)
	}
	if err := s.fencedLocked(r.epoch); err != nil {
		s.own.RUnlock()
		return err
	}
	if r.n != h.length || len(r.floats) != 4*r.n {
		s.own.RUnlock()
		return remote(codeBadRequest, "dense %q has %d values, push %d", r.table, h.length, r.n)
	}
	dim, rows := denseShape(h.length)
	g := make([]float32, dim*rows)
	getFloats(g[:h.length], r.floats)
	ids := h.ids
	if h.bar != nil {
		s.own.RUnlock()
		admit := s.syncAdmit(r, func() error { return s.checkDenseLocked(r.table, r.version) })
		err := h.bar.push(ctx, r.worker, syncStep(r.step), ids, g, admit, func(ids []uint64, g []float32, step uint32) error {
			return s.applyLocking(h, ids, g, step)
		})
		if err == nil {
			s.stats.denseDone(h, rows, start, true)
		}
		return err
	}
	if r.flags&flagPosition != 0 {
		held := s.holdsBackLocked(r.table, DataShard{r.pos.Epoch, r.pos.Shard})
		err = applyErr(s.own.applied[r.table].applyOnce(r.pos, []int32{int32(h.slot)}, held, func(func(int) bool) error {
			return h.t.Apply(ids, g, rowStep(r.step))
		}))
	} else {
		err = applyErr(h.t.Apply(ids, g, rowStep(r.step)))
	}
	s.own.RUnlock()
	if err == nil {
		s.stats.denseDone(h, rows, start, true)
	}
	return err
}

// DenseLength returns the length of the dense tensor name hosted here, or false.
func (s *Server) DenseLength(name string) (int, bool) {
	s.own.RLock()
	defer s.own.RUnlock()
	h, ok := s.own.tables[name]
	if !ok || !h.dense {
		return 0, false
	}
	return h.length, true
}
