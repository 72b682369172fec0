package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sort"
	"sync"
	"time"
	"unsafe"

	"github.com/elasticps/elasticps/embedding"
)

// runEmbedding measures table lookups and updates on a table far larger than the CPU cache against
// the limit of the hardware — the fastest gather of the same ids, in the same order, from rows laid
// out as the table lays them out (a copy of its own records, in its fill order), with the same
// look-ahead the table uses — and against a Go map of slices (the naive table). Subjects and
// baselines run interleaved in rounds so that machine noise hits them alike. Without -quick it then
// sweeps table sizes (1, 8 and 64 M rows).
func runEmbedding(ctx context.Context, opt options, r *report) error {
	const dim, batch = 64, 4096
	rows := 8 << 20
	rounds, batchesPerRound := 7, 300
	if opt.quick {
		rows, rounds, batchesPerRound = 1<<18, 3, 30
	}
	stream := zipfStream(rows, batch*batchesPerRound, 1)
	ids := make([]uint64, len(stream))
	for i, rank := range stream {
		ids[i] = rankID(rank)
	}

	fmt.Printf("embedding: filling a %d-row x dim %d Adagrad table in popularity order...\n", rows, dim)
	tcfg := embedding.Config{Dim: dim, Seed: 1, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}}
	tab, err := embFill(ctx, tcfg, rows)
	if err != nil {
		return err
	}
	dst := make([]float32, batch*dim)
	grads := make([]float32, batch*dim)
	rng := rand.New(rand.NewPCG(4, 5))
	for i := range grads {
		grads[i] = float32(rng.NormFloat64()) * 1e-3
	}

	// The limit reads a copy of the table's own records, in its layout: shard by shard, each
	// shard's rows in the order they were created (popularity order here), each record the table's
	// row (id, step, count, weights, optimizer state). Its "index" is a precomputed offset per
	// position, so it pays no hashing or probing at all. The same records at random places give
	// the effect of the fill order alone.
	fmt.Printf("embedding: copying the table's records for the limit...\n")
	lim, err := newLimitLayout(tab, ids)
	if err != nil {
		return err
	}
	window, err := lim.calibrate(ctx, dst, batch)
	if err != nil {
		return err
	}
	r.addTable("limit_window_calibration", sweepTable{
		About:   "rows/s of the limit's gather by look-ahead window (0: no look-ahead), medians of 5 interleaved rounds; the fastest is the limit",
		Columns: []string{"window", "rows_per_s"}, Rows: lim.calib})

	n := float64(len(ids))
	distinct := 0
	for b := 0; b+batch <= len(ids); b += batch {
		distinct += countDistinct(ids[b : b+batch])
	}
	lookup := func(part []uint64, out []float32) error {
		for b := 0; b+batch <= len(part); b += batch {
			if err := tab.Lookup(part[b:b+batch], out); err != nil {
				return err
			}
		}
		return nil
	}
	round := uint32(0)
	apply := func() error {
		round++
		for b := 0; b+batch <= len(ids); b += batch {
			if err := tab.Apply(ids[b:b+batch], grads, round); err != nil {
				return err
			}
		}
		return nil
	}
	half := len(ids) / 2 / batch * batch
	two := func() error {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for g := 0; g < 2; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				errs[g] = lookup(ids[g*half:(g+1)*half], make([]float32, batch*dim))
			}(g)
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	smp, err := interleave(ctx, rounds, nil,
		rate("apply", n, apply),
		rate("lookup", n, func() error { return lookup(ids, dst) }),
		rate("limit", n, func() error { lim.gather(lim.fill, dst, batch, window); return nil }),
		rate("limit_random", n, func() error { lim.gather(lim.random, dst, batch, window); return nil }),
		rate("lookup_2threads", float64(2*half), two),
	)
	if err != nil {
		return err
	}
	lk, lm := smp.median("lookup"), smp.median("limit")
	limNote := fmt.Sprintf("the limit: rows/s gathering the same ids in the same order from a copy of the table's records in its layout and fill order, offsets precomputed, look-ahead window %d", window)
	r.add("lookup_rows_per_s", lk, "rows/s, 1 goroutine, Zipf(1.1) over the table, batches of 4096")
	r.add("limit_rows_per_s", lm, limNote)
	r.addRatio("lookup_vs_limit", smp.ratio("lookup", "limit"), "limit_rows_per_s: "+limNote, "limit_rows_per_s", "target >= 0.6")
	r.add("limit_random_layout_rows_per_s", smp.median("limit_random"), "the limit's gather with the same records at random places (same look-ahead)")
	r.addRatio("fill_order_effect", smp.ratio("limit", "limit_random"), "limit_random_layout_rows_per_s", "limit_random_layout_rows_per_s",
		"the limit in popularity fill order over the same records at random places: what the fill order alone is worth")
	ap := smp.median("apply")
	r.add("apply_adagrad_rows_per_s", ap, "positions/s, Adagrad step incl. duplicate folding, credited per position")
	r.add("apply_rows_updated_per_s", ap*float64(distinct)/n, fmt.Sprintf("distinct rows updated per second (%.2f distinct ids per position in these batches)", float64(distinct)/n))
	r.addRatio("apply_vs_lookup", smp.ratio("apply", "lookup"), "lookup_rows_per_s of the same ids", "lookup_rows_per_s", "per position; target >= 0.5")
	r.addRatio("lookup_2threads_vs_1", smp.ratio("lookup_2threads", "lookup"), "lookup_rows_per_s (1 goroutine)", "lookup_rows_per_s",
		fmt.Sprintf("target >= 1.6 on 2 cores (GOMAXPROCS %d)", runtime.GOMAXPROCS(0)))
	lim = nil
	runtime.GC()
	debug.FreeOSMemory()
	over := float64(tab.MemoryBytes()-int64(tab.Len()*tab.PayloadBytesPerRow())) / float64(tab.Len())
	r.add("table_rows", float64(tab.Len()), fmt.Sprintf("rows x dim %d (+%d Adagrad state)", dim, tab.StateWidth()))
	r.add("bytes_per_row_overhead", over, "bytes beyond weights and optimizer state; target <= 24")
	wall, cpu := gcMillis()
	r.add("gc_pause_ms_table", wall, "ms wall time of a forced full GC with the table alive; target <= 10")
	r.add("gc_cpu_ms_table", cpu, "ms of CPU the collector spent in it (robust to machine load)")
	r.add("gc_stw_ms_table", lastSTW(), "ms of stop-the-world in that GC")
	mainPoint := []float64{float64(rows), dim, lk, ap, ap * float64(distinct) / n, float64(tab.MemoryBytes()) / float64(tab.Len()), over, wall, cpu}

	// The naive table: a Go map of slices, measured against ours in alternating rounds.
	fmt.Printf("embedding: filling a %d-entry map[uint64][]float32...\n", rows)
	naive := make(map[uint64][]float32, rows)
	for i := 0; i < rows; i++ {
		id := rankID(uint64(i))
		row := make([]float32, dim)
		if err := tab.InitialWeights(id, row); err != nil {
			return err
		}
		naive[id] = row
	}
	smp, err = interleave(ctx, rounds, nil,
		rate("naive", n, func() error {
			for b := 0; b+batch <= len(ids); b += batch {
				for i, id := range ids[b : b+batch] {
					copy(dst[i*dim:(i+1)*dim], naive[id])
				}
			}
			return nil
		}),
		rate("lookup", n, func() error { return lookup(ids, dst) }),
	)
	if err != nil {
		return err
	}
	r.add("naive_rows_per_s", smp.median("naive"), "rows/s, map[uint64][]float32 doing the same lookups")
	r.addRatio("lookup_vs_naive", smp.ratio("lookup", "naive"), "naive_rows_per_s, measured in the same rounds", "naive_rows_per_s", "target >= 1.0")
	runtime.KeepAlive(tab)
	tab = nil
	wall, cpu = gcMillis()
	r.add("gc_pause_ms_naive", wall, "ms wall time of a forced full GC with the naive map alive")
	r.add("gc_cpu_ms_naive", cpu, "ms of CPU the collector spent in it")
	r.add("gc_stw_ms_naive", lastSTW(), "ms of stop-the-world in that GC")
	runtime.KeepAlive(naive)
	naive = nil
	runtime.GC()
	debug.FreeOSMemory()

	// How cost grows with the table: the main table is one point of the sweep.
	sizes := []struct{ rows, dim int }{{1 << 20, 64}, {64 << 20, 8}}
	if opt.quick {
		sizes = []struct{ rows, dim int }{{1 << 14, 64}, {1 << 20, 8}}
	}
	sweep := sweepTable{
		About:   "lookup and apply of Zipf(1.1) batches of 4096 (medians of interleaved rounds), memory and a forced full GC against the table's rows; dim 8 for the largest so it fits in memory",
		Columns: []string{"rows", "dim", "lookup_rows_per_s", "apply_rows_per_s", "apply_rows_updated_per_s", "bytes_per_row", "bytes_per_row_overhead", "gc_pause_ms", "gc_cpu_ms"},
	}
	for _, sz := range sizes[:1] {
		p, err := embSweepPoint(ctx, sz.rows, sz.dim, batch, rounds, batchesPerRound)
		if err != nil {
			return err
		}
		sweep.Rows = append(sweep.Rows, p)
	}
	sweep.Rows = append(sweep.Rows, mainPoint)
	for _, sz := range sizes[1:] {
		p, err := embSweepPoint(ctx, sz.rows, sz.dim, batch, rounds, batchesPerRound)
		if err != nil {
			return err
		}
		sweep.Rows = append(sweep.Rows, p)
	}
	r.addTable("size_sweep", sweep)
	return nil
}

