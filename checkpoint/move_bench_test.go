//go:build linux

package checkpoint_test

import (
	"context"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
)

// discardStorage keeps nothing: the benchmarks below time snapshots, and a persist only has to
// finish before the next full snapshot of its generation.
type discardStorage struct{}

type discardWriter struct{}

func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (discardWriter) Commit() error               { return nil }
func (discardWriter) Abort() error                { return nil }

func (discardStorage) Create(context.Context, string) (checkpoint.Writer, error) {
	return discardWriter{}, nil
}
func (discardStorage) Open(context.Context, string) (io.ReadCloser, error) {
	return nil, checkpoint.ErrNotFound
}
func (discardStorage) List(context.Context, string) ([]string, error) { return nil, nil }
func (discardStorage) Delete(context.Context, string) error           { return nil }

var _ checkpoint.Storage = discardStorage{}

// moveChurn is the fraction of a server's rows trained between two checkpoints in
// BenchmarkSnapshotAfterMove.
const moveChurn = 0.05

// BenchmarkSnapshotAfterMove measures what the first snapshot after a live repartition costs the
// server whose owned set changed, against an ordinary delta of the same training in the same run.
// Two servers hold equal tables (dim 64, Adagrad; 256 MiB of records, 24 MiB with -short) and take
// a full snapshot; both then train moveChurn of their rows; one of them also gains a third of the
// job's slots (move=in: their rows arrive through LoadRaw, as a migration loads them) or loses a
// third (move=out: DeleteSlots, as a released migration drops them); then both snapshot. Per round
// it reports the subject's and the baseline's bytes copied into shared memory and the time the
// snapshot blocked training, and the ratios subject/baseline (median, min and max over the rounds),
// and the fraction of the subject's snapshots that were full (move_full).
//
// With embedding tables (SlotDeltaTables) the subject's snapshot is a delta: for a move in, the
// baseline's changes plus every row of the gained slots (bytes ratio 1 + gained rows/changed rows,
// 11.0 here; blocked about 8x, as finding those rows reads every row of the table); for a move
// out, the changes alone (ratio 1.0, blocked about 1.4x), its deletion records of the lost slots'
// rows left out. Before, it was a full snapshot: 30x and 20x the bytes, 10x and 12x the blocking
// (two vCPUs, medians of 15 pairs).
func BenchmarkSnapshotAfterMove(b *testing.B) {
	for _, in := range []bool{true, false} {
		name := "move=out"
		if in {
			name = "move=in"
		}
		b.Run(name, func(b *testing.B) { benchSnapshotAfterMove(b, in) })
	}
}

