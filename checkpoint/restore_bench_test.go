//go:build linux

package checkpoint_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
)

// The benchmarks below time a subject against the best the machine does with the same bytes, in
// the same run and interleaved (baseline, subject, baseline, subject, ...), and report the median
// of the per-pair ratios with its minimum and maximum, so one slow round on a shared machine
// neither makes nor breaks a figure. Tables are larger than the last-level cache: 1 GiB of records,
// or 96 MiB with -short.

// benchTableBytes is the size of the benchmark table's records.
func benchTableBytes() int {
	if testing.Short() {
		return 96 << 20
	}
	return 1 << 30
}

// minPairs is the fewest baseline/subject pairs a benchmark measures.
const minPairs = 5

// pairs collects per-pair timings of a baseline and a subject.
type pairs struct {
	base, subj []float64 // milliseconds
}

func (p *pairs) add(base, subj time.Duration) {
	p.base = append(p.base, float64(base)/1e6)
	p.subj = append(p.subj, float64(subj)/1e6)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// report adds the medians of both timings and the median, minimum and maximum of the ratios
// subject/baseline.
func (p *pairs) report(b *testing.B, subj, base string) {
	ratios := make([]float64, len(p.base))
	for i := range ratios {
		ratios[i] = p.subj[i] / p.base[i]
	}
	b.ReportMetric(median(p.subj), subj+"_ms")
	b.ReportMetric(median(p.base), base+"_ms")
	b.ReportMetric(median(ratios), subj+"/"+base)
	b.ReportMetric(slices.Min(ratios), subj+"/"+base+"_min")
	b.ReportMetric(slices.Max(ratios), subj+"/"+base+"_max")
	b.ReportMetric(0, "ns/op") // one op is a pair; its time says nothing on its own
}

// splitRun runs fn over [0, n) cut into w contiguous page-aligned parts, one goroutine each.
func splitRun(w, n int, fn func(lo, hi int)) {
	const page = 4096
	per := (n/w + page - 1) / page * page
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += per {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			fn(lo, hi)
		}(lo, min(lo+per, n))
	}
	wg.Wait()
}

// benchWorkers is the number of goroutines a restore uses (Config.Workers and the table's own
// parallelism both default to GOMAXPROCS); the baselines use as many.
func benchWorkers() int { return runtime.GOMAXPROCS(0) }

// shmRoot returns a fresh directory for shared-memory regions, on tmpfs where there is one.
func shmRoot(b *testing.B) string {
	root := "/dev/shm"
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		return b.TempDir()
	}
	dir, err := os.MkdirTemp(root, "ckbench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

var benchTableConfig = embedding.Config{Name: "emb", Dim: 64, Seed: 1,
	Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}}

// benchRecords returns rows raw records of the benchmark table's layout: spread ids, step and
// frequency 1, and pseudo-random finite weights and state.
func benchRecords(rows, rowSize int) []byte {
	recs := make([]byte, rows*rowSize)
	splitRun(benchWorkers(), rows, func(lo, hi int) {
		x := uint64(lo)*0x9e3779b97f4a7c15 + 1
		for r := lo; r < hi; r++ {
			rec := recs[r*rowSize : (r+1)*rowSize]
			binary.LittleEndian.PutUint64(rec, benchID(uint64(r)))
			binary.LittleEndian.PutUint32(rec[8:], 1)
			binary.LittleEndian.PutUint32(rec[12:], 1)
			for o := 16; o < rowSize; o += 4 {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				// A float32 in [1, 2) with random mantissa bits.
				binary.LittleEndian.PutUint32(rec[o:], 0x3f800000|uint32(x)&0x7fffff)
			}
		}
	})
	return recs
}

