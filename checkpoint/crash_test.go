package checkpoint

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cloneStorage copies every committed object of st: what a crashed process leaves behind.
func cloneStorage(t *testing.T, st Storage) *MemStorage {
	ctx := context.Background()
	out := NewMemStorage()
	names, err := st.List(ctx, "")
	require.NoError(t, err)
	for _, n := range names {
		r, err := st.Open(ctx, n)
		require.NoError(t, err)
		b, err := io.ReadAll(r)
		require.NoError(t, err)
		r.Close()
		require.NoError(t, putObject(ctx, out, n, b))
	}
	return out
}

// cloneRegion copies the files of a node's region (not its lock) into a new shm directory: the
// shared memory a crashed process leaves behind.
func cloneRegion(t *testing.T, shmDir, node string) string {
	dst := t.TempDir()
	src := filepath.Join(shmDir, "job", node)
	to := filepath.Join(dst, "job", node)
	require.NoError(t, os.MkdirAll(to, 0o700))
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		if e.Name() == "lock" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(to, e.Name()), b, 0o600))
	}
	return dst
}

// crashJob is one node with steps committed up to a point and a fault-injecting storage.
type crashJob struct {
	cl   *cluster
	fs   *FaultStorage
	ck   *Checkpointer
	m    *Committer
	ts   []*fakeTable
	rng  *rand.Rand
	want map[uint64][]map[uint64]string
}

func newCrashJob(t *testing.T, committed uint64, hooks testHooks, keepLast int) *crashJob {
	fs := NewFaultStorage(NewMemStorage())
	cl := newCluster(t, fs, 64)
	tabs, ts := tables2()
	j := &crashJob{cl: cl, fs: fs, ts: ts, rng: rand.New(rand.NewPCG(5, 6)), want: map[uint64][]map[uint64]string{}}
	fill(j.rng, ts, 300, 3000)
	j.ck = cl.open(cl.cfg("ps0", tabs))
	j.ck.hooks = hooks
	m, err := NewCommitter(CommitterConfig{Job: "job", Storage: fs, KeepLast: keepLast, Logger: testLogger(t)})
	require.NoError(t, err)
	j.m = m
	for step := uint64(1); step <= committed; step++ {
		j.mutate(step)
		_, ref := snap(t, j.ck, step)
		_, err := j.m.Commit(context.Background(), step, []ManifestRef{ref})
		require.NoError(t, err)
	}
	return j
}

func (j *crashJob) mutate(step uint64) {
	mutate(j.rng, j.ts, step, 3000)
	j.want[step] = states(j.ts)
}

// restart restores the crash image (a copy of the region and of storage) in a new Checkpointer and
// checks it gets step want bit-exactly, from shared memory when fromShm.
func (j *crashJob) restart(t *testing.T, want uint64, fromShm bool) {
	t.Helper()
	dir := cloneRegion(t, j.cl.shmDir, "ps0")
	st := cloneStorage(t, j.fs)
	tabs, ts := tables2()
	cfg := j.cl.cfg("ps0", tabs)
	cfg.ShmDir, cfg.Storage = dir, st
	ck, err := New(cfg)
	require.NoError(t, err)
	defer ck.Close()
	r, err := ck.Restore(context.Background())
	require.NoError(t, err)
	assert.Equal(t, want, r.Step)
	src := SourceStorage
	if fromShm {
		src = SourceShm
	}
	assert.Equal(t, src, r.Sources["ps0"])
	assert.Equal(t, j.want[want], states(ts))

	// The same image restored from storage alone.
	tabs2, ts2 := tables2()
	cfg2 := j.cl.cfg("other", tabs2)
	cfg2.ShmDir, cfg2.Storage = t.TempDir(), st
	ck2, err := New(cfg2)
	require.NoError(t, err)
	defer ck2.Close()
	r, err = ck2.Restore(context.Background())
	require.NoError(t, err)
	assert.Equal(t, want, r.Step)
	assert.Equal(t, j.want[want], states(ts2))
}

