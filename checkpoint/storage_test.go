package checkpoint

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func read(t *testing.T, st Storage, name string) []byte {
	t.Helper()
	r, err := st.Open(context.Background(), name)
	require.NoError(t, err)
	defer r.Close()
	b, err := io.ReadAll(r)
	require.NoError(t, err)
	return b
}

func storages(t *testing.T) map[string]Storage {
	fs, err := NewFSStorage(t.TempDir())
	require.NoError(t, err)
	return map[string]Storage{"fs": fs, "mem": NewMemStorage(), "fault": NewFaultStorage(NewMemStorage())}
}

func TestStorageContract(t *testing.T) {
	ctx := context.Background()
	for name, st := range storages(t) {
		t.Run(name, func(t *testing.T) {
			// Nothing is visible before Commit; Commit publishes the whole object.
			w, err := st.Create(ctx, "j/a/x")
			require.NoError(t, err)
			_, err = w.Write([]byte("hello "))
			require.NoError(t, err)
			_, err = st.Open(ctx, "j/a/x")
			require.ErrorIs(t, err, ErrNotFound)
			names, err := st.List(ctx, "j/")
			require.NoError(t, err)
			assert.Empty(t, names)
			_, err = w.Write([]byte("world"))
			require.NoError(t, err)
			require.NoError(t, w.Commit())
			require.NoError(t, w.Abort()) // no-op after Commit
			assert.Equal(t, "hello world", string(read(t, st, "j/a/x")))

			// An aborted overwrite leaves the old object; a committed one replaces it.
			w, err = st.Create(ctx, "j/a/x")
			require.NoError(t, err)
			_, err = w.Write([]byte("junk"))
			require.NoError(t, err)
			require.NoError(t, w.Abort())
			assert.Equal(t, "hello world", string(read(t, st, "j/a/x")))
			require.NoError(t, putObject(ctx, st, "j/a/x", []byte("v2")))
			assert.Equal(t, "v2", string(read(t, st, "j/a/x")))

			require.NoError(t, putObject(ctx, st, "j/a/y", nil))
			require.NoError(t, putObject(ctx, st, "j/b/z", []byte("z")))
			require.NoError(t, putObject(ctx, st, "k/z", []byte("z")))
			names, err = st.List(ctx, "j/")
			require.NoError(t, err)
			assert.Equal(t, []string{"j/a/x", "j/a/y", "j/b/z"}, names)
			names, err = st.List(ctx, "j/a")
			require.NoError(t, err)
			assert.Equal(t, []string{"j/a/x", "j/a/y"}, names)
			names, err = st.List(ctx, "nothing/")
			require.NoError(t, err)
			assert.Empty(t, names)
			assert.Empty(t, read(t, st, "j/a/y"))

			require.NoError(t, st.Delete(ctx, "j/a/x"))
			require.NoError(t, st.Delete(ctx, "j/a/x")) // missing is fine
			_, err = st.Open(ctx, "j/a/x")
			require.ErrorIs(t, err, ErrNotFound)
			names, err = st.List(ctx, "")
			require.NoError(t, err)
			assert.Equal(t, []string{"j/a/y", "j/b/z", "k/z"}, names)

			for _, bad := range []string{"", "/a", "a//b", "a/../b", "a/.tmp-x", `a\b`, "a/"} {
				_, err := st.Create(ctx, bad)
				assert.Error(t, err, "name %q", bad)
			}
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			_, err = st.Create(cctx, "j/c")
			assert.ErrorIs(t, err, context.Canceled)
		})
	}
}

func TestFSStorageLeavesNoTempFilesAndCleansUp(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := NewFSStorage(dir)
	require.NoError(t, err)
	w, err := st.Create(ctx, "j/d/x")
	require.NoError(t, err)
	_, err = w.Write([]byte("abandoned"))
	require.NoError(t, err)
	// A writer abandoned by a crashed process leaves a temporary file that List does not show.
	names, err := st.List(ctx, "")
	require.NoError(t, err)
	assert.Empty(t, names)
	n, err := st.RemoveTemp(ctx, "", time.Now().Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	require.NoError(t, putObject(ctx, st, "j/d/y", []byte("y")))
	require.NoError(t, st.Delete(ctx, "j/d/y"))
	_, err = os.Stat(filepath.Join(dir, "j"))
	assert.True(t, errors.Is(err, os.ErrNotExist), "empty directories are removed: %v", err)
}

func TestFaultStorage(t *testing.T) {
	ctx := context.Background()
	t.Run("nth write", func(t *testing.T) {
		f := NewFaultStorage(NewMemStorage())
		f.Inject(Fault{Op: OpWrite, Nth: 2})
		w, err := f.Create(ctx, "a")
		require.NoError(t, err)
		_, err = w.Write([]byte("1"))
		require.NoError(t, err)
		_, err = w.Write([]byte("2"))
		require.ErrorIs(t, err, ErrInjected)
		_, err = w.Write([]byte("3"))
		require.NoError(t, err)
		assert.Equal(t, 3, f.Count(OpWrite))
	})
	t.Run("short write", func(t *testing.T) {
		f := NewFaultStorage(NewMemStorage())
		f.Inject(Fault{Op: OpWrite, Nth: 1, Short: true})
		err := putObject(ctx, f, "a", []byte("abcdef"))
		require.ErrorIs(t, err, ErrInjected)
		_, err = f.Open(ctx, "a")
		require.ErrorIs(t, err, ErrNotFound)
	})
	t.Run("sync and rename", func(t *testing.T) {
		f := NewFaultStorage(NewMemStorage())
		f.Inject(Fault{Op: OpSync, Match: "x", Nth: 1})
		f.Inject(Fault{Op: OpRename, Match: "y", Nth: 1, After: true})
		require.ErrorIs(t, putObject(ctx, f, "x", []byte("x")), ErrInjected)
		_, err := f.Open(ctx, "x")
		require.ErrorIs(t, err, ErrNotFound)
		require.ErrorIs(t, putObject(ctx, f, "y", []byte("y")), ErrInjected)
		assert.Equal(t, "y", string(read(t, f, "y")), "the rename took effect before the error")
	})
	t.Run("disk full", func(t *testing.T) {
		f := NewFaultStorage(NewMemStorage())
		f.SetCapacity(10)
		require.NoError(t, putObject(ctx, f, "a", []byte("123456")))
		err := putObject(ctx, f, "b", []byte("123456"))
		require.ErrorIs(t, err, syscall.ENOSPC)
		require.NoError(t, f.Delete(ctx, "a"))
		require.NoError(t, putObject(ctx, f, "b", []byte("123456")))
	})
	t.Run("held operation", func(t *testing.T) {
		f := NewFaultStorage(NewMemStorage())
		hold, reached := make(chan struct{}), make(chan struct{}, 1)
		f.Inject(Fault{Op: OpOpen, Nth: 1, Hold: hold, Reached: reached})
		require.NoError(t, putObject(ctx, f, "a", []byte("a")))
		done := make(chan error)
		go func() {
			_, err := f.Open(ctx, "a")
			done <- err
		}()
		<-reached
		select {
		case <-done:
			t.Fatal("held operation returned")
		default:
		}
		close(hold)
		require.ErrorIs(t, <-done, ErrInjected)
		assert.Equal(t, "a", string(read(t, f, "a")))
	})
}