// benchID spreads row ids over the id space, as hashed feature ids are.
func benchID(i uint64) uint64 {
	x := i + 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// restoreJob is a committed full checkpoint of one benchmark table, sealed in a shared-memory region.
type restoreJob struct {
	cfg  checkpoint.Config
	recs []byte // the table's records, as loaded into it
	rows int
	step uint64
}

func newRestoreJob(b *testing.B) *restoreJob {
	b.Helper()
	ctx := context.Background()
	src, err := embedding.New(benchTableConfig)
	if err != nil {
		b.Fatal(err)
	}
	rowSize := src.RawRowSize()
	rows := benchTableBytes() / rowSize
	recs := benchRecords(rows, rowSize)
	if _, err := src.LoadRaw(recs, nil); err != nil {
		b.Fatal(err)
	}
	st, err := checkpoint.NewFSStorage(filepath.Join(b.TempDir(), "store"))
	if err != nil {
		b.Fatal(err)
	}
	cfg := checkpoint.Config{Job: "bench", Node: "ps0", Tables: map[string]checkpoint.Table{"emb": src},
		Storage: st, ShmDir: shmRoot(b), FullEvery: 1, Headroom: -1, Codec: checkpoint.CodecNone}
	ck, err := checkpoint.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer ck.Close()
	const step = 1
	if _, err := ck.Snapshot(ctx, step); err != nil {
		b.Fatal(err)
	}
	ref, err := ck.WaitPersisted(ctx, step)
	if err != nil {
		b.Fatal(err)
	}
	m, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "bench", Storage: st})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := m.Commit(ctx, step, []checkpoint.ManifestRef{ref}); err != nil {
		b.Fatal(err)
	}
	if err := ck.Close(); err != nil {
		b.Fatal(err)
	}
	cfg.Tables = nil // the source table's memory goes; each restore names its own table
	return &restoreJob{cfg: cfg, recs: recs, rows: rows, step: step}
}

// load restores the job's checkpoint into tab from shared memory. It returns the time of the
// Checkpointer's start (reattaching the region) and that of Load.
func (j *restoreJob) load(b *testing.B, tab *embedding.Table) (open, load time.Duration) {
	b.Helper()
	cfg := j.cfg
	cfg.Tables = map[string]checkpoint.Table{"emb": tab}
	t0 := time.Now()
	ck, err := checkpoint.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer ck.Close()
	open = time.Since(t0)
	t0 = time.Now()
	res, err := ck.Load(context.Background(), j.step)
	load = time.Since(t0)
	if err != nil {
		b.Fatal(err)
	}
	if res.Sources["ps0"] != checkpoint.SourceShm {
		b.Fatalf("restored from %v, want shared memory", res.Sources["ps0"])
	}
	if tab.Len() != j.rows {
		b.Fatalf("restored %d rows, want %d", tab.Len(), j.rows)
	}
	return open, load
}

// check compares a sample of the restored rows with the records saved.
func (j *restoreJob) check(b *testing.B, tab *embedding.Table) {
	b.Helper()
	rowSize := tab.RawRowSize()
	for r := 0; r < j.rows; r += 1 + j.rows/1000 {
		rec := j.recs[r*rowSize : (r+1)*rowSize]
		id := binary.LittleEndian.Uint64(rec)
		row, ok := tab.Row(id)
		if !ok {
			b.Fatalf("row %d missing after the restore", id)
		}
		for k, w := range row.Weights {
			if got := binary.LittleEndian.Uint32(rec[16+4*k:]); got != math.Float32bits(w) {
				b.Fatalf("row %d weight %d differs after the restore", id, k)
			}
		}
	}
}

// freshTable returns an empty benchmark table, after letting the previous ones' memory go.
func freshTable(b *testing.B) *embedding.Table {
	runtime.GC()
	runtime.GC()
	tab, err := embedding.New(benchTableConfig)
	if err != nil {
		b.Fatal(err)
	}
	return tab
}

// BenchmarkRestoreShm restores a full checkpoint from shared memory into an empty table that
// reserved its room first (as a restarting server does at start-up), against a memcpy of the same
// bytes between two pre-faulted buffers on as many goroutines as the restore uses.
func BenchmarkRestoreShm(b *testing.B) {
	j := newRestoreJob(b)
	w := benchWorkers()
	dst := make([]byte, len(j.recs))
	splitRun(w, len(dst), func(lo, hi int) { copy(dst[lo:hi], j.recs[lo:hi]) })
	memcpy := func() time.Duration {
		t0 := time.Now()
		splitRun(w, len(dst), func(lo, hi int) { copy(dst[lo:hi], j.recs[lo:hi]) })
		return time.Since(t0)
	}
	b.ResetTimer()
	var p pairs
	for i := range max(b.N, minPairs) {
		b.StopTimer()
		tab := freshTable(b)
		tab.Reserve(j.rows)
		b.StartTimer()
		base := memcpy()
		_, subj := j.load(b, tab)
		p.add(base, subj)
		if i == 0 {
			b.StopTimer()
			j.check(b, tab)
			b.StartTimer()
		}
	}
	b.StopTimer()
	p.report(b, "restore", "memcpy")
}

