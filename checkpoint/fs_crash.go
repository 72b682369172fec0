package checkpoint

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// CrashFS is an FS in memory that remembers what is durable, for tests of crash safety: the bytes
// of a file are durable once File.Sync has run after they were written, and a directory's entries
// (files and directories created, renamed, linked or removed in it) once SyncDir has run on it
// after the change. Crash returns the file system a machine would find after losing power now:
// only what was durable. A name is durable only if every directory on its path is. Paths are
// slash-separated and absolute ("/ck/job/..."). Safe for concurrent use.
type CrashFS struct {
	mu   sync.Mutex
	root *crashNode
	seq  int
	now  time.Time
}

var _ FS = (*CrashFS)(nil)

// crashNode is a file or a directory. A file's data is what reads see, synced what survives a
// crash; a directory's entries likewise.
type crashNode struct {
	dir            bool
	data, synced   []byte
	entries, dsync map[string]*crashNode
	mod            time.Time
}

func newCrashDir(now time.Time) *crashNode {
	return &crashNode{dir: true, entries: map[string]*crashNode{}, dsync: map[string]*crashNode{}, mod: now}
}

// NewCrashFS returns an empty CrashFS with a durable root directory "/".
func NewCrashFS() *CrashFS {
	now := time.Unix(1_700_000_000, 0)
	return &CrashFS{root: newCrashDir(now), now: now}
}

// Crash returns what survives a power loss now: a new CrashFS holding only the durable state.
// The receiver is left as it is (the process that "died" may go on writing to it; nothing it does
// reaches the returned one).
func (c *CrashFS) Crash() *CrashFS {
	c.mu.Lock()
	defer c.mu.Unlock()
	var clone func(n *crashNode) *crashNode
	seen := map[*crashNode]*crashNode{} // hard links stay one file
	clone = func(n *crashNode) *crashNode {
		if m, ok := seen[n]; ok {
			return m
		}
		if !n.dir {
			m := &crashNode{data: bytes.Clone(n.synced), synced: bytes.Clone(n.synced), mod: n.mod}
			seen[n] = m
			return m
		}
		m := newCrashDir(n.mod)
		seen[n] = m
		for name, e := range n.dsync {
			m.entries[name] = clone(e)
			m.dsync[name] = m.entries[name]
		}
		return m
	}
	return &CrashFS{root: clone(c.root), seq: c.seq, now: c.now}
}

// Advance moves the clock that stamps modification times forward by d.
func (c *CrashFS) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func pathErr(op, name string, err error) error { return &fs.PathError{Op: op, Path: name, Err: err} }

// split cleans name into its components.
func (c *CrashFS) split(name string) ([]string, error) {
	if !strings.HasPrefix(name, "/") {
		return nil, fmt.Errorf("crashfs: %q is not absolute", name)
	}
	p := path.Clean(name)
	if p == "/" {
		return nil, nil
	}
	return strings.Split(p[1:], "/"), nil
}

// lookupLocked returns the node at name, or nil.
func (c *CrashFS) lookupLocked(name string) (*crashNode, error) {
	parts, err := c.split(name)
	if err != nil {
		return nil, err
	}
	n := c.root
	for _, p := range parts {
		if !n.dir {
			return nil, pathErr("lookup", name, syscall.ENOTDIR)
		}
		if n = n.entries[p]; n == nil {
			return nil, pathErr("lookup", name, fs.ErrNotExist)
		}
	}
	return n, nil
}

// parentLocked returns the directory holding name and name's last component.
func (c *CrashFS) parentLocked(op, name string) (*crashNode, string, error) {
	parts, err := c.split(name)
	if err != nil {
		return nil, "", err
	}
	if len(parts) == 0 {
		return nil, "", pathErr(op, name, fs.ErrInvalid)
	}
	dir, err := c.lookupLocked("/" + strings.Join(parts[:len(parts)-1], "/"))
	if err != nil {
		return nil, "", pathErr(op, name, fs.ErrNotExist)
	}
	if !dir.dir {
		return nil, "", pathErr(op, name, syscall.ENOTDIR)
	}
	return dir, parts[len(parts)-1], nil
}

// MkdirAll implements FS.
func (c *CrashFS) MkdirAll(name string) error {
	parts, err := c.split(name)
	if err != nil {
		return err
	}
	for i := range parts {
		p := "/" + strings.Join(parts[:i+1], "/")
		if err := c.Mkdir(p); err != nil && !isExist(err) {
			return err
		}
	}
	return nil
}

func isExist(err error) bool {
	pe, ok := err.(*fs.PathError)
	return ok && pe.Err == fs.ErrExist
}

// Mkdir implements FS.
func (c *CrashFS) Mkdir(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	dir, base, err := c.parentLocked("mkdir", name)
	if err != nil {
		return err
	}
	if dir.entries[base] != nil {
		return pathErr("mkdir", name, fs.ErrExist)
	}
	dir.entries[base] = newCrashDir(c.now)
	return nil
}

// Stat implements FS.
func (c *CrashFS) Stat(name string) (fs.FileInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.lookupLocked(name)
	if err != nil {
		return nil, pathErr("stat", name, fs.ErrNotExist)
	}
	return infoOf(path.Base(name), n), nil
}

