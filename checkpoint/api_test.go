package checkpoint

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSlotOfMatchesTheProjectDefinition(t *testing.T) {
	for _, id := range []uint64{0, 1, 2, 1 << 40, ^uint64(0), 123456789} {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], id)
		for _, s := range []int{1, 7, 4096, 65536} {
			assert.Equal(t, int(xxhash.Sum64(b[:])%uint64(s)), slotOf(id, s))
		}
	}
	// Pinned values: a change here moves rows between slots in every existing checkpoint.
	assert.Equal(t, []int{slotGolden0, slotGolden1, slotGolden2}, []int{slotOf(0, 4096), slotOf(1, 4096), slotOf(2, 4096)})
	assert.Equal(t, 0, slotOf(5, 0))
}

// Slots of ids 0, 1, 2 with S = 4096.
const (
	slotGolden0 = 3003
	slotGolden1 = 2453
	slotGolden2 = 3504
)

func TestConfigValidateReportsEveryProblem(t *testing.T) {
	err := Config{Job: "bad job", Node: "_x", Slots: -1, FullEvery: -2, ChunkBytes: 10, Workers: -1, Codec: 9,
		Tables: map[string]Table{"ok": newFakeTable(8), "b/d": newFakeTable(16)}}.Validate()
	require.Error(t, err)
	for _, want := range []string{"Job", "Node", "raw row size 8", `table name "b/d"`, "Storage", "Slots", "Codec",
		"FullEvery", "ChunkBytes", "Workers"} {
		assert.Contains(t, err.Error(), want)
	}
	ok := Config{Job: "j", Node: "n", Storage: NewMemStorage()}
	require.NoError(t, ok.Validate())
	d := ok.withDefaults()
	assert.Equal(t, defaultSlots, d.Slots)
	assert.Equal(t, DefaultShmDir, d.ShmDir)
	assert.Equal(t, DefaultFullEvery, d.FullEvery)
	err = CommitterConfig{Job: "", KeepEvery: -1, Codec: 7}.Validate()
	require.Error(t, err)
	for _, want := range []string{"Job", "Storage", "KeepEvery", "Codec"} {
		assert.Contains(t, err.Error(), want)
	}
	_, err = New(Config{})
	require.Error(t, err)
}

func TestSnapshotErrorsAndLifecycle(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t, NewMemStorage(), 16)
	tabs, ts := tables2()
	fill(rand.New(rand.NewPCG(1, 1)), ts, 50, 500)
	ck, err := New(cl.cfg("ps0", tabs))
	require.NoError(t, err)

	_, err = New(cl.cfg("ps0", tabs))
	require.ErrorIs(t, err, ErrRegionLocked)
	_, err = ck.Snapshot(ctx, 1, SnapshotSlots([]int{16}))
	require.Error(t, err)
	_, err = ck.Snapshot(ctx, 1, SnapshotBlob("x", nil), SnapshotBlob("x", nil))
	require.Error(t, err)
	_, err = ck.Snapshot(ctx, 1, SnapshotBlob("no/slash", nil))
	require.Error(t, err)
	_, err = ck.WaitPersisted(ctx, 1)
	require.ErrorIs(t, err, ErrUnknownStep)

	snap(t, ck, 5)
	_, err = ck.Snapshot(ctx, 5)
	require.ErrorIs(t, err, ErrStepOrder)
	info, _ := snap(t, ck, 6, SnapshotFull())
	assert.True(t, info.Full)
	info, _ = snap(t, ck, 7, SnapshotSlots([]int{1, 2}))
	assert.True(t, info.Full, "a new slot set starts a new base")
	info, _ = snap(t, ck, 8, SnapshotSlots([]int{1, 2}))
	assert.False(t, info.Full)

	// A failing copy fails the snapshot; the next one is full.
	ts[1].loadErr = nil
	bad := &failingTable{fakeTable: ts[1]}
	ck.tables[1].t = bad
	_, err = ck.Snapshot(ctx, 9)
	require.ErrorIs(t, err, errCopy)
	ck.tables[1].t = ts[1]
	info, _ = snap(t, ck, 10)
	assert.True(t, info.Full)
	st := ck.Stats()
	assert.Equal(t, uint64(1), st.SnapshotErrors)
	assert.Equal(t, uint64(5), st.Snapshots)
	assert.Equal(t, uint64(5), st.Persists)
	assert.Positive(t, st.ShmBytes)

	require.NoError(t, ck.Close())
	require.NoError(t, ck.Close())
	_, err = ck.Snapshot(ctx, 11)
	require.ErrorIs(t, err, ErrClosed)
	_, err = ck.Restore(ctx)
	require.ErrorIs(t, err, ErrClosed)
	assertJoined(t)
}

