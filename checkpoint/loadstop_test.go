package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Load from storage returns promptly, and leaves no goroutine behind once its Checkpointer is
// closed, whatever stops it at whichever chunk: a read that fails, or its context cancelled (a
// program stopped by a signal, or a sibling load that failed) during a read or while a chunk is
// applied. Every chunk is read twice, once to verify and once to apply; each read is hit in turn.
func TestLoadEndsAtAFaultOrCancellationAtEveryChunk(t *testing.T) {
	ctx := context.Background()
	mem := NewMemStorage()
	fs := NewFaultStorage(mem)
	cl := newCluster(t, fs, 64)
	tabs, ts := tables2()
	fill(rand.New(rand.NewPCG(7, 8)), ts, 300, 4000)
	ck := cl.open(cl.cfg("ps0", tabs))
	_, ref := snap(t, ck, 1)
	_, err := cl.committer().Commit(ctx, 1, []ManifestRef{ref})
	require.NoError(t, err)
	require.NoError(t, ck.Close())
	want := states(ts)

	chunks := 0
	names, err := mem.List(ctx, "job/data/")
	require.NoError(t, err)
	for _, n := range names {
		if isChunk(n) {
			chunks++
		}
	}
	require.GreaterOrEqual(t, chunks, 8, "enough chunks to stop at")
	reads := 2 * chunks // verify, then apply

	// load runs one Load through a fresh Checkpointer (reading storage only) whose tables are
	// wrapped by wrap, and returns its error and the tables' states. (No subtests: the check
	// for goroutines left would see the parent test's.)
	load := func(name string, ctx context.Context, wrap func(Table) Table) ([]map[uint64]string, error) {
		t.Helper()
		t.Log(name)
		tabs, fresh := tables2()
		for name, tb := range tabs {
			tabs[name] = wrap(tb)
		}
		cfg := cl.cfg("restorer", tabs)
		cfg.ShmDir = t.TempDir()
		rk, err := New(cfg)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := rk.Load(ctx, 1, RestoreFromStorage())
			done <- err
		}()
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			buf := strings.Join(ourGoroutines(), "\n\n")
			t.Fatalf("%s: Load has not returned after 30s:\n%s", name, buf)
		}
		require.NoError(t, rk.Close())
		assertJoined(t)
		return states(fresh), err
	}
	same := func(tb Table) Table { return tb }

	got, err := load("intact", ctx, same)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	for k := 1; k <= reads; k++ {
		name := fmt.Sprintf("read %d of %d fails", k, reads)
		fs.Inject(Fault{Op: OpOpen, Match: "/t", Nth: k})
		_, err := load(name, ctx, same)
		fs.Clear()
		assert.ErrorIs(t, err, ErrInjected, name)
		assert.Equal(t, k > chunks, errors.Is(err, ErrPartialRestore), "%s: the tables were changed only if the fault came while applying", name)

		name = fmt.Sprintf("cancelled at read %d of %d", k, reads)
		cctx, cancel := context.WithCancel(ctx)
		var seen atomic.Int64
		// The read at which it is cancelled goes on: the loader must notice by itself.
		cl.st = &hookStorage{Storage: fs, hook: func(name string) {
			if isChunk(name) && seen.Add(1) == int64(k) {
				cancel()
			}
		}}
		_, err = load(name, cctx, same)
		cl.st = fs
		cancel()
		assert.ErrorIs(t, err, context.Canceled, name)
	}
	// Whether the loader sees the cancellation first as a failed read or as an item it never
	// started depends on the goroutines' timing: each position is tried several times. (The
	// loader's own test, TestPipelineEndsAtAnErrorOrCancellationAtEveryItem, sets each order.)
	for k := 1; k <= chunks; k++ {
		for try := 1; try <= 4; try++ {
			name := fmt.Sprintf("cancelled while applying chunk %d of %d (try %d)", k, chunks, try)
			cctx, cancel := context.WithCancel(ctx)
			var calls atomic.Int64
			got, err := load(name, cctx, func(tb Table) Table {
				return &cancelTable{Table: tb, at: int64(k), calls: &calls, cancel: cancel}
			})
			cancel()
			if err == nil {
				// Every chunk left was read before the cancellation: the load is whole.
				assert.Equal(t, want, got, name)
				continue
			}
			assert.ErrorIs(t, err, context.Canceled, name)
		}
	}
}

// isChunk reports whether a storage name is a chunk object (".../t0-s0-p0").
func isChunk(name string) bool {
	i := strings.LastIndexByte(name, '/')
	return i >= 0 && strings.HasPrefix(name[i+1:], "t")
}

// hookStorage calls hook with the name of every object opened, before opening it.
type hookStorage struct {
	Storage
	hook func(name string)
}

func (s *hookStorage) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	s.hook(name)
	return s.Storage.Open(ctx, name)
}

// cancelTable cancels a context at its at-th LoadRaw (counted over every table sharing calls),
// and applies the records all the same.
type cancelTable struct {
	Table
	at     int64
	calls  *atomic.Int64
	cancel func()
}

func (t *cancelTable) LoadRaw(src []byte, keep func(id uint64) bool) (int, error) {
	if t.calls.Add(1) == t.at {
		t.cancel()
	}
	return t.Table.LoadRaw(src, keep)
}
