package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// HeaderSize is the size in bytes of a frame header.
const HeaderSize = 16

// DefaultMaxFrameSize is the payload limit used when a caller passes a
// non-positive maximum: 64 MiB.
const DefaultMaxFrameSize = 64 << 20

// MaxFrameSizeLimit is the largest payload limit a caller may configure: 1 GiB.
// It keeps every size well inside the 32-bit size field and inside what the
// s2 block format can describe.
const MaxFrameSizeLimit = 1 << 30

var (
	// ErrTruncated is returned when the input ends inside a frame or a
	// handshake message.
	ErrTruncated = errors.New("wire: truncated frame")
	// ErrTooLarge is returned when a frame announces (or a compressed payload
	// expands to) more payload bytes than the configured maximum.
	ErrTooLarge = errors.New("wire: frame too large")
	// ErrMalformed is returned when a frame or handshake message breaks the
	// format: unknown kind or message type, unknown flag bits, a field that
	// must be zero is not, bad magic, or a corrupt compressed payload.
	ErrMalformed = errors.New("wire: malformed frame")
)

// Kind says what a frame carries.
type Kind uint8

// Frame kinds.
const (
	// KindRequest carries a call: Method names the handler, ID is chosen by
	// the caller and echoed in the answer.
	KindRequest Kind = 1
	// KindResponse carries a successful answer to the request with the same ID.
	KindResponse Kind = 2
	// KindError carries an application error (see AppendError) answering the
	// request with the same ID.
	KindError Kind = 3
	// KindGoAway tells the peer that the sender is shutting down: requests
	// with an ID greater than the frame's ID were not read and never will be.
	// Its payload is empty.
	KindGoAway Kind = 4
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case KindRequest:
		return "request"
	case KindResponse:
		return "response"
	case KindError:
		return "error"
	case KindGoAway:
		return "goaway"
	default:
		return fmt.Sprintf("kind(%d)", uint8(k))
	}
}

// Flags are per-frame bits.
type Flags uint8

// FlagCompressed marks a payload encoded as one s2 block. It is allowed on
// requests and responses only, and only on connections that negotiated
// compression during the handshake.
const FlagCompressed Flags = 1 << 0

const knownFlags = FlagCompressed

// Header is the fixed part of a frame. See the package documentation for the
// byte layout.
type Header struct {
	Kind   Kind
	Flags  Flags
	Method uint16 // handler number; zero unless Kind is KindRequest
	ID     uint64 // request id; for KindGoAway the last request id read
	Size   uint32 // payload bytes that follow the header on the wire
}

// Frame is a decoded frame: a header and its payload.
type Frame struct {
	Header
	// Payload is the frame body. From DecodeFrame it aliases the input; from
	// Reader.ReadFrame it is a buffer from the reader's pool owned by the
	// caller.
	Payload []byte
}

// AppendHeader appends the 16-byte encoding of h to dst and returns the
// extended slice. It does not validate h.
func AppendHeader(dst []byte, h Header) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, h.Size)
	dst = append(dst, byte(h.Kind), byte(h.Flags))
	dst = binary.LittleEndian.AppendUint16(dst, h.Method)
	return binary.LittleEndian.AppendUint64(dst, h.ID)
}

// PutHeader writes the encoding of h into the first HeaderSize bytes of dst,
// which must be at least that long.
func PutHeader(dst []byte, h Header) {
	_ = dst[HeaderSize-1]
	binary.LittleEndian.PutUint32(dst[0:4], h.Size)
	dst[4] = byte(h.Kind)
	dst[5] = byte(h.Flags)
	binary.LittleEndian.PutUint16(dst[6:8], h.Method)
	binary.LittleEndian.PutUint64(dst[8:16], h.ID)
}

// ParseHeader decodes and validates the header at the start of src. maxSize
// is the payload limit (non-positive means DefaultMaxFrameSize). It returns
// ErrTruncated if src is shorter than HeaderSize, ErrTooLarge if the size
// field exceeds maxSize and ErrMalformed for any other violation.
func ParseHeader(src []byte, maxSize int) (Header, error) {
	if len(src) < HeaderSize {
		return Header{}, fmt.Errorf("%w: %d of %d header bytes", ErrTruncated, len(src), HeaderSize)
	}
	h := Header{
		Size:   binary.LittleEndian.Uint32(src[0:4]),
		Kind:   Kind(src[4]),
		Flags:  Flags(src[5]),
		Method: binary.LittleEndian.Uint16(src[6:8]),
		ID:     binary.LittleEndian.Uint64(src[8:16]),
	}
	if err := h.validate(maxSize); err != nil {
		return Header{}, err
	}
	return h, nil
}

func (h Header) validate(maxSize int) error {
	switch h.Kind {
	case KindRequest, KindResponse, KindError, KindGoAway:
	default:
		return fmt.Errorf("%w: unknown kind %d", ErrMalformed, uint8(h.Kind))
	}
	if h.Flags&^knownFlags != 0 {
		return fmt.Errorf("%w: unknown flags %#x", ErrMalformed, uint8(h.Flags))
	}
	if h.Flags&FlagCompressed != 0 && h.Kind != KindRequest && h.Kind != KindResponse {
		return fmt.Errorf("%w: compressed %s frame", ErrMalformed, h.Kind)
	}
	if h.Kind != KindRequest && h.Method != 0 {
		return fmt.Errorf("%w: method %d on a %s frame", ErrMalformed, h.Method, h.Kind)
	}
	if h.Kind == KindGoAway && h.Size != 0 {
		return fmt.Errorf("%w: goaway frame with %d payload bytes", ErrMalformed, h.Size)
	}
	if int64(h.Size) > int64(EffectiveMax(maxSize)) {
		return fmt.Errorf("%w: %d payload bytes, limit %d", ErrTooLarge, h.Size, EffectiveMax(maxSize))
	}
	return nil
}

// EffectiveMax returns the payload limit a maxSize argument stands for:
// DefaultMaxFrameSize when maxSize is not positive, MaxFrameSizeLimit when it
// is larger than that, maxSize otherwise.
func EffectiveMax(maxSize int) int {
	switch {
	case maxSize <= 0:
		return DefaultMaxFrameSize
	case maxSize > MaxFrameSizeLimit:
		return MaxFrameSizeLimit
	default:
		return maxSize
	}
}

// AppendFrame appends a frame with header h and the given payload to dst and
// returns the extended slice. h.Size is ignored and replaced by len(payload),
// which must not exceed MaxFrameSizeLimit (callers check their limit first).
func AppendFrame(dst []byte, h Header, payload []byte) []byte {
	h.Size = uint32(len(payload))
	dst = AppendHeader(dst, h)
	return append(dst, payload...)
}

// DecodeFrame decodes one frame from the start of src and returns it with the
// bytes that follow it. The frame's Payload aliases src and is not
// decompressed. maxSize is the payload limit (non-positive means
// DefaultMaxFrameSize). Errors are ErrTruncated, ErrTooLarge or ErrMalformed,
// wrapped with detail.
func DecodeFrame(src []byte, maxSize int) (Frame, []byte, error) {
	h, err := ParseHeader(src, maxSize)
	if err != nil {
		return Frame{}, src, err
	}
	end := HeaderSize + int(h.Size)
	if len(src) < end {
		return Frame{}, src, fmt.Errorf("%w: %d of %d payload bytes", ErrTruncated, len(src)-HeaderSize, h.Size)
	}
	return Frame{Header: h, Payload: src[HeaderSize:end:end]}, src[end:], nil
}
