package remote

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/ps"
)

// The control protocol's payloads are little-endian fields in a fixed order per method:
//
//	u64     8 bytes
//	u8      1 byte
//	str     u16 length, then the bytes (at most maxString)
//	bytes   u32 length, then the bytes (at most maxBytes)
//	u64s    u32 count, then count u64 (at most maxEpochs)
//
// A decoder checks every length against what is left before it allocates, and a payload with
// bytes left over is malformed.

const (
	maxString = 1024
	maxBytes  = 64 << 20
	maxEpochs = 1 << 16
)

var errMalformed = errors.New("remote: malformed control message")

type enc []byte

func (e enc) u64(v uint64) enc { return binary.LittleEndian.AppendUint64(e, v) }
func (e enc) u8(v uint8) enc   { return append(e, v) }
func (e enc) str(s string) enc {
	return append(binary.LittleEndian.AppendUint16(e, uint16(len(s))), s...)
}
func (e enc) bytes(b []byte) enc {
	return append(binary.LittleEndian.AppendUint32(e, uint32(len(b))), b...)
}
func (e enc) u64s(v []uint64) enc {
	e = binary.LittleEndian.AppendUint32(e, uint32(len(v)))
	for _, x := range v {
		e = e.u64(x)
	}
	return e
}

// dec reads fields; the first failure sticks.
type dec struct {
	b   []byte
	err error
}

func (d *dec) take(n int) []byte {
	if d.err != nil || n < 0 || n > len(d.b) {
		d.err = errMalformed
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (d *dec) u8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *dec) str() string {
	n := 0
	if b := d.take(2); b != nil {
		n = int(binary.LittleEndian.Uint16(b))
	}
	if n > maxString {
		d.err = errMalformed
	}
	return string(d.take(n))
}

func (d *dec) bytes() []byte {
	n := 0
	if b := d.take(4); b != nil {
		n = int(binary.LittleEndian.Uint32(b))
	}
	if n > maxBytes {
		d.err = errMalformed
	}
	return d.take(n)
}

func (d *dec) u64s() []uint64 {
	n := 0
	if b := d.take(4); b != nil {
		n = int(binary.LittleEndian.Uint32(b))
	}
	if n > maxEpochs || 8*n > len(d.b) {
		d.err = errMalformed
		return nil
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = d.u64()
	}
	return out
}

// end reports the first failure, or leftover bytes.
func (d *dec) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = errMalformed
	}
	return d.err
}

// workerMsg is the request of Join, Begin, End and Leave.
type workerMsg struct {
	worker string
	epoch  uint64
	ok     bool
	batch  uint64 // Join: the worker's batch size
}

func (m workerMsg) append(dst []byte) []byte {
	ok := uint8(0)
	if m.ok {
		ok = 1
	}
	return enc(dst).str(m.worker).u64(m.epoch).u8(ok).u64(m.batch)
}

func decodeWorkerMsg(b []byte) (workerMsg, error) {
	d := dec{b: b}
	m := workerMsg{worker: d.str(), epoch: d.u64(), ok: d.u8() == 1, batch: d.u64()}
	return m, d.end()
}

// serverMsg is the request of the server agent's methods.
type serverMsg struct {
	inc    uint64 // the incarnation the call is meant for (0: any)
	coord  uint64 // the coordinator incarnation making it (0: one that has not led the server)
	step   uint64
	floor  uint64
	epochs []uint64
	table  []byte // ps.AppendOwnerTable, or empty
	done   []byte // Progress.AppendBinary, or empty: Snapshot's committed progress
	acc    []byte // Progress.AppendBinary, or empty: Snapshot's accepted progress
	mode   uint8  // Restore's RestoreMode
}

func (m serverMsg) append(dst []byte) []byte {
	return enc(dst).u64(m.inc).u64(m.coord).u64(m.step).u64(m.floor).u64s(m.epochs).bytes(m.table).bytes(m.done).bytes(m.acc).u8(m.mode)
}

func decodeServerMsg(b []byte) (serverMsg, error) {
	d := dec{b: b}
	m := serverMsg{inc: d.u64(), coord: d.u64(), step: d.u64(), floor: d.u64(), epochs: d.u64s(), table: d.bytes(), done: d.bytes(), acc: d.bytes(), mode: d.u8()}
	return m, d.end()
}

// rebalanceMsg is the request of Rebalance.
type rebalanceMsg struct {
	over     float64
	window   time.Duration
	maxMoves uint64
}

func (m rebalanceMsg) append(dst []byte) []byte {
	return enc(dst).u64(math.Float64bits(m.over)).u64(uint64(m.window)).u64(m.maxMoves)
}

func decodeRebalanceMsg(b []byte) (rebalanceMsg, error) {
	d := dec{b: b}
	m := rebalanceMsg{over: math.Float64frombits(d.u64()), window: time.Duration(d.u64()), maxMoves: d.u64()}
	return m, d.end()
}

// minMoveSize is the least size of a move in Rebalance's answer: its slot and two empty ids.
const minMoveSize = 8 + 2 + 2

// appendMoves is Rebalance's answer: the count of moves, then each move's slot and the ids of
// the servers it moves from and to.
func appendMoves(dst []byte, moves []ps.Move) []byte {
	e := enc(dst).u64(uint64(len(moves)))
	for _, m := range moves {
		e = e.u64(uint64(m.Slot)).str(m.From).str(m.To)
	}
	return e
}

// decodeMoves decodes appendMoves's answer; no move is nil.
func decodeMoves(b []byte) ([]ps.Move, error) {
	d := dec{b: b}
	n := d.u64()
	if d.err != nil || n > uint64(len(d.b)/minMoveSize) { // checked before the slice is made
		return nil, errMalformed
	}
	var moves []ps.Move
	if n > 0 {
		moves = make([]ps.Move, 0, n)
	}
	for range n {
		slot, from, to := d.u64(), d.str(), d.str()
		if slot > math.MaxInt32 {
			d.err = errMalformed
		}
		moves = append(moves, ps.Move{Slot: int(slot), From: from, To: to})
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return moves, nil
}

// progressBytes is d's encoding (Progress.AppendBinary cannot fail).
func progressBytes(d elastic.Progress) []byte {
	b, _ := d.AppendBinary(nil)
	return b
}

// decodeProgress decodes what progressBytes wrote.
func decodeProgress(b []byte) (elastic.Progress, error) {
	var p elastic.Progress
	if err := p.UnmarshalBinary(b); err != nil {
		return elastic.Progress{}, fmt.Errorf("%w: %w", errMalformed, err)
	}
	return p, nil
}
