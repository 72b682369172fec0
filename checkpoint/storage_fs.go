package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// FSStorage is a Storage on a local or shared file system (a POSIX file system with atomic rename).
// Each object is a file under the root directory. Create writes a temporary file ".tmp-*" in the
// object's directory; Commit fsyncs it, renames it over the name and fsyncs the directory, so a
// committed object survives a crash and a torn one is never visible under its name. Directories it
// creates are fsynced into their parents. It is safe for concurrent use. It works on the host's
// file system, or on any FS (NewFSStorageOn), such as a CrashFS that keeps only what was made
// durable.
type FSStorage struct {
	fs   FS
	root string
}

var _ Storage = (*FSStorage)(nil)

// NewFSStorage returns a Storage rooted at dir on the host's file system, creating dir if needed.
func NewFSStorage(dir string) (*FSStorage, error) { return NewFSStorageOn(OSFS{}, dir) }

// NewFSStorageOn returns a Storage rooted at dir on fsys, creating dir if needed (and making its
// entry in its parent durable).
func NewFSStorageOn(fsys FS, dir string) (*FSStorage, error) {
	if dir == "" {
		return nil, errors.New("checkpoint: FSStorage needs a directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: storage dir: %w", err)
	}
	if _, err := fsys.Stat(abs); err != nil {
		if err := fsys.MkdirAll(abs); err != nil {
			return nil, fmt.Errorf("checkpoint: storage dir: %w", err)
		}
		if err := fsys.SyncDir(filepath.Dir(abs)); err != nil {
			return nil, fmt.Errorf("checkpoint: storage dir: %w", err)
		}
	}
	return &FSStorage{fs: fsys, root: abs}, nil
}

// Root returns the storage's root directory.
func (s *FSStorage) Root() string { return s.root }

func (s *FSStorage) path(name string) (string, error) {
	if err := validName(name); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	return filepath.Join(s.root, filepath.FromSlash(name)), nil
}

// Create implements Storage.
func (s *FSStorage) Create(ctx context.Context, name string) (Writer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := s.path(name)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(p)
	// A concurrent Delete may remove a directory that it emptied between mkdirAll and CreateTemp.
	for attempt := 0; ; attempt++ {
		if err := s.mkdirAll(dir); err != nil {
			return nil, err
		}
		f, err := s.fs.CreateTemp(dir, ".tmp-"+filepath.Base(p)+"-*")
		if err == nil {
			return &fsWriter{fs: s.fs, f: f, final: p, dir: dir}, nil
		}
		if !errors.Is(err, fs.ErrNotExist) || attempt == 3 {
			return nil, err
		}
	}
}

// mkdirAll creates dir and its missing parents below the root, fsyncing each parent that gained an entry.
func (s *FSStorage) mkdirAll(dir string) error {
	if _, err := s.fs.Stat(dir); err == nil {
		return nil
	}
	rel, err := filepath.Rel(s.root, dir)
	if err != nil {
		return err
	}
	cur := s.root
	for _, c := range strings.Split(rel, string(filepath.Separator)) {
		next := filepath.Join(cur, c)
		err := s.fs.Mkdir(next)
		switch {
		case err == nil:
			if err := s.fs.SyncDir(cur); err != nil {
				return err
			}
		case !errors.Is(err, fs.ErrExist):
			return err
		}
		cur = next
	}
	return nil
}

type fsWriter struct {
	fs    FS
	f     File
	final string
	dir   string
	done  bool
}

func (w *fsWriter) Write(p []byte) (int, error) {
	if w.done {
		return 0, fs.ErrClosed
	}
	return w.f.Write(p)
}

// Commit makes the bytes durable before the name points to them: fsync, rename, fsync of the
// directory. (A rename before the fsync could leave the name pointing to a file whose bytes a
// crash lost.)
func (w *fsWriter) Commit() error {
	if w.done {
		return fs.ErrClosed
	}
	w.done = true
	tmp := w.f.Name()
	if err := w.f.Sync(); err != nil {
		w.f.Close()
		w.fs.Remove(tmp)
		return err
	}
	if err := w.f.Close(); err != nil {
		w.fs.Remove(tmp)
		return err
	}
	if err := w.fs.Rename(tmp, w.final); err != nil {
		w.fs.Remove(tmp)
		return err
	}
	return w.fs.SyncDir(w.dir)
}

