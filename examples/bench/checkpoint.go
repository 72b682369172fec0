package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
)

// runCheckpoint measures flash checkpoints of one parameter server holding a dim-64 Adagrad table of
// more than 2 GiB: the blocking copy into pre-faulted shared memory against a memcpy of the same
// bytes on as many cores as the snapshot copies with, a 10% incremental snapshot against a full one,
// the background persist to a directory on disk against a write + fsync of the same bytes to the
// same directory in as many parallel streams as the persister writes, and a restore from shared
// memory against the same memcpy. Each subject alternates with its baseline in rounds so that
// machine noise hits both alike; ratios are medians of the per-round ratios, with their range.
// Without -quick, snapshot and restore times are also swept over table sizes.
func runCheckpoint(ctx context.Context, opt options, r *report) error {
	const dim, batch = 64, 4096
	rows, rounds := 4_200_000, 5
	if opt.quick {
		rows, rounds = 200_000, 3
	}
	if err := ckMain(ctx, opt, r, dim, batch, rows, rounds); err != nil {
		return err
	}
	sizes := []int{rows / 16, rows / 4}
	if opt.quick {
		sizes = []int{rows / 4}
	}
	return ckSizeSweep(ctx, opt, r, dim, sizes, rows)
}

// ckCopyWorkers is the number of goroutines a snapshot copies a table with (the table copies its
// shards on up to GOMAXPROCS goroutines) and a restore loads with (Config.Workers, default
// GOMAXPROCS): the memcpy baseline copies on as many.
func ckCopyWorkers() int { return runtime.GOMAXPROCS(0) }

// ckPersistStreams is the number of chunk writes a persist keeps in flight (Config.Workers + 2):
// the disk baseline writes in as many parallel streams.
func ckPersistStreams() int { return runtime.GOMAXPROCS(0) + 2 }

// parallelCopy copies src into dst (same length) in workers contiguous parts at once.
func parallelCopy(dst, src []byte, workers int) {
	part := (len(src)/workers + 4095) &^ 4095
	var wg sync.WaitGroup
	for off := 0; off < len(src); off += part {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			copy(dst[lo:hi], src[lo:hi])
		}(off, min(off+part, len(src)))
	}
	wg.Wait()
}

// parallelWrite writes src to dir as streams files written at once, each in 4 MiB writes and
// fsynced, then fsyncs the directory: the best a plain program does with that many streams. The
// files are removed afterwards.
func parallelWrite(dir string, src []byte, streams int) error {
	part := (len(src)/streams + 4095) &^ 4095
	var wg sync.WaitGroup
	errs := make([]error, streams)
	for i := range streams {
		lo, hi := min(i*part, len(src)), min((i+1)*part, len(src))
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("plain-%d", i)))
			if err != nil {
				errs[i] = err
				return
			}
			for off := lo; off < hi && err == nil; off += 4 << 20 {
				_, err = f.Write(src[off:min(off+4<<20, hi)])
			}
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	if d, err := os.Open(dir); err == nil {
		if err := d.Sync(); err != nil {
			errs = append(errs, err)
		}
		d.Close()
	}
	for i := range streams {
		os.Remove(filepath.Join(dir, fmt.Sprintf("plain-%d", i)))
	}
	return errors.Join(errs...)
}

