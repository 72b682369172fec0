package wire

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// protectorPair returns the sending and the receiving Protector of one
// direction.
func protectorPair(t testing.TB, encrypt bool) (send, recv *Protector) {
	t.Helper()
	key := bytes.Repeat([]byte{0x5a}, KeySize)
	send, err := NewProtector(key, encrypt)
	require.NoError(t, err)
	recv, err = NewProtector(key, encrypt)
	require.NoError(t, err)
	return send, recv
}

func modeName(encrypt bool) string {
	if encrypt {
		return "encrypted"
	}
	return "integrity"
}

func sampleFrames(t testing.TB) []Frame {
	var p Pool
	comp, ok := Compress(&p, bytes.Repeat([]byte("row "), 5000))
	require.True(t, ok)
	return []Frame{
		{Header: Header{Kind: KindRequest, Method: 7, ID: 1}, Payload: []byte("hello")},
		{Header: Header{Kind: KindResponse, ID: 1}, Payload: bytes.Repeat([]byte{9, 8, 7}, 40000)}, // larger than the read-ahead buffer
		{Header: Header{Kind: KindResponse, Flags: FlagCompressed, ID: 2}, Payload: comp},
		{Header: Header{Kind: KindError, ID: 3}, Payload: AppendError(nil, 42, "boom", []byte{1, 2})},
		{Header: Header{Kind: KindResponse, ID: 4}},
		{Header: Header{Kind: KindGoAway, ID: 99}},
	}
}

func TestProtectedRoundTrip(t *testing.T) {
	for _, encrypt := range []bool{false, true} {
		t.Run(modeName(encrypt), func(t *testing.T) {
			send, recv := protectorPair(t, encrypt)
			frames := sampleFrames(t)
			var stream []byte
			for _, f := range frames {
				stream = AppendSealedFrame(stream, send, f.Header, f.Payload)
			}
			var p Pool
			r := NewReader(iotest.OneByteReader(bytes.NewReader(stream)), ReaderOptions{Pool: &p, Decompress: true, BufferSize: 4096, Protector: recv})
			for i, want := range frames {
				got, err := r.ReadFrame()
				require.NoError(t, err, "frame %d", i)
				assert.Equal(t, want.Kind, got.Kind)
				assert.Equal(t, want.ID, got.ID)
				assert.Equal(t, uint32(len(want.Payload)), got.Size)
				if want.Flags&FlagCompressed != 0 {
					assert.Equal(t, bytes.Repeat([]byte("row "), 5000), got.Payload)
				} else {
					assert.True(t, bytes.Equal(want.Payload, got.Payload), "frame %d payload", i)
				}
				p.Put(got.Payload)
			}
			_, err := r.ReadFrame()
			assert.Equal(t, io.EOF, err)
			assert.Equal(t, uint64(len(frames)), send.Seq())
			assert.Equal(t, uint64(len(frames)), recv.Seq())
		})
	}
}

func TestSealLayout(t *testing.T) {
	payload := []byte("some payload bytes")
	h := Header{Kind: KindRequest, Method: 3, ID: 5}
	for _, encrypt := range []bool{false, true} {
		send, _ := protectorPair(t, encrypt)
		b := AppendSealedFrame(nil, send, h, payload)
		require.Len(t, b, HeaderSize+len(payload)+TagSize)
		assert.Equal(t, AppendHeader(nil, Header{Kind: KindRequest, Method: 3, ID: 5, Size: uint32(len(payload))}), b[:HeaderSize], "the header is in clear")
		body := b[HeaderSize : HeaderSize+len(payload)]
		if encrypt {
			assert.NotContains(t, string(b), "payload", "the payload is encrypted")
		} else {
			assert.Equal(t, payload, body)
		}
	}
}