// BenchmarkRestoreShmCold is a restarted process's restore: it opens the region again (reported
// alone as reattach_ms too) and loads the checkpoint into a new table that reserved nothing, so
// every page of the table is touched for the first time. The baseline reads the same shared-memory files into new memory as
// fast as it can: the region's extent files, read in parallel into a fresh anonymous mapping.
func BenchmarkRestoreShmCold(b *testing.B) {
	j := newRestoreJob(b)
	w := benchWorkers()
	region := filepath.Join(j.cfg.ShmDir, j.cfg.Job, j.cfg.Node)
	entries, err := os.ReadDir(region)
	if err != nil {
		b.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name()[0] == 'g' && filepath.Ext(e.Name()) != ".seal" {
			files = append(files, filepath.Join(region, e.Name()))
		}
	}
	coldRead := func() time.Duration {
		t0 := time.Now()
		for _, name := range files {
			f, err := os.Open(name)
			if err != nil {
				b.Fatal(err)
			}
			st, err := f.Stat()
			if err != nil {
				b.Fatal(err)
			}
			buf := mmapAnon(b, int(st.Size()))
			splitRun(w, len(buf), func(lo, hi int) {
				for lo < hi {
					n, err := f.ReadAt(buf[lo:hi], int64(lo))
					if err != nil {
						b.Error(err)
						return
					}
					lo += n
				}
			})
			f.Close()
			defer syscall.Munmap(buf)
		}
		return time.Since(t0)
	}
	var bytes int64
	for _, name := range files {
		st, err := os.Stat(name)
		if err != nil {
			b.Fatal(err)
		}
		bytes += st.Size()
	}
	b.Logf("region files: %d, %d MiB; table records: %d MiB", len(files), bytes>>20, len(j.recs)>>20)
	j.recs = nil // the memory is needed for the tables
	b.ResetTimer()
	var p pairs
	var opens []float64
	for range max(b.N, minPairs) {
		b.StopTimer()
		tab := freshTable(b)
		b.StartTimer()
		base := coldRead()
		open, load := j.load(b, tab)
		p.add(base, open+load)
		opens = append(opens, float64(open)/1e6)
	}
	b.StopTimer()
	p.report(b, "restore_cold", "cold_read")
	b.ReportMetric(median(opens), "reattach_ms")
}

// BenchmarkReserveShm faults in the shared memory of both generations for a table's full
// snapshot (Checkpointer.Reserve on a new region) against a memset of as many bytes of new
// anonymous memory on as many goroutines.
func BenchmarkReserveShm(b *testing.B) {
	ctx := context.Background()
	size := int64(benchTableBytes())
	w := benchWorkers()
	root := shmRoot(b)
	st := checkpoint.NewMemStorage()
	var p pairs
	b.ResetTimer()
	for i := range max(b.N, minPairs) {
		b.StopTimer()
		node := fmt.Sprintf("ps%d", i)
		ck, err := checkpoint.New(checkpoint.Config{Job: "bench", Node: node, Storage: st, ShmDir: root})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		buf := mmapAnon(b, int(2*size))
		splitRun(w, len(buf), func(lo, hi int) { clear(buf[lo:hi]) })
		base := time.Since(t0)
		b.StopTimer()
		syscall.Munmap(buf)
		b.StartTimer()
		t0 = time.Now()
		if err := ck.Reserve(ctx, size); err != nil {
			b.Fatal(err)
		}
		subj := time.Since(t0)
		b.StopTimer()
		p.add(base, subj)
		if err := ck.Close(); err != nil {
			b.Fatal(err)
		}
		if err := checkpoint.DeleteRegion(root, "bench", node); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	p.report(b, "reserve", "memset")
}

// mmapAnon maps n bytes of new anonymous memory, not yet faulted in.
func mmapAnon(b *testing.B, n int) []byte {
	buf, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		b.Fatal(err)
	}
	return buf
}
