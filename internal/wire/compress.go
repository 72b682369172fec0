package wire

import (
	"fmt"

	"github.com/klauspost/compress/s2"
)

// Compress encodes src as one s2 block in a buffer from pool. It reports
// false, and hands its buffer back to pool, when the block would not be at
// least one eighth smaller than src: such payloads are better sent as they
// are. On true the caller owns the returned buffer. src must not exceed
// MaxFrameSizeLimit.
func Compress(pool *Pool, src []byte) ([]byte, bool) {
	if len(src) == 0 || len(src) > MaxFrameSizeLimit {
		return nil, false
	}
	buf := pool.Get(s2.MaxEncodedLen(len(src)))
	out := s2.Encode(buf, src)
	if len(out) > len(src)-len(src)/8 {
		pool.Put(buf)
		return nil, false
	}
	return out, true
}

// Decompress decodes the s2 block src into a buffer from pool and returns it;
// the caller owns it. It returns ErrTooLarge if the block announces more than
// maxSize bytes (non-positive means DefaultMaxFrameSize) and ErrMalformed if
// the block is corrupt. It never allocates more than the limit.
func Decompress(pool *Pool, src []byte, maxSize int) ([]byte, error) {
	n, err := s2.DecodedLen(src)
	if err != nil {
		return nil, fmt.Errorf("%w: compressed payload: %w", ErrMalformed, err)
	}
	if limit := EffectiveMax(maxSize); n > limit {
		return nil, fmt.Errorf("%w: compressed payload expands to %d bytes, limit %d", ErrTooLarge, n, limit)
	}
	buf := pool.Get(n)
	out, err := s2.Decode(buf, src)
	if err != nil {
		pool.Put(buf)
		return nil, fmt.Errorf("%w: compressed payload: %w", ErrMalformed, err)
	}
	return out, nil
}