// embFill returns a table of cfg with rows rows created in popularity (rank) order.
func embFill(ctx context.Context, cfg embedding.Config, rows int) (*embedding.Table, error) {
	tab, err := embedding.New(cfg)
	if err != nil {
		return nil, err
	}
	const batch = 4096
	dst := make([]float32, batch*cfg.Dim)
	all := make([]uint64, batch)
	for base := 0; base < rows; base += batch {
		part := all[:min(batch, rows-base)]
		for i := range part {
			part[i] = rankID(uint64(base + i))
		}
		if err := tab.Lookup(part, dst[:len(part)*cfg.Dim]); err != nil {
			return nil, err
		}
		if base%(1<<20) == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return tab, nil
}

// embSweepPoint fills a table of rows rows of dim weights and measures one row of the size sweep.
func embSweepPoint(ctx context.Context, rows, dim, batch, rounds, batchesPerRound int) ([]float64, error) {
	fmt.Printf("embedding: size sweep, %d rows x dim %d...\n", rows, dim)
	tab, err := embFill(ctx, embedding.Config{Dim: dim, Seed: 1, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}}, rows)
	if err != nil {
		return nil, err
	}
	stream := zipfStream(rows, batch*batchesPerRound, 1)
	ids := make([]uint64, len(stream))
	for i, rank := range stream {
		ids[i] = rankID(rank)
	}
	distinct := 0
	for b := 0; b+batch <= len(ids); b += batch {
		distinct += countDistinct(ids[b : b+batch])
	}
	dst := make([]float32, batch*dim)
	grads := make([]float32, batch*dim)
	for i := range grads {
		grads[i] = 1e-3
	}
	n := float64(len(ids))
	step := uint32(0)
	smp, err := interleave(ctx, rounds, nil,
		rate("lookup", n, func() error {
			for b := 0; b+batch <= len(ids); b += batch {
				if err := tab.Lookup(ids[b:b+batch], dst); err != nil {
					return err
				}
			}
			return nil
		}),
		rate("apply", n, func() error {
			step++
			for b := 0; b+batch <= len(ids); b += batch {
				if err := tab.Apply(ids[b:b+batch], grads, step); err != nil {
					return err
				}
			}
			return nil
		}))
	if err != nil {
		return nil, err
	}
	ids, stream = nil, nil
	runtime.GC()
	mem := float64(tab.MemoryBytes())
	per := mem / float64(tab.Len())
	over := (mem - float64(tab.Len()*tab.PayloadBytesPerRow())) / float64(tab.Len())
	wall, cpu := gcMillis()
	ap := smp.median("apply")
	p := []float64{float64(rows), float64(dim), smp.median("lookup"), ap, ap * float64(distinct) / n, per, over, wall, cpu}
	runtime.KeepAlive(tab)
	tab = nil
	runtime.GC()
	debug.FreeOSMemory()
	return p, nil
}