func (w *fsWriter) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	w.f.Close()
	return w.fs.Remove(w.f.Name())
}

// Open implements Storage.
func (s *FSStorage) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := s.path(name)
	if err != nil {
		return nil, err
	}
	f, err := s.fs.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	return f, err
}

// List implements Storage. Temporary files are not listed.
func (s *FSStorage) List(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	start := s.root
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		if err := validName(prefix[:i]); err != nil {
			return nil, fmt.Errorf("checkpoint: list prefix: %w", err)
		}
		start = filepath.Join(s.root, filepath.FromSlash(prefix[:i]))
	}
	var names []string
	err := s.walk(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() || strings.HasPrefix(d.Name(), ".tmp") {
			return nil
		}
		rel, err := filepath.Rel(s.root, p)
		if err != nil {
			return err
		}
		if name := filepath.ToSlash(rel); strings.HasPrefix(name, prefix) {
			names = append(names, name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	return names, nil
}

// Delete implements Storage. It also removes directories the deletion leaves empty.
func (s *FSStorage) Delete(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := s.path(name)
	if err != nil {
		return err
	}
	if err := s.fs.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	dir := filepath.Dir(p)
	if err := s.fs.SyncDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for dir != s.root && strings.HasPrefix(dir, s.root) {
		if s.fs.Remove(dir) != nil {
			break
		}
		dir = filepath.Dir(dir)
	}
	return nil
}

// walk calls fn for start and everything below it, in lexical order, as filepath.WalkDir does
// (fn's error for start itself when it cannot be read; fs.SkipDir is not used here).
func (s *FSStorage) walk(start string, fn func(p string, d fs.DirEntry, err error) error) error {
	entries, err := s.fs.ReadDir(start)
	if err != nil {
		return fn(start, nil, err)
	}
	for _, e := range entries {
		p := filepath.Join(start, e.Name())
		if e.IsDir() {
			if err := s.walk(p, fn); err != nil {
				return err
			}
			continue
		}
		if err := fn(p, e, nil); err != nil {
			return err
		}
	}
	return nil
}

var _ TempRemover = (*FSStorage)(nil)

// RemoveTemp implements TempRemover: it deletes the temporary files in the directory of prefix
// ("job/" for a job's, "" for all) and below it, left
// by writers that never finished (a crashed process) and last modified before cutoff. Writers
// still running are not disturbed if cutoff is older than they are.
func (s *FSStorage) RemoveTemp(ctx context.Context, prefix string, cutoff time.Time) (int, error) {
	start := s.root
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		if err := validName(prefix[:i]); err != nil {
			return 0, fmt.Errorf("checkpoint: remove temporary files: %w", err)
		}
		start = filepath.Join(s.root, filepath.FromSlash(prefix[:i]))
	}
	n := 0
	err := s.walk(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() || !strings.HasPrefix(d.Name(), ".tmp") {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if info.ModTime().Before(cutoff) && s.fs.Remove(p) == nil {
			n++
		}
		return nil
	})
	return n, err
}

var _ ExclusiveStorage = (*FSStorage)(nil)

// PutNew implements ExclusiveStorage: the bytes go to a temporary file, fsynced, then are linked
// under name (a hard link fails if the name exists, atomically), and the directory is fsynced.
func (s *FSStorage) PutNew(ctx context.Context, name string, data []byte) error {
	w, err := s.Create(ctx, name)
	if err != nil {
		return err
	}
	fw := w.(*fsWriter)
	tmp := fw.f.Name()
	defer s.fs.Remove(tmp)
	fw.done = true
	if _, err := fw.f.Write(data); err != nil {
		fw.f.Close()
		return err
	}
	if err := fw.f.Sync(); err != nil {
		fw.f.Close()
		return err
	}
	if err := fw.f.Close(); err != nil {
		return err
	}
	if err := s.fs.Link(tmp, fw.final); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("checkpoint: %s: %w", name, fs.ErrExist)
		}
		return err
	}
	return s.fs.SyncDir(fw.dir)
}
