package checkpoint

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// The file formats (chunk, manifest, commit record, seal) share these primitives: fixed-width
// little-endian integers, uvarint-prefixed byte strings, a leading 8-byte magic and version, and a
// trailing xxhash64 of everything before it.

type encoder struct{ b []byte }

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *encoder) uv(v uint64)  { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) bool(v bool) {
	if v {
		e.u8(1)
	} else {
		e.u8(0)
	}
}
func (e *encoder) bytes(v []byte) { e.uv(uint64(len(v))); e.b = append(e.b, v...) }
func (e *encoder) str(v string)   { e.uv(uint64(len(v))); e.b = append(e.b, v...) }

// slots writes a slot set as its size and packed little-endian bits.
func (e *encoder) slots(s slotSet) {
	e.uv(uint64(s.n))
	for _, w := range s.bits {
		e.u64(w)
	}
}

// seal appends the xxhash64 trailer and returns the finished bytes.
func (e *encoder) seal() []byte {
	e.u64(xxhash.Sum64(e.b))
	return e.b
}

// decoder reads what encoder wrote. The first failure sticks; every later read returns zero values.
type decoder struct {
	b   []byte
	err error
}

// openFile checks the trailer checksum, magic and version of a whole file and returns a decoder
// positioned after them.
func openFile(src []byte, magic string, version uint32) (*decoder, error) {
	d, _, err := openFileVersion(src, magic, version, version)
	return d, err
}

// openFileVersion is openFile for a format read in versions lo..hi; it returns the version.
func openFileVersion(src []byte, magic string, lo, hi uint32) (*decoder, uint32, error) {
	if len(src) < len(magic)+4+8 {
		return nil, 0, corruptf("%s: %d bytes is too short", magic, len(src))
	}
	body := src[:len(src)-8]
	if binary.LittleEndian.Uint64(src[len(src)-8:]) != xxhash.Sum64(body) {
		return nil, 0, corruptf("%s: checksum mismatch", magic)
	}
	if string(body[:len(magic)]) != magic {
		return nil, 0, corruptf("bad magic %q, want %q", body[:len(magic)], magic)
	}
	d := &decoder{b: body[len(magic):]}
	v := d.u32()
	switch {
	case v > hi:
		return nil, 0, fmt.Errorf("%w: %s version %d, this release reads %d to %d", ErrUnsupportedVersion, magic, v, lo, hi)
	case v < lo:
		return nil, 0, corruptf("%s: version %d, want %d to %d", magic, v, lo, hi)
	}
	return d, v, nil
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = corruptf("truncated or malformed %s", what)
	}
}

func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail(what)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	v := d.take(1, "u8")
	if v == nil {
		return 0
	}
	return v[0]
}

func (d *decoder) u32() uint32 {
	v := d.take(4, "u32")
	if v == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(v)
}

func (d *decoder) u64() uint64 {
	v := d.take(8, "u64")
	if v == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(v)
}

func (d *decoder) uv() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bool() bool {
	switch d.u8() {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail("bool")
		return false
	}
}

// bytes returns a copy, so the result does not alias the source buffer.
func (d *decoder) bytes() []byte {
	n := d.uv()
	if n > uint64(len(d.b)) {
		d.fail("byte string")
		return nil
	}
	return append([]byte(nil), d.take(int(n), "byte string")...)
}

func (d *decoder) str() string {
	n := d.uv()
	if n > uint64(len(d.b)) {
		d.fail("string")
		return ""
	}
	return string(d.take(int(n), "string"))
}

// count reads a slice length and checks that at least min bytes per element remain, so a forged
// length cannot make the caller allocate more than the input justifies.
func (d *decoder) count(minElem int) int {
	n := d.uv()
	if d.err != nil {
		return 0
	}
	if minElem < 1 {
		minElem = 1
	}
	if n > uint64(len(d.b)/minElem) {
		d.fail("count")
		return 0
	}
	return int(n)
}

// maxSlots bounds the slot count any file may declare.
const maxSlots = 1 << 24

func (d *decoder) slots() slotSet {
	n := d.uv()
	if d.err != nil {
		return slotSet{}
	}
	if n == 0 || n > maxSlots || (n+63)/64*8 > uint64(len(d.b)) {
		d.fail("slot set")
		return slotSet{}
	}
	s := newSlotSet(int(n))
	for i := range s.bits {
		s.bits[i] = d.u64()
	}
	if r := uint(n) & 63; r != 0 && s.bits[len(s.bits)-1]>>r != 0 {
		d.fail("slot set padding")
	}
	return s
}

// done reports the sticky error, or an error if bytes are left over.
func (d *decoder) done() error {
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return corruptf("%d trailing bytes", len(d.b))
	}
	return nil
}

func xxhashSum(b []byte) uint64 { return xxhash.Sum64(b) }
