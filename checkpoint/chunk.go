package checkpoint

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// A chunk file holds the records of one table for one slot range (or one part of a range too large
// for a single chunk), or the bytes of one blob:
//
//	magic "EPSCHUNK", version u32
//	codec u8, kind u8, reserved u16
//	rowSize u32, slotLo u32, slotHi u32, part u32
//	records u64, rawLen u64, rawSum u64 (xxhash64 of the uncompressed bytes; 0 when stored raw,
//	as the trailer covers them), payloadLen u64
//	payload (payloadLen bytes, compressed with codec)
//	xxhash64 of everything above
//
// All integers are little-endian. For a table chunk rawLen = records*rowSize and every record's slot
// lies in [slotLo, slotHi).
const (
	chunkMagic   = "EPSCHUNK"
	chunkVersion = 1
	chunkHeader  = 64

	chunkKindRows = 1
	chunkKindBlob = 2
)

// chunkInfo is the header of a chunk file.
type chunkInfo struct {
	codec          Codec
	kind           uint8
	rowSize        uint32
	slotLo, slotHi uint32
	part           uint32
	records        uint64
	rawLen         uint64
	rawSum         uint64
}

// appendChunk encodes raw as a chunk file appended to dst, compressing with codec if that pays
// (see worthCompressing).
func appendChunk(dst []byte, ci chunkInfo, raw []byte, codec Codec, cs *codecs) []byte {
	if !cs.worthCompressing(raw, codec) {
		codec = CodecNone
	}
	return appendChunkWith(dst, ci, raw, codec, cs)
}

// appendChunkWith is appendChunk with the decision to compress already taken.
func appendChunkWith(dst []byte, ci chunkInfo, raw []byte, codec Codec, cs *codecs) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, chunkHeader)...)
	dst, used := cs.compress(dst, raw, codec)
	return finishChunk(dst, start, ci, used, raw)
}

// chunkInPlace turns b, whose first chunkHeader bytes are reserved and whose rest holds the raw
// bytes, into an uncompressed chunk file without copying them; b needs 8 bytes of spare capacity.
func chunkInPlace(b []byte, ci chunkInfo) []byte {
	return finishChunk(b, 0, ci, CodecNone, b[chunkHeader:])
}

// finishChunk fills the header of the chunk starting at dst[start] (payload already in place) and
// appends the trailer.
func finishChunk(dst []byte, start int, ci chunkInfo, used Codec, raw []byte) []byte {
	h := dst[start : start+chunkHeader]
	clear(h) // the buffer may be reused
	copy(h, chunkMagic)
	le := binary.LittleEndian
	le.PutUint32(h[8:], chunkVersion)
	h[12] = byte(used)
	h[13] = ci.kind
	le.PutUint32(h[16:], ci.rowSize)
	le.PutUint32(h[20:], ci.slotLo)
	le.PutUint32(h[24:], ci.slotHi)
	le.PutUint32(h[28:], ci.part)
	le.PutUint64(h[32:], ci.records)
	le.PutUint64(h[40:], uint64(len(raw)))
	if used != CodecNone { // stored raw, the trailer already covers these bytes
		le.PutUint64(h[48:], xxhash.Sum64(raw))
	}
	le.PutUint64(h[56:], uint64(len(dst)-start-chunkHeader))
	return le.AppendUint64(dst, xxhash.Sum64(dst[start:]))
}

// checkChunk verifies a chunk file's framing and trailer checksum without decompressing it, and
// returns its header and payload (aliasing src).
func checkChunk(src []byte) (chunkInfo, []byte, error) {
	var ci chunkInfo
	if len(src) < chunkHeader+8 {
		return ci, nil, corruptf("chunk: %d bytes is too short", len(src))
	}
	le := binary.LittleEndian
	body := src[:len(src)-8]
	if le.Uint64(src[len(src)-8:]) != xxhash.Sum64(body) {
		return ci, nil, corruptf("chunk: checksum mismatch")
	}
	h := body[:chunkHeader]
	if string(h[:8]) != chunkMagic || le.Uint32(h[8:]) != chunkVersion {
		return ci, nil, corruptf("chunk: bad magic or version")
	}
	ci = chunkInfo{
		codec: Codec(h[12]), kind: h[13],
		rowSize: le.Uint32(h[16:]), slotLo: le.Uint32(h[20:]), slotHi: le.Uint32(h[24:]), part: le.Uint32(h[28:]),
		records: le.Uint64(h[32:]), rawLen: le.Uint64(h[40:]), rawSum: le.Uint64(h[48:]),
	}
	payload := body[chunkHeader:]
	if le.Uint64(h[56:]) != uint64(len(payload)) {
		return ci, nil, corruptf("chunk: payload length %d, file holds %d", le.Uint64(h[56:]), len(payload))
	}
	if !ci.codec.valid() || le.Uint16(h[14:]) != 0 || (ci.codec == CodecNone && ci.rawSum != 0) {
		return ci, nil, corruptf("chunk: bad codec %d or reserved bits", h[12])
	}
	switch ci.kind {
	case chunkKindRows:
		if ci.rowSize < minRowSize || ci.slotLo >= ci.slotHi {
			return ci, nil, corruptf("chunk: row size %d, slots [%d,%d)", ci.rowSize, ci.slotLo, ci.slotHi)
		}
		if ci.records > ci.rawLen || ci.records*uint64(ci.rowSize) != ci.rawLen {
			return ci, nil, corruptf("chunk: %d records of %d bytes in %d raw bytes", ci.records, ci.rowSize, ci.rawLen)
		}
	case chunkKindBlob:
		if ci.rowSize != 0 || ci.slotLo != 0 || ci.slotHi != 0 || ci.part != 0 || ci.records != 0 {
			return ci, nil, corruptf("chunk: blob with row fields set")
		}
	default:
		return ci, nil, corruptf("chunk: unknown kind %d", ci.kind)
	}
	return ci, payload, nil
}

// decodeChunk verifies and decompresses a chunk file into dst (reused when large enough). maxRaw
// bounds the uncompressed size the caller is willing to hold.
func decodeChunk(src, dst []byte, maxRaw int, cs *codecs) (chunkInfo, []byte, error) {
	ci, payload, err := checkChunk(src)
	if err != nil {
		return ci, nil, err
	}
	if ci.rawLen > uint64(maxRaw) {
		return ci, nil, corruptf("chunk: %d raw bytes exceeds the expected %d", ci.rawLen, maxRaw)
	}
	raw, err := cs.decompress(dst, payload, ci.codec, int(ci.rawLen))
	if err != nil {
		return ci, nil, err
	}
	if ci.codec != CodecNone && xxhash.Sum64(raw) != ci.rawSum {
		return ci, nil, corruptf("chunk: decompressed checksum mismatch")
	}
	return ci, raw, nil
}
