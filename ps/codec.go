package ps

import (
	"encoding/binary"
	"errors"
	"math"
	"unsafe"
)

// RPC method numbers.
const (
	methodPull uint16 = iota + 1
	methodPush
	methodPullDense
	methodPushDense
	methodInitDense
	methodStats
	methodTable
	methodMigrate // slot migration between servers: see migrate.go
)

// Application error codes carried in rpc.RemoteError.Code.
const (
	codeWrongOwner uint32 = 100 + iota
	codeUnknownTable
	codeBadRequest
	codeNonFinite
	codeClosed
	codeFenced
	codeMoved     // the slot is fenced for a move to another server
	codeMigration // a migration request that cannot be carried out
)

var errShort = errors.New("short")

// decoder reads little-endian values; the first failure sticks in err.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil || n < 0 || len(d.b) < n {
		d.err = errShort
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u16() uint16 {
	if b := d.bytes(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.bytes(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.bytes(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (d *decoder) str() string { return string(d.bytes(int(d.u16()))) }

func appendString(dst []byte, s string) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

// pad8 appends zero bytes until len(dst)-start is a multiple of 8, so the arrays that follow sit
// at aligned offsets of the payload.
func pad8(dst []byte, start int) []byte {
	for (len(dst)-start)%8 != 0 {
		dst = append(dst, 0)
	}
	return dst
}

func (d *decoder) skipPad8(total int) {
	if used := total - len(d.b); used%8 != 0 {
		d.bytes(8 - used%8)
	}
}

// A request to the table methods, little-endian:
//
//	version u64 | step u64 | epoch u64 | worker u32 | dim u32 |
//	position: data epoch u32, shard u32, start u64, end u64 |
//	table (len u16, bytes) | zero pad to 8 | n u32 | flags u32 | ids n×u64 |
//	[push: grads n×dim×f32]
//
// epoch is the pusher's fence epoch (0: none); the position counts only with flagPosition.
// Pull answers n×dim float32; Push answers nothing. For the dense methods ids are absent
// (n counts floats) and the payload is n float32.
type tableReq struct {
	version uint64
	step    uint64
	epoch   uint64
	worker  uint32
	dim     uint32
	pos     Position
	table   string
	ids     []uint64 // aliases the request when aligned
	floats  []byte   // raw little-endian float32 values
	n       int      // ids, or floats of a dense request
	flags   uint32
}

// Request flags.
const (
	flagReadOnly uint32 = 1 << iota // pull: create no rows (Table.Peek)
	flagPosition                    // push: pos is the batch's position (apply at most once)
)

func appendTableReq(dst []byte, r *tableReq, ids []uint64, floats []float32, nFloats int) []byte {
	n := len(ids)
	if ids == nil {
		n = nFloats
	}
	dst = appendReqHeader(dst, r, n)
	dst = appendIDs(dst, ids)
	return appendFloats(dst, floats)
}

// appendReqHeader appends a request's header and its count n; ids and floats follow.
func appendReqHeader(dst []byte, r *tableReq, n int) []byte {
	start := len(dst)
	dst = binary.LittleEndian.AppendUint64(dst, r.version)
	dst = binary.LittleEndian.AppendUint64(dst, r.step)
	dst = binary.LittleEndian.AppendUint64(dst, r.epoch)
	dst = binary.LittleEndian.AppendUint32(dst, r.worker)
	dst = binary.LittleEndian.AppendUint32(dst, r.dim)
	dst = binary.LittleEndian.AppendUint32(dst, r.pos.Epoch)
	dst = binary.LittleEndian.AppendUint32(dst, r.pos.Shard)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(r.pos.Start))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(r.pos.End))
	dst = appendString(dst, r.table)
	dst = pad8(dst, start)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(n))
	return binary.LittleEndian.AppendUint32(dst, r.flags)
}

func appendIDs(dst []byte, ids []uint64) []byte {
	if littleEndian() && len(ids) > 0 {
		return append(dst, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(ids))), 8*len(ids))...)
	}
	for _, id := range ids {
		dst = binary.LittleEndian.AppendUint64(dst, id)
	}
	return dst
}

// putIDsAt writes ids[i] for each i of idx into dst (8*len(idx) bytes), little-endian.
func putIDsAt(dst []byte, ids []uint64, idx []int32) {
	dst = dst[:8*len(idx)]
	for k, i := range idx {
		binary.LittleEndian.PutUint64(dst[8*k:], ids[i])
	}
}

// grow extends b by n bytes and returns the new bytes.
func grow(b []byte, n int) ([]byte, []byte) {
	l := len(b)
	b = append(b, make([]byte, n)...)
	return b, b[l:]
}

// decodeTableReq decodes a request. With withIDs, n ids follow the header; the rest of the
// payload is raw float32 values.
func decodeTableReq(b []byte, withIDs bool) (tableReq, error) {
	d := decoder{b: b}
	r := tableReq{version: d.u64(), step: d.u64(), epoch: d.u64(), worker: d.u32(), dim: d.u32()}
	r.pos = Position{Epoch: d.u32(), Shard: d.u32(), Start: int64(d.u64()), End: int64(d.u64())}
	r.table = d.str()
	d.skipPad8(len(b))
	n := int(d.u32())
	r.flags = d.u32()
	if d.err != nil || n > 1<<28 || r.flags&flagPosition != 0 && !r.pos.valid() {
		return r, errShort
	}
	if withIDs {
		raw := d.bytes(8 * n)
		if d.err != nil {
			return r, errShort
		}
		r.ids = u64s(raw)
	}
	r.n = n
	r.floats = d.b
	if len(r.floats)%4 != 0 {
		return r, errShort
	}
	return r, nil
}

func appendFloats(dst []byte, f []float32) []byte {
	if len(f) == 0 {
		return dst
	}
	if littleEndian() {
		return append(dst, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))...)
	}
	for _, v := range f {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	return dst
}

// putFloats writes f into dst (4*len(f) bytes) little-endian.
func putFloats(dst []byte, f []float32) {
	if littleEndian() {
		copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f)))
		return
	}
	for i, v := range f {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}

// getFloats fills f from little-endian bytes.
func getFloats(f []float32, src []byte) {
	if littleEndian() {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f)), src)
		return
	}
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// floatView returns b as []float32 without copying when b is aligned and the host is
// little-endian, else nil.
func floatView(b []byte) []float32 {
	if len(b) == 0 || !littleEndian() || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 != 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// u64s returns the little-endian uint64s in b, aliasing b when it is aligned.
func u64s(b []byte) []uint64 {
	n := len(b) / 8
	if n == 0 {
		return nil
	}
	if littleEndian() && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 == 0 {
		return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), n)
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return out
}

func littleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}
