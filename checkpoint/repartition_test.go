package checkpoint_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
)

var _ checkpoint.SlotDeltaTable = (*embedding.Table)(nil)

// moveJob is a job of three servers with embedding tables whose slots move between them while
// they train, checkpointing every step with deltas only.
type moveJob struct {
	t     *testing.T
	slots int
	st    *checkpoint.FaultStorage
	shm   string
	tabs  []*embedding.Table
	cks   []*checkpoint.Checkpointer
	m     *checkpoint.Committer
	owner []int        // slot -> server
	froze map[int]bool // slots being copied: not trained
	rng   *rand.Rand
	// want is the job's rows (each slot from its owner) and owned the slots of each server, at
	// each committed step.
	want  map[uint64]map[uint64]string
	owned map[uint64][][]int
	// digest is the digest of the job's rows at each committed step, made from the servers'
	// tables.
	digest map[uint64]checkpoint.Digest
}

var moveTableConfig = embedding.Config{Name: "emb", Dim: 8, Seed: 5, Shards: 4,
	Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}}

func newMoveJob(t *testing.T) *moveJob {
	j := &moveJob{t: t, slots: 64, st: checkpoint.NewFaultStorage(checkpoint.NewMemStorage()), shm: t.TempDir(),
		froze: map[int]bool{}, rng: rand.New(rand.NewPCG(3, 4)),
		want: map[uint64]map[uint64]string{}, owned: map[uint64][][]int{}, digest: map[uint64]checkpoint.Digest{}}
	for s := range j.slots {
		j.owner = append(j.owner, s%3)
	}
	for i := range 3 {
		tab, err := embedding.New(moveTableConfig)
		require.NoError(t, err)
		j.tabs = append(j.tabs, tab)
		j.cks = append(j.cks, j.open(fmt.Sprintf("ps%d", i), j.slots, tab))
	}
	m, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "job", Storage: j.st, KeepLast: 100})
	require.NoError(t, err)
	j.m = m
	return j
}

func (j *moveJob) config(node string, slots int, tab *embedding.Table) checkpoint.Config {
	return checkpoint.Config{Job: "job", Node: node, Tables: map[string]checkpoint.Table{"emb": tab},
		Storage: j.st, Slots: slots, ShmDir: j.shm, FullEvery: 100, ChunkBytes: 4 << 10, Workers: 2,
		Codec: checkpoint.CodecNone}
}

func (j *moveJob) open(node string, slots int, tab *embedding.Table) *checkpoint.Checkpointer {
	ck, err := checkpoint.New(j.config(node, slots, tab))
	require.NoError(j.t, err)
	j.t.Cleanup(func() { ck.Close() })
	return ck
}

func (j *moveJob) slotsOf(server int) []int {
	var out []int
	for s, o := range j.owner {
		if o == server {
			out = append(out, s)
		}
	}
	return out
}

// train updates 300 random ids on their owners with nonzero gradients and deletes 15 (slots
// being copied are left alone).
func (j *moveJob) train(step uint32) {
	var ids [3][]uint64
	seen := map[uint64]bool{}
	for range 300 {
		id := j.rng.Uint64N(6000)
		s := embedding.Slot(id, j.slots)
		if j.froze[s] || seen[id] {
			continue
		}
		seen[id] = true
		ids[j.owner[s]] = append(ids[j.owner[s]], id)
	}
	for i, batch := range ids {
		g := make([]float32, len(batch)*moveTableConfig.Dim)
		for k := range g {
			g[k] = float32(j.rng.NormFloat64()) + 0.5
		}
		require.NoError(j.t, j.tabs[i].Apply(batch, g, step))
	}
	for range 15 {
		id := j.rng.Uint64N(6000)
		if s := embedding.Slot(id, j.slots); !j.froze[s] {
			j.tabs[j.owner[s]].Delete(id)
		}
	}
}

