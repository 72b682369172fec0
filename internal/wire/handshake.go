package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Handshake message constants.
const (
	// Magic opens every handshake message.
	Magic = "ePSw"
	// Version is the protocol version this package speaks. Version 2: the
	// client proves first, frames are protected with session keys.
	Version = 2
	// NonceSize is the size of a handshake nonce in bytes.
	NonceSize = 32
	// MACSize is the size of an HMAC-SHA256 proof in bytes.
	MACSize = 32
	// HandshakePrefixSize is the size of the part every handshake message
	// starts with: Magic and the message type.
	HandshakePrefixSize = len(Magic) + 1
)

// MsgType identifies a handshake message.
type MsgType uint8

// Handshake message types, in the order they are exchanged.
const (
	MsgClientHello MsgType = 1 // client -> server: version, flags, limit, nonce
	MsgServerHello MsgType = 2 // server -> client: version, flags, limit, nonce
	MsgClientProof MsgType = 3 // client -> server: client proof
	MsgVerdict     MsgType = 4 // server -> client: why the client is refused
	MsgServerProof MsgType = 5 // server -> client: accepted, and the server's proof
)

// HelloFlags are the capability bits of a hello message.
type HelloFlags uint8

// Hello flags.
const (
	// HelloCompress offers (client) or accepts (server) s2 compression.
	HelloCompress HelloFlags = 1 << 0
	// HelloEncrypt asks for encrypted frames; either side's asking is enough.
	HelloEncrypt HelloFlags = 1 << 1
	// HelloUnprotected accepts frames without tags; only if both sides set
	// it are frames unprotected. For measuring the cost of protection.
	HelloUnprotected HelloFlags = 1 << 2
	// HelloTLS says the sender's end of the connection runs mutual TLS.
	// If both hellos set it, frames carry no tags (TLS protects them);
	// if only one does, the handshake fails. It excludes HelloEncrypt and
	// HelloUnprotected.
	HelloTLS HelloFlags = 1 << 3
)

const knownHelloFlags = HelloCompress | HelloEncrypt | HelloUnprotected | HelloTLS

// Verdict is why the server refuses a client. A client the server accepts
// gets a MsgServerProof instead.
type Verdict uint8

// Verdicts.
const (
	VerdictAuthFailed Verdict = 1 // the client's proof is wrong
	VerdictVersion    Verdict = 2 // the server does not speak the client's version
	VerdictTLS        Verdict = 3 // one end runs TLS and the other does not
)

const (
	helloBodySize    = 1 + 1 + 2 + 4 + NonceSize // version, flags, reserved, max frame, nonce
	verdictBodySize  = 4                         // verdict, reserved
	maxHandshakeSize = HandshakePrefixSize + helloBodySize
)

// Handshake is any handshake message; which fields are meaningful depends on
// Type.
type Handshake struct {
	Type MsgType
	// Version, Flags, MaxFrame and Nonce are carried by both hellos. MaxFrame
	// is the largest payload the sender accepts.
	Version  uint8
	Flags    HelloFlags
	MaxFrame uint32
	Nonce    [NonceSize]byte
	// Proof is carried by MsgClientProof and MsgServerProof.
	Proof [MACSize]byte
	// Verdict is carried by MsgVerdict.
	Verdict Verdict
}

// HandshakeSize returns the encoded size of a message of type t including
// its prefix, or 0 if t is unknown.
func HandshakeSize(t MsgType) int {
	switch t {
	case MsgClientHello:
		return HandshakePrefixSize + helloBodySize
	case MsgServerHello:
		return HandshakePrefixSize + helloBodySize
	case MsgClientProof, MsgServerProof:
		return HandshakePrefixSize + MACSize
	case MsgVerdict:
		return HandshakePrefixSize + verdictBodySize
	default:
		return 0
	}
}

// AppendHandshake appends the encoding of m to dst and returns the extended
// slice. An unknown m.Type appends nothing.
func AppendHandshake(dst []byte, m Handshake) []byte {
	if HandshakeSize(m.Type) == 0 {
		return dst
	}
	dst = append(dst, Magic...)
	dst = append(dst, byte(m.Type))
	switch m.Type {
	case MsgClientHello, MsgServerHello:
		dst = append(dst, m.Version, byte(m.Flags), 0, 0)
		dst = binary.LittleEndian.AppendUint32(dst, m.MaxFrame)
		dst = append(dst, m.Nonce[:]...)
	case MsgClientProof, MsgServerProof:
		dst = append(dst, m.Proof[:]...)
	case MsgVerdict:
		dst = append(dst, byte(m.Verdict), 0, 0, 0)
	}
	return dst
}