// countDistinct returns the number of distinct ids in a batch.
func countDistinct(ids []uint64) int {
	seen := make(map[uint64]struct{}, len(ids))
	for _, id := range ids {
		seen[id] = struct{}{}
	}
	return len(seen)
}

// limitLayout is a copy of a table's records in the table's own layout, with the offset of each
// stream position's weights precomputed: in that layout (fill) and with the records moved to random
// places (random).
type limitLayout struct {
	flat         []float32
	fill, random []int
	dim          int
	calib        [][]float64
	sink         uint32 // keeps the look-ahead loads alive
}

func newLimitLayout(tab *embedding.Table, ids []uint64) (*limitLayout, error) {
	raw := tab.RawSize(false)
	rec := tab.RawRowSize()
	flat := make([]float32, raw/4)
	n, err := tab.CopyRaw(unsafe.Slice((*byte)(unsafe.Pointer(&flat[0])), len(flat)*4), false, false)
	if err != nil {
		return nil, err
	}
	recs, words := n/rec, rec/4
	u := unsafe.Slice((*uint32)(unsafe.Pointer(&flat[0])), len(flat))
	at := make(map[uint64]int32, recs)
	for i := 0; i < recs; i++ {
		at[uint64(u[i*words])|uint64(u[i*words+1])<<32] = int32(i) // the record's id, low word first
	}
	perm := rand.New(rand.NewPCG(2, 3)).Perm(recs)
	const hdrWords = 4 // id (2 words), step, count: the weights follow
	l := &limitLayout{flat: flat, fill: make([]int, len(ids)), random: make([]int, len(ids)), dim: tab.Dim()}
	for p, id := range ids {
		i, ok := at[id]
		if !ok {
			return nil, fmt.Errorf("embedding bench: id %d has no record", id)
		}
		l.fill[p] = int(i)*words + hdrWords
		l.random[p] = perm[i]*words + hdrWords
	}
	return l, nil
}

