package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// FSStorage is a Storage on a local or shared file system (a POSIX file system with atomic rename).
// Each object is a file under the root directory. Create writes a temporary file ".tmp-*" in the
// object's directory; Commit fsyncs it, renames it over the name and fsyncs the directory, so a
// committed object survives a crash and a torn one is never visible under its name. Directories it
// creates are fsynced into their parents. It is safe for concurrent use.
type FSStorage struct {
	root string
}

var _ Storage = (*FSStorage)(nil)

// NewFSStorage returns a Storage rooted at dir, creating dir if needed.
func NewFSStorage(dir string) (*FSStorage, error) {
	if dir == "" {
		return nil, errors.New("checkpoint: FSStorage needs a directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: storage dir: %w", err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint: storage dir: %w", err)
	}
	return &FSStorage{root: abs}, nil
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
		f, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(p)+"-*")
		if err == nil {
			return &fsWriter{f: f, final: p, dir: dir}, nil
		}
		if !errors.Is(err, fs.ErrNotExist) || attempt == 3 {
			return nil, err
		}
	}
}

// mkdirAll creates dir and its missing parents below the root, fsyncing each parent that gained an entry.
func (s *FSStorage) mkdirAll(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	rel, err := filepath.Rel(s.root, dir)
	if err != nil {
		return err
	}
	cur := s.root
	for _, c := range strings.Split(rel, string(filepath.Separator)) {
		next := filepath.Join(cur, c)
		err := os.Mkdir(next, 0o755)
		switch {
		case err == nil:
			if err := syncDir(cur); err != nil {
				return err
			}
		case !errors.Is(err, fs.ErrExist):
			return err
		}
		cur = next
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

type fsWriter struct {
	f     *os.File
	final string
	dir   string
	done  bool
}

func (w *fsWriter) Write(p []byte) (int, error) {
	if w.done {
		return 0, os.ErrClosed
	}
	return w.f.Write(p)
}

func (w *fsWriter) Commit() error {
	if w.done {
		return os.ErrClosed
	}
	w.done = true
	tmp := w.f.Name()
	if err := w.f.Sync(); err != nil {
		w.f.Close()
		os.Remove(tmp)
		return err
	}
	if err := w.f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, w.final); err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(w.dir)
}

func (w *fsWriter) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	w.f.Close()
	return os.Remove(w.f.Name())
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
	f, err := os.Open(p)
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
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
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
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	dir := filepath.Dir(p)
	if err := syncDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for dir != s.root && strings.HasPrefix(dir, s.root) {
		if os.Remove(dir) != nil {
			break
		}
		dir = filepath.Dir(dir)
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
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
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
		if info.ModTime().Before(cutoff) && os.Remove(p) == nil {
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
	defer os.Remove(tmp)
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
	if err := os.Link(tmp, fw.final); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("checkpoint: %s: %w", name, fs.ErrExist)
		}
		return err
	}
	return syncDir(fw.dir)
}