// assertJoined checks that no goroutine runs code of this package once Close has returned. A
// goroutine that Close joined may still show, on its way out: its deferred WaitGroup.Done has
// run and its top frame is its function's closing brace, or the runtime's exit. Those are left
// out; any other is a goroutine Close did not wait for.
func assertJoined(t *testing.T) {
	t.Helper()
	var left []string
	for _, g := range ourGoroutines() {
		if !leaving(g) {
			left = append(left, g)
		}
	}
	assert.Empty(t, left, "Close joins every goroutine")
}

// leaving reports whether goroutine stack g is of a goroutine that has finished its function:
// its top frame (past the runtime's preemption frames, when it was stopped there) is its deferred
// WaitGroup.Done, or is at a line of source that is only a closing brace (with the parentheses of a function literal's call), is the wrapper the compiler makes for a go statement
// past its start (the wrapper runs on once the function it calls has returned), or is the
// runtime's exit.
func leaving(g string) bool {
	lines := strings.Split(g, "\n")[1:] // past "goroutine N [state]:"
	for len(lines) >= 2 && strings.HasPrefix(lines[0], "runtime.asyncPreempt") {
		lines = lines[2:] // a function line and its location line
	}
	// A goroutine stopped inside its deferred WaitGroup.Done (the counter Close waited for has
	// reached zero, so its decrement is done) is leaving as well.
	for len(lines) >= 2 && (strings.HasPrefix(lines[0], "sync/atomic.") || strings.HasPrefix(lines[0], "sync.(*WaitGroup).Add(")) {
		lines = lines[2:]
	}
	if len(lines) < 2 {
		return false
	}
	fn := lines[0]
	if strings.HasPrefix(fn, "sync.(*WaitGroup).Done(") {
		return true
	}
	loc := strings.TrimSpace(lines[1]) // "/path/file.go:28 +0x21d"
	off := ""
	if i := strings.LastIndex(loc, " +0x"); i >= 0 {
		loc, off = loc[:i], loc[i+len(" +0x"):]
	}
	if strings.HasPrefix(fn, "runtime.goexit1(") {
		return true
	}
	if goWrapper.MatchString(fn) {
		// Past its start (a goroutine not yet run shows the wrapper at offset 0, or none).
		return off != "" && strings.Trim(off, "0") != ""
	}
	i := strings.LastIndex(loc, ":")
	if i < 0 {
		return false
	}
	n, err := strconv.Atoi(loc[i+1:])
	if err != nil {
		return false
	}
	src, err := os.ReadFile(loc[:i])
	if err != nil {
		return false
	}
	text := strings.Split(string(src), "\n")
	if n < 1 || n > len(text) {
		return false
	}
	// "}", or the end of a function literal a go statement runs ("}()") or a call takes ("})").
	line := strings.TrimSpace(text[n-1])
	return strings.HasPrefix(line, "}") && strings.Trim(line, "}()") == ""
}

// goWrapper matches the frame of the wrapper a go statement runs its call in (New.gowrap1).
var goWrapper = regexp.MustCompile(`\.gowrap\d+\(`)

