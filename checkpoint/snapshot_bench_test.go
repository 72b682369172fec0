//go:build linux

package checkpoint_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
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

// benchSlots is the slot count of the benchmark tables; server k of BenchmarkSnapshotServer owns
// the slots s with s%2 == k.
const benchSlots = 4096

// benchServer is one parameter server of BenchmarkSnapshotServer: its tables, their ids, its
// slots and its checkpointer.
type benchServer struct {
	emb   map[string]*embedding.Table
	ids   map[string][]uint64
	owned []int
	ck    *checkpoint.Checkpointer
	bytes int // the records of its tables
}

// newBenchServer returns server k of the job: Adagrad tables of dim 16 with serverTableRows rows
// of its slots, and a checkpointer with gate, room reserved as the dlrm example reserves it (a
// full snapshot and a quarter).
func newBenchServer(b *testing.B, k int, gate *checkpoint.CopyGate) *benchServer {
	b.Helper()
	const dim = 16
	s := &benchServer{emb: map[string]*embedding.Table{}, ids: map[string][]uint64{}}
	tabs := map[string]checkpoint.Table{}
	for i, rows := range serverTableRows {
		name := fmt.Sprintf("emb.C%d", i+1)
		t, err := embedding.New(embedding.Config{Name: name, Dim: dim, Seed: uint64(i + 1),
			Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}})
		if err != nil {
			b.Fatal(err)
		}
		id := make([]uint64, 0, rows)
		for r := uint64(0); len(id) < rows; r++ {
			if x := benchID(uint64(i)<<32 | r); embedding.Slot(x, benchSlots)%2 == k {
				id = append(id, x)
			}
		}
		if err := t.Lookup(id, make([]float32, rows*dim)); err != nil {
			b.Fatal(err)
		}
		s.emb[name], s.ids[name], tabs[name] = t, id, t
		s.bytes += t.RawSize(false)
	}
	for sl := k; sl < benchSlots; sl += 2 {
		s.owned = append(s.owned, sl)
	}
	ck, err := checkpoint.New(checkpoint.Config{Job: "bench", Node: fmt.Sprintf("ps%d", k), Tables: tabs, Slots: benchSlots,
		Storage: discardStorage{}, ShmDir: shmRoot(b), FullEvery: 5, Gate: gate})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ck.Close() })
	if err := ck.Reserve(context.Background(), int64(s.bytes)*5/4); err != nil {
		b.Fatal(err)
	}
	s.ck = ck
	return s
}

// BenchmarkSnapshotServer times the snapshots of servers like the dlrm example's (26 Adagrad
// tables of dim 16, 12 MiB of records per server, each server half the slots of 4096; every
// fifth snapshot full): one server alone, and two in one process taking their snapshots at once
// with a shared CopyGate, as an embedded job does (training waits for the slower), against a
// memcpy of as many bytes as all of them copy between two pre-faulted buffers on as many
// goroutines as a snapshot copies with, measured right before each round. Every row is trained
// between two snapshots, as in the example, where a thousand steps touch nearly every row, so a
// delta copies as much as a full snapshot. Each snapshot is persisted (S2, storage that keeps
// nothing) and the background work done (Flush) before the next, as seconds between
// checkpoints allow. It reports the medians of both timings and the ratios snapshot/memcpy
// (median, minimum, maximum) for full snapshots and for deltas.
func BenchmarkSnapshotServer(b *testing.B) {
	for _, n := range []int{1, 2} {
		b.Run(fmt.Sprintf("servers=%d", n), func(b *testing.B) { benchSnapshotServers(b, n) })
	}
}

func benchSnapshotServers(b *testing.B, n int) {
	ctx := context.Background()
	gate := checkpoint.NewCopyGate()
	servers := make([]*benchServer, n)
	total := 0
	for k := range servers {
		servers[k] = newBenchServer(b, k, gate)
		total += servers[k].bytes
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
		for _, s := range servers {
			for name, t := range s.emb {
				if err := t.Apply(s.ids[name], grads[:16*len(s.ids[name])], uint32(step)); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.StartTimer()
		t0 := time.Now()
		splitRun(w, len(dst), func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
		mem := time.Since(t0)
		infos := make([]checkpoint.SnapshotInfo, n)
		var wg sync.WaitGroup
		for k, s := range servers {
			wg.Go(func() {
				info, err := s.ck.Snapshot(ctx, step, checkpoint.SnapshotSlots(s.owned))
				if err != nil {
					b.Error(err)
				}
				infos[k] = info
			})
		}
		wg.Wait()
		b.StopTimer()
		if b.Failed() {
			b.FailNow()
		}
		for _, s := range servers {
			if _, err := s.ck.WaitPersisted(ctx, step); err != nil {
				b.Fatal(err)
			}
			if err := s.ck.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		blocked := slices.MaxFunc(infos, func(a, b checkpoint.SnapshotInfo) int { return int(a.Blocked - b.Blocked) }).Blocked
		switch {
		case round < warmup:
		case infos[0].Full:
			full.add(mem, blocked)
		default:
			delta.add(mem, blocked)
		}
	}
	b.StopTimer()
	full.report(b, "full", "memcpy")
	delta.report(b, "delta", "memcpy")
	b.ReportMetric(median(append(full.base, delta.base...)), "memcpy_ms")
	b.ReportMetric(float64(total)/(1<<20), "copied_MiB")
}