// TestCrashAtEveryPhaseOfSnapshot takes a crash image at each phase of the snapshot, seal, persist and
// commit of step 3 (a delta appended to the generation holding steps 1-2) and of step 4 (a full
// snapshot into the other generation), then restores it.
func TestCrashAtEveryPhaseOfSnapshot(t *testing.T) {
	type phase struct {
		name string
		want func(step uint64) uint64 // the step a restore must return, given the step in progress
	}
	prev := func(s uint64) uint64 { return s - 1 }
	phases := []phase{{"mid-copy", prev}, {"before-seal", prev}, {"after-seal", prev}, {"mid-chunk-write", prev},
		{"before-manifest", prev}, {"before-commit", prev}, {"mid-commit-write", prev}, {"after-commit", func(s uint64) uint64 { return s }}}
	for _, step := range []uint64{3, 4} {
		for _, ph := range phases {
			t.Run(fmt.Sprintf("step%d/%s", step, ph.name), func(t *testing.T) {
				reached := make(chan struct{}, 1)
				hold := make(chan struct{})
				var hooks testHooks
				stopAt := func(want uint64) func(uint64) {
					return func(s uint64) {
						if s == want {
							reached <- struct{}{}
							<-hold
						}
					}
				}
				switch ph.name {
				case "before-seal":
					hooks.beforeSeal = stopAt(step)
				case "after-seal":
					hooks.afterSeal = stopAt(step)
				}
				j := newCrashJob(t, step-1, hooks, 100)
				released := false
				release := func() {
					if !released {
						released = true
						close(hold)
					}
				}
				defer release()
				switch ph.name {
				case "mid-copy":
					j.ts[0].copyHook = func() { reached <- struct{}{}; <-hold }
				case "mid-chunk-write":
					j.fs.Inject(Fault{Op: OpWrite, Match: "/t1-", Nth: 1, Hold: hold, Reached: reached})
				case "before-manifest":
					j.fs.Inject(Fault{Op: OpCreate, Match: "/manifest", Nth: 1, Hold: hold, Reached: reached})
				case "mid-commit-write":
					j.fs.Inject(Fault{Op: OpWrite, Match: "/commits/", Nth: 1, Hold: hold, Reached: reached})
				}
				j.mutate(step)
				snapDone := make(chan error, 1)
				go func() {
					_, err := j.ck.Snapshot(context.Background(), step)
					snapDone <- err
				}()
				commitDone := make(chan error, 1)
				switch ph.name {
				case "mid-copy", "before-seal", "after-seal", "mid-chunk-write", "before-manifest":
					<-reached
				case "before-commit", "mid-commit-write", "after-commit":
					require.NoError(t, <-snapDone)
					ref, err := j.ck.WaitPersisted(context.Background(), step)
					require.NoError(t, err)
					if ph.name != "before-commit" {
						go func() {
							_, err := j.m.Commit(context.Background(), step, []ManifestRef{ref})
							commitDone <- err
						}()
					}
					if ph.name == "mid-commit-write" {
						<-reached
					} else if ph.name == "after-commit" {
						require.NoError(t, <-commitDone)
					}
				}
				// The process "dies" here: restore its image in a new one. The committed chain is
				// sealed in the image's shared memory in every phase.
				j.restart(t, ph.want(step), true)
				release()
				switch ph.name {
				case "mid-copy", "before-seal", "after-seal", "mid-chunk-write", "before-manifest":
					require.NoError(t, <-snapDone)
				case "mid-commit-write":
					assert.ErrorIs(t, <-commitDone, ErrInjected)
				}
				require.NoError(t, j.ck.Flush(context.Background()))
			})
		}
	}
}