// ckMain is the suite at its main size: rows rows, rounds recorded rounds.
func ckMain(ctx context.Context, opt options, r *report, dim, batch, rows, rounds int) error {
	shmDir, release, err := shmScratch(shmRoot, "elasticps-bench-", os.TempDir())
	if err != nil {
		return err
	}
	defer release()
	diskRoot := opt.dir
	if diskRoot == "" {
		diskRoot = os.TempDir()
	}
	diskDir, err := os.MkdirTemp(diskRoot, "elasticps-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(diskDir)

	tcfg := embedding.Config{Name: "emb", Dim: dim, Seed: 1, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}}
	tab, err := embedding.New(tcfg)
	if err != nil {
		return err
	}
	fmt.Printf("checkpoint: filling and training a %d-row dim-%d Adagrad table...\n", rows, dim)
	ids := make([]uint64, rows)
	for i := range ids {
		ids[i] = ckID(uint64(i))
	}
	out := make([]float32, batch*dim)
	grads := make([]float32, batch*dim)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range grads {
		grads[i] = float32(rng.NormFloat64()) * 1e-2
	}
	for b := 0; b < rows; b += batch {
		part := ids[b:min(b+batch, rows)]
		if err := tab.Lookup(part, out[:len(part)*dim]); err != nil {
			return err
		}
		if err := tab.Apply(part, grads[:len(part)*dim], 1); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	raw := tab.RawSize(false)
	fmt.Printf("checkpoint: %d rows, %.2f GiB of records (%d B/row)\n", tab.Len(), float64(raw)/(1<<30), tab.RawRowSize())

	store, err := checkpoint.NewFSStorage(filepath.Join(diskDir, "store"))
	if err != nil {
		return err
	}
	ccfg := checkpoint.Config{Job: "bench", Node: "ps0", Tables: map[string]checkpoint.Table{"emb": tab},
		Storage: store, ShmDir: shmDir, FullEvery: 1000, Headroom: 0.25}
	ck, err := checkpoint.New(ccfg)
	if err != nil {
		return err
	}
	defer ck.Close()
	committer, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "bench", Storage: store, KeepLast: 2})
	if err != nil {
		return err
	}
	fmt.Printf("checkpoint: reserving and faulting in shared memory for two generations...\n")
	start := time.Now()
	if err := ck.Reserve(ctx, int64(raw)+int64(raw)/4); err != nil {
		return err
	}
	r.add("shm_reserve_s", time.Since(start).Seconds(), "one-off: fault in both generations (start-up, not per checkpoint)")

	// Baseline buffers: src holds the table's records, dst is written through once so both are faulted in.
	src := make([]byte, raw)
	if _, err := tab.CopyRaw(src, false, false); err != nil {
		return err
	}
	dst := make([]byte, raw)
	for i := 0; i < len(dst); i += os.Getpagesize() {
		dst[i] = 1
	}
	workers, streams := ckCopyWorkers(), ckPersistStreams()
	memcpy := func() time.Duration {
		t0 := time.Now()
		parallelCopy(dst, src, workers)
		return time.Since(t0)
	}
	plainWrite := func() (time.Duration, error) {
		t0 := time.Now()
		err := parallelWrite(diskDir, src, streams)
		return time.Since(t0), err
	}
	persistAndCommit := func(step uint64, t0 time.Time) (time.Duration, checkpoint.PersistResult, error) {
		ref, err := ck.WaitPersisted(ctx, step)
		d := time.Since(t0)
		if err != nil {
			return 0, checkpoint.PersistResult{}, err
		}
		var res checkpoint.PersistResult
		res.Manifest = ref
		if _, err := committer.Commit(ctx, step, []checkpoint.ManifestRef{ref}); err != nil {
			return 0, res, err
		}
		return d, res, ck.Flush(ctx)
	}

	step := uint64(0)

	// Each round: the memcpy right before a full snapshot, the snapshot's persist, the table's own
	// full CopyRaw (no checkpoint code), the plain parallel disk write of the same bytes; then 10% of
	// rows trained, the table's own incremental CopyRaw and an
	// incremental snapshot. Ratios are medians of the per-round ratios. The first two rounds are not
	// recorded: they write each generation's pages for the first time and create the table's change
	// tracker, one-off costs of a new process.
	var memT, copyFullT, fullT, copyDeltaT, deltaT, persistT, diskT []float64
	var snapR, incR, persistR []float64
	var deltaFrac float64
	var lastFull uint64
	const warmup = 2
	for round := range warmup + rounds {
		fmt.Printf("checkpoint: round %d/%d\n", round+1, warmup+rounds)
		record := round >= warmup
		var mem, full float64
		snap := func() error {
			step++
			info, err := ck.Snapshot(ctx, step, checkpoint.SnapshotFull())
			full = ckMillis(info.Blocked)
			return err
		}
		mem = ckMillis(memcpy()) // right before the snapshot, whose persist then runs in the background
		if err := snap(); err != nil {
			return err
		}
		t0 := time.Now()
		pd, _, err := persistAndCommit(step, t0)
		if err != nil {
			return err
		}
		lastFull = step
		t0 = time.Now()
		if _, err := tab.CopyRaw(dst, false, false); err != nil {
			return err
		}
		copyFull := ckMillis(time.Since(t0))
		dd, err := plainWrite()
		if err != nil {
			return err
		}
		if record {
			memT, copyFullT, fullT = append(memT, mem), append(copyFullT, copyFull), append(fullT, full)
			persistT, diskT = append(persistT, pd.Seconds()), append(diskT, dd.Seconds())
			snapR, persistR = append(snapR, full/mem), append(persistR, dd.Seconds()/pd.Seconds())
		}

		// Train 10% of the rows, then take an incremental snapshot.
		pick := rand.New(rand.NewPCG(uint64(round), 9))
		changed := rows / 10
		sel := make([]uint64, 0, batch)
		for i := 0; i < changed; i += len(sel) {
			sel = sel[:0]
			for len(sel) < min(batch, changed-i) {
				sel = append(sel, ids[pick.IntN(rows)])
			}
			slices.Sort(sel)
			sel = slices.Compact(sel)
			if err := tab.Apply(sel, grads[:len(sel)*dim], uint32(step)); err != nil {
				return err
			}
		}
		t0 = time.Now()
		if _, err := tab.CopyRaw(dst, true, false); err != nil { // changed rows; the change set is kept
			return err
		}
		copyDelta := ckMillis(time.Since(t0))
		step++
		dinfo, err := ck.Snapshot(ctx, step)
		if err != nil {
			return err
		}
		if dinfo.Full {
			return errors.New("checkpoint bench: expected an incremental snapshot")
		}
		if record {
			copyDeltaT, deltaT = append(copyDeltaT, copyDelta), append(deltaT, ckMillis(dinfo.Blocked))
			incR = append(incR, ckMillis(dinfo.Blocked)/full)
			deltaFrac = float64(dinfo.Bytes) / float64(raw)
		}
		if _, _, err := persistAndCommit(step, time.Now()); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	st := ck.Stats()
	mb := float64(raw) / 1e6
	r.add("table_gib", float64(raw)/(1<<30), fmt.Sprintf("%d rows x %d B", tab.Len(), tab.RawRowSize()))
	memNote := fmt.Sprintf("baseline: copy of the same bytes between two pre-faulted buffers on %d goroutines, as many as the snapshot and the restore copy with; median of every round before a snapshot or a restore", workers)
	r.add("memcpy_ms", ckMedian(memT), memNote)
	r.add("copyraw_full_ms", ckMedian(copyFullT), "the table's own CopyRaw of every row into a faulted buffer (no checkpoint code)")
	r.add("snapshot_block_ms", ckMedian(fullT), "full snapshot: time training waits (copy into pre-faulted shm)")
	r.addRatio("snapshot_vs_memcpy", withMedians(spreadOf(snapR), fullT, memT), "memcpy_ms measured right before each snapshot", "memcpy_ms", "snapshot_block_ms over the memcpy; target <= 1.3")
	r.add("incremental_fraction", deltaFrac, "bytes of the incremental snapshot / bytes of the full one")
	r.add("copyraw_delta_ms", ckMedian(copyDeltaT), "the table's own CopyRaw of the changed rows (no checkpoint code)")
	r.add("incremental10_block_ms", ckMedian(deltaT), "snapshot of the ~10% of rows changed since the previous one")
	r.addRatio("incremental10_vs_full", withMedians(spreadOf(incR), deltaT, fullT), "the full snapshot of the same round", "snapshot_block_ms", "target <= 0.3")
	r.add("persist_mb_per_s", mb/ckMedian(persistT), "seal + chunk + write + fsync + manifest, raw MB per second, background")
	r.add("disk_write_mb_per_s", mb/ckMedian(diskT), fmt.Sprintf("baseline: the same bytes written in %d parallel streams (files) + fsync each, same directory", streams))
	r.addRatio("persist_vs_disk", withMedians(spreadOf(persistR), []float64{mb / ckMedian(persistT)}, []float64{mb / ckMedian(diskT)}), fmt.Sprintf("the same bytes written in %d parallel streams right after the persist, as many as it writes", streams), "disk_write_mb_per_s", "target >= 0.7")
	r.add("compressed_ratio_s2_persisted", float64(st.PersistedStored)/float64(st.PersistedRaw),
		"bytes stored / raw over every persist (chunks S2 does not shrink by 1/8 are stored raw)")

	// Codec ratios on the table bytes: every 16th 8 MiB span (the whole table with zstd takes minutes here).
	s2r, zr, err := ckCodecRatios(src)
	if err != nil {
		return err
	}
	r.add("compressed_ratio_s2", s2r, "S2 compressed / raw table bytes (1/16 sample)")
	r.add("compressed_ratio_zstd", zr, "zstd (fastest) compressed / raw table bytes (1/16 sample)")

	// Restore from shared memory in a restarted process: reattach the region, then Load the newest
	// commit (the last full checkpoint and the 10% delta after it) into an empty table and check it.
	// That first load also faults in the new table's memory (cold). The timed loads then restore the
	// last full checkpoint into the same table emptied, its memory already faulted, like the memcpy
	// baseline; the table's own LoadRaw of the same bytes is measured alongside as the floor.
	fmt.Printf("checkpoint: restoring from shared memory...\n")
	if err := ck.Close(); err != nil {
		return err
	}
	tab2, err := embedding.New(tcfg)
	if err != nil {
		return err
	}
	ccfg.Tables = map[string]checkpoint.Table{"emb": tab2}
	start = time.Now()
	ck2, err := checkpoint.New(ccfg)
	if err != nil {
		return err
	}
	r.add("shm_reattach_ms", ckMillis(time.Since(start)), "a restarted process maps its region again (MAP_POPULATE)")
	load := func(step uint64) (float64, error) {
		t0 := time.Now()
		res, err := ck2.Load(ctx, step)
		if err != nil {
			return 0, err
		}
		if res.Sources["ps0"] != checkpoint.SourceShm {
			return 0, fmt.Errorf("checkpoint bench: restored from %v, want shm", res.Sources["ps0"])
		}
		return ckMillis(time.Since(t0)), nil
	}
	coldMs, err := load(step)
	if err != nil {
		return err
	}
	if err := ckSameRows(tab, tab2, ids, step); err != nil {
		return err
	}
	if err := ck2.Close(); err != nil {
		return err
	}
	// Each timed restore goes into a new table that reserved its room first (a restarting server
	// does that at start-up, as it reserves its shared memory), so no first-touch page faults are
	// timed, as none are in the memcpy baseline.
	reserved := func() (*embedding.Table, error) {
		tab2 = nil
		runtime.GC()
		t, err := embedding.New(tcfg)
		if err != nil {
			return nil, err
		}
		t.Reserve(tab.Len())
		return t, nil
	}
	var restoreT, memT2, floorT, restoreR, floorR []float64
	for range rounds {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if tab2, err = reserved(); err != nil {
			return err
		}
		ccfg.Tables = map[string]checkpoint.Table{"emb": tab2}
		if ck2, err = checkpoint.New(ccfg); err != nil {
			return err
		}
		mem := ckMillis(memcpy())
		d, err := load(lastFull)
		ck2.Close()
		if err != nil {
			return err
		}
		if tab2, err = reserved(); err != nil {
			return err
		}
		t0 := time.Now()
		if _, err := tab2.LoadRaw(src, nil); err != nil {
			return err
		}
		floor := ckMillis(time.Since(t0))
		memT2, restoreT, floorT = append(memT2, mem), append(restoreT, d), append(floorT, floor)
		restoreR, floorR = append(restoreR, d/mem), append(floorR, d/floor)
	}
	r.add("restore_shm_cold_ms", coldMs, "first restore (full + 10% delta): includes faulting in the new table's memory")
	r.add("restore_shm_ms", ckMedian(restoreT), "restore of the full checkpoint: verify checksums + LoadRaw into an empty table with reserved room")
	r.addRatio("restore_shm_vs_memcpy", withMedians(spreadOf(restoreR), restoreT, memT2), "memcpy_ms measured right before each restore", "memcpy_ms", "restore_shm_ms over the memcpy; target <= 1.3")
	r.add("loadraw_floor_ms", ckMedian(floorT), "the table's own LoadRaw of the same bytes, no checkpoint code: a floor for any restore")
	r.addRatio("restore_shm_vs_loadraw", withMedians(spreadOf(floorR), restoreT, floorT), "loadraw_floor_ms of the same round", "loadraw_floor_ms", "what the checkpoint adds on top of the table's load (checksums, plan)")
	r.add("memcpy_ms", ckMedian(append(memT, memT2...)), memNote)
	return nil
}

