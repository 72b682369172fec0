package checkpoint

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// testLogger writes through t.Log, so a skipped checkpoint's reason shows up in a failing test.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// cluster is a set of tables per node plus the shared pieces of a test job.
type cluster struct {
	t      *testing.T
	st     Storage
	shmDir string
	slots  int
	cfg    func(node string, tables map[string]Table) Config
}

func newCluster(t *testing.T, st Storage, slots int) *cluster {
	c := &cluster{t: t, st: st, shmDir: t.TempDir(), slots: slots}
	c.cfg = func(node string, tables map[string]Table) Config {
		return Config{Job: "job", Node: node, Tables: tables, Storage: c.st, Slots: c.slots, ShmDir: c.shmDir,
			FullEvery: 3, ChunkBytes: 4 << 10, Workers: 2, Logger: testLogger(t)}
	}
	return c
}

func (c *cluster) open(cfg Config) *Checkpointer {
	c.t.Helper()
	ck, err := New(cfg)
	require.NoError(c.t, err)
	c.t.Cleanup(func() { ck.Close() })
	return ck
}

func (c *cluster) committer() *Committer {
	m, err := NewCommitter(CommitterConfig{Job: "job", Storage: c.st, KeepLast: 100, Logger: testLogger(c.t)})
	require.NoError(c.t, err)
	return m
}

// tables2 returns two fresh fake tables of different row sizes.
func tables2() (map[string]Table, []*fakeTable) {
	a, b := newFakeTable(64), newFakeTable(40)
	return map[string]Table{"a": a, "b": b}, []*fakeTable{a, b}
}

func fill(rng *rand.Rand, ts []*fakeTable, n int, maxID uint64) {
	for _, t := range ts {
		for range n {
			t.put(rng.Uint64N(maxID), 0)
		}
	}
}

func states(ts []*fakeTable) []map[uint64]string {
	out := make([]map[uint64]string, len(ts))
	for i, t := range ts {
		out[i] = t.state()
	}
	return out
}

// snap takes a snapshot and waits for its persist.
func snap(t *testing.T, ck *Checkpointer, step uint64, opts ...SnapshotOption) (SnapshotInfo, ManifestRef) {
	t.Helper()
	info, err := ck.Snapshot(context.Background(), step, opts...)
	require.NoError(t, err)
	ref, err := ck.WaitPersisted(context.Background(), step)
	require.NoError(t, err)
	return info, ref
}

// restoreFresh restores step (or the newest, when step is 0) into fresh tables through a Checkpointer
// with its own shared-memory directory, so only storage is read.
func (c *cluster) restoreFresh(step uint64, opts ...RestoreOption) ([]map[uint64]string, *Restored, error) {
	c.t.Helper()
	tabs, ts := tables2()
	cfg := c.cfg("restorer", tabs)
	cfg.ShmDir = c.t.TempDir()
	ck, err := New(cfg)
	require.NoError(c.t, err)
	defer ck.Close()
	var r *Restored
	if step == 0 {
		r, err = ck.Restore(context.Background(), opts...)
	} else {
		r, err = ck.Load(context.Background(), step, opts...)
	}
	return states(ts), r, err
}