// ourGoroutines returns the stacks of goroutines, other than the caller, running code of this
// package. (A goroutine count would also see helpers such as errgroup's, which may still be on their
// way out after Wait returned, having finished our work.)
func ourGoroutines() []string {
	buf := make([]byte, 1<<20)
	stacks := strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
	var out []string
	for _, s := range stacks[1:] { // stacks[0] is the caller
		if strings.Contains(s, "elasticps/checkpoint.") {
			out = append(out, s)
		}
	}
	return out
}

var errCopy = errors.New("copy failed")

type failingTable struct{ *fakeTable }

func (f *failingTable) CopyRaw([]byte, bool, bool) (int, error) { return 0, errCopy }

func TestSnapshotBusyWhileGenerationIsPersisted(t *testing.T) {
	ctx := context.Background()
	fs := NewFaultStorage(NewMemStorage())
	cl := newCluster(t, fs, 16)
	tabs, ts := tables2()
	fill(rand.New(rand.NewPCG(1, 1)), ts, 50, 500)
	cfg := cl.cfg("ps0", tabs)
	cfg.FullEvery = 1
	ck := cl.open(cfg)
	hold, reached := make(chan struct{}), make(chan struct{}, 1)
	fs.Inject(Fault{Op: OpCreate, Match: "/00000000000000000001/", Nth: 1, Hold: hold, Reached: reached})
	_, err := ck.Snapshot(ctx, 1) // generation 0, its persist held
	require.NoError(t, err)
	<-reached
	_, err = ck.Snapshot(ctx, 2) // generation 1
	require.NoError(t, err)
	_, err = ck.Snapshot(ctx, 3) // generation 0 again: still being persisted
	require.ErrorIs(t, err, ErrBusy)
	close(hold)
	_, err = ck.WaitPersisted(ctx, 1)
	require.ErrorIs(t, err, ErrInjected)
	_, err = ck.WaitPersisted(ctx, 2)
	require.NoError(t, err)
	_, err = ck.Snapshot(ctx, 3)
	require.NoError(t, err)
	_, err = ck.WaitPersisted(ctx, 3)
	require.NoError(t, err)
}

// TestSnapshotWhileTraining snapshots while other goroutines keep writing rows; at a barrier (no
// writers) the checkpoint equals the tables. Run with -race.
func TestSnapshotWhileTraining(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t, NewMemStorage(), 32)
	tabs, ts := tables2()
	ck := cl.open(cl.cfg("ps0", tabs))
	m := cl.committer()
	for round := uint64(1); round <= 6; round++ {
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(round, uint64(w)))
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					ts[w].put(rng.Uint64N(400), round*1000+uint64(i))
					if i%7 == 0 {
						ts[w].del(rng.Uint64N(400))
					}
				}
			}()
		}
		_, err := ck.Snapshot(ctx, round*10) // concurrent with training: per-row consistent
		require.NoError(t, err)
		close(stop)
		wg.Wait()
		_, ref := snap(t, ck, round*10+1) // at the barrier
		_, err = m.Commit(ctx, round*10+1, []ManifestRef{ref})
		require.NoError(t, err)
		got, _, err := cl.restoreFresh(round*10 + 1)
		require.NoError(t, err)
		require.Equal(t, states(ts), got)
	}
}