// TestCrashAtEveryStorageOperation fails each storage operation of the persist, commit and retention
// of step 3 (a delta) and of step 4 (a full checkpoint) in turn — cleanly, after taking effect, or as
// a short write — and checks that a restore then returns the newest commit bit-exactly, that a failed
// persist is reported, and that checkpointing goes on afterwards.
func TestCrashAtEveryStorageOperation(t *testing.T) {
	for _, step := range []uint64{3, 4} {
		// Count the operations of one persist and commit.
		j := newCrashJob(t, step-1, testHooks{}, 1)
		var before [opCount]int
		for op := OpCreate; op < opCount; op++ {
			before[op] = j.fs.Count(op)
		}
		j.mutate(step)
		_, ref := snap(t, j.ck, step)
		_, err := j.m.Commit(context.Background(), step, []ManifestRef{ref})
		require.NoError(t, err)
		type variant struct {
			op    Op
			n     int
			after bool
			short bool
		}
		var variants []variant
		for op := OpCreate; op < opCount; op++ {
			for n := 1; n <= j.fs.Count(op)-before[op]; n++ {
				variants = append(variants, variant{op: op, n: n})
				switch op {
				case OpRename, OpDelete:
					variants = append(variants, variant{op: op, n: n, after: true})
				case OpWrite:
					variants = append(variants, variant{op: op, n: n, short: true})
				}
			}
		}
		require.Greater(t, len(variants), 30)
		for _, v := range variants {
			t.Run(fmt.Sprintf("step%d/%v#%d/after=%v/short=%v", step, v.op, v.n, v.after, v.short), func(t *testing.T) {
				crashStorageOp(t, step, v.op, v.n, v.after, v.short)
			})
		}
	}
}

func crashStorageOp(t *testing.T, step uint64, op Op, n int, after, short bool) {
	j := newCrashJob(t, step-1, testHooks{}, 1)
	j.fs.Inject(Fault{Op: op, Nth: n, After: after, Short: short})
	j.mutate(step)
	_, err := j.ck.Snapshot(context.Background(), step)
	require.NoError(t, err)
	ref, perr := j.ck.WaitPersisted(context.Background(), step)
	committed := false
	if perr == nil {
		_, cerr := j.m.Commit(context.Background(), step, []ManifestRef{ref})
		committed = cerr == nil
	} else {
		var pe *PersistError
		require.ErrorAs(t, perr, &pe)
		assert.Equal(t, uint64(1), j.ck.Stats().PersistErrors)
	}
	j.fs.Clear()
	tabs, ts := tables2()
	cfg := j.cl.cfg("restorer", tabs)
	cfg.ShmDir = t.TempDir()
	ck, err := New(cfg)
	require.NoError(t, err)
	defer ck.Close()
	r, err := ck.Restore(context.Background())
	require.NoError(t, err)
	want := step - 1
	// An error may hide an operation that took effect (a rename before a failed directory sync):
	// the commit is then visible although Commit failed, and it must be whole.
	if committed || (after && r.Step == step) {
		want = step
	}
	assert.Equal(t, want, r.Step)
	assert.Equal(t, j.want[want], states(ts))
	// Training and checkpointing go on after the failure.
	j.mutate(step + 1)
	_, ref2 := snap(t, j.ck, step+1)
	_, err = j.m.Commit(context.Background(), step+1, []ManifestRef{ref2})
	require.NoError(t, err)
	got, _, err := j.cl.restoreFresh(step + 1)
	require.NoError(t, err)
	assert.Equal(t, j.want[step+1], got)
}