// gather copies the rows at offs into dst batch by batch. With a window, it first loads one word
// of each cache line of the next window rows' weights (the table's look-ahead: their misses are
// then in flight together), then copies them.
func (l *limitLayout) gather(offs []int, dst []float32, batch, window int) {
	flat, d := l.flat, l.dim
	var sink uint32
	for b := 0; b+batch <= len(offs); b += batch {
		part := offs[b : b+batch]
		if window <= 0 {
			for i, o := range part {
				copy(dst[i*d:(i+1)*d], flat[o:o+d])
			}
			continue
		}
		for lo := 0; lo < batch; lo += window {
			w := part[lo:min(lo+window, batch)]
			for _, o := range w {
				row := flat[o : o+d]
				for k := 0; k < d; k += 16 {
					sink += math.Float32bits(row[k])
				}
				sink += math.Float32bits(row[d-1])
			}
			for i, o := range w {
				copy(dst[(lo+i)*d:(lo+i+1)*d], flat[o:o+d])
			}
		}
	}
	l.sink += sink
}

// calibrate measures the gather with several look-ahead windows, in five interleaved rounds, and
// returns the window of the highest median.
func (l *limitLayout) calibrate(ctx context.Context, dst []float32, batch int) (int, error) {
	windows := []int{0, 8, 16, 32, 64, 128, 256, batch}
	var trials []trial
	for _, w := range windows {
		trials = append(trials, rate(fmt.Sprint(w), float64(len(l.fill)/batch*batch), func() error {
			l.gather(l.fill, dst, batch, w)
			return nil
		}))
	}
	smp, err := interleave(ctx, 5, nil, trials...)
	if err != nil {
		return 0, err
	}
	best, bestRate := 0, 0.0
	l.calib = nil
	for _, w := range windows {
		v := smp.median(fmt.Sprint(w))
		l.calib = append(l.calib, []float64{float64(w), v})
		if v > bestRate {
			best, bestRate = w, v
		}
	}
	return best, nil
}

// zipfStream returns n ranks in [0, rows) drawn from Zipf(1.1).
func zipfStream(rows, n int, seed uint64) []uint64 {
	z := rand.NewZipf(rand.New(rand.NewPCG(seed, 17)), 1.1, 1, uint64(rows-1))
	out := make([]uint64, n)
	for i := range out {
		out[i] = z.Uint64()
	}
	return out
}

// rankID maps a popularity rank to a feature id scattered over uint64 (a bijection).
func rankID(rank uint64) uint64 {
	x := rank + 0x9e3779b97f4a7c15
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	return x ^ x>>29
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// gcMillis returns the wall time of a forced full collection and the CPU time the collector
// spent in it, both in milliseconds and both the best of three.
func gcMillis() (wall, cpu float64) {
	gcCPU := func() float64 {
		s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
		metrics.Read(s)
		return s[0].Value.Float64()
	}
	for i := 0; i < 3; i++ {
		c0 := gcCPU()
		start := time.Now()
		runtime.GC()
		w := float64(time.Since(start).Microseconds()) / 1000
		c := (gcCPU() - c0) * 1000
		if i == 0 || w < wall {
			wall = w
		}
		if i == 0 || c < cpu {
			cpu = c
		}
	}
	return wall, cpu
}

// lastSTW returns the stop-the-world pause of the most recent collection in milliseconds.
func lastSTW() float64 {
	var s debug.GCStats
	debug.ReadGCStats(&s)
	if len(s.Pause) == 0 {
		return 0
	}
	return float64(s.Pause[0].Microseconds()) / 1000
}
