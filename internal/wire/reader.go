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
}

// Reader decodes a stream of frames. It reads ahead, so once a Reader is
// used nothing else may read from the same source. It is not safe for
// concurrent use: one goroutine owns it.
type Reader struct {
	br   *bufio.Reader
	pool *Pool
	max  int
	dec  bool
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
	return &Reader{br: bufio.NewReaderSize(r, size), pool: pool, max: EffectiveMax(opts.MaxFrameSize), dec: opts.Decompress}
}

// ReadFrame reads the next frame. The returned Payload is decompressed if the
// frame was flagged (Flags still shows FlagCompressed, Size the bytes on the
// wire); it comes from the reader's pool and belongs to the caller, who may
// hand it back with Pool.Put. Errors:
//   - io.EOF: the stream ended cleanly between frames;
//   - ErrTruncated (wrapping io.ErrUnexpectedEOF): it ended inside a frame;
//   - ErrTooLarge, ErrMalformed: the frame breaks the format or the limit,
//     detected before its payload is read or allocated;
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
	if _, err := r.br.Discard(HeaderSize); err != nil {
		return Frame{}, err
	}
	payload := r.pool.Get(int(h.Size))
	if _, err := io.ReadFull(r.br, payload); err != nil {
		r.pool.Put(payload)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return Frame{}, fmt.Errorf("%w: payload of %d bytes: %w", ErrTruncated, h.Size, io.ErrUnexpectedEOF)
		}
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
