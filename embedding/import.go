package embedding

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/cespare/xxhash/v2"
)

// ImportOptions select what Import applies.
type ImportOptions struct {
	// Keep applies only records whose id it accepts (nil: all), e.g. a SlotSet's Contains.
	Keep func(id uint64) bool
}

// Import reads a stream written by Export, verifies it completely (magic, version, layout,
// every checksum, the record count) and only then applies its records as LoadRaw does. A corrupt
// or truncated stream returns ErrCorrupt, one from a table with another layout ErrSchema; either
// way nothing is changed. It returns the number of records applied.
func (t *Table) Import(r io.Reader, opt ImportOptions) (int, error) {
	data, err := t.readStream(r)
	if err != nil {
		return 0, fmt.Errorf("import into %s: %w", t.name(), err)
	}
	return t.LoadRaw(data, opt.Keep)
}

// readStream verifies a stream and returns its records, concatenated.
func (t *Table) readStream(r io.Reader) ([]byte, error) {
	sum := xxhash.New()
	in := io.TeeReader(r, sum)
	corrupt := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, a...))
	}
	read := func(b []byte, what string) error {
		if _, err := io.ReadFull(in, b); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return corrupt("truncated %s", what)
			}
			return fmt.Errorf("read %s: %w", what, err)
		}
		return nil
	}
	fixed := make([]byte, len(streamMagic)+8)
	if err := read(fixed, "header"); err != nil {
		return nil, err
	}
	if string(fixed[:len(streamMagic)]) != streamMagic {
		return nil, corrupt("not a row stream (bad magic)")
	}
	if v := binary.LittleEndian.Uint16(fixed[8:]); v != streamVersion {
		return nil, corrupt("stream version %d, want %d", v, streamVersion)
	}
	if f := binary.LittleEndian.Uint16(fixed[10:]); f&^flagDelta != 0 {
		return nil, corrupt("unknown stream flags %#x", f)
	}
	n := binary.LittleEndian.Uint32(fixed[12:])
	if n > 1<<10 {
		return nil, corrupt("layout of %d bytes", n)
	}
	rest := make([]byte, int(n)+8)
	if err := read(rest, "header"); err != nil {
		return nil, err
	}
	hdr := append(fixed, rest[:n]...)
	if xxhash.Sum64(hdr) != binary.LittleEndian.Uint64(rest[n:]) {
		return nil, corrupt("header checksum mismatch")
	}
	got, err := DecodeLayout(rest[:n])
	if err != nil {
		return nil, err
	}
	if want := t.Layout(); got != want {
		return nil, &SchemaError{Want: want, Got: got}
	}
	rec := t.RawRowSize()
	var out bytes.Buffer
	var cnt [4]byte
	total := uint64(0)
	for {
		if err := read(cnt[:], "block"); err != nil {
			return nil, err
		}
		k := binary.LittleEndian.Uint32(cnt[:])
		if k == 0 {
			break
		}
		if k > uint32(blockLimit(rec)) {
			return nil, corrupt("block of %d records of %d bytes", k, rec)
		}
		// Copy as the bytes arrive, so a lying count cannot make us allocate ahead of the data.
		start := out.Len()
		if n, err := io.CopyN(&out, in, int64(k)*int64(rec)); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, corrupt("truncated block (%d of %d bytes)", n, int64(k)*int64(rec))
			}
			return nil, fmt.Errorf("read block: %w", err)
		}
		var bs [8]byte
		if err := read(bs[:], "block checksum"); err != nil {
			return nil, err
		}
		d := xxhash.New()
		d.Write(cnt[:])
		d.Write(out.Bytes()[start:])
		if d.Sum64() != binary.LittleEndian.Uint64(bs[:]) {
			return nil, corrupt("block %d checksum mismatch", total)
		}
		total += uint64(k)
	}
	var tail [8]byte
	if err := read(tail[:], "trailer"); err != nil {
		return nil, err
	}
	if c := binary.LittleEndian.Uint64(tail[:]); c != total {
		return nil, corrupt("trailer counts %d records, stream holds %d", c, total)
	}
	want := sum.Sum64()
	var fin [8]byte
	if _, err := io.ReadFull(r, fin[:]); err != nil {
		return nil, corrupt("truncated trailer")
	}
	if binary.LittleEndian.Uint64(fin[:]) != want {
		return nil, corrupt("stream checksum mismatch")
	}
	return out.Bytes(), nil
}
