package embedding

import (
	"math/rand/v2"
	"testing"
)

// benchTable returns a filled Adagrad table and a Zipf(1.1) id stream over it.
func benchTable(b *testing.B, rows int) (*Table, []uint64) {
	b.Helper()
	tab, err := New(Config{Dim: 64, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	const batch = 4096
	ids := make([]uint64, batch)
	w := make([]float32, batch*64)
	for base := 0; base < rows; base += batch {
		for i := range ids {
			ids[i] = mix64(uint64(base + i))
		}
		if err := tab.Lookup(ids, w); err != nil {
			b.Fatal(err)
		}
	}
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, uint64(rows-1))
	stream := make([]uint64, batch*64)
	for i := range stream {
		stream[i] = mix64(z.Uint64())
	}
	return tab, stream
}

// BenchmarkLookup measures batched lookups of 4096 Zipf-distributed ids, with a Go map of slices
// doing the same lookups as the baseline.
func BenchmarkLookup(b *testing.B) {
	const rows, batch = 1 << 20, 4096
	tab, stream := benchTable(b, rows)
	dst := make([]float32, batch*64)
	b.Run("table", func(b *testing.B) {
		b.SetBytes(batch * 256)
		for i := 0; i < b.N; i++ {
			o := (i * batch) % len(stream)
			if err := tab.Lookup(stream[o:o+batch], dst); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "rows/s")
	})
	b.Run("flatgather", func(b *testing.B) {
		// The memory limit: the same stream gathered from one flat slice at random row offsets.
		flat := make([]float32, rows*64)
		perm := rand.New(rand.NewPCG(3, 4)).Perm(rows)
		off := make([]int, len(stream))
		for i, id := range stream {
			off[i] = perm[id%rows] * 64
		}
		b.SetBytes(batch * 256)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			o := (i * batch) % len(stream)
			for k, x := range off[o : o+batch] {
				copy(dst[k*64:(k+1)*64], flat[x:x+64])
			}
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "rows/s")
	})
	b.Run("gomap", func(b *testing.B) {
		m := make(map[uint64][]float32, rows)
		tab.Range(func(v RowView) bool { m[v.ID] = append([]float32(nil), v.Weights...); return true })
		b.SetBytes(batch * 256)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			o := (i * batch) % len(stream)
			for k, id := range stream[o : o+batch] {
				copy(dst[k*64:(k+1)*64], m[id])
			}
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "rows/s")
	})
}

// BenchmarkApplyAdagrad measures batched Adagrad updates of 4096 Zipf-distributed ids.
func BenchmarkApplyAdagrad(b *testing.B) {
	const rows, batch = 1 << 20, 4096
	tab, stream := benchTable(b, rows)
	g := make([]float32, batch*64)
	for i := range g {
		g[i] = 1e-3
	}
	b.SetBytes(batch * 256)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o := (i * batch) % len(stream)
		if err := tab.Apply(stream[o:o+batch], g, uint32(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkLoadRaw measures restoring 1M rows into a fresh and into a reserved table, in one
// call and in 4 MiB chunks (as a migration and a checkpoint restore load them), against a
// memcpy of the same bytes between pre-faulted buffers.
func BenchmarkLoadRaw(b *testing.B) {
	const rows = 1 << 20
	src, _ := benchTable(b, rows)
	raw := make([]byte, src.RawSize(false))
	n, err := src.CopyRaw(raw, false, false)
	if err != nil {
		b.Fatal(err)
	}
	raw = raw[:n]
	b.Run("memcpy", func(b *testing.B) {
		dst := make([]byte, n)
		copy(dst, raw)
		b.SetBytes(int64(n))
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			copy(dst, raw)
		}
	})
	chunk := (4 << 20) / src.RawRowSize() * src.RawRowSize()
	for _, reserve := range []bool{false, true} {
		for _, chunked := range []bool{false, true} {
			name := "fresh"
			if reserve {
				name = "reserved"
			}
			if chunked {
				name += "/4MiB-chunks"
			}
			b.Run(name, func(b *testing.B) {
				b.SetBytes(int64(n))
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					dst, _ := New(src.Config())
					if reserve {
						dst.Reserve(rows)
					}
					b.StartTimer()
					step := n
					if chunked {
						step = chunk
					}
					for off := 0; off < n; off += step {
						if _, err := dst.LoadRaw(raw[off:min(off+step, n)], nil); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}

// BenchmarkMoveSlots measures a migration's work on its source with a table of 2M rows (1 GiB,
// larger than the CPU cache): the chunked copy of a third of the slots' rows (AppendRawRows, 4
// MiB chunks) and the deletion of those rows (DeleteSlots), on a fresh table each time, against
// copying the same bytes from one flat buffer.
func BenchmarkMoveSlots(b *testing.B) {
	const rows, slots = 2 << 20, 4096
	src, _ := benchTable(b, rows)
	set := NewSlotSet(slots)
	for sl := 0; sl < slots; sl += 3 {
		set.Add(sl)
	}
	raw := make([]byte, src.RawSize(false))
	n, err := src.CopyRaw(raw, false, false)
	if err != nil {
		b.Fatal(err)
	}
	raw = raw[:n]
	moved := 0
	src.Range(func(v RowView) bool {
		if set.Contains(v.ID) {
			moved++
		}
		return true
	})
	rec := src.RawRowSize()
	fresh := func(b *testing.B) *Table {
		b.StopTimer()
		t, _ := New(src.Config())
		if _, err := t.LoadRaw(raw, nil); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		return t
	}
	b.Run("memcpy", func(b *testing.B) {
		dst := make([]byte, moved*rec)
		b.SetBytes(int64(moved * rec))
		for i := 0; i < b.N; i++ {
			copy(dst, raw[:moved*rec])
		}
		b.ReportMetric(float64(b.N*moved)/b.Elapsed().Seconds(), "rows/s")
	})
	b.Run("copy", func(b *testing.B) {
		buf := make([]byte, 0, 4<<20+rec)
		b.SetBytes(int64(moved * rec))
		for i := 0; i < b.N; i++ {
			got := 0
			for cur := (Cursor{}); cur.Shard < src.Shards(); {
				buf, cur = src.AppendRawRows(buf[:0], cur, 4<<20, set)
				got += len(buf) / rec
			}
			if got != moved {
				b.Fatalf("copied %d rows, want %d", got, moved)
			}
		}
		b.ReportMetric(float64(b.N*moved)/b.Elapsed().Seconds(), "rows/s")
	})
	b.Run("delete", func(b *testing.B) {
		b.SetBytes(int64(moved * rec))
		for i := 0; i < b.N; i++ {
			t := fresh(b)
			if got := t.DeleteSlots(set); got != moved {
				b.Fatalf("deleted %d rows, want %d", got, moved)
			}
		}
		b.ReportMetric(float64(b.N*moved)/b.Elapsed().Seconds(), "rows/s")
	})
}
