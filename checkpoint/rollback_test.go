package checkpoint

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heldStorage holds the first operation on a name that match accepts — its Create, or with atCommit
// its Writer's Commit — until release is closed, whatever the context says: a storage slow to notice
// that a persist was cancelled.
type heldStorage struct {
	Storage
	match    func(name string) bool
	atCommit bool
	once     sync.Once
	reached  chan struct{}
	release  chan struct{}
}

func newHeldStorage(inner Storage, match func(string) bool, atCommit bool) *heldStorage {
	return &heldStorage{Storage: inner, match: match, atCommit: atCommit, reached: make(chan struct{}),
		release: make(chan struct{})}
}

func (h *heldStorage) hold(name string) {
	if !h.match(name) {
		return
	}
	first := false
	h.once.Do(func() { first = true })
	if first {
		close(h.reached)
		<-h.release
	}
}

func (h *heldStorage) Create(ctx context.Context, name string) (Writer, error) {
	if !h.atCommit {
		h.hold(name)
	}
	w, err := h.Storage.Create(ctx, name)
	if err != nil || !h.atCommit {
		return w, err
	}
	return &heldWriter{Writer: w, h: h, name: name}, nil
}

type heldWriter struct {
	Writer
	h    *heldStorage
	name string
}

func (w *heldWriter) Commit() error {
	w.h.hold(w.name)
	return w.Writer.Commit()
}

// emptyTables removes every row, as a node does before a restore.
func emptyTables(ts []*fakeTable) {
	for _, tb := range ts {
		for id := range tb.state() {
			tb.del(id)
		}
	}
}

