package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"
	"sync"
)

// MemStorage is a Storage in memory, for tests and examples. Commit publishes a private copy of the
// written bytes, so it is atomic like FSStorage; nothing survives the process. Safe for concurrent use.
type MemStorage struct {
	mu   sync.Mutex
	objs map[string][]byte
}

var _ Storage = (*MemStorage)(nil)

// NewMemStorage returns an empty MemStorage.
func NewMemStorage() *MemStorage { return &MemStorage{objs: map[string][]byte{}} }

// Create implements Storage.
func (m *MemStorage) Create(ctx context.Context, name string) (Writer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return &memWriter{m: m, name: name}, nil
}

type memWriter struct {
	m    *MemStorage
	name string
	buf  []byte
	done bool
}

var errWriterDone = errors.New("checkpoint: writer already committed or aborted")

func (w *memWriter) Write(p []byte) (int, error) {
	if w.done {
		return 0, errWriterDone
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

func (w *memWriter) Commit() error {
	if w.done {
		return errWriterDone
	}
	w.done = true
	w.m.mu.Lock()
	w.m.objs[w.name] = w.buf
	w.m.mu.Unlock()
	w.buf = nil
	return nil
}

func (w *memWriter) Abort() error {
	w.done = true
	w.buf = nil
	return nil
}

// Open implements Storage.
func (m *MemStorage) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	b, ok := m.objs[name]
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// List implements Storage.
func (m *MemStorage) List(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	var names []string
	for n := range m.objs {
		if strings.HasPrefix(n, prefix) {
			names = append(names, n)
		}
	}
	m.mu.Unlock()
	sort.Strings(names)
	return names, nil
}

// Delete implements Storage.
func (m *MemStorage) Delete(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.objs, name)
	m.mu.Unlock()
	return nil
}

// Update replaces the bytes of an existing object with fn's result, as a test's stand-in for media
// corruption or a storage that broke its atomicity. fn receives a copy.
func (m *MemStorage) Update(name string, fn func([]byte) []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[name]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	m.objs[name] = fn(append([]byte(nil), b...))
	return nil
}

var _ ExclusiveStorage = (*MemStorage)(nil)

// PutNew implements ExclusiveStorage.
func (m *MemStorage) PutNew(ctx context.Context, name string, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validName(name); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.objs[name]; ok {
		return fmt.Errorf("checkpoint: %s: %w", name, fs.ErrExist)
	}
	m.objs[name] = bytes.Clone(data)
	return nil
}
