package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Storage holds checkpoint objects under slash-separated names such as
// "job/data/00000000000000000100/ps-0/1f2e3d4c5b6a7988/manifest".
//
// Atomicity: an object becomes visible only when its Writer's Commit returns nil, and then as a whole
// and durably — after Commit returns, a crash of the process or the machine leaves the complete
// object. Until then nothing is visible under the name; an earlier object of the same name stays
// until Commit replaces it in one step. A writer that fails, is aborted or is abandoned leaves nothing
// visible (an implementation may leave invisible temporary data behind and should clean it up).
//
// Open returns an error wrapping ErrNotFound for a missing object; Delete of a missing object is not
// an error; List returns the committed names that start with prefix, sorted. All methods are safe for
// concurrent use and should honour ctx. Slices passed to Write are not retained.
type Storage interface {
	// Create starts a new object; nothing is visible until the Writer's Commit succeeds.
	Create(ctx context.Context, name string) (Writer, error)
	// Open reads a committed object.
	Open(ctx context.Context, name string) (io.ReadCloser, error)
	// List returns the names of committed objects that start with prefix, in ascending order.
	List(ctx context.Context, prefix string) ([]string, error)
	// Delete removes an object.
	Delete(ctx context.Context, name string) error
}

// Writer is an object being written. Exactly one of Commit or Abort ends it; Abort after Commit does
// nothing. A Writer is used by one goroutine at a time.
type Writer interface {
	io.Writer
	// Commit makes the written bytes durable and visible under the name, atomically.
	Commit() error
	// Abort discards the written bytes.
	Abort() error
}

// validName reports whether name can be used as a Storage name: non-empty slash-separated components,
// none of them ".", ".." or starting with ".tmp", and no backslash or NUL.
func validName(name string) error {
	if name == "" {
		return errors.New("empty name")
	}
	if strings.ContainsAny(name, "\\\x00") {
		return fmt.Errorf("name %q holds a backslash or NUL", name)
	}
	for _, c := range strings.Split(name, "/") {
		if c == "" || c == "." || c == ".." || strings.HasPrefix(c, ".tmp") {
			return fmt.Errorf("bad component %q in name %q", c, name)
		}
	}
	return nil
}

// putObject writes data to name and commits it.
func putObject(ctx context.Context, st Storage, name string, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w, err := st.Create(ctx, name)
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	for off := 0; off < len(data); {
		if err := ctx.Err(); err != nil {
			_ = w.Abort()
			return err
		}
		end := min(off+writeBlock, len(data))
		n, err := w.Write(data[off:end])
		if err == nil && n != end-off {
			err = io.ErrShortWrite
		}
		if err != nil {
			_ = w.Abort()
			return fmt.Errorf("write %s: %w", name, err)
		}
		off = end
	}
	if err := w.Commit(); err != nil {
		_ = w.Abort()
		return fmt.Errorf("commit %s: %w", name, err)
	}
	return nil
}

// writeBlock is the largest slice handed to one Writer.Write, so a long write notices ctx.
const writeBlock = 4 << 20

// getObject reads the object name into dst[:0] (grown as needed). A known size (>= 0) is checked
// exactly; limit bounds the bytes read when the size is unknown.
func getObject(ctx context.Context, st Storage, name string, dst []byte, size, limit int64) ([]byte, error) {
	r, err := st.Open(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	defer r.Close()
	if size >= 0 {
		limit = size
		if int64(cap(dst)) < size+1 {
			dst = make([]byte, 0, size+1)
		}
	}
	buf := dst[:0]
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return nil, corruptf("%s: longer than %d bytes", name, limit)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	if size >= 0 && int64(len(buf)) != size {
		return nil, corruptf("%s: %d bytes, want %d", name, len(buf), size)
	}
	return buf, nil
}