func TestChooseAgreesAcrossNodes(t *testing.T) {
	ctx := context.Background()
	st := NewMemStorage()
	cl := newCluster(t, st, 64)
	global := threeNodeJob(t, cl)
	_ = global
	// Corrupt one chunk of node ps1 at step 50: nodes that do not need it would still take 50 on
	// their own; Choose makes every node use 40.
	names, err := st.List(ctx, "job/data/"+stepName(50)+"/ps1/")
	require.NoError(t, err)
	var chunk string
	for _, n := range names {
		if strings.Contains(n, "/t0-") {
			chunk = n
			break
		}
	}
	require.NotEmpty(t, chunk)
	require.NoError(t, st.Update(chunk, func(b []byte) []byte { b[chunkHeader+1] ^= 0xff; return b }))

	var cks []*Checkpointer
	var tss [][]*fakeTable
	for j := range 2 {
		tabs, ts := tables2()
		ck := cl.open(cl.cfg("new"+string(rune('a'+j)), tabs))
		cks = append(cks, ck)
		tss = append(tss, ts)
	}
	m := cl.committer()
	opts := func(j int) []RestoreOption {
		return []RestoreOption{RestoreSlots(ownedBy(64, 2, j)), RestoreFromStorage()}
	}
	info, err := m.Choose(ctx, func(ctx context.Context, step uint64) error {
		var errs []error
		for j, ck := range cks {
			errs = append(errs, ck.Verify(ctx, step, opts(j)...))
		}
		return errors.Join(errs...)
	})
	require.NoError(t, err)
	assert.Equal(t, uint64(40), info.Step)
	for j, ck := range cks {
		_, err := ck.Load(ctx, info.Step, opts(j)...)
		require.NoError(t, err)
	}
	// Every row equals what an independent single restore of step 40 gives.
	tabs, ts := tables2()
	cfg := cl.cfg("whole", tabs)
	cfg.ShmDir = t.TempDir()
	ck, err := New(cfg)
	require.NoError(t, err)
	defer ck.Close()
	_, err = ck.Load(ctx, 40)
	require.NoError(t, err)
	for k := range ts {
		union := map[uint64]string{}
		for j := range tss {
			for id, r := range tss[j][k].state() {
				union[id] = r
			}
		}
		assert.Equal(t, ts[k].state(), union)
	}
}

func TestCommitRejectsIncompleteCheckpoints(t *testing.T) {
	ctx := context.Background()
	st := NewMemStorage()
	cl := newCluster(t, st, 16)
	tabs, ts := tables2()
	fill(rand.New(rand.NewPCG(1, 1)), ts, 50, 500)
	ck := cl.open(cl.cfg("ps0", tabs))
	tabs2, ts2 := tables2()
	fill(rand.New(rand.NewPCG(2, 2)), ts2, 50, 500)
	ck2 := cl.open(cl.cfg("ps1", tabs2))
	m := cl.committer()
	_, a := snap(t, ck, 1, SnapshotSlots([]int{0, 1, 2, 3, 4, 5, 6, 7}))
	_, b := snap(t, ck2, 1, SnapshotSlots([]int{7, 8, 9, 10, 11, 12, 13, 14, 15}))
	_, err := m.Commit(ctx, 1, []ManifestRef{a, b})
	require.ErrorIs(t, err, ErrIncomplete, "slot 7 owned twice")
	_, err = m.Commit(ctx, 1, []ManifestRef{a})
	require.ErrorIs(t, err, ErrIncomplete, "slots 8-15 have no owner")
	_, err = m.Commit(ctx, 1, nil)
	require.ErrorIs(t, err, ErrIncomplete)
	bad := a
	bad.Sum++
	_, err = m.Commit(ctx, 1, []ManifestRef{bad})
	require.ErrorIs(t, err, ErrIncomplete)
	_, c := snap(t, ck2, 2, SnapshotSlots([]int{8, 9, 10, 11, 12, 13, 14, 15}))
	_, err = m.Commit(ctx, 1, []ManifestRef{a, c})
	require.ErrorIs(t, err, ErrIncomplete, "manifests of different steps")
	_, a3 := snap(t, ck, 3, SnapshotSlots([]int{0, 1, 2, 3, 4, 5, 6, 7}))
	_, c3 := snap(t, ck2, 3, SnapshotSlots([]int{8, 9, 10, 11, 12, 13, 14, 15}))
	// A delta whose parent is gone cannot be committed.
	man, err := getObject(ctx, st, c3.Name, nil, c3.Size, 0)
	require.NoError(t, err)
	parsed, err := decodeManifest(man)
	require.NoError(t, err)
	require.False(t, parsed.Full)
	require.NoError(t, st.Delete(ctx, parsed.Parent))
	_, err = m.Commit(ctx, 3, []ManifestRef{a3, c3})
	require.ErrorIs(t, err, ErrIncomplete)
	assert.Equal(t, uint64(6), m.Stats().CommitErrors)
	_, err = m.Choose(ctx, nil)
	require.ErrorIs(t, err, ErrNoCheckpoint)
}