// ckSizeSweep reports snapshot blocking time and restore time against table bytes: a fresh table
// and checkpointer for each number of rows in sizes, and the main size's figures from the report.
func ckSizeSweep(ctx context.Context, opt options, r *report, dim int, sizes []int, mainRows int) error {
	t := sweepTable{About: "full snapshot blocking time and restore from shared memory against table size (medians of 3); memcpy: the parallel memcpy of the same bytes",
		Columns: []string{"rows", "table_mib", "snapshot_block_ms", "restore_shm_ms", "memcpy_ms", "snapshot_ms_per_gib", "restore_ms_per_gib"}}
	for _, rows := range sizes {
		fmt.Printf("checkpoint: size sweep, %d rows...\n", rows)
		p, err := ckSizePoint(ctx, opt, dim, rows)
		if err != nil {
			return err
		}
		t.Rows = append(t.Rows, p)
	}
	gib := r.get("table_gib")
	t.Rows = append(t.Rows, []float64{float64(mainRows), gib * 1024, r.get("snapshot_block_ms"), r.get("restore_shm_ms"), r.get("memcpy_ms"),
		r.get("snapshot_block_ms") / gib, r.get("restore_shm_ms") / gib})
	r.addTable("size_sweep", t)
	return nil
}

// ckSizePoint fills a table of rows rows, takes full snapshots into shared memory (persisting and
// committing each) and restores the last into reserved tables, three times each, and returns a row
// of the sweep table. The first snapshots of the two generations fault their pages in and are not
// counted.
func ckSizePoint(ctx context.Context, opt options, dim, rows int) ([]float64, error) {
	shmDir, release, err := shmScratch(shmRoot, "elasticps-bench-", os.TempDir())
	if err != nil {
		return nil, err
	}
	defer release()
	diskDir, err := os.MkdirTemp(opt.dir, "elasticps-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(diskDir)
	tcfg := embedding.Config{Name: "emb", Dim: dim, Seed: 1, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}}
	tab, err := embedding.New(tcfg)
	if err != nil {
		return nil, err
	}
	const batch = 4096
	ids := make([]uint64, batch)
	out := make([]float32, batch*dim)
	for b := 0; b < rows; b += batch {
		part := ids[:min(batch, rows-b)]
		for i := range part {
			part[i] = ckID(uint64(b + i))
		}
		if err := tab.Lookup(part, out[:len(part)*dim]); err != nil {
			return nil, err
		}
	}
	raw := tab.RawSize(false)
	store, err := checkpoint.NewFSStorage(filepath.Join(diskDir, "store"))
	if err != nil {
		return nil, err
	}
	ccfg := checkpoint.Config{Job: "bench", Node: "ps0", Tables: map[string]checkpoint.Table{"emb": tab},
		Storage: store, ShmDir: shmDir, FullEvery: 1000, Headroom: 0.25}
	ck, err := checkpoint.New(ccfg)
	if err != nil {
		return nil, err
	}
	defer func() { ck.Close() }()
	committer, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "bench", Storage: store, KeepLast: 2})
	if err != nil {
		return nil, err
	}
	src := make([]byte, raw)
	if _, err := tab.CopyRaw(src, false, false); err != nil {
		return nil, err
	}
	dst := make([]byte, raw)
	parallelCopy(dst, src, ckCopyWorkers())
	var snapT, restoreT, memT []float64
	step := uint64(0)
	for i := range 5 {
		t0 := time.Now()
		parallelCopy(dst, src, ckCopyWorkers())
		mem := ckMillis(time.Since(t0))
		step++
		info, err := ck.Snapshot(ctx, step, checkpoint.SnapshotFull())
		if err != nil {
			return nil, err
		}
		ref, err := ck.WaitPersisted(ctx, step)
		if err != nil {
			return nil, err
		}
		if _, err := committer.Commit(ctx, step, []checkpoint.ManifestRef{ref}); err != nil {
			return nil, err
		}
		if i >= 2 {
			snapT, memT = append(snapT, ckMillis(info.Blocked)), append(memT, mem)
		}
	}
	if err := ck.Flush(ctx); err != nil {
		return nil, err
	}
	if err := ck.Close(); err != nil {
		return nil, err
	}
	for range 3 {
		runtime.GC() // the previous round's table goes
		t2, err := embedding.New(tcfg)
		if err != nil {
			return nil, err
		}
		t2.Reserve(rows)
		ccfg.Tables = map[string]checkpoint.Table{"emb": t2}
		if ck, err = checkpoint.New(ccfg); err != nil {
			return nil, err
		}
		t0 := time.Now()
		parallelCopy(dst, src, ckCopyWorkers())
		memT = append(memT, ckMillis(time.Since(t0)))
		t0 = time.Now()
		res, err := ck.Load(ctx, step)
		if err != nil {
			return nil, err
		}
		restoreT = append(restoreT, ckMillis(time.Since(t0)))
		if res.Sources["ps0"] != checkpoint.SourceShm {
			return nil, fmt.Errorf("checkpoint bench: restored from %v, want shm", res.Sources["ps0"])
		}
		if t2.Len() != rows {
			return nil, fmt.Errorf("checkpoint bench: restored %d rows, saved %d", t2.Len(), rows)
		}
		if err := ck.Close(); err != nil {
			return nil, err
		}
	}
	gib := float64(raw) / (1 << 30)
	sn, rs := ckMedian(snapT), ckMedian(restoreT)
	return []float64{float64(rows), float64(raw) / (1 << 20), sn, rs, ckMedian(memT), sn / gib, rs / gib}, nil
}

