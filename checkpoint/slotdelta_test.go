package checkpoint

import (
	"context"
	"encoding/binary"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slotFake is a fakeTable that is also a SlotDeltaTable, written the naive way.
type slotFake struct {
	*fakeTable
	deltas int // CopyRawDelta calls that copied
	short  int // CopyRawDelta calls refused for want of room
}

var _ SlotDeltaTable = (*slotFake)(nil)

func (t *slotFake) CopyRawDelta(dst []byte, changed, whole func(uint64) bool, newBase bool) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var dels, rows []uint64
	for _, id := range slices.Sorted(maps.Keys(t.changed)) {
		if _, live := t.rows[id]; !live && (changed == nil || changed(id)) && (whole == nil || !whole(id)) {
			dels = append(dels, id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(t.rows)) {
		if (whole != nil && whole(id)) || (t.changed[id] && (changed == nil || changed(id))) {
			rows = append(rows, id)
		}
	}
	need := (len(dels) + len(rows)) * t.rowSize
	if need > len(dst) {
		t.short++
		return need, io.ErrShortBuffer
	}
	o := 0
	for _, id := range dels {
		clear(dst[o : o+t.rowSize])
		binary.LittleEndian.PutUint64(dst[o:], id)
		binary.LittleEndian.PutUint32(dst[o+8:], DeletionMark)
		o += t.rowSize
	}
	for _, id := range rows {
		o += copy(dst[o:], t.rows[id])
	}
	if newBase {
		clear(t.changed)
	}
	t.deltas++
	return o, nil
}

func mustSlots(n int, slots []int) slotSet {
	s, ok := slotSetFrom(n, slots)
	if !ok {
		panic("slots out of range")
	}
	return s
}

// putIn writes n rows of ids in the slots s of slots with in(s).
func putIn(rng *rand.Rand, t *fakeTable, slots, n int, version uint64, in func(int) bool) {
	for added := 0; added < n; {
		id := rng.Uint64()
		if in(slotOf(id, slots)) {
			t.put(id, version)
			added++
		}
	}
}

// A node that gains three times the rows its base holds, more than the free room of its shared
// memory (room for a delta as large as the base, and headroom), takes a delta: the slotted copy is
// refused, says what it needs, and gets it. Restores from shared
// memory and from storage, before and after, equal the tables.
func TestSlottedDeltaGrowsSharedMemory(t *testing.T) {
	ctx := context.Background()
	cl := newCluster(t, NewMemStorage(), 64)
	tab := &slotFake{fakeTable: newFakeTable(64)}
	cfg := cl.cfg("ps0", map[string]Table{"a": tab})
	cfg.FullEvery = 10
	ck := cl.open(cfg)
	m := cl.committer()
	rng := rand.New(rand.NewPCG(9, 9))
	low := func(s int) bool { return s < 32 }
	high := func(s int) bool { return s >= 32 }
	var lowSlots []int
	for s := range 32 {
		lowSlots = append(lowSlots, s)
	}
	putIn(rng, tab.fakeTable, 64, 20000, 1, low)
	want := map[uint64]map[uint64]string{}
	// ps1, with no rows, owns the slots ps0 does not.
	other := cl.open(cl.cfg("ps1", map[string]Table{"a": &slotFake{fakeTable: newFakeTable(64)}}))
	commit := func(step uint64, slots []int, full bool) {
		info, ref := snap(t, ck, step, SnapshotSlots(slots))
		require.Equal(t, full, info.Full, "step %d", step)
		_, ref1 := snap(t, other, step, SnapshotSlots(allSlots(64).minus(mustSlots(64, slots)).list()))
		_, err := m.Commit(ctx, step, []ManifestRef{ref, ref1})
		require.NoError(t, err)
		want[step] = filterState(tab.state(), 64, func(s int) bool { return slices.Contains(slots, s) })
	}
	commit(1, lowSlots, true)
	shm := ck.Stats().ShmBytes

	// The node gains every slot; its table receives the rows of the high ones.
	putIn(rng, tab.fakeTable, 64, 60000, 2, high)
	tab.fakeTable.mu.Lock()
	clear(tab.changed) // they arrived before the previous snapshot, as if copied before the hand-over
	tab.fakeTable.mu.Unlock()
	mutate(rng, []*fakeTable{tab.fakeTable}, 2, 1<<62)
	commit(2, allSlots(64).list(), false)
	assert.Equal(t, 1, tab.short, "the gained rows did not fit the free room")
	assert.Greater(t, ck.Stats().ShmBytes, shm, "shared memory grew")

	// It loses the high slots again and drops their rows.
	mutate(rng, []*fakeTable{tab.fakeTable}, 3, 1<<62)
	for id := range tab.state() {
		if high(slotOf(id, 64)) {
			tab.del(id)
		}
	}
	commit(3, lowSlots, false)
	require.NoError(t, ck.Close())
	require.NoError(t, other.Close())

	for _, step := range []uint64{1, 2, 3} {
		for _, fromStorage := range []bool{false, true} {
			tab := newFakeTable(64)
			ck := cl.open(cl.cfg("ps0", map[string]Table{"a": tab}))
			opts := []RestoreOption{}
			if fromStorage {
				opts = append(opts, RestoreFromStorage())
			}
			r, err := ck.Load(ctx, step, opts...)
			require.NoError(t, err)
			for node, src := range r.Sources {
				assert.Equal(t, !fromStorage, src == SourceShm, "node %s", node)
			}
			assert.Equal(t, want[step], tab.state(), "step %d from storage %v", step, fromStorage)
			require.NoError(t, ck.Close())
		}
	}
}
