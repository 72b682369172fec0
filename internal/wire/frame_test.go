package wire

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFrameRoundTrip(t *testing.T) {
	frames := []Frame{
		{Header: Header{Kind: KindRequest, Method: 7, ID: 1}, Payload: []byte("hello")},
		{Header: Header{Kind: KindResponse, Flags: FlagCompressed, ID: 1 << 60}, Payload: bytes.Repeat([]byte{9}, 1000)},
		{Header: Header{Kind: KindError, ID: 3}, Payload: AppendError(nil, 42, "boom", []byte{1, 2})},
		{Header: Header{Kind: KindGoAway, ID: 99}},
		{Header: Header{Kind: KindRequest, Method: 65535, ID: 0}},
	}
	var buf []byte
	for _, f := range frames {
		buf = AppendFrame(buf, f.Header, f.Payload)
	}
	rest := buf
	for i, want := range frames {
		got, r, err := DecodeFrame(rest, 0)
		require.NoError(t, err, "frame %d", i)
		assert.Equal(t, want.Kind, got.Kind)
		assert.Equal(t, want.Flags, got.Flags)
		assert.Equal(t, want.Method, got.Method)
		assert.Equal(t, want.ID, got.ID)
		assert.Equal(t, uint32(len(want.Payload)), got.Size)
		assert.Equal(t, len(want.Payload), len(got.Payload))
		assert.True(t, bytes.Equal(want.Payload, got.Payload))
		rest = r
	}
	assert.Empty(t, rest)
}

func TestHeaderLayout(t *testing.T) {
	h := Header{Kind: KindRequest, Flags: FlagCompressed, Method: 0x0102, ID: 0x0a0b0c0d0e0f1011, Size: 0x01020304}
	b := AppendHeader(nil, h)
	require.Len(t, b, HeaderSize)
	want := []byte{
		0x04, 0x03, 0x02, 0x01, // size
		0x01,       // kind
		0x01,       // flags
		0x02, 0x01, // method
		0x11, 0x10, 0x0f, 0x0e, 0x0d, 0x0c, 0x0b, 0x0a, // id
	}
	assert.Equal(t, want, b)
	var put [HeaderSize]byte
	PutHeader(put[:], h)
	assert.Equal(t, want, put[:])
}

func TestParseHeaderRejects(t *testing.T) {
	mk := func(size uint32, kind, flags byte, method uint16) []byte {
		b := binary.LittleEndian.AppendUint32(nil, size)
		b = append(b, kind, flags)
		b = binary.LittleEndian.AppendUint16(b, method)
		return binary.LittleEndian.AppendUint64(b, 5)
	}
	cases := []struct {
		name string
		in   []byte
		max  int
		want error
	}{
		{"short", mk(0, 1, 0, 0)[:15], 0, ErrTruncated},
		{"empty", nil, 0, ErrTruncated},
		{"kind zero", mk(0, 0, 0, 0), 0, ErrMalformed},
		{"kind unknown", mk(0, 5, 0, 0), 0, ErrMalformed},
		{"unknown flag", mk(0, 1, 2, 0), 0, ErrMalformed},
		{"compressed error", mk(0, 3, 1, 0), 0, ErrMalformed},
		{"compressed goaway", mk(0, 4, 1, 0), 0, ErrMalformed},
		{"method on response", mk(0, 2, 0, 1), 0, ErrMalformed},
		{"goaway payload", mk(1, 4, 0, 0), 0, ErrMalformed},
		{"over limit", mk(101, 1, 0, 0), 100, ErrTooLarge},
		{"over default", mk(DefaultMaxFrameSize+1, 2, 0, 0), 0, ErrTooLarge},
		{"over hard limit", mk(MaxFrameSizeLimit+1, 2, 0, 0), 1 << 40, ErrTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseHeader(c.in, c.max)
			assert.ErrorIs(t, err, c.want)
		})
	}
	h, err := ParseHeader(mk(100, 1, 0, 3), 100)
	require.NoError(t, err)
	assert.Equal(t, uint32(100), h.Size)
}

func TestDecodeFrameTruncated(t *testing.T) {
	full := AppendFrame(nil, Header{Kind: KindResponse, ID: 1}, []byte("0123456789"))
	for n := range len(full) {
		_, rest, err := DecodeFrame(full[:n], 0)
		assert.ErrorIs(t, err, ErrTruncated, "prefix %d", n)
		assert.Len(t, rest, n)
	}
}

func TestEffectiveMax(t *testing.T) {
	assert.Equal(t, DefaultMaxFrameSize, EffectiveMax(0))
	assert.Equal(t, DefaultMaxFrameSize, EffectiveMax(-1))
	assert.Equal(t, 10, EffectiveMax(10))
	assert.Equal(t, MaxFrameSizeLimit, EffectiveMax(MaxFrameSizeLimit*2))
}

func TestErrorPayload(t *testing.T) {
	b := AppendError(nil, 7, "wrong owner", []byte{0xff, 1})
	code, msg, data, err := DecodeError(b)
	require.NoError(t, err)
	assert.Equal(t, uint32(7), code)
	assert.Equal(t, "wrong owner", msg)
	assert.Equal(t, []byte{0xff, 1}, data)

	code, msg, data, err = DecodeError(AppendError(nil, 1, "", nil))
	require.NoError(t, err)
	assert.Equal(t, uint32(1), code)
	assert.Empty(t, msg)
	assert.Nil(t, data)

	_, _, _, err = DecodeError(b[:7])
	assert.ErrorIs(t, err, ErrTruncated)
	_, _, _, err = DecodeError(b[:10])
	assert.ErrorIs(t, err, ErrTruncated)
}
