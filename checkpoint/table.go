package checkpoint

import "encoding/binary"

// Table is the view of one embedding table that checkpoints need.
//
// A Table must be safe for concurrent use: training goes on while CopyRaw runs. The checkpointer calls
// RawSize from the goroutine that calls Snapshot and from its own background goroutines (to grow
// shared memory ahead of the next snapshot), and CopyRaw from the goroutine that calls Snapshot or
// from goroutines it starts: a snapshot copies several tables at once, never one table twice at once. It calls LoadRaw from the
// goroutine that calls Load or Restore; it never calls LoadRaw on the same table from two
// goroutines at once.
type Table interface {
	// Schema describes the row layout (dim, optimizer, state width, ...); a restore into a
	// table whose Schema differs is refused.
	Schema() []byte
	// RawRowSize is the fixed size in bytes of one raw record. Bytes [0:8) of a record are the
	// row id as a little-endian uint64; bytes [8:12) are a little-endian uint32 that equals
	// 0xFFFFFFFF in a deletion record (the row was removed since the base); the rest is opaque.
	RawRowSize() int
	// RawSize returns an upper bound of the bytes CopyRaw(changedOnly, ...) would write now.
	RawSize(changedOnly bool) int
	// CopyRaw copies packed records into dst and returns the bytes written: every live row
	// (changedOnly false), or only rows changed or deleted since the last base (changedOnly
	// true; deletions as deletion records). With newBase the change set is cleared in the same
	// critical section as the copy, so this copy becomes the base of later incremental copies.
	// A dst too small returns io.ErrShortBuffer and changes nothing (the caller grows and retries).
	// Each row is copied consistently; training may go on concurrently (per-row consistency),
	// and at a step barrier the whole copy is consistent.
	CopyRaw(dst []byte, changedOnly, newBase bool) (int, error)
	// LoadRaw applies records in order — inserting or replacing rows, deletion records remove
	// them — skipping records whose id keep rejects (nil keeps all). It returns the number of
	// records applied. Malformed input returns an error and changes nothing.
	LoadRaw(src []byte, keep func(id uint64) bool) (int, error)
}

// ShardedTable is a Table whose full copies hold its rows grouped by an internal partition (the
// shards of an embedding table), and which can take such a copy back group by group. A full
// snapshot records each group's record count; a restore from shared memory into an empty table of
// the same partition then hands every group its records as they lie, on all workers at once,
// checking each piece's checksum just before the piece is loaded, and undoes the whole load if a
// piece fails, so the table is left as it was. The checkpointer detects the interface by type
// assertion; a plain Table is restored with LoadRaw.
type ShardedTable interface {
	Table
	// CopyRawShards is CopyRaw(dst, false, newBase) that also returns the record count of each
	// group, in the order the groups follow one another in dst, and a key naming the partition:
	// tables with equal keys put every id in the same group.
	CopyRawShards(dst []byte, newBase bool) (n int, counts []int, key []byte, err error)
	// LoadRawShards starts loading records that a CopyRawShards with this key and these counts
	// wrote, into this table. It fails, changing nothing, when the table is not empty or
	// partitions otherwise. Then load(g, src) adds the next records of group g, in order (calls
	// for different groups run concurrently, those for one group one at a time), and one call of
	// end after the last load either keeps the rows (end(true), which fails unless every group got
	// its count) or removes every row the load added (end(false), or a failed end(true)). Bad
	// records make load fail; the checkpointer then calls end(false).
	LoadRawShards(key []byte, counts []int) (load func(group int, src []byte) error, end func(keep bool) (int, error), err error)
}

// SlotDeltaTable is a Table that can restrict a delta to the slots a node owns and copy whole the
// rows of slots it gained, so that a snapshot after a change of the node's slot set (a live
// repartition) is a delta rather than a full copy. The checkpointer detects it by type
// assertion; when any table is a plain Table, a snapshot whose slot set differs from the
// previous snapshot's is taken in full.
type SlotDeltaTable interface {
	Table
	// CopyRawDelta copies into dst, in one consistent cut like CopyRaw, every live row whose id
	// whole accepts, and the rows changed or deleted since the last base whose id changed accepts
	// and whole rejects (deletions as deletion records, each before any row of its id). A nil
	// changed accepts every id; a nil whole accepts none, which makes it CopyRaw(dst, true,
	// newBase) restricted to changed. With newBase the change set is cleared in the same
	// critical section, also of rows neither filter accepts. The filters may be called from
	// several goroutines at once. A dst too small returns io.ErrShortBuffer, changes nothing, and
	// returns as n the room the copy needs (a bound, which may count records it then leaves out;
	// rows may be added before the retry, so the checkpointer adds some room to it).
	CopyRawDelta(dst []byte, changed, whole func(id uint64) bool, newBase bool) (n int, err error)
}

// DeletionMark is the little-endian uint32 at bytes [8:12) of a deletion record.
const DeletionMark = 0xFFFFFFFF

// minRowSize is the smallest raw record: an 8-byte id and a 4-byte mark.
const minRowSize = 12

// recordID returns the row id of the raw record that starts at rec[0].
func recordID(rec []byte) uint64 { return binary.LittleEndian.Uint64(rec) }
