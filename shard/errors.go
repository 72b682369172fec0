package shard

import (
	"errors"
	"fmt"
	"time"
)

// Dispatcher and Service errors. Test with errors.Is; the wire adapter maps each to a status code
// (package shardwire) so a network client returns the same sentinels.
var (
	// ErrNoMoreWork is returned by Acquire when every epoch is finished (or, for a stream, when the
	// stream is sealed and drained): the worker should stop asking.
	ErrNoMoreWork = errors.New("shard: no more work")
	// ErrWait is returned by Acquire, wrapped in a *WaitError, when no shard can be handed out now but
	// work remains (other workers hold the last shards of the epoch, or a stream has no new data).
	ErrWait = errors.New("shard: no shard available yet")
	// ErrStaleLease is returned by Report when the lease is not the current lease of a DOING shard
	// held by that worker: it expired, was revoked (Evict, Leave, restore, the worker's lease limit),
	// its shard is finished, or it was granted by another dispatcher incarnation. Nothing of such a
	// report is counted; the worker must drop the shard and Acquire again.
	ErrStaleLease = errors.New("shard: stale lease")
	// ErrBadOffset is returned by Report when the offset is negative or beyond the shard's record
	// count, or when done is set and the offset is not the shard's record count. The lease stays.
	ErrBadOffset = errors.New("shard: bad offset")
	// ErrBadWorker is returned when a worker name is empty or longer than MaxWorkerName bytes.
	ErrBadWorker = errors.New("shard: bad worker name")
	// ErrInvalidConfig is returned (joined with every problem found) by Validate and New.
	ErrInvalidConfig = errors.New("shard: invalid config")
	// ErrSnapshotCorrupt is returned by Restore and DecodeSnapshot when the bytes are truncated,
	// fail their checksum or describe an impossible state.
	ErrSnapshotCorrupt = errors.New("shard: corrupt snapshot")
	// ErrSnapshotVersion is returned by Restore when the snapshot was written by an unknown
	// (newer) encoding version.
	ErrSnapshotVersion = errors.New("shard: unsupported snapshot version")
	// ErrSnapshotMismatch is returned by Restore when the snapshot was taken for another dataset,
	// shard size, seed or shuffle setting than the dispatcher's Config.
	ErrSnapshotMismatch = errors.New("shard: snapshot does not match the dataset")
	// ErrNotStream is returned by GrowStream, FlushStream and SealStream on a non-stream dataset.
	ErrNotStream = errors.New("shard: dataset is not a stream")
	// ErrStreamSealed is returned by GrowStream and FlushStream after SealStream.
	ErrStreamSealed = errors.New("shard: stream is sealed")
	// ErrBadPartition is returned by GrowStream for an unknown partition or a shrinking end offset.
	ErrBadPartition = errors.New("shard: bad stream partition or offset")
	// ErrPermanent is matched by the errors of a Service that retrying cannot cure: a network
	// client refused for a wrong cluster secret, talking to something that is not a dispatcher
	// of its protocol version, or closed. A Reader returns such an error at once instead of
	// retrying it; every other error that is not a sentinel of this package is retried.
	ErrPermanent = errors.New("shard: permanent service failure")
)

// Worker-side errors.
var (
	// ErrMalformed is matched (errors.Is) by every *ParseError: a line that a format parser rejects.
	ErrMalformed = errors.New("shard: malformed record")
	// ErrShardMismatch is returned by a Cursor when the data behind a shard holds fewer or more
	// records than the shard table says (the files changed after splitting).
	ErrShardMismatch = errors.New("shard: data does not match the shard table")
	// ErrSchema is returned by Batch.Append when a record's dense width or field count differs
	// from the records already in the batch.
	ErrSchema = errors.New("shard: record schema differs within a batch")
	// ErrClosed is returned by Reader methods after Close.
	ErrClosed = errors.New("shard: reader closed")
)

// WaitError is the error Acquire returns when no shard is available yet. It matches ErrWait.
type WaitError struct {
	// RetryAfter is how long the dispatcher suggests waiting before asking again.
	RetryAfter time.Duration
}

func (e *WaitError) Error() string {
	return fmt.Sprintf("shard: no shard available yet, retry after %v", e.RetryAfter)
}

// Is reports whether target is ErrWait.
func (e *WaitError) Is(target error) bool { return target == ErrWait }

// ParseError reports a malformed line with its place. It matches ErrMalformed.
type ParseError struct {
	File string // file name as given to the source; "" for in-memory data
	Line int64  // 1-based line number within File (or record index for in-memory data)
	Err  error  // what is wrong
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("shard: %s:%d: %v", e.File, e.Line, e.Err)
}

// Unwrap returns the underlying problem.
func (e *ParseError) Unwrap() error { return e.Err }

// Is reports whether target is ErrMalformed.
func (e *ParseError) Is(target error) bool { return target == ErrMalformed }