// TestPersistFailureKeepsTraining fills the disk: the persist fails with ENOSPC and is counted, the
// earlier commit stays restorable, snapshots go on, and once space is back the next persist carries
// the rows of the failed one as well.
func TestPersistFailureKeepsTraining(t *testing.T) {
	j := newCrashJob(t, 1, testHooks{}, 100)
	j.fs.SetCapacity(1) // everything already written stays; nothing new fits
	var results []PersistResult
	j.mutate(2)
	_, err := j.ck.Snapshot(context.Background(), 2)
	require.NoError(t, err)
	_, err = j.ck.WaitPersisted(context.Background(), 2)
	require.ErrorIs(t, err, syscall.ENOSPC)
	st := j.ck.Stats()
	assert.Equal(t, uint64(1), st.PersistErrors)
	assert.ErrorIs(t, st.LastPersistError, syscall.ENOSPC)
	got, r, err := j.cl.restoreFresh(0)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), r.Step)
	assert.Equal(t, j.want[1], got)
	names, err := j.fs.List(context.Background(), "job/data/"+stepName(2))
	require.NoError(t, err)
	assert.Empty(t, names, "a failed persist removes what it wrote")

	j.fs.Clear()
	require.NoError(t, j.ck.Flush(context.Background()))
	j.ck.cfg.OnPersist = func(r PersistResult) { results = append(results, r) }
	j.mutate(3)
	info, ref := snap(t, j.ck, 3)
	assert.False(t, info.Full)
	require.NoError(t, j.ck.Flush(context.Background()))
	require.Len(t, results, 1)
	assert.Equal(t, 2, results[0].Segments, "step 3 carries the rows of failed step 2")
	_, err = j.m.Commit(context.Background(), 3, []ManifestRef{ref})
	require.NoError(t, err)
	got, _, err = j.cl.restoreFresh(3)
	require.NoError(t, err)
	assert.Equal(t, j.want[3], got)
}

// TestMergedPersistInParts persists two snapshots in one (the first persist failed) where one slot
// holds more rows than a chunk, so the slot is written in parts and an id appears in both snapshots:
// the later version must win after restore.
func TestMergedPersistInParts(t *testing.T) {
	ctx := context.Background()
	fs := NewFaultStorage(NewMemStorage())
	cl := newCluster(t, fs, 2)
	tabs, ts := tables2()
	rng := rand.New(rand.NewPCG(21, 22))
	fill(rng, ts, 1500, 1<<40)
	ck := cl.open(cl.cfg("ps0", tabs))
	m := cl.committer()
	_, ref := snap(t, ck, 1)
	_, err := m.Commit(ctx, 1, []ManifestRef{ref})
	require.NoError(t, err)
	var ids []uint64
	for id := range ts[0].state() {
		ids = append(ids, id)
	}
	fs.Inject(Fault{Op: OpCreate, Match: "/00000000000000000002/", Nth: 1})
	for _, id := range ids[:600] {
		ts[0].put(id, 2)
	}
	_, err = ck.Snapshot(ctx, 2)
	require.NoError(t, err)
	_, err = ck.WaitPersisted(ctx, 2)
	require.ErrorIs(t, err, ErrInjected)
	for _, id := range ids[300:900] {
		ts[0].put(id, 3)
	}
	for _, id := range ids[:100] {
		ts[0].del(id)
	}
	var res []PersistResult
	require.NoError(t, ck.Flush(ctx))
	ck.cfg.OnPersist = func(r PersistResult) { res = append(res, r) }
	_, ref = snap(t, ck, 3)
	require.NoError(t, ck.Flush(ctx))
	require.Len(t, res, 1)
	assert.Equal(t, 2, res[0].Segments)
	man, err := getObject(ctx, fs, ref.Name, nil, ref.Size, 0)
	require.NoError(t, err)
	parsed, err := decodeManifest(man)
	require.NoError(t, err)
	parts := 0
	for _, ch := range parsed.Tables[0].Chunks {
		parts = max(parts, int(ch.Part)+1)
	}
	assert.Greater(t, parts, 3, "a slot of ~%d rows is written in parts", len(ids)/2)
	_, err = m.Commit(ctx, 3, []ManifestRef{ref})
	require.NoError(t, err)
	got, _, err := cl.restoreFresh(3)
	require.NoError(t, err)
	assert.Equal(t, states(ts), got)
}
