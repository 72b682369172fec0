package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A scratch directory's lock keeps it while its run lives; the next scratch directory made
// removes those of the same prefix whose lock is free (their run died), and nothing else.
func TestShmScratchRemovesWhatDeadRunsLeft(t *testing.T) {
	root := t.TempDir()
	live, release, err := shmScratch(root, "p-", t.TempDir())
	require.NoError(t, err)
	assert.Equal(t, root, filepath.Dir(live))
	assert.FileExists(t, filepath.Join(live, ownerFile))
	mk := func(name string, owner bool) string {
		d := filepath.Join(root, name)
		require.NoError(t, os.Mkdir(d, 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(d, "data"), []byte("x"), 0o600))
		if owner {
			require.NoError(t, os.WriteFile(filepath.Join(d, ownerFile), nil, 0o600))
		}
		return d
	}
	dead := mk("p-dead", true)      // its run died: the lock is free
	nolock := mk("p-nolock", false) // not ours to judge
	other := mk("q-dead", true)     // another prefix

	second, release2, err := shmScratch(root, "p-", t.TempDir())
	require.NoError(t, err)
	assert.NoDirExists(t, dead)
	for _, d := range []string{live, nolock, other, second} {
		assert.DirExists(t, d)
	}
	release()
	assert.NoDirExists(t, live)
	release2()
	assert.NoDirExists(t, second)

	// Without a writable root, a directory under the fallback, removed by release.
	fallback := t.TempDir()
	d, release3, err := shmScratch(filepath.Join(root, "missing"), "p-", fallback)
	require.NoError(t, err)
	assert.Equal(t, fallback, filepath.Dir(d))
	release3()
	assert.NoDirExists(t, d)
}