func TestReserveAndProvisionKeepAllocationOffTheBlockingPath(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t, NewMemStorage(), 16)
	tabs, ts := tables2()
	fill(rand.New(rand.NewPCG(1, 1)), ts, 3000, 1<<30)
	cfg := cl.cfg("ps0", tabs)
	ck := cl.open(cfg)
	require.NoError(t, ck.Reserve(ctx, 4<<20))
	mapped := ck.Stats().ShmBytes
	assert.GreaterOrEqual(t, mapped, int64(8<<20))
	for step := uint64(1); step <= 7; step++ {
		mutate(rand.New(rand.NewPCG(step, 0)), ts, step, 1<<30)
		snap(t, ck, step)
		require.NoError(t, ck.Flush(ctx))
	}
	assert.Equal(t, mapped, ck.Stats().ShmBytes, "reserved memory sufficed")

	// Without Reserve the first snapshot allocates; afterwards the sealer grows ahead of need.
	tabs2, ts2 := tables2()
	fill(rand.New(rand.NewPCG(2, 1)), ts2, 30000, 1<<30)
	cfg2 := cl.cfg("ps1", tabs2)
	ck2 := cl.open(cfg2)
	snap(t, ck2, 1)
	require.NoError(t, ck2.Flush(ctx))
	ck2.mu.Lock()
	assert.NotEmpty(t, ck2.reg.gens[1].extents, "the other generation is provisioned in the background")
	ck2.mu.Unlock()
	for step := uint64(2); step <= 8; step++ {
		mutate(rand.New(rand.NewPCG(step, 1)), ts2, step, 1<<30)
		before := ck2.Stats().ShmBytes
		_, err := ck2.Snapshot(ctx, step)
		require.NoError(t, err)
		assert.Equal(t, before, ck2.Stats().ShmBytes, "step %d allocated while blocking", step)
		require.NoError(t, ck2.Flush(ctx))
	}
}

func TestRealDevShm(t *testing.T) {
	if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
		t.Skip("no /dev/shm")
	}
	dir, err := os.MkdirTemp("/dev/shm", "elasticps-test-")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	ctx := context.Background()
	st := NewMemStorage()
	tabs, ts := tables2()
	fill(rand.New(rand.NewPCG(1, 1)), ts, 500, 5000)
	cfg := Config{Job: "job", Node: "ps0", Tables: tabs, Storage: st, Slots: 64, ShmDir: dir}
	ck, err := New(cfg)
	require.NoError(t, err)
	_, ref := snap(t, ck, 1)
	m, err := NewCommitter(CommitterConfig{Job: "job", Storage: st})
	require.NoError(t, err)
	_, err = m.Commit(ctx, 1, []ManifestRef{ref})
	require.NoError(t, err)
	require.NoError(t, ck.Close())
	want := states(ts)

	tabs2, ts2 := tables2()
	cfg.Tables = tabs2
	ck, err = New(cfg)
	require.NoError(t, err)
	r, err := ck.Restore(ctx)
	require.NoError(t, err)
	assert.Equal(t, SourceShm, r.Sources["ps0"])
	assert.Equal(t, want, states(ts2))
	require.ErrorIs(t, DeleteRegion(dir, "job", "ps0"), ErrRegionLocked)
	require.NoError(t, ck.Close())
	require.NoError(t, DeleteRegion(dir, "job", "ps0"))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)
}