// Every single-byte change anywhere in a protected stream is refused at
// or before the frame that holds it, and no altered frame is ever
// returned.
func TestProtectedRefusesEveryAlteredByte(t *testing.T) {
	frames := []Frame{
		{Header: Header{Kind: KindRequest, Method: 1, ID: 1}, Payload: []byte("first")},
		{Header: Header{Kind: KindRequest, Method: 2, ID: 2}},
		{Header: Header{Kind: KindResponse, ID: 3}, Payload: []byte("third frame")},
	}
	for _, encrypt := range []bool{false, true} {
		send, _ := protectorPair(t, encrypt)
		var stream []byte
		var ends []int
		for _, f := range frames {
			stream = AppendSealedFrame(stream, send, f.Header, f.Payload)
			ends = append(ends, len(stream))
		}
		for pos := range stream {
			for _, mask := range []byte{0x01, 0x80} {
				bad := bytes.Clone(stream)
				bad[pos] ^= mask
				_, recv := protectorPair(t, encrypt)
				r := NewReader(bytes.NewReader(bad), ReaderOptions{Protector: recv})
				for i := range frames {
					f, err := r.ReadFrame()
					if pos < ends[i] {
						require.Error(t, err, "%s: byte %d ^ %#x accepted in frame %d", modeName(encrypt), pos, mask, i)
						break
					}
					require.NoError(t, err)
					assert.Equal(t, frames[i].Payload, f.Payload)
				}
			}
		}
	}
}

func TestProtectedTagComparedInFull(t *testing.T) {
	for _, encrypt := range []bool{false, true} {
		send, recv := protectorPair(t, encrypt)
		b := AppendSealedFrame(nil, send, Header{Kind: KindRequest, Method: 1, ID: 1}, []byte("x"))
		b[len(b)-1] ^= 1 // the last byte of the tag
		_, err := NewReader(bytes.NewReader(b), ReaderOptions{Protector: recv}).ReadFrame()
		assert.ErrorIs(t, err, ErrIntegrity, modeName(encrypt))
	}
}

// The counter is part of every tag: a frame replayed, reordered or
// following a dropped one fails.
func TestProtectedReplayReorderDrop(t *testing.T) {
	for _, encrypt := range []bool{false, true} {
		send, _ := protectorPair(t, encrypt)
		var f [3][]byte
		for i := range f {
			f[i] = AppendSealedFrame(nil, send, Header{Kind: KindRequest, Method: 1, ID: uint64(i + 1)}, []byte("same payload"))
		}
		for name, stream := range map[string][][]byte{
			"duplicated": {f[0], f[0]},
			"reordered":  {f[1], f[0]},
			"dropped":    {f[0], f[2]},
		} {
			_, recv := protectorPair(t, encrypt)
			r := NewReader(bytes.NewReader(bytes.Join(stream, nil)), ReaderOptions{Protector: recv})
			_, first := r.ReadFrame()
			_, second := r.ReadFrame()
			assert.True(t, errors.Is(first, ErrIntegrity) || errors.Is(second, ErrIntegrity), "%s %s: %v, %v", modeName(encrypt), name, first, second)
			if name != "reordered" {
				assert.NoError(t, first, name)
			}
		}
	}
}

func TestProtectedWrongKeyOrMode(t *testing.T) {
	send, _ := protectorPair(t, false)
	b := AppendSealedFrame(nil, send, Header{Kind: KindRequest, Method: 1, ID: 1}, []byte("x"))
	other, err := NewProtector(bytes.Repeat([]byte{1}, KeySize), false)
	require.NoError(t, err)
	_, err = NewReader(bytes.NewReader(b), ReaderOptions{Protector: other}).ReadFrame()
	assert.ErrorIs(t, err, ErrIntegrity)
	_, enc := protectorPair(t, true)
	_, err = NewReader(bytes.NewReader(b), ReaderOptions{Protector: enc}).ReadFrame()
	assert.ErrorIs(t, err, ErrIntegrity)
	_, err = NewProtector(make([]byte, 16), false)
	assert.Error(t, err)
}

func TestProtectedTruncated(t *testing.T) {
	send, _ := protectorPair(t, false)
	full := AppendSealedFrame(nil, send, Header{Kind: KindResponse, ID: 1}, []byte("payload bytes"))
	for n := 1; n < len(full); n++ {
		_, recv := protectorPair(t, false)
		_, err := NewReader(bytes.NewReader(full[:n]), ReaderOptions{Protector: recv}).ReadFrame()
		assert.ErrorIs(t, err, ErrTruncated, "prefix %d", n)
	}
}