func benchSnapshotAfterMove(b *testing.B, in bool) {
	ctx := context.Background()
	const S = 4096
	var movedSlots, keptSlots, allSlots []int
	for s := range S {
		allSlots = append(allSlots, s)
		if s%3 == 0 {
			movedSlots = append(movedSlots, s)
		} else {
			keptSlots = append(keptSlots, s)
		}
	}
	moved := embedding.NewSlotSet(S, movedSlots...)
	probe, err := embedding.New(benchTableConfig)
	if err != nil {
		b.Fatal(err)
	}
	rowSize := probe.RawRowSize()
	rows := benchTableBytes() / 4 / rowSize
	recs := benchRecords(rows, rowSize)
	// The records of the moved slots, and the ids of the others (the ones trained).
	var movedRecs []byte
	var keptIDs []uint64
	for r := range rows {
		rec := recs[r*rowSize : (r+1)*rowSize]
		id := benchID(uint64(r))
		if moved.Contains(id) {
			movedRecs = append(movedRecs, rec...)
		} else {
			keptIDs = append(keptIDs, id)
		}
	}
	shm := shmRoot(b)
	open := func(node string) (*embedding.Table, *checkpoint.Checkpointer) {
		tab, err := embedding.New(benchTableConfig)
		if err != nil {
			b.Fatal(err)
		}
		initial := recs
		if in {
			initial = nil
			for r := range rows {
				if !moved.Contains(benchID(uint64(r))) {
					initial = append(initial, recs[r*rowSize:(r+1)*rowSize]...)
				}
			}
		}
		if _, err := tab.LoadRaw(initial, nil); err != nil {
			b.Fatal(err)
		}
		ck, err := checkpoint.New(checkpoint.Config{Job: "bench", Node: node, Slots: S,
			Tables: map[string]checkpoint.Table{"emb": tab}, Storage: discardStorage{}, ShmDir: shm,
			FullEvery: 1 << 20, Codec: checkpoint.CodecNone})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ck.Close() })
		return tab, ck
	}
	baseTab, baseCk := open("ps-base")
	subjTab, subjCk := open("ps-moved")
	before, after := allSlots, keptSlots
	if in {
		before, after = keptSlots, allSlots
	}
	snap := func(ck *checkpoint.Checkpointer, step uint64, slots []int, opts ...checkpoint.SnapshotOption) checkpoint.SnapshotInfo {
		info, err := ck.Snapshot(ctx, step, append(opts, checkpoint.SnapshotSlots(slots))...)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ck.WaitPersisted(ctx, step); err != nil {
			b.Fatal(err)
		}
		return info
	}
	rng := rand.New(rand.NewPCG(7, 11))
	trained := make([]uint64, int(moveChurn*float64(len(keptIDs))))
	grads := make([]float32, len(trained)*benchTableConfig.Dim)
	var p pairs
	var baseBytes, subjBytes, bytesRatio []float64
	full := 0
	b.ResetTimer()
	for i := 0; i < max(b.N, minPairs); i++ {
		step := uint64(2*i + 1)
		// Both servers start a chain: the subject back at the layout before the move.
		if in {
			subjTab.DeleteSlots(moved)
		} else if _, err := subjTab.LoadRaw(movedRecs, nil); err != nil {
			b.Fatal(err)
		}
		snap(baseCk, step, before, checkpoint.SnapshotFull())
		snap(subjCk, step, before, checkpoint.SnapshotFull())
		// The same training on both, on distinct rows the servers kept.
		perm := rng.Perm(len(keptIDs))
		for k := range trained {
			trained[k] = keptIDs[perm[k]]
		}
		for k := range grads {
			grads[k] = float32(rng.NormFloat64())
		}
		for _, t := range []*embedding.Table{baseTab, subjTab} {
			if err := t.Apply(trained, grads, uint32(step)); err != nil {
				b.Fatal(err)
			}
		}
		if in {
			if _, err := subjTab.LoadRaw(movedRecs, nil); err != nil {
				b.Fatal(err)
			}
		} else {
			subjTab.DeleteSlots(moved)
		}
		// Alternate which goes first, so neither always meets a warmer cache.
		var bi, si checkpoint.SnapshotInfo
		if i%2 == 0 {
			bi = snap(baseCk, step+1, before)
			si = snap(subjCk, step+1, after)
		} else {
			si = snap(subjCk, step+1, after)
			bi = snap(baseCk, step+1, before)
		}
		if bi.Full {
			b.Fatal("the baseline's snapshot is full, not a delta")
		}
		if si.Full {
			full++
		}
		p.add(bi.Blocked, si.Blocked)
		baseBytes = append(baseBytes, float64(bi.Bytes))
		subjBytes = append(subjBytes, float64(si.Bytes))
		bytesRatio = append(bytesRatio, float64(si.Bytes)/float64(bi.Bytes))
	}
	b.StopTimer()
	p.report(b, "move_blocked", "delta_blocked")
	b.ReportMetric(median(subjBytes)/(1<<20), "move_MiB")
	b.ReportMetric(median(baseBytes)/(1<<20), "delta_MiB")
	b.ReportMetric(median(bytesRatio), "move_bytes/delta_bytes")
	b.ReportMetric(float64(full)/float64(len(subjBytes)), "move_full")
	b.ReportMetric(float64(rows*rowSize)/(1<<20), "table_MiB")
}
