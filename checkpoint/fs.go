package checkpoint

import (
	"io"
	"io/fs"
	"os"
)

// FS is the file system FSStorage works on: the few calls it makes, so that a test can put a
// crash-simulating file system (CrashFS) under it. Names are absolute paths of the host's form.
// OSFS is the real one. Errors for a missing file or a name taken wrap fs.ErrNotExist and
// fs.ErrExist.
type FS interface {
	// MkdirAll creates a directory and its missing parents (not made durable).
	MkdirAll(name string) error
	// Mkdir creates one directory; its parent must exist.
	Mkdir(name string) error
	// Stat describes a file or directory.
	Stat(name string) (fs.FileInfo, error)
	// CreateTemp creates a new file in dir named by pattern, whose last "*" becomes a unique string.
	CreateTemp(dir, pattern string) (File, error)
	// Open opens a file for reading.
	Open(name string) (io.ReadCloser, error)
	// Rename replaces newname with oldname, atomically.
	Rename(oldname, newname string) error
	// Link makes newname another name of the file oldname; it fails if newname exists.
	Link(oldname, newname string) error
	// Remove removes a file or an empty directory.
	Remove(name string) error
	// ReadDir lists a directory, sorted by name.
	ReadDir(name string) ([]fs.DirEntry, error)
	// SyncDir makes the entries of a directory (files created, renamed or removed in it) durable.
	SyncDir(name string) error
}

// File is a file being written through an FS.
type File interface {
	io.Writer
	// Name returns the file's path.
	Name() string
	// Sync makes the bytes written durable.
	Sync() error
	Close() error
}

// OSFS is the host's file system.
type OSFS struct{}

var _ FS = OSFS{}

// MkdirAll implements FS.
func (OSFS) MkdirAll(name string) error { return os.MkdirAll(name, 0o755) }

// Mkdir implements FS.
func (OSFS) Mkdir(name string) error { return os.Mkdir(name, 0o755) }

// Stat implements FS.
func (OSFS) Stat(name string) (fs.FileInfo, error) { return os.Stat(name) }

// CreateTemp implements FS.
func (OSFS) CreateTemp(dir, pattern string) (File, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// Open implements FS.
func (OSFS) Open(name string) (io.ReadCloser, error) { return os.Open(name) }

// Rename implements FS.
func (OSFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

// Link implements FS.
func (OSFS) Link(oldname, newname string) error { return os.Link(oldname, newname) }

// Remove implements FS.
func (OSFS) Remove(name string) error { return os.Remove(name) }

// ReadDir implements FS.
func (OSFS) ReadDir(name string) ([]fs.DirEntry, error) { return os.ReadDir(name) }

// SyncDir implements FS.
func (OSFS) SyncDir(name string) error {
	d, err := os.Open(name)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