// DecodeHandshake decodes one handshake message from the start of src and
// returns it with the bytes that follow. It checks the magic, the type, that
// reserved bytes are zero and that flags and verdicts are known; it does not
// check versions or proofs. Errors are ErrTruncated or ErrMalformed.
func DecodeHandshake(src []byte) (Handshake, []byte, error) {
	if len(src) < HandshakePrefixSize {
		return Handshake{}, src, fmt.Errorf("%w: handshake prefix of %d bytes", ErrTruncated, len(src))
	}
	if string(src[:len(Magic)]) != Magic {
		return Handshake{}, src, fmt.Errorf("%w: bad handshake magic %q", ErrMalformed, src[:len(Magic)])
	}
	m := Handshake{Type: MsgType(src[len(Magic)])}
	size := HandshakeSize(m.Type)
	if size == 0 {
		return Handshake{}, src, fmt.Errorf("%w: unknown handshake message type %d", ErrMalformed, uint8(m.Type))
	}
	if len(src) < size {
		return Handshake{}, src, fmt.Errorf("%w: handshake message of %d of %d bytes", ErrTruncated, len(src), size)
	}
	body := src[HandshakePrefixSize:size]
	switch m.Type {
	case MsgClientHello, MsgServerHello:
		m.Version = body[0]
		m.Flags = HelloFlags(body[1])
		if m.Flags&^knownHelloFlags != 0 {
			return Handshake{}, src, fmt.Errorf("%w: unknown hello flags %#x", ErrMalformed, body[1])
		}
		if m.Flags&HelloEncrypt != 0 && m.Flags&HelloUnprotected != 0 {
			return Handshake{}, src, fmt.Errorf("%w: hello asks for encryption and no protection at once", ErrMalformed)
		}
		if m.Flags&HelloTLS != 0 && m.Flags&(HelloEncrypt|HelloUnprotected) != 0 {
			return Handshake{}, src, fmt.Errorf("%w: hello on TLS asks for a frame protection", ErrMalformed)
		}
		if body[2] != 0 || body[3] != 0 {
			return Handshake{}, src, fmt.Errorf("%w: reserved hello bytes are not zero", ErrMalformed)
		}
		m.MaxFrame = binary.LittleEndian.Uint32(body[4:8])
		copy(m.Nonce[:], body[8:8+NonceSize])
	case MsgClientProof, MsgServerProof:
		copy(m.Proof[:], body)
	case MsgVerdict:
		m.Verdict = Verdict(body[0])
		if m.Verdict < VerdictAuthFailed || m.Verdict > VerdictTLS {
			return Handshake{}, src, fmt.Errorf("%w: unknown verdict %d", ErrMalformed, body[0])
		}
		if body[1] != 0 || body[2] != 0 || body[3] != 0 {
			return Handshake{}, src, fmt.Errorf("%w: reserved verdict bytes are not zero", ErrMalformed)
		}
	}
	return m, src[size:], nil
}

// ReadHandshake reads exactly one handshake message from r, never more, and
// returns it with its raw encoding (a new slice owned by the caller, used by
// the authentication transcript). A short read yields ErrTruncated wrapping
// the I/O error; a clean end of input before any byte yields io.EOF.
func ReadHandshake(r io.Reader) (Handshake, []byte, error) {
	buf := make([]byte, HandshakePrefixSize, maxHandshakeSize)
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.ErrUnexpectedEOF {
			return Handshake{}, nil, fmt.Errorf("%w: %w", ErrTruncated, err)
		}
		return Handshake{}, nil, err
	}
	if _, _, err := DecodeHandshake(buf); err != nil && !errors.Is(err, ErrTruncated) {
		return Handshake{}, nil, err
	}
	size := HandshakeSize(MsgType(buf[len(Magic)]))
	buf = buf[:size]
	if _, err := io.ReadFull(r, buf[HandshakePrefixSize:]); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return Handshake{}, nil, fmt.Errorf("%w: %w", ErrTruncated, io.ErrUnexpectedEOF)
		}
		return Handshake{}, nil, err
	}
	m, _, err := DecodeHandshake(buf)
	if err != nil {
		return Handshake{}, nil, err
	}
	return m, buf, nil
}
