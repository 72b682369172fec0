package rpc

import "github.com/elasticps/elasticps/internal/wire"

// Buffer is a handler's response under construction. Its storage comes from
// the server's buffer pool and returns there once the response is written,
// so a handler builds large responses without allocating. A Buffer belongs
// to one handler invocation: do not keep it, or any slice obtained from it,
// after the handler returns.
type Buffer struct {
	b    []byte
	pool *wire.Pool
}

// Extend appends n bytes to the response and returns them for the handler to
// fill in place (for example with binary.LittleEndian.PutUint32 or copy).
// Their contents are not zeroed: write every byte. A later Extend or Write
// may move the response, so fill the returned slice before calling them
// again.
func (b *Buffer) Extend(n int) []byte {
	if n < 0 {
		n = 0
	}
	l := len(b.b)
	if cap(b.b)-l < n {
		nb := b.pool.Get(max(l+n, 2*cap(b.b)))
		copy(nb, b.b)
		b.pool.Put(b.b)
		b.b = nb[:l]
	}
	b.b = b.b[:l+n]
	return b.b[l : l+n : l+n]
}

// Write appends p to the response. It never fails; it makes Buffer an
// io.Writer for encoders.
func (b *Buffer) Write(p []byte) (int, error) {
	copy(b.Extend(len(p)), p)
	return len(p), nil
}

// Bytes returns the response so far. It aliases the buffer.
func (b *Buffer) Bytes() []byte { return b.b }

// Len returns the response length so far.
func (b *Buffer) Len() int { return len(b.b) }

// Reset empties the response, keeping its storage.
func (b *Buffer) Reset() { b.b = b.b[:0] }

// Truncate shortens the response to n bytes (no-op if it is not longer), keeping its storage:
// a handler can Extend by as much as it may write, fill part of it, and give back the rest.
func (b *Buffer) Truncate(n int) {
	if n >= 0 && n < len(b.b) {
		b.b = b.b[:n]
	}
}

// release hands the storage back to the pool.
func (b *Buffer) release() {
	b.pool.Put(b.b)
	b.b = nil
}