// persistDirs returns the persist directories (one per persist attempt) of node at step in st.
func persistDirs(t *testing.T, st Storage, step uint64, node string) []string {
	t.Helper()
	names, err := st.List(context.Background(), "job/data/"+stepName(step)+"/"+node+"/")
	require.NoError(t, err)
	var dirs []string
	for _, n := range names {
		if d := objectDir(n); len(dirs) == 0 || dirs[len(dirs)-1] != d {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// TestStepTakenAgainAfterLoadGetsItsOwnManifest is a regression test. Persist results were kept by
// step alone: a Load let step 2 be snapshotted again while the persist of the first, abandoned step-2
// snapshot was still in flight, and when that persist finished it handed its manifest to the waiter
// of the new snapshot. WaitPersisted(2) then returned the abandoned snapshot's manifest (a delta of
// the rolled-back future), and the coordinator committed tables that were not the ones snapshotted
// as step 2 after the Load, next to a dispatcher blob that matched the new ones (invariant 3).
//
// The abandoned persist is held in storage across the Load and the new snapshot: once at its first
// chunk (released, it fails on the cancelled context), once at the very end, in the Commit of its
// manifest (released, it completes, and what it wrote must be removed since nobody may commit it).
func TestStepTakenAgainAfterLoadGetsItsOwnManifest(t *testing.T) {
	step2 := "/data/" + stepName(2) + "/ps0/"
	for _, tc := range []struct {
		name     string
		match    func(string) bool
		atCommit bool
	}{
		{"held-at-first-chunk", func(n string) bool { return strings.Contains(n, step2) }, false},
		{"held-at-manifest-commit", func(n string) bool {
			return strings.Contains(n, step2) && strings.HasSuffix(n, "/manifest")
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			inner := NewMemStorage()
			hs := newHeldStorage(inner, tc.match, tc.atCommit)
			cl := newCluster(t, hs, 64)
			tabs, ts := tables2()
			rng := rand.New(rand.NewPCG(1, 2))
			fill(rng, ts, 200, 2000)
			cfg := cl.cfg("ps0", tabs)
			var mu sync.Mutex
			var reports []PersistResult
			cfg.OnPersist = func(r PersistResult) {
				mu.Lock()
				reports = append(reports, r)
				mu.Unlock()
			}
			ck := cl.open(cfg)
			m := cl.committer()

			_, ref1 := snap(t, ck, 1)
			_, err := m.Commit(ctx, 1, []ManifestRef{ref1})
			require.NoError(t, err)
			want1 := states(ts)

			// Step 2 of a future that will be rolled back: a delta, whose persist gets stuck.
			mutate(rng, ts, 2, 2000)
			info, err := ck.Snapshot(ctx, 2)
			require.NoError(t, err)
			require.False(t, info.Full)
			<-hs.reached
			// A coordinator already waiting for it learns that it was abandoned.
			oldWait := make(chan error, 1)
			go func() {
				_, err := ck.WaitPersisted(ctx, 2)
				oldWait <- err
			}()

			// Roll back to step 1 and take step 2 again, differently.
			emptyTables(ts)
			r, err := ck.Load(ctx, 1)
			require.NoError(t, err)
			assert.Equal(t, SourceShm, r.Sources["ps0"])
			assert.Equal(t, want1, states(ts))
			require.ErrorIs(t, <-oldWait, ErrAbandoned)
			mutate(rng, ts, 20, 2000)
			want2 := states(ts)
			info, err = ck.Snapshot(ctx, 2)
			require.NoError(t, err)
			assert.True(t, info.Full, "the first snapshot after a Load is full")
			close(hs.release)

			ref2, err := ck.WaitPersisted(ctx, 2)
			require.NoError(t, err)
			b, err := getObject(ctx, inner, ref2.Name, nil, ref2.Size, 0)
			require.NoError(t, err)
			man, err := decodeManifest(b)
			require.NoError(t, err)
			assert.True(t, man.Full, "WaitPersisted(2) returns the manifest of the snapshot taken after the Load")
			_, err = m.Commit(ctx, 2, []ManifestRef{ref2}, Blob{Name: "dispatcher", Data: []byte("after the load")})
			require.NoError(t, err)
			got, _, err := cl.restoreFresh(2)
			require.NoError(t, err)
			assert.Equal(t, want2, got, "commit 2 restores the snapshot taken as step 2 after the Load")

			// The abandoned persist left nothing behind and was never reported.
			require.NoError(t, ck.Flush(ctx))
			assert.Equal(t, []string{strings.TrimSuffix(ref2.Name, "/manifest")}, persistDirs(t, inner, 2, "ps0"))
			st := ck.Stats()
			assert.Equal(t, uint64(1), st.Abandoned)
			assert.Equal(t, uint64(2), st.Persists)
			assert.Zero(t, st.PersistErrors)
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, reports, 2)
			assert.Equal(t, ref1, reports[0].Manifest)
			assert.Equal(t, ref2, reports[1].Manifest)
			assert.True(t, reports[1].Full)
		})
	}
}

// TestLoadForgetsResultsOfLaterSteps: results of snapshots after the step loaded belong to the
// rolled-back future. A late WaitPersisted for such a step must not hand out its manifest (a
// coordinator asking before the node has taken the step again would commit the old future);
// results up to the step loaded stay.
func TestLoadForgetsResultsOfLaterSteps(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t, NewMemStorage(), 64)
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(3, 4))
	fill(rng, ts, 200, 2000)
	ck := cl.open(cl.cfg("ps0", tabs))
	m := cl.committer()
	_, ref1 := snap(t, ck, 1)
	_, err := m.Commit(ctx, 1, []ManifestRef{ref1})
	require.NoError(t, err)
	mutate(rng, ts, 2, 2000)
	snap(t, ck, 2)
	mutate(rng, ts, 3, 2000)
	snap(t, ck, 3)

	emptyTables(ts)
	_, err = ck.Load(ctx, 1)
	require.NoError(t, err)
	got, err := ck.WaitPersisted(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, ref1, got)
	for _, step := range []uint64{2, 3} {
		_, err := ck.WaitPersisted(ctx, step)
		require.ErrorIs(t, err, ErrAbandoned, "step %d", step)
		var pe *PersistError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, step, pe.Step)
	}
	assert.Zero(t, ck.Stats().Abandoned, "those persists had finished: nothing was cut short")

	_, err = ck.Snapshot(ctx, 1)
	require.ErrorIs(t, err, ErrStepOrder)
	mutate(rng, ts, 30, 2000)
	_, ref3 := snap(t, ck, 3)
	_, err = m.Commit(ctx, 3, []ManifestRef{ref3})
	require.NoError(t, err)
	restored, _, err := cl.restoreFresh(3)
	require.NoError(t, err)
	assert.Equal(t, states(ts), restored)
	_, err = ck.WaitPersisted(ctx, 2)
	require.ErrorIs(t, err, ErrAbandoned, "step 2 was not taken again")
}

// valveStorage holds every Create of a node's persist while shut, until it is opened or the
// persist's context is cancelled.
type valveStorage struct {
	Storage
	mu   sync.Mutex
	open chan struct{} // closed while the valve is open
}

