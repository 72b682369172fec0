//go:build linux

package checkpoint_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
)

// serverTableRows are the rows of one of the two parameter servers of the dlrm example's main
// command after a minute of training: 26 tables of dim 16 (each field's ids split between the
// servers by slot).
var serverTableRows = []int{730, 292, 8325, 8296, 153, 12, 5868, 317, 2, 8281, 2831, 8259, 1597,
	14, 6777, 8346, 5, 2817, 1087, 2, 8291, 9, 8, 8292, 53, 6485}

// benchSlots is the slot count of the benchmark tables; the server of BenchmarkSnapshotServer
// owns the even slots.
const benchSlots = 4096

// serverTables returns Adagrad tables of dim 16 with serverTableRows rows of even slots, and
// their ids.
func serverTables(b *testing.B) (map[string]*embedding.Table, map[string][]uint64) {
	b.Helper()
	const dim = 16
	tabs := map[string]*embedding.Table{}
	ids := map[string][]uint64{}
	for i, rows := range serverTableRows {
		name := fmt.Sprintf("emb.C%d", i+1)
		t, err := embedding.New(embedding.Config{Name: name, Dim: dim, Seed: uint64(i + 1),
			Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}})
		if err != nil {
			b.Fatal(err)
		}
		id := make([]uint64, 0, rows)
		for r := uint64(0); len(id) < rows; r++ {
			if x := benchID(uint64(i)<<32 | r); embedding.Slot(x, benchSlots)%2 == 0 {
				id = append(id, x)
			}
		}
		if err := t.Lookup(id, make([]float32, rows*dim)); err != nil {
			b.Fatal(err)
		}
		tabs[name], ids[name] = t, id
	}
	return tabs, ids
}

// BenchmarkSnapshotServer times the snapshots of a server like one of the dlrm example's two (26
// Adagrad tables of dim 16, 12 MiB of records, the even slots of 4096; every fifth snapshot
// full) against a memcpy of as many bytes between two pre-faulted buffers on as many goroutines
// as the snapshot copies with, measured right before each snapshot. Every row is trained between
// two snapshots, as in the example, where a thousand steps touch nearly every row, so a delta
// copies as much as a full snapshot. Each snapshot is persisted and the background work done
// (Flush) before the next, as seconds between checkpoints allow. It reports the medians of
// both timings and the ratios snapshot/memcpy (median, minimum, maximum) for full snapshots
// and for deltas.
func BenchmarkSnapshotServer(b *testing.B) {
	ctx := context.Background()
	emb, ids := serverTables(b)
	tabs := map[string]checkpoint.Table{}
	total := 0
	for name, t := range emb {
		tabs[name] = t
		total += t.RawSize(false)
	}
	var owned []int
	for s := 0; s < benchSlots; s += 2 {
		owned = append(owned, s)
	}
	ck, err := checkpoint.New(checkpoint.Config{Job: "bench", Node: "ps0", Tables: tabs, Slots: benchSlots,
		Storage: discardStorage{}, ShmDir: shmRoot(b), FullEvery: 5, Codec: checkpoint.CodecNone})
	if err != nil {
		b.Fatal(err)
	}
	defer ck.Close()
	// As the dlrm example does: room for a full snapshot and a quarter, faulted in at start-up.
	if err := ck.Reserve(ctx, int64(total)*5/4); err != nil {
		b.Fatal(err)
	}
	src := benchRecords(total/144+1, 144)
	dst := make([]byte, len(src))
	w := benchWorkers()
	splitRun(w, len(dst), func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
	grads := make([]float32, 16*slices.Max(serverTableRows))
	for i := range grads {
		grads[i] = 1e-3
	}
	var full, delta pairs
	const warmup = 10 // two chains: each generation's first full snapshot and deltas
	b.ResetTimer()
	for round, step := 0, uint64(1); round < warmup+5*max(b.N, minPairs); round, step = round+1, step+1 {
		b.StopTimer()
		for name, t := range emb {
			if err := t.Apply(ids[name], grads[:16*len(ids[name])], uint32(step)); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		t0 := time.Now()
		splitRun(w, len(dst), func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
		mem := time.Since(t0)
		info, err := ck.Snapshot(ctx, step, checkpoint.SnapshotSlots(owned))
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if _, err := ck.WaitPersisted(ctx, step); err != nil {
			b.Fatal(err)
		}
		if err := ck.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		switch {
		case round < warmup:
		case info.Full:
			full.add(mem, info.Blocked)
		default:
			delta.add(mem, info.Blocked)
		}
	}
	b.StopTimer()
	full.report(b, "full", "memcpy")
	delta.report(b, "delta", "memcpy")
	b.ReportMetric(median(append(full.base, delta.base...)), "memcpy_ms")
	b.ReportMetric(float64(total)/(1<<20), "table_MiB")
}
