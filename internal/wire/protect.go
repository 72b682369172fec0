package wire

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
)

// Frame protection sizes.
const (
	// TagSize is the size of the authentication tag that follows the
	// payload of every frame on a protected connection.
	TagSize = 16
	// KeySize is the size of a direction key: AES-256.
	KeySize = 32
	// nonceSize is the AES-GCM nonce: 4 zero bytes, then the frame
	// counter as a big-endian uint64.
	nonceSize = 12
)

// ErrIntegrity is returned when a frame's tag does not match its counter,
// header and payload: the frame was altered, injected, replayed, reordered,
// or sealed with another key. The connection must be closed.
var ErrIntegrity = errors.New("wire: frame failed authentication")

// Protector authenticates, and optionally encrypts, the frames of one
// direction of a connection. The sender and the receiver each hold a
// Protector made from the same key; every frame sealed or opened advances
// its counter by one, so both ends agree on the counter of every frame
// without sending it, and a frame replayed, dropped or moved gets another
// counter than the one it was sealed with and fails. See the package
// documentation for the construction. A Protector is not safe for
// concurrent use; after a failed Open it must not be used again.
type Protector struct {
	aead    cipher.AEAD
	encrypt bool
	seq     uint64
	nonce   [nonceSize]byte
	scratch [HeaderSize + TagSize]byte // Seal's output in integrity mode
}

// NewProtector returns a Protector for one direction, keyed with key
// (KeySize bytes, fresh for every connection and direction: the counter
// starts at zero). When encrypt is set, payloads are encrypted too.
func NewProtector(key []byte, encrypt bool) (*Protector, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("wire: protector key of %d bytes, want %d", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Protector{aead: aead, encrypt: encrypt}, nil
}

// Encrypts reports whether p encrypts payloads.
func (p *Protector) Encrypts() bool { return p.encrypt }

// Seq returns the counter of the next frame.
func (p *Protector) Seq() uint64 { return p.seq }

// next returns the nonce of the next frame and advances the counter.
func (p *Protector) next() []byte {
	binary.BigEndian.PutUint64(p.nonce[4:], p.seq)
	p.seq++
	return p.nonce[:]
}

// Seal protects the next frame this direction sends: hdr is its encoded
// header (HeaderSize bytes, Size equal to len(payload)), payload its
// payload as the application gave it. When encrypting, Seal appends to dst
// the ciphertext of payload followed by the tag (len(payload)+TagSize
// bytes, sent after the header in place of the payload); otherwise it
// appends the tag alone (sent after the payload, which goes as it is). To
// encrypt in place pass payload[:0] as dst; otherwise dst's spare capacity
// must not overlap payload or hdr. Seal allocates only if dst is too small.
func (p *Protector) Seal(dst, hdr, payload []byte) []byte {
	nonce := p.next()
	if p.encrypt {
		return p.aead.Seal(dst, nonce, payload, hdr)
	}
	out := p.aead.Seal(p.scratch[:0], nonce, hdr, payload)
	return append(dst, out[HeaderSize:]...)
}

// Open checks the next frame this direction receives: hdr is its header
// as received, body the payload followed by the tag, as received. It
// returns the payload, decrypted in place when encrypting (aliasing body),
// or ErrIntegrity. The tag is compared in full and in constant time.
func (p *Protector) Open(hdr, body []byte) ([]byte, error) {
	if len(body) < TagSize {
		return nil, fmt.Errorf("%w: %d bytes, shorter than a tag", ErrIntegrity, len(body))
	}
	n := len(body) - TagSize
	if p.encrypt {
		out, err := p.aead.Open(body[:0], p.next(), body, hdr)
		if err != nil {
			return nil, ErrIntegrity
		}
		return out, nil
	}
	if err := p.verify(hdr, body[:n], body[n:]); err != nil {
		return nil, err
	}
	return body[:n:n], nil
}

// verify checks the tag of an unencrypted frame whose payload and tag are
// in separate buffers.
func (p *Protector) verify(hdr, payload, tag []byte) error {
	out := p.aead.Seal(p.scratch[:0], p.next(), hdr, payload)
	if subtle.ConstantTimeCompare(out[HeaderSize:], tag) != 1 {
		return ErrIntegrity
	}
	return nil
}

// AppendSealedFrame appends a protected frame (header, payload, tag; the
// payload encrypted if p encrypts) to dst and returns the extended slice.
// It is the one-call form of what a connection's writer does frame by
// frame, for tests and tools.
func AppendSealedFrame(dst []byte, p *Protector, h Header, payload []byte) []byte {
	h.Size = uint32(len(payload))
	start := len(dst)
	dst = AppendHeader(dst, h)
	hdr := make([]byte, HeaderSize)
	copy(hdr, dst[start:])
	if p.encrypt {
		return p.Seal(dst, hdr, payload)
	}
	dst = append(dst, payload...)
	return p.Seal(dst, hdr, payload)
}