// allocatedBy returns the bytes allocated while fn runs.
func allocatedBy(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A header over the limit is refused before anything of its size is
// allocated: measured in bytes allocated, not only bytes read.
func TestReaderOversizedAllocatesNothing(t *testing.T) {
	for _, prot := range []string{"plain", "integrity", "encrypted"} {
		t.Run(prot, func(t *testing.T) {
			var p *Protector
			if prot != "plain" {
				_, p = protectorPair(t, prot == "encrypted")
			}
			hdr := AppendHeader(nil, Header{Kind: KindRequest, ID: 1, Size: 1 << 30})
			src := &countingReader{r: io.MultiReader(bytes.NewReader(hdr), iotest.ErrReader(errors.New("payload must not be read")))}
			r := NewReader(src, ReaderOptions{MaxFrameSize: 1 << 20, BufferSize: 16, Protector: p})
			var err error
			n := allocatedBy(func() { _, err = r.ReadFrame() })
			assert.ErrorIs(t, err, ErrTooLarge)
			assert.Equal(t, HeaderSize, src.n)
			assert.Less(t, n, uint64(64<<10), "bytes allocated for a refused 1 GiB header")

			// Under the limit, the payload is allocated once it is read:
			// the measurement sees allocations.
			hdr = AppendHeader(nil, Header{Kind: KindRequest, ID: 1, Size: 1 << 20})
			r = NewReader(bytes.NewReader(hdr), ReaderOptions{MaxFrameSize: 1 << 20, BufferSize: 16, Protector: p})
			n = allocatedBy(func() { _, err = r.ReadFrame() })
			assert.ErrorIs(t, err, ErrTruncated)
			assert.GreaterOrEqual(t, n, uint64(1<<20))
		})
	}
}

// FuzzProtectedReader seals three frames (payloads from the fuzzer),
// optionally flips bits of one byte of the stream, and reads it back: a
// frame that holds the changed byte is never returned, every frame before
// it is returned intact, and an unchanged stream reads back exactly.
func FuzzProtectedReader(f *testing.F) {
	f.Add([]byte("a"), []byte("b"), uint32(0), byte(0), false)
	f.Add([]byte("request"), []byte("response"), uint32(20), byte(1), false)
	f.Add([]byte("request"), []byte("response"), uint32(70), byte(0x80), true)
	f.Add([]byte{}, bytes.Repeat([]byte{7}, 300), uint32(3), byte(0xff), true)
	f.Add(bytes.Repeat([]byte("z"), 5000), []byte{}, uint32(5040), byte(4), false)
	f.Fuzz(func(t *testing.T, a, b []byte, at uint32, mask byte, encrypt bool) {
		if len(a) > 1<<16 || len(b) > 1<<16 {
			return
		}
		frames := []Frame{
			{Header: Header{Kind: KindRequest, Method: 1, ID: 1}, Payload: a},
			{Header: Header{Kind: KindResponse, ID: 1}, Payload: b},
			{Header: Header{Kind: KindGoAway, ID: 1}},
		}
		send, recv := protectorPair(t, encrypt)
		var stream []byte
		var ends []int
		for _, fr := range frames {
			stream = AppendSealedFrame(stream, send, fr.Header, fr.Payload)
			ends = append(ends, len(stream))
		}
		pos := int(at % uint32(len(stream)))
		stream[pos] ^= mask
		r := NewReader(bytes.NewReader(stream), ReaderOptions{Protector: recv, MaxFrameSize: 1 << 17, BufferSize: 64})
		for i, want := range frames {
			got, err := r.ReadFrame()
			altered := mask != 0 && pos < ends[i]
			if err != nil {
				if !altered {
					t.Fatalf("frame %d refused without a change: %v", i, err)
				}
				return
			}
			if altered {
				t.Fatalf("frame %d accepted with byte %d changed by %#x", i, pos, mask)
			}
			if got.Kind != want.Kind || got.ID != want.ID || !bytes.Equal(got.Payload, want.Payload) {
				t.Fatalf("frame %d differs", i)
			}
		}
		if _, err := r.ReadFrame(); err != io.EOF {
			t.Fatalf("after the frames: %v", err)
		}
	})
}
