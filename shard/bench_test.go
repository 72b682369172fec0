package shard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardtest"
)

// BenchmarkAcquireReportDone measures Acquire + Report(done) round trips per second in process
// (one shard per round trip), with 1 and 8 concurrent workers, over 1024 shards (the state fits
// in cache) and 65536 shards (shuffled order: most round trips miss the cache), as two calls
// and as one ReportAndAcquire. The baseline is the same number of calls into an empty
// mutex-guarded critical section: the floor for any locked dispatcher making two calls.
func BenchmarkAcquireReportDone(b *testing.B) {
	for _, c := range []struct {
		workers, shards int
		combined        bool
	}{{1, 1 << 10, false}, {1, 1 << 10, true}, {8, 1 << 10, false}, {8, 1 << 10, true}, {1, 1 << 16, false}, {8, 1 << 16, false}, {8, 1 << 16, true}} {
		workers, shards := c.workers, int64(c.shards)
		calls := 2
		if c.combined {
			calls = 1
		}
		b.Run(fmt.Sprintf("workers=%d/shards=%d/calls=%d", workers, shards, calls), func(b *testing.B) {
			d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(shards), ShardSize: 1, Epochs: 1 << 30, Shuffle: true})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			per := b.N / workers
			for w := range workers {
				n := per
				if w == 0 {
					n += b.N % workers
				}
				name := fmt.Sprintf("w%d", w)
				if c.combined {
					wg.Go(func() { combinedRoundTrips(b, d, name, n) })
					continue
				}
				wg.Go(func() {
					for i := 0; i < n; {
						l, err := d.Acquire(ctx, name)
						if errors.Is(err, shard.ErrWait) {
							runtime.Gosched() // epoch barrier: the others hold the last shards
							continue
						}
						if err != nil {
							b.Error(err)
							return
						}
						if err := d.Report(ctx, name, l.ID, l.Shard.Records, true); err != nil {
							b.Error(err)
							return
						}
						i++
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "roundtrips/s")
		})
	}
	b.Run("baseline=mutex", func(b *testing.B) {
		var mu sync.Mutex
		var x [2]int
		var wg sync.WaitGroup
		b.ResetTimer()
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < b.N; i += 8 {
					for k := range 2 { // two calls per round trip
						mu.Lock()
						x[k]++
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "roundtrips/s")
	})
}

// combinedRoundTrips finishes n shards with ReportAndAcquire, acquiring only when a combined
// call found no shard (the epoch barrier). It hands its last lease back, which the other
// workers would otherwise wait for at the next barrier.
func combinedRoundTrips(b *testing.B, d *shard.Dispatcher, name string, n int) {
	ctx := context.Background()
	defer func() { _ = d.Leave(ctx, name) }()
	var l shard.Lease
	have := false
	for i := 0; i < n; {
		if !have {
			var err error
			if l, err = d.Acquire(ctx, name); errors.Is(err, shard.ErrWait) {
				runtime.Gosched() // let the holders of the epoch's last shards report them
				continue
			} else if err != nil {
				b.Error(err)
				return
			}
			have = true
		}
		next, err := d.ReportAndAcquire(ctx, name, l.ID, l.Shard.Records)
		switch {
		case err == nil:
			l = next
		case errors.Is(err, shard.ErrWait): // the shard is done; the next epoch has not begun
			have = false
		default:
			b.Error(err)
			return
		}
		i++
	}
}

// BenchmarkReportBatch512 measures the cost of a progress report that covers one batch of 512
// records, per record.
func BenchmarkReportBatch512(b *testing.B) {
	const batch = 512
	const shardRecords = batch << 16
	d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(shardRecords), ShardSize: shardRecords, Epochs: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	l, err := d.Acquire(ctx, "w")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	off := l.Offset
	for range b.N {
		off += batch
		if err := d.Report(ctx, "w", l.ID, off, false); err != nil {
			b.Fatal(err)
		}
		if off == shardRecords-batch { // finish the shard, start the next epoch's
			if err := d.Report(ctx, "w", l.ID, shardRecords, true); err != nil {
				b.Fatal(err)
			}
			if l, err = d.Acquire(ctx, "w"); err != nil {
				b.Fatal(err)
			}
			off = 0
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/record")
}

// BenchmarkReader measures the worker side end to end in process: acquire, read an in-memory
// dataset of Criteo-shaped records (13 dense, 26 fields), build batches of 512 and report each.
// The baseline copies the same records into the same batches without any dispatcher.
func BenchmarkReader(b *testing.B) {
	const n = 1 << 16
	data := shard.IndexedFunc(n, func(i int64, rec *shard.Record) error {
		rec.Label = float32(i & 1)
		for k := range 13 {
			rec.Dense = append(rec.Dense, float32(k))
		}
		for f := range 26 {
			rec.IDs = append(rec.IDs, uint64(i)*31+uint64(f))
			rec.EndField()
		}
		return nil
	})
	b.Run("reader", func(b *testing.B) {
		ctx := context.Background()
		d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(n), ShardSize: 8192, Epochs: 1 << 30})
		if err != nil {
			b.Fatal(err)
		}
		r, err := shard.NewReader(shard.ReaderConfig{Service: d, Worker: "w", Source: shard.IndexedSource{Data: data}, BatchSize: 512})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		records := 0
		for records < b.N {
			bt, err := r.Next(ctx)
			if err != nil {
				b.Fatal(err)
			}
			records += bt.Len()
			if err := r.Done(ctx, bt); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
	})
	b.Run("baseline=batch-only", func(b *testing.B) {
		var rec shard.Record
		var bt shard.Batch
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if i%512 == 0 {
				bt.Reset()
			}
			if err := data.ReadRecord(int64(i%n), &rec); err != nil {
				b.Fatal(err)
			}
			if err := bt.Append(&rec); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	})
}

// BenchmarkParse measures the format parsers in bytes of input per second.
func BenchmarkParse(b *testing.B) {
	for _, c := range []struct {
		name  string
		p     shard.Parser
		lines string
	}{
		{"criteo", shard.Criteo{}, shardtest.CriteoLines(1024, 1)},
		{"libsvm", shard.LibSVM{}, shardtest.LibSVMLines(1024, 1)},
	} {
		lines := strings.Split(strings.TrimSuffix(c.lines, "\n"), "\n")
		raw := make([][]byte, len(lines))
		for i, l := range lines {
			raw[i] = []byte(l)
		}
		b.Run(c.name, func(b *testing.B) {
			var rec shard.Record
			b.SetBytes(int64(len(c.lines)) / int64(len(lines)))
			b.ReportAllocs()
			for i := range b.N {
				rec.Reset()
				if err := c.p.Parse(raw[i%len(raw)], &rec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTextReader reads Criteo text shards through TextSource and the Reader.
func BenchmarkTextReader(b *testing.B) {
	const n = 8192
	text := shardtest.CriteoLines(n, 2)
	fsys := mapFS("day_0", text)
	ctx := context.Background()
	shards, err := shard.SplitText(ctx, fsys, []string{"day_0"}, shard.SplitConfig{RecordsPerShard: 2048})
	if err != nil {
		b.Fatal(err)
	}
	d, err := shard.New(shard.Config{Dataset: shard.TextDataset(shards), Epochs: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	r, err := shard.NewReader(shard.ReaderConfig{Service: d, Worker: "w", Source: shard.TextSource{FS: fsys, Parser: shard.Criteo{}}, BatchSize: 512})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	b.SetBytes(int64(len(text) / n))
	b.ReportAllocs()
	b.ResetTimer()
	records := 0
	for records < b.N {
		bt, err := r.Next(ctx)
		if err == io.EOF {
			b.Fatal("ran out of epochs")
		}
		if err != nil {
			b.Fatal(err)
		}
		records += bt.Len()
		if err := r.Done(ctx, bt); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
}