// The goroutine-join check tells goroutines on their way out from ones still at work.
func TestLeaving(t *testing.T) {
	preemptedInWrapper := `goroutine 11 [runnable]:
runtime.asyncPreempt2()
	/usr/local/go/src/runtime/preempt.go:320 +0x14
runtime.asyncPreempt()
	/usr/local/go/src/runtime/preempt_amd64.s:124 +0x28b
github.com/elasticps/elasticps/checkpoint.New.gowrap1()
	/src/checkpoint/checkpointer.go:219 +0x1b
runtime.goexit({})
	/usr/local/go/src/runtime/asm_amd64.s:1771 +0x1
created by github.com/elasticps/elasticps/checkpoint.New in goroutine 10`
	exiting := `goroutine 12 [runnable]:
runtime.goexit1()
	/usr/local/go/src/runtime/proc.go:4400 +0x1b
runtime.goexit({})
	/usr/local/go/src/runtime/asm_amd64.s:1771 +0x1`
	working := `goroutine 13 [select]:
github.com/elasticps/elasticps/checkpoint.(*Checkpointer).sealLoop(0xc000100000)
	/src/checkpoint/seal.go:40 +0x1b
github.com/elasticps/elasticps/checkpoint.New.gowrap1()
	/src/checkpoint/checkpointer.go:219 +0x1b
runtime.goexit({})
	/usr/local/go/src/runtime/asm_amd64.s:1771 +0x1`
	preemptedWorking := "goroutine 14 [runnable]:\nruntime.asyncPreempt2()\n\t/usr/local/go/src/runtime/preempt.go:320 +0x14\n" +
		"runtime.asyncPreempt()\n\t/usr/local/go/src/runtime/preempt_amd64.s:124 +0x28b\n" + strings.SplitN(working, "\n", 2)[1]
	notStarted := `goroutine 15 [runnable]:
github.com/elasticps/elasticps/checkpoint.New.gowrap1()
	/src/checkpoint/checkpointer.go:219
runtime.goexit({})
	/usr/local/go/src/runtime/asm_amd64.s:1771 +0x1`
	inDone := "goroutine 17 [runnable]:\nsync/atomic.(*Uint64).Add(...)\n\t/usr/local/go/src/sync/atomic/type.go:195\n" +
		"sync.(*WaitGroup).Add(0xc000100000, 0xffffffffffffffff)\n\t/usr/local/go/src/sync/waitgroup.go:104 +0x129\n" +
		"sync.(*WaitGroup).Done(...)\n\t/usr/local/go/src/sync/waitgroup.go:156\n" + strings.SplitN(working, "\n", 2)[1]
	assert.True(t, leaving(preemptedInWrapper))
	assert.True(t, leaving(inDone), "a goroutine in its deferred WaitGroup.Done is on its way out")
	assert.False(t, leaving(notStarted), "a goroutine not yet run is not on its way out")
	assert.True(t, leaving(exiting))
	assert.False(t, leaving(working))
	assert.False(t, leaving(preemptedWorking))

	// A function literal a go statement runs, at its last line and still in its body.
	src := filepath.Join(t.TempDir(), "literal.go")
	require.NoError(t, os.WriteFile(src, []byte("package p\n\nfunc f() {\n\tgo func() {\n\t\twork()\n\t}()\n}\n"), 0o600))
	literalAt := func(line int) string {
		return fmt.Sprintf("goroutine 16 [runnable]:\ngithub.com/elasticps/elasticps/checkpoint.populate.func1()\n\t%s:%d +0xfa\n"+
			"created by github.com/elasticps/elasticps/checkpoint.populate in goroutine 15", src, line)
	}
	assert.True(t, leaving(literalAt(6)), "at the literal's closing line")
	assert.False(t, leaving(literalAt(5)))
}
