package checkpoint

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shardedTables returns two empty sharded fake tables: "a" with rows of 1 KiB in 4 groups, so a
// group of a few thousand rows spans several checksum pieces, and "b" with small rows in 3 groups.
func shardedTables() (map[string]Table, []*shardedFake) {
	a, b := newShardedFake(1024, 4), newShardedFake(40, 3)
	return map[string]Table{"a": a, "b": b}, []*shardedFake{a, b}
}

func shardedStates(ts []*shardedFake) []map[uint64]string {
	out := make([]map[uint64]string, len(ts))
	for i, t := range ts {
		out[i] = t.state()
	}
	return out
}

// bulkJob commits a full checkpoint (step 1) and a delta (step 2) of sharded tables on node ps0,
// closes its Checkpointer and returns the states at both steps.
func bulkJob(t *testing.T, cl *cluster) map[uint64][]map[uint64]string {
	ctx := context.Background()
	tabs, ts := shardedTables()
	rng := rand.New(rand.NewPCG(5, 6))
	for range 20000 {
		ts[0].put(rng.Uint64(), 0)
	}
	for range 500 {
		ts[1].put(rng.Uint64N(5000), 0)
	}
	cfg := cl.cfg("ps0", tabs)
	cfg.ChunkBytes = 1 << 20
	ck := cl.open(cfg)
	m := cl.committer()
	want := map[uint64][]map[uint64]string{}
	for step := uint64(1); step <= 2; step++ {
		if step == 2 {
			for _, tab := range ts {
				mutate(rng, []*fakeTable{tab.fakeTable}, step, 5000)
			}
		}
		info, ref := snap(t, ck, step)
		require.Equal(t, step == 1, info.Full)
		want[step] = shardedStates(ts)
		_, err := m.Commit(ctx, step, []ManifestRef{ref})
		require.NoError(t, err)
	}
	require.NoError(t, ck.Close())
	return want
}

