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
