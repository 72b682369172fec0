package wire

import (
	"encoding/binary"
	"fmt"
)

// ErrorHeaderSize is the fixed part of an error payload: code and message
// length.
const ErrorHeaderSize = 8

// AppendError appends the payload of a KindError frame to dst and returns the
// extended slice:
//
//	[0:4]   code, uint32 little-endian
//	[4:8]   m = len(msg), uint32 little-endian
//	[8:8+m] msg
//	[8+m:]  data, opaque to this package (may be empty)
func AppendError(dst []byte, code uint32, msg string, data []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, code)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(msg)))
	dst = append(dst, msg...)
	return append(dst, data...)
}

// DecodeError decodes a KindError payload. msg is a copy; data aliases src
// (nil when empty). It returns ErrTruncated if src is shorter than its header
// or than the message length it announces.
func DecodeError(src []byte) (code uint32, msg string, data []byte, err error) {
	if len(src) < ErrorHeaderSize {
		return 0, "", nil, fmt.Errorf("%w: error payload of %d bytes", ErrTruncated, len(src))
	}
	code = binary.LittleEndian.Uint32(src[0:4])
	m := binary.LittleEndian.Uint32(src[4:8])
	rest := src[ErrorHeaderSize:]
	if uint64(m) > uint64(len(rest)) {
		return 0, "", nil, fmt.Errorf("%w: error message of %d bytes, %d present", ErrTruncated, m, len(rest))
	}
	msg = string(rest[:m])
	if len(rest) > int(m) {
		data = rest[m:len(rest):len(rest)]
	}
	return code, msg, data, nil
}
