package checkpoint

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
)

// Op names a Storage operation a Fault can hit.
type Op uint8

const (
	// OpCreate is Storage.Create.
	OpCreate Op = iota + 1
	// OpWrite is one Writer.Write.
	OpWrite
	// OpSync is the flush-to-stable-storage step at the start of Writer.Commit.
	OpSync
	// OpRename is the publish step of Writer.Commit that makes the object visible.
	OpRename
	// OpOpen is Storage.Open.
	OpOpen
	// OpRead is one Read of an opened object.
	OpRead
	// OpList is Storage.List.
	OpList
	// OpDelete is Storage.Delete.
	OpDelete
	opCount
)

func (o Op) String() string {
	names := [...]string{"?", "create", "write", "sync", "rename", "open", "read", "list", "delete"}
	if int(o) < len(names) {
		return names[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Fault describes an injected failure.
type Fault struct {
	// Op is the operation to fail.
	Op Op
	// Match restricts the fault to names containing this substring ("" matches every name).
	Match string
	// Nth fires the fault on the Nth matching operation after Inject (1-based); 0 fires on every one.
	Nth int
	// Err is the error returned; nil means ErrInjected.
	Err error
	// After lets the operation take effect before Err is returned: a rename (or delete, write) that
	// happened although the caller saw an error.
	After bool
	// Short makes an OpWrite write only half of its bytes before failing.
	Short bool
	// Hold, when non-nil, blocks the operation until Hold is closed and then fails it: the goroutine is
	// stuck mid-write, as in a process that died there. Reached, when non-nil, receives one value
	// (without blocking) when the fault fires.
	Hold    <-chan struct{}
	Reached chan<- struct{}
}

type faultState struct {
	Fault
	seen int
}

// FaultStorage wraps a Storage and fails chosen operations, for tests: the Nth write, sync or rename,
// short writes, a full disk (SetCapacity), and goroutines held mid-operation (Fault.Hold). It is safe for
// concurrent use.
type FaultStorage struct {
	inner Storage

	mu       sync.Mutex
	faults   []*faultState
	counts   [opCount]int
	capacity int64 // 0: unlimited
	used     int64
	sizes    map[string]int64
}

var _ Storage = (*FaultStorage)(nil)

// NewFaultStorage wraps inner with no faults injected.
func NewFaultStorage(inner Storage) *FaultStorage {
	return &FaultStorage{inner: inner, sizes: map[string]int64{}}
}

// Inject adds a fault.
func (f *FaultStorage) Inject(ft Fault) {
	f.mu.Lock()
	f.faults = append(f.faults, &faultState{Fault: ft})
	f.mu.Unlock()
}

// Clear removes every fault and the capacity limit.
func (f *FaultStorage) Clear() {
	f.mu.Lock()
	f.faults = nil
	f.capacity = 0
	f.mu.Unlock()
}

// SetCapacity limits the bytes held by objects written through f (committed plus being written); a
// write beyond it writes what fits and fails with an error wrapping syscall.ENOSPC. 0 is unlimited.
func (f *FaultStorage) SetCapacity(n int64) {
	f.mu.Lock()
	f.capacity = n
	f.mu.Unlock()
}

// Count returns how many operations of kind op were attempted.
func (f *FaultStorage) Count(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if op >= opCount {
		return 0
	}
	return f.counts[op]
}

// hit counts an operation and returns the fault it triggers, if any.
func (f *FaultStorage) hit(op Op, name string) *Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts[op]++
	for _, s := range f.faults {
		if s.Op != op || !strings.Contains(name, s.Match) {
			continue
		}
		s.seen++
		if s.Nth == 0 || s.seen == s.Nth {
			ft := s.Fault
			return &ft
		}
	}
	return nil
}

// fire waits on a held fault and returns its error.
func (ft *Fault) fire(op Op, name string) error {
	if ft.Reached != nil {
		select {
		case ft.Reached <- struct{}{}:
		default:
		}
	}
	if ft.Hold != nil {
		<-ft.Hold
	}
	err := ft.Err
	if err == nil {
		err = ErrInjected
	}
	return fmt.Errorf("%s %s: %w", op, name, err)
}

// Create implements Storage.
func (f *FaultStorage) Create(ctx context.Context, name string) (Writer, error) {
	ft := f.hit(OpCreate, name)
	if ft != nil && !ft.After {
		return nil, ft.fire(OpCreate, name)
	}
	w, err := f.inner.Create(ctx, name)
	if err != nil {
		return nil, err
	}
	if ft != nil {
		w.Abort()
		return nil, ft.fire(OpCreate, name)
	}
	return &faultWriter{f: f, w: w, name: name}, nil
}

type faultWriter struct {
	f       *FaultStorage
	w       Writer
	name    string
	written int64
	done    bool
}

func (w *faultWriter) Write(p []byte) (int, error) {
	f := w.f
	ft := f.hit(OpWrite, w.name)
	n := len(p)
	var limitErr error
	f.mu.Lock()
	if f.capacity > 0 && f.used+int64(n) > f.capacity {
		n = int(max(f.capacity-f.used, 0))
		limitErr = fmt.Errorf("write %s: %w", w.name, syscall.ENOSPC)
	}
	f.mu.Unlock()
	if ft != nil {
		switch {
		case ft.Short:
			n = min(n, len(p)/2)
		case !ft.After:
			n = 0
		}
	}
	m, err := w.w.Write(p[:n])
	f.mu.Lock()
	f.used += int64(m)
	f.mu.Unlock()
	w.written += int64(m)
	if err != nil {
		return m, err
	}
	if ft != nil {
		return m, ft.fire(OpWrite, w.name)
	}
	if limitErr != nil {
		return m, limitErr
	}
	return m, nil
}

func (w *faultWriter) Commit() error {
	f := w.f
	if ft := f.hit(OpSync, w.name); ft != nil {
		w.release()
		return ft.fire(OpSync, w.name)
	}
	ft := f.hit(OpRename, w.name)
	if ft != nil && !ft.After {
		w.release()
		return ft.fire(OpRename, w.name)
	}
	if err := w.w.Commit(); err != nil {
		w.release()
		return err
	}
	w.done = true
	f.mu.Lock()
	f.used -= f.sizes[w.name]
	f.sizes[w.name] = w.written
	f.mu.Unlock()
	if ft != nil {
		return ft.fire(OpRename, w.name)
	}
	return nil
}

// release aborts the inner writer and frees the bytes it held.
func (w *faultWriter) release() {
	if w.done {
		return
	}
	w.done = true
	w.w.Abort()
	w.f.mu.Lock()
	w.f.used -= w.written
	w.f.mu.Unlock()
}

func (w *faultWriter) Abort() error {
	w.release()
	return nil
}

// Open implements Storage.
func (f *FaultStorage) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if ft := f.hit(OpOpen, name); ft != nil {
		return nil, ft.fire(OpOpen, name)
	}
	r, err := f.inner.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	return &faultReader{f: f, r: r, name: name}, nil
}

type faultReader struct {
	f    *FaultStorage
	r    io.ReadCloser
	name string
}

func (r *faultReader) Read(p []byte) (int, error) {
	if ft := r.f.hit(OpRead, r.name); ft != nil {
		return 0, ft.fire(OpRead, r.name)
	}
	return r.r.Read(p)
}

func (r *faultReader) Close() error { return r.r.Close() }

// List implements Storage.
func (f *FaultStorage) List(ctx context.Context, prefix string) ([]string, error) {
	if ft := f.hit(OpList, prefix); ft != nil {
		return nil, ft.fire(OpList, prefix)
	}
	return f.inner.List(ctx, prefix)
}

// Delete implements Storage.
func (f *FaultStorage) Delete(ctx context.Context, name string) error {
	ft := f.hit(OpDelete, name)
	if ft != nil && !ft.After {
		return ft.fire(OpDelete, name)
	}
	if err := f.inner.Delete(ctx, name); err != nil {
		return err
	}
	f.mu.Lock()
	f.used -= f.sizes[name]
	delete(f.sizes, name)
	f.mu.Unlock()
	if ft != nil {
		return ft.fire(OpDelete, name)
	}
	return nil
}

var _ ExclusiveStorage = (*FaultStorage)(nil)

// PutNew implements ExclusiveStorage when the wrapped storage does; a create fault fails it
// before anything is stored.
func (f *FaultStorage) PutNew(ctx context.Context, name string, data []byte) error {
	ex, ok := f.inner.(ExclusiveStorage)
	if !ok {
		return fmt.Errorf("checkpoint: %T cannot create objects exclusively", f.inner)
	}
	if ft := f.hit(OpCreate, name); ft != nil {
		return ft.fire(OpCreate, name)
	}
	return ex.PutNew(ctx, name, data)
}
