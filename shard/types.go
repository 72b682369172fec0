package shard

import (
	"fmt"
	"time"
)

// Kind is the kind of a dataset and of its shards.
type Kind uint8

const (
	// KindIndexed is a dataset of N records addressed by index 0..N-1 (for example a table held in
	// memory). Shards are index ranges [Start, End).
	KindIndexed Kind = iota + 1
	// KindText is a list of text files with one record per line. Shards are byte ranges
	// [Start, End) of one file, cut at line boundaries by SplitText.
	KindText
	// KindStream is a set of partitions whose records are addressed by offset and which grow over
	// time. Shards are offset ranges [Start, End) of one partition, cut as the stream grows.
	KindStream
)

func (k Kind) String() string {
	switch k {
	case KindIndexed:
		return "indexed"
	case KindText:
		return "text"
	case KindStream:
		return "stream"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Shard is one unit of work: a contiguous run of records of a dataset.
//
// Records of a shard are numbered by their offset 0..Records-1 within the shard; progress is
// reported as an offset. Record offset i of the shard is the dataset record Base+i (for KindStream:
// offset Start+i of Partition) unless the lease carries a ShuffleSeed, in which case offset i is the
// record RecordOrder(seed, Records)[i] positions after the shard's first record.
type Shard struct {
	Index     int    // position in the dispatcher's shard table
	Kind      Kind   // dataset kind
	File      string // KindText: file name within the source file system
	Partition int    // KindStream: partition number
	Start     int64  // KindIndexed: first record index; KindText: first byte; KindStream: first offset
	End       int64  // exclusive end of the range, in the same unit as Start
	Records   int64  // number of records in the shard (> 0)
	Base      int64  // dataset-wide index of the first record (KindStream: Start)
	Line      int64  // KindText: 1-based line number of the first record in File
}

// Global returns the dataset-wide index of the record at position pos (0 <= pos < Records) of
// the shard's natural (unshuffled) order. For KindStream it is the partition offset.
func (s Shard) Global(pos int64) int64 { return s.Base + pos }

// LeaseID names one grant of one shard to one worker. Lease ids are never reused: Seq grows
// monotonically within one dispatcher incarnation, and Incarnation differs between dispatcher
// instances (see Config.Incarnation), so a report carrying an old lease id can never be mistaken
// for a report on a newer lease.
type LeaseID struct {
	Incarnation uint64 // the granting dispatcher instance
	Seq         uint64 // grant number within that instance, from 1
	Shard       uint32 // shard table index the lease is for
}

func (id LeaseID) String() string {
	return fmt.Sprintf("%x/%d/%d", id.Incarnation, id.Seq, id.Shard)
}

// Lease is a shard handed to a worker by Acquire.
type Lease struct {
	ID    LeaseID
	Epoch int   // epoch the shard belongs to, from 0
	Shard Shard // what to read
	// Offset is the first record offset still to train: records before it were already reported
	// (by this worker or an earlier holder of the shard).
	Offset int64
	// TTL is how long the lease lives after the grant and after each accepted Report. A worker
	// that does not report for TTL loses the lease.
	TTL time.Duration
	// ShuffleSeed, when non-zero, says records within the shard are visited in the order
	// RecordOrder(ShuffleSeed, Records); offsets count positions in that order.
	ShuffleSeed uint64
}

// Dataset describes what the dispatcher splits into shards. Build it with IndexedDataset,
// TextDataset or StreamDataset.
type Dataset struct {
	Kind Kind
	// Records is the number of records of a KindIndexed dataset.
	Records int64
	// Text is the line-aligned shard list of a KindText dataset, as returned by SplitText, in
	// file order. New renumbers Index and Base.
	Text []Shard
	// Partitions is the number of partitions of a KindStream dataset.
	Partitions int
	// StreamStart optionally gives each partition's first offset (default 0).
	StreamStart []int64
}

// IndexedDataset returns a dataset of n records addressed by index.
func IndexedDataset(n int64) Dataset { return Dataset{Kind: KindIndexed, Records: n} }

// TextDataset returns a dataset of text files already cut into line-aligned shards by SplitText.
func TextDataset(shards []Shard) Dataset { return Dataset{Kind: KindText, Text: shards} }

// StreamDataset returns a growing dataset of the given number of partitions, each starting at
// offset 0. Offsets become available through Dispatcher.GrowStream.
func StreamDataset(partitions int) Dataset { return Dataset{Kind: KindStream, Partitions: partitions} }
