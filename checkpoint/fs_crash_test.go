package checkpoint

import (
	"context"
	"io"
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func readAll(t *testing.T, st Storage, name string) []byte {
	t.Helper()
	r, err := st.Open(context.Background(), name)
	require.NoError(t, err, name)
	defer r.Close()
	b, err := io.ReadAll(r)
	require.NoError(t, err)
	return b
}

// The crash-simulating file system itself: only synced bytes and synced directory entries
// survive.
func TestCrashFSKeepsOnlyWhatWasSynced(t *testing.T) {
	c := NewCrashFS()
	require.NoError(t, c.Mkdir("/d"))
	f, err := c.CreateTemp("/d", "a-*")
	require.NoError(t, err)
	_, err = f.Write([]byte("synced"))
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	_, err = f.Write([]byte(" and not"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, c.Rename(f.Name(), "/d/a"))

	_, err = c.Crash().Stat("/d")
	assert.ErrorIs(t, err, fs.ErrNotExist, "a directory is not durable before its parent is synced")
	require.NoError(t, c.SyncDir("/"))
	_, err = c.Crash().Stat("/d/a")
	assert.ErrorIs(t, err, fs.ErrNotExist, "the rename is not durable before its directory is synced")
	require.NoError(t, c.SyncDir("/d"))
	r, err := c.Crash().Open("/d/a")
	require.NoError(t, err)
	b, _ := io.ReadAll(r)
	assert.Equal(t, "synced", string(b))
}

// Every object FSStorage committed is there, whole, after a crash; nothing uncommitted is
// visible; a deletion that returned stays done.
func TestFSStorageSurvivesACrash(t *testing.T) {
	ctx := context.Background()
	cfs := NewCrashFS()
	st, err := NewFSStorageOn(cfs, "/ck")
	require.NoError(t, err)
	objs := map[string][]byte{
		"job/data/1/ps0/a/t0": []byte("chunk of ps0"),
		"job/data/1/ps1/b/t0": []byte("chunk of ps1"),
		"job/commits/1":       []byte("commit record"),
	}
	for n, b := range objs {
		require.NoError(t, putObject(ctx, st, n, b))
	}
	require.NoError(t, st.PutNew(ctx, "job/coordinators/1", []byte("claim")))
	objs["job/coordinators/1"] = []byte("claim")
	require.NoError(t, putObject(ctx, st, "job/data/0/ps0/old/t0", []byte("old")))
	require.NoError(t, st.Delete(ctx, "job/data/0/ps0/old/t0"))
	w, err := st.Create(ctx, "job/data/2/ps0/c/t0") // a persist the crash interrupts
	require.NoError(t, err)
	_, err = w.Write([]byte("half"))
	require.NoError(t, err)

	after, err := NewFSStorageOn(cfs.Crash(), "/ck")
	require.NoError(t, err)
	names, err := after.List(ctx, "")
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"job/data/1/ps0/a/t0", "job/data/1/ps1/b/t0", "job/commits/1", "job/coordinators/1"}, names)
	for n, b := range objs {
		assert.Equal(t, b, readAll(t, after, n), n)
	}
}

// A whole checkpoint job on a storage that loses power after each commit restores every
// committed step bit-exactly from what survived.
func TestCommittedCheckpointsSurviveACrash(t *testing.T) {
	cfs := NewCrashFS()
	st, err := NewFSStorageOn(cfs, "/ck")
	require.NoError(t, err)
	cl := newCluster(t, st, 64)
	want, _, _ := fourSteps(t, cl)

	after, err := NewFSStorageOn(cfs.Crash(), "/ck")
	require.NoError(t, err)
	cl2 := newCluster(t, after, 64)
	for step := uint64(1); step <= 4; step++ {
		got, _, err := cl2.restoreFresh(step)
		require.NoError(t, err, "step %d after the crash", step)
		assert.Equal(t, want[step], got, "step %d after the crash", step)
	}
}