func newValveStorage(inner Storage) *valveStorage {
	v := &valveStorage{Storage: inner, open: make(chan struct{})}
	close(v.open)
	return v
}

func (v *valveStorage) setOpen(open bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-v.open:
		if !open {
			v.open = make(chan struct{})
		}
	default:
		if open {
			close(v.open)
		}
	}
}

func (v *valveStorage) Create(ctx context.Context, name string) (Writer, error) {
	if strings.Contains(name, "/data/") && !strings.Contains(name, "/"+coordinatorNode+"/") {
		v.mu.Lock()
		open := v.open
		v.mu.Unlock()
		select {
		case <-open:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return v.Storage.Create(ctx, name)
}

// report is one OnPersist call: the lineage (count of Loads returned) it was delivered in and the
// id of the newest shared-memory segment its manifest holds.
type report struct {
	step    uint64
	lineage int64
	segID   uint64
	err     error
}

// TestInterleavedSnapshotsPersistsAndLoads runs a seeded random mix of snapshots, commits and loads
// (rollbacks to any kept commit) while persists are held in storage for a while, so that snapshots
// pile up in the pipeline and loads overtake them. It checks every commit and every load against a
// model of the tables, that a rolled-back future's results are never handed out, and that OnPersist
// never reports a snapshot of an earlier lineage once a Load has returned.
func TestInterleavedSnapshotsPersistsAndLoads(t *testing.T) {
	ctx := context.Background()
	inner := NewMemStorage()
	valve := newValveStorage(inner)
	cl := newCluster(t, valve, 32)
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(11, 12))
	fill(rng, ts, 150, 1500)

	var lineage atomic.Int64
	var mu sync.Mutex
	var reports []report
	cfg := cl.cfg("ps0", tabs)
	cfg.OnPersist = func(r PersistResult) {
		rep := report{step: r.Step, lineage: lineage.Load(), err: r.Err}
		if r.Err == nil {
			b, err := getObject(ctx, inner, r.Manifest.Name, nil, r.Manifest.Size, 0)
			if err == nil {
				var man *manifest
				if man, err = decodeManifest(b); err == nil {
					rep.segID = man.Segments[len(man.Segments)-1]
				}
			}
			rep.err = err
		}
		mu.Lock()
		reports = append(reports, rep)
		mu.Unlock()
	}
	ck := cl.open(cfg)
	m := cl.committer()
	segLineage := map[uint64]int64{} // shared-memory segment id -> lineage it was taken in

	var (
		step       uint64                             // newest step of the current lineage
		lastCommit uint64                             // newest step committed in the current lineage
		snaps      = map[uint64][]map[uint64]string{} // current lineage: step -> tables
		committed  = map[uint64][]map[uint64]string{} // commits that exist: step -> tables
		loads      int
		commits    int
		busy       int
		shut       bool // the valve holds persists
		held       int  // snapshots taken since the valve was shut: their persists cannot finish
		overtaken  int  // snapshots a Load overtook while they were held
	)
	setValve := func(open bool) {
		valve.setOpen(open)
		if open {
			held = 0
		}
		shut = !open
	}
	snapshot := func(op int) {
		mutate(rng, ts, uint64(op), 1500)
		info, err := ck.Snapshot(ctx, step+1)
		if errors.Is(err, ErrBusy) {
			busy++
			return
		}
		require.NoError(t, err, "op %d", op)
		step++
		snaps[step] = states(ts)
		if shut {
			held++
		}
		ck.mu.Lock()
		g := ck.reg.gens[info.Generation]
		segLineage[g.segs[len(g.segs)-1].ID] = lineage.Load()
		ck.mu.Unlock()
	}
	for op := 0; op < 120; op++ {
		switch k := rng.IntN(10); {
		case k < 5:
			snapshot(op)
		case k < 6: // hold persists in storage, or let them go
			setValve(rng.IntN(2) == 0)
		case k < 9: // commit a step of this lineage newer than its last commit
			var cands []uint64
			for s := range snaps {
				if s > lastCommit {
					cands = append(cands, s)
				}
			}
			if len(cands) == 0 {
				continue
			}
			slices.Sort(cands) // map order is random; the pick must depend on the seed alone
			s := cands[rng.IntN(len(cands))]
			setValve(true)
			ref, err := ck.WaitPersisted(ctx, s)
			require.NoError(t, err, "op %d: step %d", op, s)
			_, err = m.Commit(ctx, s, []ManifestRef{ref}, Blob{Name: "dispatcher", Data: []byte{byte(s)}})
			require.NoError(t, err, "op %d: step %d", op, s)
			got, _, err := cl.restoreFresh(s)
			require.NoError(t, err, "op %d: step %d", op, s)
			require.Equal(t, snaps[s], got, "op %d: commit of step %d", op, s)
			committed[s], lastCommit = snaps[s], s
			commits++
		default: // roll back to a kept commit, with whatever is in the pipeline
			var cands []uint64
			for s := range committed {
				cands = append(cands, s)
			}
			if len(cands) == 0 {
				continue
			}
			slices.Sort(cands)
			r := cands[rng.IntN(len(cands))]
			if rng.IntN(2) == 0 { // a snapshot is held in storage when the load comes
				setValve(false)
				snapshot(op)
			}
			emptyTables(ts)
			res, err := ck.Load(ctx, r)
			require.NoError(t, err, "op %d: load %d", op, r)
			lineage.Add(1)
			loads++
			overtaken += held
			held = 0
			require.Equal(t, committed[r], states(ts), "op %d: load %d from %v", op, r, res.Sources)
			for s := r + 1; s <= step; s++ {
				if _, ok := snaps[s]; ok {
					_, err := ck.WaitPersisted(ctx, s)
					require.ErrorIs(t, err, ErrAbandoned, "op %d: step %d after a load of %d", op, s, r)
				}
			}
			require.NoError(t, m.DropAfter(ctx, r))
			for s := range committed {
				if s > r {
					delete(committed, s)
				}
			}
			step, lastCommit = r, r
			snaps = map[uint64][]map[uint64]string{}
		}
	}
	setValve(true)
	require.NoError(t, ck.Flush(ctx))
	require.Positive(t, loads, "the mix rolled back at least once")
	abandoned := ck.Stats().Abandoned
	require.GreaterOrEqual(t, abandoned, uint64(overtaken), "every snapshot held in storage when a Load came is abandoned")
	t.Logf("%d commits, %d loads, %d persists abandoned (%d of them held in storage), %d snapshots refused as busy",
		commits, loads, abandoned, overtaken, busy)

	mu.Lock()
	defer mu.Unlock()
	for _, rep := range reports {
		require.NoError(t, rep.err, "step %d", rep.step)
		assert.Equal(t, rep.lineage, segLineage[rep.segID],
			"step %d reported in lineage %d is a snapshot of lineage %d", rep.step, rep.lineage, segLineage[rep.segID])
	}

	// The current lineage goes on and commits.
	mutate(rng, ts, 1000, 1500)
	_, ref := snap(t, ck, step+1)
	_, err := m.Commit(ctx, step+1, []ManifestRef{ref})
	require.NoError(t, err)
	got, _, err := cl.restoreFresh(0)
	require.NoError(t, err)
	assert.Equal(t, states(ts), got)
}

// TestCloseReportsPendingPersistsAndFlushReturns: Close cancels a persist held in storage and
// reports it and the snapshots queued behind it as closed; it removes what the persist wrote, joins
// every goroutine, and Flush afterwards returns at once.
func TestCloseReportsPendingPersistsAndFlushReturns(t *testing.T) {
	ctx := context.Background()
	inner := NewMemStorage()
	valve := newValveStorage(inner)
	cl := newCluster(t, valve, 16)
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(7, 8))
	fill(rng, ts, 100, 1000)
	ck, err := New(cl.cfg("ps0", tabs))
	require.NoError(t, err)
	_, ref1 := snap(t, ck, 1)
	valve.setOpen(false)
	for step := uint64(2); step <= 3; step++ {
		mutate(rng, ts, step, 1000)
		_, err := ck.Snapshot(ctx, step)
		require.NoError(t, err)
	}
	require.NoError(t, ck.Close())
	for step := uint64(2); step <= 3; step++ {
		_, err := ck.WaitPersisted(ctx, step)
		require.ErrorIs(t, err, ErrClosed, "step %d", step)
	}
	got, err := ck.WaitPersisted(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, ref1, got)
	fctx, cancel := context.WithTimeout(ctx, time.Minute) // a hang fails instead of stalling the run
	defer cancel()
	require.ErrorIs(t, ck.Flush(fctx), ErrClosed)
	assertJoined(t)
	for step := uint64(2); step <= 3; step++ {
		assert.Empty(t, persistDirs(t, inner, step, "ps0"), "step %d", step)
	}
}
