package checkpoint

import (
	"fmt"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// Codec selects how chunks are compressed. The zero value is CodecS2.
type Codec uint8

const (
	// CodecS2 compresses with S2 (a faster Snappy variant): about memory speed, modest ratio. Default.
	CodecS2 Codec = iota
	// CodecZstd compresses with zstd at its fastest level: a better ratio for several times the CPU.
	CodecZstd
	// CodecNone stores chunks as they are.
	CodecNone
)

func (c Codec) String() string {
	switch c {
	case CodecS2:
		return "s2"
	case CodecZstd:
		return "zstd"
	case CodecNone:
		return "none"
	default:
		return fmt.Sprintf("Codec(%d)", uint8(c))
	}
}

func (c Codec) valid() bool { return c <= CodecNone }

// codecs holds the zstd coders of one Checkpointer or Committer, created on first use (S2 needs no
// state). Its methods are safe for concurrent use; the coders start no goroutines, so nothing needs closing.
type codecs struct {
	workers int
	encOnce sync.Once
	enc     *zstd.Encoder
	encErr  error
	decOnce sync.Once
	dec     *zstd.Decoder
	decErr  error
}

func newCodecs(workers int) *codecs { return &codecs{workers: workers} }

func (c *codecs) zenc() (*zstd.Encoder, error) {
	c.encOnce.Do(func() {
		c.enc, c.encErr = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithEncoderConcurrency(c.workers), zstd.WithEncoderCRC(false))
	})
	return c.enc, c.encErr
}

func (c *codecs) zdec() (*zstd.Decoder, error) {
	c.decOnce.Do(func() {
		c.dec, c.decErr = zstd.NewReader(nil, zstd.WithDecoderConcurrency(c.workers), zstd.WithDecodeAllCapLimit(true))
	})
	return c.dec, c.decErr
}

// Compression must pay for itself: a chunk whose first sampleBytes do not shrink by at least
// 1/minSaving is stored as it is without compressing the rest. Trained float32 weights rarely
// compress with LZ codecs, and compressing them anyway would make the persister CPU-bound.
const (
	sampleBytes = 256 << 10
	minSaving   = 8
)

// worthCompressing reports whether codec shrinks the first sampleBytes of src by at least
// 1/minSaving (always true for chunks too small to sample).
func (c *codecs) worthCompressing(src []byte, codec Codec) bool {
	if codec == CodecNone {
		return false
	}
	if len(src) < 4*sampleBytes {
		return true
	}
	buf := getBuf(s2.MaxEncodedLen(sampleBytes))
	defer putBuf(buf)
	probe, used := c.compress((*buf)[:0], src[:sampleBytes], codec)
	*buf = probe[:0]
	return used != CodecNone && len(probe) <= sampleBytes-sampleBytes/minSaving
}

// compress appends the compressed form of src to dst and returns it with the codec actually used: a
// chunk that does not shrink is stored as it is (CodecNone), so a reader never pays to decode it.
func (c *codecs) compress(dst, src []byte, codec Codec) ([]byte, Codec) {
	start := len(dst)
	switch codec {
	case CodecS2:
		need := start + s2.MaxEncodedLen(len(src))
		if cap(dst) < need {
			dst = append(make([]byte, 0, need), dst...)
		}
		enc := s2.Encode(dst[start:need], src)
		dst = dst[:start+len(enc)]
	case CodecZstd:
		enc, err := c.zenc()
		if err != nil {
			return append(dst, src...), CodecNone
		}
		dst = enc.EncodeAll(src, dst)
	default:
		return append(dst, src...), CodecNone
	}
	if len(dst)-start >= len(src) {
		return append(dst[:start], src...), CodecNone
	}
	return dst, codec
}

// decompress decodes src into dst[:0], which it grows to exactly rawLen bytes; rawLen bounds the output,
// so a forged payload cannot make it allocate more than the caller allowed.
func (c *codecs) decompress(dst, src []byte, codec Codec, rawLen int) ([]byte, error) {
	if cap(dst) < rawLen {
		dst = make([]byte, 0, rawLen)
	}
	dst = dst[:0:rawLen]
	switch codec {
	case CodecNone:
		if len(src) != rawLen {
			return nil, corruptf("stored payload is %d bytes, want %d", len(src), rawLen)
		}
		return append(dst, src...), nil
	case CodecS2:
		n, err := s2.DecodedLen(src)
		if err != nil || n != rawLen {
			return nil, corruptf("s2 payload decodes to %d bytes (%v), want %d", n, err, rawLen)
		}
		out, err := s2.Decode(dst[:rawLen], src)
		if err != nil {
			return nil, corruptf("s2: %v", err)
		}
		return out, nil
	case CodecZstd:
		dec, err := c.zdec()
		if err != nil {
			return nil, fmt.Errorf("checkpoint: zstd decoder: %w", err)
		}
		out, err := dec.DecodeAll(src, dst)
		if err != nil {
			return nil, corruptf("zstd: %v", err)
		}
		if len(out) != rawLen {
			return nil, corruptf("zstd payload decodes to %d bytes, want %d", len(out), rawLen)
		}
		return out, nil
	default:
		return nil, corruptf("unknown codec %d", codec)
	}
}
