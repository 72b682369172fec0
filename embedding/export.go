package embedding

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// The export stream (version 1), all integers little-endian:
//
//	header  "EPSROWS\x00" | version u16 | flags u16 | layout length u32 | layout (Schema) |
//	        xxhash64 of the header bytes before it
//	block   record count u32 (1..65536) | count raw records | xxhash64 of count and records
//	        (repeated)
//	trailer 0 u32 | total records u64 | xxhash64 of every byte of the stream before it
//
// The trailer's running checksum catches dropped, repeated or reordered blocks; the per-block
// checksum lets a reader stop at the first bad block.
const (
	streamMagic   = "EPSROWS\x00"
	streamVersion = 1
	flagDelta     = 1 // the stream holds changed rows and deletions, not a whole selection
	maxBlockRecs  = 1 << 16
	maxBlockBytes = 8 << 20 // a block holds at most this many bytes, or one record
	blockRecords  = 4096    // records per block written, within maxBlockBytes
)

// blockLimit is how many records of rec bytes a block may hold.
func blockLimit(rec int) int { return max(1, min(maxBlockRecs, maxBlockBytes/rec)) }

// ExportOptions select the rows to export.
type ExportOptions struct {
	// Slots keeps rows whose slot is in the set (nil: every row).
	Slots *SlotSet
	// Changed exports only the rows the tracker recorded as changed, with deletion records for
	// removed ids (nil: every live row).
	Changed *Tracker
	// Reset clears Changed as each shard is copied. If the export then fails, the cleared changes
	// are not recorded anywhere: send a full export next.
	Reset bool
}

// Export writes the selected rows to w as a checksummed stream that Import reads back bit-exactly,
// and returns the number of records written. It copies one shard at a time under that shard's
// read lock and writes without holding any lock, so each shard is a consistent cut.
func (t *Table) Export(w io.Writer, opt ExportOptions) (int, error) {
	var keep func(uint64) bool
	if opt.Slots != nil {
		keep = opt.Slots.Contains
	}
	tr := opt.Changed
	if tr != nil {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if tr.isClosed() {
			return 0, ErrClosed
		}
	}
	sum := xxhash.New()
	bw := bufio.NewWriterSize(io.MultiWriter(w, sum), 1<<16)
	var hdr []byte
	hdr = append(hdr, streamMagic...)
	hdr = binary.LittleEndian.AppendUint16(hdr, streamVersion)
	var flags uint16
	if tr != nil {
		flags |= flagDelta
	}
	hdr = binary.LittleEndian.AppendUint16(hdr, flags)
	schema := t.Schema()
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(schema)))
	hdr = append(hdr, schema...)
	hdr = binary.LittleEndian.AppendUint64(hdr, xxhash.Sum64(hdr))
	if _, err := bw.Write(hdr); err != nil {
		return 0, fmt.Errorf("export %s: %w", t.name(), err)
	}
	rec := t.RawRowSize()
	total := 0
	var buf []byte
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.RLock()
		need := t.boundLocked(s, tr)
		if cap(buf) < need {
			buf = make([]byte, need)
		}
		n := t.copyShardSelectedLocked(s, buf[:need], tr, keep)
		if opt.Reset && tr != nil {
			s.bitsLocked(tr).reset()
		}
		s.mu.RUnlock()
		for data := buf[:n]; len(data) > 0; {
			k := min(len(data)/rec, blockRecords, blockLimit(rec))
			if err := writeBlock(bw, data[:k*rec], k); err != nil {
				return total, fmt.Errorf("export %s: %w", t.name(), err)
			}
			data = data[k*rec:]
			total += k
		}
	}
	var tail [12]byte
	binary.LittleEndian.PutUint64(tail[4:], uint64(total))
	if _, err := bw.Write(tail[:]); err != nil {
		return total, fmt.Errorf("export %s: %w", t.name(), err)
	}
	if err := bw.Flush(); err != nil {
		return total, fmt.Errorf("export %s: %w", t.name(), err)
	}
	var fin [8]byte
	binary.LittleEndian.PutUint64(fin[:], sum.Sum64())
	if _, err := w.Write(fin[:]); err != nil {
		return total, fmt.Errorf("export %s: %w", t.name(), err)
	}
	return total, nil
}

// copyShardSelectedLocked copies one shard's selected rows (changed ones when tr is set, deletions
// first) into dst.
func (t *Table) copyShardSelectedLocked(s *shard, dst []byte, tr *Tracker, keep func(uint64) bool) int {
	if tr == nil && keep == nil {
		t.copyShardLocked(s, dst[:s.live*t.RawRowSize()])
		return s.live * t.RawRowSize()
	}
	stride := t.stride
	rec := 4 * stride
	o := 0
	row := func(r uint32) {
		w := s.rowWords(r, stride)
		if w[wordStep] == freeMark || (keep != nil && !keep(uint64(w[0])|uint64(w[1])<<32)) {
			return
		}
		o += putWords(dst[o:o+rec], w)
	}
	if tr == nil {
		for r := uint32(0); r < s.hi; r++ {
			row(r)
		}
		return o
	}
	b := s.bitsLocked(tr)
	if b == nil {
		return 0
	}
	del := make([]uint32, stride)
	del[wordStep] = freeMark
	for _, id := range b.deleted {
		if keep == nil || keep(id) {
			del[0], del[1] = uint32(id), uint32(id>>32)
			o += putWords(dst[o:o+rec], del)
		}
	}
	if keep == nil {
		forRuns(b.bits, s.hi, func(lo, hi uint32) { o += t.putLiveRowsLocked(s, lo, hi, dst[o:]) })
		return o
	}
	for wi, word := range b.bits {
		for ; word != 0; word &= word - 1 {
			if r := uint32(wi*64 + bits.TrailingZeros64(word)); r < s.hi {
				row(r)
			}
		}
	}
	return o
}

func writeBlock(w io.Writer, data []byte, records int) error {
	var c [4]byte
	binary.LittleEndian.PutUint32(c[:], uint32(records))
	d := xxhash.New()
	d.Write(c[:])
	d.Write(data)
	var sum [8]byte
	binary.LittleEndian.PutUint64(sum[:], d.Sum64())
	for _, p := range [][]byte{c[:], data, sum[:]} {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}