// CreateTemp implements FS.
func (c *CrashFS) CreateTemp(dir, pattern string) (File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	base := pattern + fmt.Sprint(c.seq)
	if i := strings.LastIndexByte(pattern, '*'); i >= 0 {
		base = pattern[:i] + fmt.Sprint(c.seq) + pattern[i+1:]
	}
	name := path.Join(dir, base)
	d, b, err := c.parentLocked("createtemp", name)
	if err != nil {
		return nil, err
	}
	n := &crashNode{mod: c.now}
	d.entries[b] = n
	return &crashFile{c: c, n: n, name: name}, nil
}

type crashFile struct {
	c      *CrashFS
	n      *crashNode
	name   string
	closed bool
}

func (f *crashFile) Name() string { return f.name }

func (f *crashFile) Write(p []byte) (int, error) {
	f.c.mu.Lock()
	defer f.c.mu.Unlock()
	if f.closed {
		return 0, pathErr("write", f.name, fs.ErrClosed)
	}
	f.n.data = append(f.n.data, p...)
	f.n.mod = f.c.now
	return len(p), nil
}

func (f *crashFile) Sync() error {
	f.c.mu.Lock()
	defer f.c.mu.Unlock()
	if f.closed {
		return pathErr("sync", f.name, fs.ErrClosed)
	}
	f.n.synced = bytes.Clone(f.n.data)
	return nil
}

func (f *crashFile) Close() error {
	f.c.mu.Lock()
	defer f.c.mu.Unlock()
	if f.closed {
		return pathErr("close", f.name, fs.ErrClosed)
	}
	f.closed = true
	return nil
}

// Open implements FS.
func (c *CrashFS) Open(name string) (io.ReadCloser, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.lookupLocked(name)
	if err != nil {
		return nil, pathErr("open", name, fs.ErrNotExist)
	}
	if n.dir {
		return nil, pathErr("open", name, syscall.EISDIR)
	}
	return io.NopCloser(bytes.NewReader(bytes.Clone(n.data))), nil
}

// Rename implements FS.
func (c *CrashFS) Rename(oldname, newname string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	od, ob, err := c.parentLocked("rename", oldname)
	if err != nil {
		return err
	}
	n := od.entries[ob]
	if n == nil {
		return pathErr("rename", oldname, fs.ErrNotExist)
	}
	nd, nb, err := c.parentLocked("rename", newname)
	if err != nil {
		return err
	}
	if t := nd.entries[nb]; t != nil && t.dir {
		return pathErr("rename", newname, syscall.EISDIR)
	}
	delete(od.entries, ob)
	nd.entries[nb] = n
	return nil
}

// Link implements FS.
func (c *CrashFS) Link(oldname, newname string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.lookupLocked(oldname)
	if err != nil {
		return pathErr("link", oldname, fs.ErrNotExist)
	}
	nd, nb, err := c.parentLocked("link", newname)
	if err != nil {
		return err
	}
	if nd.entries[nb] != nil {
		return pathErr("link", newname, fs.ErrExist)
	}
	nd.entries[nb] = n
	return nil
}

// Remove implements FS.
func (c *CrashFS) Remove(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, b, err := c.parentLocked("remove", name)
	if err != nil {
		return err
	}
	n := d.entries[b]
	if n == nil {
		return pathErr("remove", name, fs.ErrNotExist)
	}
	if n.dir && len(n.entries) > 0 {
		return pathErr("remove", name, syscall.ENOTEMPTY)
	}
	delete(d.entries, b)
	return nil
}

// ReadDir implements FS.
func (c *CrashFS) ReadDir(name string) ([]fs.DirEntry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.lookupLocked(name)
	if err != nil {
		return nil, pathErr("readdir", name, fs.ErrNotExist)
	}
	if !n.dir {
		return nil, pathErr("readdir", name, syscall.ENOTDIR)
	}
	out := make([]fs.DirEntry, 0, len(n.entries))
	for b, e := range n.entries {
		out = append(out, fs.FileInfoToDirEntry(infoOf(b, e)))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out, nil
}

// SyncDir implements FS.
func (c *CrashFS) SyncDir(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.lookupLocked(name)
	if err != nil {
		return pathErr("sync", name, fs.ErrNotExist)
	}
	if !n.dir {
		return pathErr("sync", name, syscall.ENOTDIR)
	}
	n.dsync = make(map[string]*crashNode, len(n.entries))
	for b, e := range n.entries {
		n.dsync[b] = e
	}
	return nil
}

// crashInfo describes a node as it was when asked (its size is what reads see).
type crashInfo struct {
	name string
	dir  bool
	size int64
	mod  time.Time
}

// infoOf describes n; the caller holds mu.
func infoOf(name string, n *crashNode) crashInfo {
	return crashInfo{name: name, dir: n.dir, size: int64(len(n.data)), mod: n.mod}
}

func (i crashInfo) Name() string { return i.name }
func (i crashInfo) Size() int64  { return i.size }
func (i crashInfo) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o755
	}
	return 0o644
}
func (i crashInfo) ModTime() time.Time { return i.mod }
func (i crashInfo) IsDir() bool        { return i.dir }
func (i crashInfo) Sys() any           { return nil }