// flipShm flips one byte of table a's records in the base segment of generation 0, inside the
// last checksum piece of its last group, and returns how many pieces that table has.
func flipShm(t *testing.T, cl *cluster) int {
	dir := filepath.Join(cl.shmDir, "job", "ps0")
	seal, err := os.ReadFile(sealPath(dir, 0))
	require.NoError(t, err)
	sf, err := decodeSeal(seal)
	require.NoError(t, err)
	tb := sf.Segments[0].Tables[sf.Segments[0].tableIndex("a")]
	spans := tb.spans(sf.Piece)
	require.Len(t, tb.Groups, 4)
	require.Greater(t, len(spans), len(tb.Groups), "some group spans several pieces")
	at := int64(tb.Off) + int64(spans[len(spans)-1].lo) + 100
	f, err := os.OpenFile(filepath.Join(dir, sf.Extents[tb.Extent].Name), os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	b := make([]byte, 1)
	_, err = f.ReadAt(b, at)
	require.NoError(t, err)
	b[0] ^= 0x10
	_, err = f.WriteAt(b, at)
	require.NoError(t, err)
	return len(spans)
}

func TestBulkRestoreFromSharedMemory(t *testing.T) {
	cl := newCluster(t, NewMemStorage(), 64)
	want := bulkJob(t, cl)
	tabs, ts := shardedTables()
	ck := cl.open(cl.cfg("ps0", tabs))
	r, err := ck.Restore(context.Background())
	require.NoError(t, err)
	assert.Equal(t, uint64(2), r.Step)
	assert.Equal(t, SourceShm, r.Sources["ps0"])
	assert.Equal(t, want[2], shardedStates(ts))
	for _, tab := range ts {
		assert.Equal(t, 1, tab.bulkLoads, "the base is loaded group by group")
	}
	assert.Greater(t, ts[0].pieces, 4, "table a's groups arrive in several pieces")

	// A table that is not empty takes the records one by one, through LoadRaw.
	tabs, ts = shardedTables()
	ts[1].put(1<<40, 0)
	ck.Close()
	ck = cl.open(cl.cfg("ps0", tabs))
	_, err = ck.Load(context.Background(), 1)
	require.NoError(t, err)
	assert.Equal(t, 1, ts[0].bulkLoads)
	assert.Equal(t, 0, ts[1].bulkLoads)
	assert.Equal(t, want[1][0], ts[0].state())
	assert.Len(t, ts[1].state(), len(want[1][1])+1)
}

// A piece of shared memory that fails its checksum only once the load has begun changes no table:
// the rows loaded before it are removed again and the restore reads storage instead, or fails
// with the tables as they were when storage is damaged too.
func TestBulkRestoreCorruptPieceChangesNoTable(t *testing.T) {
	for _, storageToo := range []bool{false, true} {
		name := "storage intact"
		if storageToo {
			name = "storage damaged too"
		}
		t.Run(name, func(t *testing.T) {
			st := NewMemStorage()
			cl := newCluster(t, st, 64)
			want := bulkJob(t, cl)
			flipShm(t, cl)
			if storageToo {
				flip := func(b []byte) []byte { b[len(b)/2] ^= 0x40; return b }
				require.NoError(t, st.Update(objects(t, st, 1, "-p0")[0], flip))
			}
			tabs, ts := shardedTables()
			cfg := cl.cfg("ps0", tabs)
			cfg.Workers = 1 // groups in order: the damaged last piece comes after every other one
			ck := cl.open(cfg)
			r, err := ck.Load(context.Background(), 2)
			assert.Greater(t, ts[0].pieces, 1, "rows were loaded before the damage was found")
			if storageToo {
				require.ErrorIs(t, err, ErrCorrupt)
				assert.NotErrorIs(t, err, ErrPartialRestore)
				assert.Equal(t, []map[uint64]string{{}, {}}, shardedStates(ts), "no table changed")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, SourceStorage, r.Sources["ps0"])
			assert.Equal(t, want[2], shardedStates(ts))
		})
	}
}

// appendSealV1 encodes s as version 1 wrote seals: no groups, a checksum every Piece bytes.
func appendSealV1(s *sealFile) []byte {
	e := encoder{b: []byte(sealMagic)}
	e.u32(1)
	e.str(s.Job)
	e.str(s.Node)
	e.u32(s.Gen)
	e.uv(uint64(s.Slots))
	e.u64(s.Piece)
	e.uv(uint64(len(s.Extents)))
	for _, x := range s.Extents {
		e.str(x.Name)
		e.u64(x.Size)
	}
	e.uv(uint64(len(s.Segments)))
	for _, g := range s.Segments {
		e.u64(g.ID)
		e.u64(g.Step)
		e.bool(g.Full)
		e.u64(g.BaseStep)
		e.slots(g.Owned)
		e.uv(uint64(len(g.Tables)))
		for _, t := range g.Tables {
			e.str(t.Name)
			e.bytes(t.Schema)
			e.u32(t.RowSize)
			e.u32(t.Extent)
			e.u64(t.Off)
			e.u64(t.Len)
			e.uv(uint64(len(t.Sums)))
			for _, x := range t.Sums {
				e.u64(x)
			}
		}
		e.uv(uint64(len(g.Blobs)))
		for _, b := range g.Blobs {
			e.str(b.Name)
			e.u32(b.Extent)
			e.u64(b.Off)
			e.u64(b.Len)
			e.u64(b.Sum)
		}
	}
	return e.seal()
}

// Regions sealed before seals recorded groups (version 1) are still restored from shared memory.
func TestVersion1SealIsStillRestored(t *testing.T) {
	cl := newCluster(t, NewMemStorage(), 64)
	want := bulkJob(t, cl)
	dir := filepath.Join(cl.shmDir, "job", "ps0")
	b, err := os.ReadFile(sealPath(dir, 0))
	require.NoError(t, err)
	sf, err := decodeSeal(b)
	require.NoError(t, err)
	g := &generation{}
	for _, x := range sf.Extents {
		data, err := openExtent(filepath.Join(dir, x.Name), false)
		require.NoError(t, err)
		defer unmap(data)
		g.extents = append(g.extents, &extent{name: x.Name, data: data})
	}
	v2spans := sf.Segments[0].Tables[0].spans(sf.Piece)
	for _, seg := range sf.Segments {
		for ti := range seg.Tables {
			tb := &seg.Tables[ti]
			tb.WholeRecords, tb.Groups, tb.Key = false, nil, nil
			data := g.data(tb.Extent, tb.Off, tb.Len)
			tb.Sums = tb.Sums[:0]
			for _, sp := range tb.spans(sf.Piece) {
				tb.Sums = append(tb.Sums, xxhashSum(data[sp.lo:sp.hi]))
			}
		}
	}
	require.NotEqual(t, v2spans, sf.Segments[0].Tables[0].spans(sf.Piece), "version 1 cuts pieces otherwise")
	v1 := appendSealV1(sf)
	back, err := decodeSeal(v1)
	require.NoError(t, err)
	require.False(t, back.Segments[0].Tables[0].WholeRecords)
	require.NoError(t, os.WriteFile(sealPath(dir, 0), v1, 0o600))

	tabs, ts := shardedTables()
	ck := cl.open(cl.cfg("ps0", tabs))
	r, err := ck.Restore(context.Background())
	require.NoError(t, err)
	assert.Equal(t, SourceShm, r.Sources["ps0"])
	assert.Equal(t, want[2], shardedStates(ts))
	assert.Zero(t, ts[0].bulkLoads, "a version-1 seal records no groups")
}

// Regions sealed by version 2 (the layout of version 3, whose chains never change slots) are
// still restored from shared memory, group by group.
func TestVersion2SealIsStillRestored(t *testing.T) {
	cl := newCluster(t, NewMemStorage(), 64)
	want := bulkJob(t, cl)
	dir := filepath.Join(cl.shmDir, "job", "ps0")
	b, err := os.ReadFile(sealPath(dir, 0))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(sealPath(dir, 0), withVersion(b, 2), 0o600))

	tabs, ts := shardedTables()
	ck := cl.open(cl.cfg("ps0", tabs))
	r, err := ck.Restore(context.Background())
	require.NoError(t, err)
	assert.Equal(t, SourceShm, r.Sources["ps0"])
	assert.Equal(t, want[2], shardedStates(ts))
	assert.Equal(t, 1, ts[0].bulkLoads)
}
