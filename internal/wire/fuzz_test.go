package wire

import (
	"bytes"
	"testing"
)

func frameSeeds() [][]byte {
	var p Pool
	comp, _ := Compress(&p, bytes.Repeat([]byte("abcd"), 1024))
	return [][]byte{
		AppendFrame(nil, Header{Kind: KindRequest, Method: 3, ID: 1}, []byte("x")),
		AppendFrame(nil, Header{Kind: KindResponse, ID: 2}, nil),
		AppendFrame(nil, Header{Kind: KindResponse, Flags: FlagCompressed, ID: 2}, comp),
		AppendFrame(nil, Header{Kind: KindError, ID: 4}, AppendError(nil, 9, "m", []byte{1})),
		AppendFrame(nil, Header{Kind: KindGoAway, ID: 7}, nil),
		AppendHeader(nil, Header{Kind: KindRequest, Size: 1 << 31}),
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		{},
	}
}

// FuzzDecodeFrame checks that DecodeFrame never panics, that what it accepts
// re-encodes to the same bytes, and that the streaming Reader agrees with it.
func FuzzDecodeFrame(f *testing.F) {
	for _, s := range frameSeeds() {
		f.Add(s, int32(0))
		f.Add(s, int32(16))
	}
	f.Fuzz(func(t *testing.T, in []byte, max int32) {
		limit := int(max)
		fr, rest, err := DecodeFrame(in, limit)
		if err != nil {
			return
		}
		if int(fr.Size) > EffectiveMax(limit) || len(fr.Payload) != int(fr.Size) {
			t.Fatalf("accepted frame of %d bytes over limit %d", fr.Size, EffectiveMax(limit))
		}
		consumed := in[:len(in)-len(rest)]
		if again := AppendFrame(nil, fr.Header, fr.Payload); !bytes.Equal(again, consumed) {
			t.Fatalf("re-encoding differs: %x vs %x", again, consumed)
		}
		var p Pool
		got, rerr := NewReader(bytes.NewReader(in), ReaderOptions{Pool: &p, MaxFrameSize: limit, Decompress: true}).ReadFrame()
		if rerr == nil && fr.Flags&FlagCompressed == 0 && !bytes.Equal(got.Payload, fr.Payload) {
			t.Fatalf("reader payload differs")
		}
		if rerr != nil && fr.Flags&FlagCompressed == 0 {
			t.Fatalf("reader rejected a frame DecodeFrame accepted: %v", rerr)
		}
	})
}

// FuzzReader feeds arbitrary streams to the streaming Reader.
func FuzzReader(f *testing.F) {
	for _, s := range frameSeeds() {
		f.Add(s)
		f.Add(append(bytes.Clone(s), s...))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var p Pool
		r := NewReader(bytes.NewReader(in), ReaderOptions{Pool: &p, MaxFrameSize: 1 << 16, Decompress: true, BufferSize: 32})
		for range 64 {
			fr, err := r.ReadFrame()
			if err != nil {
				return
			}
			if len(fr.Payload) > 1<<16 {
				t.Fatalf("payload of %d bytes over limit", len(fr.Payload))
			}
			p.Put(fr.Payload)
		}
	})
}

// FuzzDecodeError checks the error payload decoder.
func FuzzDecodeError(f *testing.F) {
	f.Add(AppendError(nil, 1, "msg", []byte{1, 2, 3}))
	f.Add(AppendError(nil, 0, "", nil))
	f.Add([]byte{1, 2, 3, 4, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		code, msg, data, err := DecodeError(in)
		if err != nil {
			return
		}
		if again := AppendError(nil, code, msg, data); !bytes.Equal(again, in) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzDecodeHandshake checks the handshake message decoder and ReadHandshake.
func FuzzDecodeHandshake(f *testing.F) {
	for _, m := range sampleHandshakes() {
		f.Add(AppendHandshake(nil, m))
	}
	f.Add([]byte(Magic))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, rest, err := DecodeHandshake(in)
		_, raw, rerr := ReadHandshake(bytes.NewReader(in))
		if (err == nil) != (rerr == nil) {
			t.Fatalf("DecodeHandshake err %v, ReadHandshake err %v", err, rerr)
		}
		if err != nil {
			return
		}
		consumed := in[:len(in)-len(rest)]
		if again := AppendHandshake(nil, m); !bytes.Equal(again, consumed) || !bytes.Equal(raw, consumed) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzDecompress checks that a hostile s2 block is refused without panics or
// oversized allocations.
func FuzzDecompress(f *testing.F) {
	var p Pool
	comp, _ := Compress(&p, bytes.Repeat([]byte("xyz"), 500))
	f.Add(comp)
	f.Add([]byte{0})
	f.Add([]byte{0x80, 0x80, 0x80, 0x80, 0x04})
	f.Fuzz(func(t *testing.T, in []byte) {
		var p Pool
		out, err := Decompress(&p, in, 1<<16)
		if err == nil && len(out) > 1<<16 {
			t.Fatalf("decoded %d bytes over limit", len(out))
		}
	})
}