// ckID spreads row ids over the id space (a splitmix64 step), as hashed feature ids are.
func ckID(i uint64) uint64 {
	x := i + 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func ckMillis(d time.Duration) float64 { return float64(d) / 1e6 }

// withMedians sets the medians of a ratio's subject and baseline figures.
func withMedians(s spread, subject, baseline []float64) spread {
	s.subj, s.base = ckMedian(subject), ckMedian(baseline)
	return s
}

func ckMedian(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// ckCodecRatios compresses every 16th 8 MiB span of b with S2 and with zstd (fastest level).
func ckCodecRatios(b []byte) (s2Ratio, zstdRatio float64, err error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return 0, 0, err
	}
	defer enc.Close()
	const span = 8 << 20
	var rawN, s2N, zN int
	var buf []byte
	for off := 0; off < len(b); off += 16 * span {
		part := b[off:min(off+span, len(b))]
		rawN += len(part)
		buf = s2.Encode(buf[:cap(buf)], part)
		s2N += len(buf)
		buf = enc.EncodeAll(part, buf[:0])
		zN += len(buf)
	}
	return float64(s2N) / float64(rawN), float64(zN) / float64(rawN), nil
}

// ckSameRows checks that the restored table holds the saved table's rows bit-exactly: every row count,
// and a sample of rows compared field by field.
func ckSameRows(a, b *embedding.Table, ids []uint64, step uint64) error {
	if a.Len() != b.Len() {
		return fmt.Errorf("checkpoint bench: restored %d rows, saved %d", b.Len(), a.Len())
	}
	rng := rand.New(rand.NewPCG(step, 3))
	for range 2000 {
		id := ids[rng.IntN(len(ids))]
		x, okx := a.Row(id)
		y, oky := b.Row(id)
		if !okx || !oky {
			return fmt.Errorf("checkpoint bench: row %d missing (saved %v, restored %v)", id, okx, oky)
		}
		if x.Freq != y.Freq || x.LastStep != y.LastStep || !slices.Equal(x.Weights, y.Weights) || !slices.Equal(x.State, y.State) {
			return fmt.Errorf("checkpoint bench: row %d differs after restore", id)
		}
	}
	return nil
}
