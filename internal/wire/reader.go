package wire

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// DefaultReadBufferSize is the size of a Reader's read-ahead buffer when
// ReaderOptions.BufferSize is not positive: 64 KiB.
const DefaultReadBufferSize = 64 << 10

// ReaderOptions configure a Reader.
type ReaderOptions struct {
	// Pool supplies payload buffers. Nil means a private pool.
	Pool *Pool
	// MaxFrameSize is the payload limit in bytes, applied both to the size
	// on the wire and to the size after decompression. Non-positive means
	// DefaultMaxFrameSize.
	MaxFrameSize int
	// Decompress accepts frames flagged FlagCompressed and decodes them.
	// When false such a frame is ErrMalformed: the connection did not
	// negotiate compression.
	Decompress bool
	// BufferSize is the read-ahead buffer in bytes; non-positive means
	// DefaultReadBufferSize. Payloads at least this large are read straight
	// into their own buffer without passing through it.
	BufferSize int
	// Protector, when set, checks (and decrypts) every frame: each is
	// followed by a TagSize tag, and a frame that fails is ErrIntegrity.
	// It is the receiving direction's Protector; the Reader owns it.
	Protector *Protector
}

// Reader decodes a stream of frames. It reads ahead, so once a Reader is
// used nothing else may read from the same source. It is not safe for
// concurrent use: one goroutine owns it.
type Reader struct {
	br   *bufio.Reader
	pool *Pool
	max  int
	dec  bool
	prot *Protector
	tag  [TagSize]byte
	hdr  [HeaderSize]byte
}

// NewReader returns a Reader decoding frames from r.
func NewReader(r io.Reader, opts ReaderOptions) *Reader {
	size := opts.BufferSize
	if size <= 0 {
		size = DefaultReadBufferSize
	}
	pool := opts.Pool
	if pool == nil {
		pool = new(Pool)
	}
	return &Reader{br: bufio.NewReaderSize(r, size), pool: pool, max: EffectiveMax(opts.MaxFrameSize), dec: opts.Decompress, prot: opts.Protector}
}

// ReadFrame reads the next frame. The returned Payload is decompressed if the
// frame was flagged (Flags still shows FlagCompressed, Size the bytes on the
// wire); it comes from the reader's pool and belongs to the caller, who may
// hand it back with Pool.Put. Errors:
//   - io.EOF: the stream ended cleanly between frames;
//   - ErrTruncated (wrapping io.ErrUnexpectedEOF): it ended inside a frame;
//   - ErrTooLarge, ErrMalformed: the frame breaks the format or the limit,
//     detected before its payload is read or allocated;
//   - ErrIntegrity: on a protected stream, the frame's tag does not match
//     (checked before a compressed payload is decoded);
//   - any other error from the underlying reader, unchanged.
//
// After an error the stream position is undefined: stop reading.
func (r *Reader) ReadFrame() (Frame, error) {
	hdr, err := r.br.Peek(HeaderSize)
	if err != nil {
		if err == io.EOF && len(hdr) > 0 {
			return Frame{}, fmt.Errorf("%w: %d of %d header bytes: %w", ErrTruncated, len(hdr), HeaderSize, io.ErrUnexpectedEOF)
		}
		return Frame{}, err
	}
	h, err := ParseHeader(hdr, r.max)
	if err != nil {
		return Frame{}, err
	}
	if h.Flags&FlagCompressed != 0 && !r.dec {
		return Frame{}, fmt.Errorf("%w: compressed frame on a connection without compression", ErrMalformed)
	}
	if r.prot != nil {
		copy(r.hdr[:], hdr) // Peek's bytes are only valid until the next read
	}
	if _, err := r.br.Discard(HeaderSize); err != nil {
		return Frame{}, err
	}
	payload, err := r.readPayload(int(h.Size))
	if err != nil {
		return Frame{}, err
	}
	if h.Flags&FlagCompressed != 0 {
		plain, err := Decompress(r.pool, payload, r.max)
		r.pool.Put(payload)
		if err != nil {
			return Frame{}, err
		}
		payload = plain
	}
	return Frame{Header: h, Payload: payload}, nil
}

// readPayload reads a payload of n bytes (the header has been checked
// against the limit), and its tag on a protected stream, and returns the
// payload, checked and decrypted.
func (r *Reader) readPayload(n int) ([]byte, error) {
	var payload, body []byte
	switch {
	case r.prot == nil:
		payload = r.pool.Get(n)
		body = payload
	case r.prot.encrypt && n > 0:
		// The ciphertext and its tag are opened in place, in one buffer.
		body = r.pool.Get(n + TagSize)
		payload = body[:n]
	default:
		// Payload in its own buffer (its size class stays that of the
		// payload), tag beside it.
		payload = r.pool.Get(n)
		body = payload
	}
	if err := r.readFull(body, n); err != nil {
		r.pool.Put(body)
		return nil, err
	}
	if r.prot == nil {
		return payload, nil
	}
	var err error
	switch {
	case r.prot.encrypt && n > 0:
		payload, err = r.prot.Open(r.hdr[:], body)
	case r.prot.encrypt:
		_, err = r.prot.Open(r.hdr[:], r.tag[:])
	default:
		err = r.prot.verify(r.hdr[:], payload, r.tag[:])
	}
	if err != nil {
		r.pool.Put(body)
		return nil, err
	}
	return payload, nil
}

// readFull fills b, and the tag array after it unless b already has room
// for the tag (len(b) > n).
func (r *Reader) readFull(b []byte, n int) error {
	if _, err := io.ReadFull(r.br, b); err != nil {
		return truncated(err, n)
	}
	if r.prot != nil && len(b) == n {
		if _, err := io.ReadFull(r.br, r.tag[:]); err != nil {
			return truncated(err, n)
		}
	}
	return nil
}

func truncated(err error, n int) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: payload of %d bytes: %w", ErrTruncated, n, io.ErrUnexpectedEOF)
	}
	return err
}
