package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReaderStream(t *testing.T) {
	var p Pool
	big := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320 KB, larger than the read-ahead buffer
	comp, ok := Compress(&p, big)
	require.True(t, ok)
	var stream []byte
	stream = AppendFrame(stream, Header{Kind: KindRequest, Method: 1, ID: 1}, []byte("small"))
	stream = AppendFrame(stream, Header{Kind: KindResponse, ID: 2}, big)
	stream = AppendFrame(stream, Header{Kind: KindResponse, Flags: FlagCompressed, ID: 3}, comp)
	stream = AppendFrame(stream, Header{Kind: KindGoAway, ID: 3}, nil)

	// One byte at a time exercises every partial-read path.
	r := NewReader(iotest.OneByteReader(bytes.NewReader(stream)), ReaderOptions{Pool: &p, Decompress: true, BufferSize: 4096})
	f, err := r.ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, "small", string(f.Payload))
	assert.Equal(t, uint16(1), f.Method)
	f, err = r.ReadFrame()
	require.NoError(t, err)
	assert.True(t, bytes.Equal(big, f.Payload))
	f, err = r.ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, FlagCompressed, f.Flags)
	assert.Equal(t, uint32(len(comp)), f.Size)
	assert.True(t, bytes.Equal(big, f.Payload))
	f, err = r.ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, KindGoAway, f.Kind)
	assert.Nil(t, f.Payload)
	_, err = r.ReadFrame()
	assert.Equal(t, io.EOF, err)
}

func TestReaderTruncated(t *testing.T) {
	full := AppendFrame(nil, Header{Kind: KindResponse, ID: 1}, []byte("payload bytes"))
	for n := 1; n < len(full); n++ {
		r := NewReader(bytes.NewReader(full[:n]), ReaderOptions{})
		_, err := r.ReadFrame()
		assert.ErrorIs(t, err, ErrTruncated, "prefix %d", n)
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "prefix %d", n)
	}
}

// countingReader records how many bytes were read from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestReaderOversizedRejectedBeforePayload(t *testing.T) {
	hdr := AppendHeader(nil, Header{Kind: KindRequest, ID: 1, Size: 1 << 30})
	src := &countingReader{r: io.MultiReader(bytes.NewReader(hdr), iotest.ErrReader(errors.New("payload must not be read")))}
	r := NewReader(src, ReaderOptions{MaxFrameSize: 1 << 20, BufferSize: 16})
	_, err := r.ReadFrame()
	assert.ErrorIs(t, err, ErrTooLarge)
	assert.Equal(t, HeaderSize, src.n)
}

func TestReaderCompressionNotNegotiated(t *testing.T) {
	var p Pool
	comp, ok := Compress(&p, bytes.Repeat([]byte{1}, 4096))
	require.True(t, ok)
	stream := AppendFrame(nil, Header{Kind: KindResponse, Flags: FlagCompressed, ID: 1}, comp)
	_, err := NewReader(bytes.NewReader(stream), ReaderOptions{Pool: &p}).ReadFrame()
	assert.ErrorIs(t, err, ErrMalformed)
}

func TestReaderCompressedBomb(t *testing.T) {
	var p Pool
	comp, ok := Compress(&p, make([]byte, 1<<20))
	require.True(t, ok)
	stream := AppendFrame(nil, Header{Kind: KindResponse, Flags: FlagCompressed, ID: 1}, comp)
	_, err := NewReader(bytes.NewReader(stream), ReaderOptions{Pool: &p, Decompress: true, MaxFrameSize: 64 << 10}).ReadFrame()
	assert.ErrorIs(t, err, ErrTooLarge)
}

func TestReaderIOError(t *testing.T) {
	boom := errors.New("boom")
	_, err := NewReader(iotest.ErrReader(boom), ReaderOptions{}).ReadFrame()
	assert.ErrorIs(t, err, boom)
}
