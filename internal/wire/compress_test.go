package wire

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCompressRoundTrip(t *testing.T) {
	var p Pool
	src := make([]byte, 256<<10)
	for i := range len(src) / 4 {
		binary.LittleEndian.PutUint32(src[4*i:], uint32(i%97))
	}
	enc, ok := Compress(&p, src)
	require.True(t, ok)
	assert.Less(t, len(enc), len(src)/2)
	dec, err := Decompress(&p, enc, 0)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(src, dec))

	_, err = Decompress(&p, enc, len(src)-1)
	assert.ErrorIs(t, err, ErrTooLarge)
}

func TestCompressIncompressible(t *testing.T) {
	var p Pool
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 64<<10)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	_, ok := Compress(&p, src)
	assert.False(t, ok)
	_, ok = Compress(&p, nil)
	assert.False(t, ok)
}

func TestDecompressCorrupt(t *testing.T) {
	var p Pool
	_, err := Decompress(&p, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0)
	assert.ErrorIs(t, err, ErrMalformed)
	enc := s2.Encode(nil, bytes.Repeat([]byte("abcdefgh"), 1000))
	_, err = Decompress(&p, enc[:len(enc)-3], 0)
	assert.ErrorIs(t, err, ErrMalformed)
	// A block announcing 1 GiB is refused before allocating it.
	huge := binary.AppendUvarint(nil, 1<<30)
	_, err = Decompress(&p, huge, 0)
	assert.ErrorIs(t, err, ErrTooLarge)
	out, err := Decompress(&p, s2.Encode(nil, nil), 0)
	require.NoError(t, err)
	assert.Empty(t, out)
}