// slotRows returns the owner's table of slot s and the ids of the slot's rows in it, sorted.
func (j *moveJob) slotRows(s int) (*embedding.Table, []uint64) {
	tab := j.tabs[j.owner[s]]
	var ids []uint64
	for id := range rowsOf(tab) {
		if embedding.Slot(id, j.slots) == s {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return tab, ids
}

// deleteIn deletes up to n rows of slot s on its owner: rows a stale copy elsewhere would revive.
func (j *moveJob) deleteIn(s, n int) {
	tab, ids := j.slotRows(s)
	require.NotEmpty(j.t, ids, "slot %d has rows", s)
	for _, id := range ids[:min(n, len(ids))] {
		require.True(j.t, tab.Delete(id))
	}
}

// touch trains every row of slot s on its owner.
func (j *moveJob) touch(s int, step uint32) {
	tab, ids := j.slotRows(s)
	g := make([]float32, len(ids)*moveTableConfig.Dim)
	for k := range g {
		g[k] = float32(j.rng.NormFloat64()) - 0.5
	}
	require.NoError(j.t, tab.Apply(ids, g, step))
}

// copySlots copies the rows of slots from server from to server to, as a migration does before
// it hands them over; the slots are not trained until they are handed over.
func (j *moveJob) copySlots(from, to int, slots ...int) {
	set := embedding.NewSlotSet(j.slots, slots...)
	need, err := j.tabs[from].CopyRawSlots(nil, set.Contains)
	require.ErrorIs(j.t, err, io.ErrShortBuffer)
	buf := make([]byte, need)
	n, err := j.tabs[from].CopyRawSlots(buf, set.Contains)
	require.NoError(j.t, err)
	_, err = j.tabs[to].LoadRaw(buf[:n], nil)
	require.NoError(j.t, err)
	for _, s := range slots {
		j.froze[s] = true
	}
}

// handOver gives the slots to server to; with release the old owner drops their rows at once,
// else it keeps them until release is called.
func (j *moveJob) handOver(to int, release bool, slots ...int) {
	from := map[int][]int{}
	for _, s := range slots {
		from[j.owner[s]] = append(from[j.owner[s]], s)
		j.owner[s] = to
		delete(j.froze, s)
	}
	if release {
		for f, ss := range from {
			j.release(f, ss...)
		}
	}
}

func (j *moveJob) release(server int, slots ...int) {
	j.tabs[server].DeleteSlots(embedding.NewSlotSet(j.slots, slots...))
}

// move copies, hands over and releases slots at once.
func (j *moveJob) move(from, to int, slots ...int) {
	j.copySlots(from, to, slots...)
	j.handOver(to, true, slots...)
}

// snapshot takes step on every server (each a delta) and commits it unless a persist fails; it
// returns the servers whose persist failed.
func (j *moveJob) snapshot(step uint64) []int {
	ctx := context.Background()
	var refs []checkpoint.ManifestRef
	var failed []int
	for i, ck := range j.cks {
		info, err := ck.Snapshot(ctx, step, checkpoint.SnapshotSlots(j.slotsOf(i)))
		require.NoError(j.t, err)
		require.Equal(j.t, step == 1, info.Full, "server %d at step %d", i, step)
		ref, err := ck.WaitPersisted(ctx, step)
		if err != nil {
			require.ErrorIs(j.t, err, checkpoint.ErrInjected)
			failed = append(failed, i)
			continue
		}
		refs = append(refs, ref)
	}
	if len(failed) > 0 {
		return failed
	}
	_, err := j.m.Commit(ctx, step, refs)
	require.NoError(j.t, err)
	global := map[uint64]string{}
	var owned [][]int
	var parts []checkpoint.Digest
	for i, tab := range j.tabs {
		for id, r := range rowsOf(tab) {
			if j.owner[embedding.Slot(id, j.slots)] == i {
				global[id] = r
			}
		}
		owned = append(owned, j.slotsOf(i))
		raw, _ := tab.AppendRawRows(nil, embedding.Cursor{}, math.MaxInt, embedding.NewSlotSet(j.slots, j.slotsOf(i)...))
		td := checkpoint.TableDigest{Name: "emb", Schema: tab.Schema()}
		require.NoError(j.t, td.Add(raw, tab.RawRowSize()))
		parts = append(parts, checkpoint.Digest{Step: step, Tables: []checkpoint.TableDigest{td}})
	}
	j.want[step], j.owned[step] = global, owned
	j.digest[step], err = checkpoint.Merge(parts...)
	require.NoError(j.t, err)
	return nil
}

// restore loads step onto servers, each owning the given slots of a job with slots slots, into
// fresh tables, and returns the union of their rows; it checks each server got exactly its slots'
// rows and that every node's part came from the expected source.
func (j *moveJob) restore(step uint64, slots int, names []string, owned [][]int, fromStorage bool) map[uint64]string {
	t := j.t
	t.Helper()
	union := map[uint64]string{}
	want := j.want[step]
	for i, name := range names {
		tab, err := embedding.New(moveTableConfig)
		require.NoError(t, err)
		ck, err := checkpoint.New(j.config(name, slots, tab))
		require.NoError(t, err)
		opts := []checkpoint.RestoreOption{checkpoint.RestoreSlots(owned[i])}
		if fromStorage {
			opts = append(opts, checkpoint.RestoreFromStorage())
		}
		r, err := ck.Load(context.Background(), step, opts...)
		require.NoError(t, err)
		require.NoError(t, ck.Close())
		src := checkpoint.SourceShm
		if fromStorage {
			src = checkpoint.SourceStorage
		}
		for node, got := range r.Sources {
			assert.Equal(t, src, got, "part of node %s", node)
		}
		mine := embedding.NewSlotSet(slots, owned[i]...)
		got := rowsOf(tab)
		wantMine := map[uint64]string{}
		for id, row := range want {
			if mine.Contains(id) {
				wantMine[id] = row
			}
		}
		require.Equal(t, len(wantMine), len(got), "rows of server %s", name)
		require.Equal(t, wantMine, got, "server %s", name)
		for id, row := range got {
			union[id] = row
		}
	}
	return union
}

// ownedBy returns the slots s of slots with s % n == i.
func ownedBy(slots, n, i int) []int {
	var out []int
	for s := range slots {
		if s%n == i {
			out = append(out, s)
		}
	}
	return out
}

// A chain whose servers gain, lose and regain slots is made of deltas only (base, move in, move
// out, move back), and every committed step restores exactly — every row, weights and optimizer
// state — from shared memory and from storage, onto the same servers, onto another number of
// servers, and with another slot count; also when failed persists make the next one carry
// several snapshots with changes of slots between them.
func TestDeltasAcrossSlotMoves(t *testing.T) {
	j := newMoveJob(t)
	A := []int{0, 3, 6, 9} // ps0's slots that move into ps1
	const x = 1            // ps1 -> ps2 -> ps1
	B := []int{4, 7}       // ps1's slots that move out to ps0

	j.train(1)
	require.Empty(t, j.snapshot(1))

	// ps1 receives A's rows before it owns A: its step 2 holds rows of slots it does not own.
	j.train(2)
	j.copySlots(0, 1, A...)
	require.Empty(t, j.snapshot(2))

	// ps1 gains A (most of A's rows unchanged since step 2: only the whole copy of a gained slot
	// brings them into ps1's chain); ps0 keeps A's rows for now. x moves to ps2, which deletes
	// some of its rows. ps1's persist of step 3 fails, so its next persist carries steps 3 and 4.
	j.handOver(1, false, A...)
	j.move(1, 2, x)
	j.train(3)
	j.deleteIn(x, 5)
	j.deleteIn(A[1], 3)
	j.st.Inject(checkpoint.Fault{Op: checkpoint.OpCreate, Match: "data/00000000000000000003/ps1/"})
	require.Equal(t, []int{1}, j.snapshot(3))
	j.st.Clear()

	// ps0 drops A's rows (deletion records for every one, which its delta leaves out), x comes
	// back to ps1 (which must not revive what ps2 deleted), and ps1 loses B to ps0.
	j.release(0, A...)
	j.move(2, 1, x)
	j.move(1, 0, B...)
	j.train(4)
	j.deleteIn(B[0], 4)
	require.Empty(t, j.snapshot(4))

	// A slot moves back to the server whose base held it; meanwhile ps1 trained and deleted rows
	// of it, and ps0's base rows of it are stale. ps2 trains every row of y, then loses y to ps0,
	// which deletes some of its rows, and gains it back: with its persists of steps 5 and 6
	// failing, its persist of step 7 carries all three snapshots.
	const y = 2
	j.deleteIn(A[0], 6)
	j.move(1, 0, A[0])
	j.train(5)
	j.touch(y, 5)
	j.st.Inject(checkpoint.Fault{Op: checkpoint.OpCreate, Match: "/ps2/"})
	require.Equal(t, []int{2}, j.snapshot(5))
	j.move(2, 0, y)
	j.train(6)
	j.deleteIn(y, 5)
	require.Equal(t, []int{2}, j.snapshot(6))
	j.st.Clear()
	j.move(0, 2, y)
	j.train(7)
	require.Empty(t, j.snapshot(7))

	j.train(8)
	require.Empty(t, j.snapshot(8))
	for _, ck := range j.cks {
		require.NoError(t, ck.Close()) // their regions are read by the restoring servers below
	}

	for _, step := range []uint64{2, 4, 7, 8} {
		for _, fromStorage := range []bool{false, true} {
			t.Run(fmt.Sprintf("step=%d/storage=%v", step, fromStorage), func(t *testing.T) {
				j.t = t
				if fromStorage {
					// The commit's digest is that of the rows its servers held, whatever the
					// deltas and moves that brought them there.
					d, err := j.m.Digest(context.Background(), step)
					require.NoError(t, err)
					require.NoError(t, j.digest[step].Compare(d))
					require.Equal(t, step, d.Step)
				}
				got := j.restore(step, j.slots, []string{"ps0", "ps1", "ps2"}, j.owned[step], fromStorage)
				require.Equal(t, j.want[step], got, "the same servers")
				for _, n := range []int{2, 4} {
					var names []string
					var owned [][]int
					for i := range n {
						names = append(names, fmt.Sprintf("r%d-%d", n, i))
						owned = append(owned, ownedBy(j.slots, n, i))
					}
					got := j.restore(step, j.slots, names, owned, fromStorage)
					require.Equal(t, j.want[step], got, "%d servers", n)
				}
				got = j.restore(step, 48, []string{"s48-0", "s48-1"}, [][]int{ownedBy(48, 2, 0), ownedBy(48, 2, 1)}, fromStorage)
				require.Equal(t, j.want[step], got, "another slot count")
			})
		}
	}
}

// A move costs a delta about the gained slots' rows on top of the changes; a lost slot's
// deletions cost nothing.
func TestSnapshotAfterMoveIsSmall(t *testing.T) {
	j := newMoveJob(t)
	ctx := context.Background()
	j.train(1)
	require.Empty(t, j.snapshot(1))
	rowSize := int64(j.tabs[0].RawRowSize())
	full := int64(j.tabs[1].Len()) * rowSize

	gained := []int{0, 3, 6, 9, 12, 15}
	set := embedding.NewSlotSet(j.slots, gained...)
	var moved int64
	for id := range rowsOf(j.tabs[0]) {
		if set.Contains(id) {
			moved += rowSize
		}
	}
	j.move(0, 1, gained...)
	info, err := j.cks[1].Snapshot(ctx, 2, checkpoint.SnapshotSlots(j.slotsOf(1)))
	require.NoError(t, err)
	require.False(t, info.Full)
	assert.Equal(t, moved, info.Bytes, "ps1 copies the gained slots' rows, nothing else changed")
	info, err = j.cks[0].Snapshot(ctx, 2, checkpoint.SnapshotSlots(j.slotsOf(0)))
	require.NoError(t, err)
	require.False(t, info.Full)
	assert.Zero(t, info.Bytes, "ps0's deletions of the slots it lost are left out")
	assert.Less(t, moved, full)
	for _, ck := range j.cks[:2] {
		_, err := ck.WaitPersisted(ctx, 2)
		require.NoError(t, err)
	}
}

// manifestVersions returns, by node, the format versions of the manifests the job stored for
// step.
func (j *moveJob) manifestVersions(step uint64) map[string]uint32 {
	ctx := context.Background()
	names, err := j.st.List(ctx, fmt.Sprintf("job/data/%020d/", step))
	require.NoError(j.t, err)
	out := map[string]uint32{}
	for _, name := range names {
		if !strings.HasSuffix(name, "/manifest") {
			continue
		}
		r, err := j.st.Open(ctx, name)
		require.NoError(j.t, err)
		b, err := io.ReadAll(r)
		r.Close()
		require.NoError(j.t, err)
		require.Greater(j.t, len(b), 12)
		node := strings.Split(name, "/")[3]
		out[node] = binary.LittleEndian.Uint32(b[8:12])
	}
	return out
}

// A chain whose slots never change is stored in the manifest format an earlier release reads
// (version 1), so going back to that release keeps the job's checkpoints; a node whose slots
// change writes version 2, which records them, from then on in that chain.
func TestManifestVersionFollowsSlotChanges(t *testing.T) {
	j := newMoveJob(t)
	j.train(1)
	require.Empty(t, j.snapshot(1))
	j.train(2)
	require.Empty(t, j.snapshot(2))
	assert.Equal(t, map[string]uint32{"ps0": 1, "ps1": 1, "ps2": 1}, j.manifestVersions(2))
	j.move(0, 1, 0, 3)
	j.train(3)
	require.Empty(t, j.snapshot(3))
	assert.Equal(t, map[string]uint32{"ps0": 2, "ps1": 2, "ps2": 1}, j.manifestVersions(3))
	j.train(4)
	require.Empty(t, j.snapshot(4))
	assert.Equal(t, map[string]uint32{"ps0": 2, "ps1": 2, "ps2": 1}, j.manifestVersions(4), "the chain changed its slots")
}
