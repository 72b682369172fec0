package wire_test

import (
	"bytes"
	"fmt"

	"github.com/elasticps/elasticps/internal/wire"
)

func Example() {
	// Encode two frames back to back, as a connection would carry them.
	var buf []byte
	buf = wire.AppendFrame(buf, wire.Header{Kind: wire.KindRequest, Method: 2, ID: 1}, []byte("pull ids"))
	buf = wire.AppendFrame(buf, wire.Header{Kind: wire.KindError, ID: 1}, wire.AppendError(nil, 1001, "wrong owner", []byte{7}))

	// Decode them from the buffer...
	f, rest, err := wire.DecodeFrame(buf, 0)
	fmt.Println(f.Kind, f.Method, f.ID, string(f.Payload), err)
	f, _, _ = wire.DecodeFrame(rest, 0)
	code, msg, data, _ := wire.DecodeError(f.Payload)
	fmt.Println(f.Kind, code, msg, data)

	// ...or from a stream, with payloads from a pool.
	var pool wire.Pool
	r := wire.NewReader(bytes.NewReader(buf), wire.ReaderOptions{Pool: &pool, MaxFrameSize: 1 << 20})
	f, _ = r.ReadFrame()
	fmt.Println(len(buf), f.Size)
	pool.Put(f.Payload)
	// Output:
	// request 2 1 pull ids <nil>
	// error 1001 wrong owner [7]
	// 60 8
}

func ExampleProtector() {
	// Both ends of one direction hold a Protector made from the same key
	// (package rpc derives one per connection and direction).
	key := bytes.Repeat([]byte{0x42}, wire.KeySize)
	send, _ := wire.NewProtector(key, false)
	recv, _ := wire.NewProtector(key, false)

	var stream []byte
	stream = wire.AppendSealedFrame(stream, send, wire.Header{Kind: wire.KindRequest, Method: 2, ID: 1}, []byte("pull ids"))
	stream = wire.AppendSealedFrame(stream, send, wire.Header{Kind: wire.KindRequest, Method: 2, ID: 2}, []byte("more ids"))
	fmt.Println(len(stream), "bytes: two headers, two payloads, two tags")

	// Frames read in order pass.
	r := wire.NewReader(bytes.NewReader(stream), wire.ReaderOptions{Protector: recv})
	f, err := r.ReadFrame()
	fmt.Println(f.ID, string(f.Payload), err)

	// The first frame again, where the second belongs, fails: its tag was
	// made for counter 0.
	again, _ := wire.NewProtector(key, false)
	r = wire.NewReader(bytes.NewReader(append(append([]byte(nil), stream[:40]...), stream[:40]...)), wire.ReaderOptions{Protector: again})
	_, _ = r.ReadFrame()
	_, err = r.ReadFrame()
	fmt.Println(err)
	// Output:
	// 80 bytes: two headers, two payloads, two tags
	// 1 pull ids <nil>
	// wire: frame failed authentication
}
