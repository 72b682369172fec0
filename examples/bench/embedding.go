package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sort"
	"sync"
	"time"

	"github.com/elasticps/elasticps/embedding"
)

// runEmbedding measures table lookups and updates on a table far larger than the CPU cache,
// against a flat gather (the memory limit) and a Go map of slices (the naive table), interleaved
// in rounds so that machine noise hits every subject alike.
func runEmbedding(ctx context.Context, opt options, r *report) error {
	const dim, batch = 64, 4096
	rows := 8 << 20
	rounds, batchesPerRound := 5, 300
	if opt.quick {
		rows, rounds, batchesPerRound = 1<<18, 2, 30
	}
	stream := zipfStream(rows, batch*batchesPerRound, 1)
	ids := make([]uint64, len(stream))
	for i, rank := range stream {
		ids[i] = rankID(rank)
	}

	fmt.Printf("embedding: filling a %d-row x dim %d Adagrad table...\n", rows, dim)
	tab, err := embedding.New(embedding.Config{Dim: dim, Seed: 1, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}})
	if err != nil {
		return err
	}
	dst := make([]float32, batch*dim)
	all := make([]uint64, batch)
	for base := 0; base < rows; base += batch {
		for i := range all {
			all[i] = rankID(uint64(base + i))
		}
		if err := tab.Lookup(all, dst); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// The limit: the same sample stream as 256-byte rows at random places in one flat slice.
	flat := make([]float32, rows*dim)
	for i := range flat {
		flat[i] = float32(i)
	}
	perm := rand.New(rand.NewPCG(2, 3)).Perm(rows)
	offsets := make([]int, len(stream))
	for i, rank := range stream {
		offsets[i] = perm[rank] * dim
	}
	grads := make([]float32, batch*dim)
	rng := rand.New(rand.NewPCG(4, 5))
	for i := range grads {
		grads[i] = float32(rng.NormFloat64()) * 1e-3
	}

	lookup := func(part []uint64, out []float32) error {
		for b := 0; b+batch <= len(part); b += batch {
			if err := tab.Lookup(part[b:b+batch], out); err != nil {
				return err
			}
		}
		return nil
	}
	var lookupT, limitT, applyT, twoT []float64
	n := float64(len(ids))
	for round := 0; round < rounds; round++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d, err := timed(func() error { return lookup(ids, dst) })
		if err != nil {
			return err
		}
		lookupT = append(lookupT, n/d)
		d, _ = timed(func() error { gather(flat, offsets, dst, dim, batch); return nil })
		limitT = append(limitT, n/d)
		d, err = timed(func() error {
			for b := 0; b+batch <= len(ids); b += batch {
				if err := tab.Apply(ids[b:b+batch], grads, uint32(round)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		applyT = append(applyT, n/d)
		d, err = timed(func() error {
			var wg sync.WaitGroup
			errs := make([]error, 2)
			half := len(ids) / 2 / batch * batch
			for g := 0; g < 2; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					errs[g] = lookup(ids[g*half:(g+1)*half], make([]float32, batch*dim))
				}(g)
			}
			wg.Wait()
			for _, e := range errs {
				if e != nil {
					return e
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		twoT = append(twoT, float64(len(ids)/2/batch*batch*2)/d)
	}
	lk, lim, ap, two := median(lookupT), median(limitT), median(applyT), median(twoT)
	r.add("lookup_rows_per_s", lk, "rows/s, 1 goroutine, Zipf(1.1) over the table, batches of 4096")
	r.add("limit_rows_per_s", lim, "rows/s, plain gather of 256-byte rows from one flat []float32")
	r.add("lookup_vs_limit", lk/lim, "target >= 0.5")
	r.add("apply_adagrad_rows_per_s", ap, "rows/s, Adagrad step incl. duplicate folding")
	r.add("apply_vs_lookup", ap/lk, "target >= 0.5")
	r.add("lookup_2threads_vs_1", two/lk, fmt.Sprintf("target >= 1.6 on 2 cores (GOMAXPROCS %d)", runtime.GOMAXPROCS(0)))
	over := float64(tab.MemoryBytes()-int64(tab.Len()*tab.PayloadBytesPerRow())) / float64(tab.Len())
	r.add("table_rows", float64(tab.Len()), fmt.Sprintf("rows x dim %d (+%d Adagrad state)", dim, tab.StateWidth()))
	r.add("bytes_per_row_overhead", over, "bytes beyond weights and optimizer state; target <= 24")
	flat, offsets = nil, nil
	wall, cpu := gcMillis()
	r.add("gc_pause_ms_table", wall, "ms wall time of a forced full GC with the table alive; target <= 10")
	r.add("gc_cpu_ms_table", cpu, "ms of CPU the collector spent in it (robust to machine load)")
	r.add("gc_stw_ms_table", lastSTW(), "ms of stop-the-world in that GC")

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
	var naiveT, lookup2T []float64
	for round := 0; round < rounds; round++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d, _ := timed(func() error {
			for b := 0; b+batch <= len(ids); b += batch {
				for i, id := range ids[b : b+batch] {
					copy(dst[i*dim:(i+1)*dim], naive[id])
				}
			}
			return nil
		})
		naiveT = append(naiveT, n/d)
		d, err := timed(func() error { return lookup(ids, dst) })
		if err != nil {
			return err
		}
		lookup2T = append(lookup2T, n/d)
	}
	nv := median(naiveT)
	r.add("naive_rows_per_s", nv, "rows/s, map[uint64][]float32 doing the same lookups")
	r.add("lookup_vs_naive", median(lookup2T)/nv, "target >= 1.0 (our lookups measured in the same rounds)")
	runtime.KeepAlive(tab)
	tab = nil
	wall, cpu = gcMillis()
	r.add("gc_pause_ms_naive", wall, "ms wall time of a forced full GC with the naive map alive")
	r.add("gc_cpu_ms_naive", cpu, "ms of CPU the collector spent in it")
	r.add("gc_stw_ms_naive", lastSTW(), "ms of stop-the-world in that GC")
	runtime.KeepAlive(naive)
	return nil
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

func gather(flat []float32, offsets []int, dst []float32, dim, batch int) {
	for b := 0; b+batch <= len(offsets); b += batch {
		for i, o := range offsets[b : b+batch] {
			copy(dst[i*dim:(i+1)*dim], flat[o:o+dim])
		}
	}
}

func timed(fn func() error) (float64, error) {
	start := time.Now()
	err := fn()
	return time.Since(start).Seconds(), err
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
