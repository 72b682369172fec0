package embedding

import (
	"errors"
	"fmt"
)

var (
	// ErrBadConfig is returned by New and Config.Validate when the configuration is invalid; the
	// wrapped error lists every problem.
	ErrBadConfig = errors.New("embedding: bad config")
	// ErrLength is returned by Lookup and Apply when a slice length does not match len(ids)*Dim.
	ErrLength = errors.New("embedding: wrong slice length")
	// ErrNonFinite is returned by Apply when a gradient is NaN or ±Inf. The whole batch is
	// rejected, nothing is changed, and Stats.RejectedBatches is incremented.
	ErrNonFinite = errors.New("embedding: non-finite gradient")
	// ErrCorrupt is returned by Import and LoadRaw when the input is malformed, truncated or fails
	// its checksum. Nothing is changed.
	ErrCorrupt = errors.New("embedding: corrupt input")
	// ErrSchema is returned by Import and LoadRaw when the input was written by a table with a
	// different row layout (dimension, optimizer or state width). Nothing is changed.
	ErrSchema = errors.New("embedding: schema mismatch")
	// ErrNoBase is returned by CopyRaw and RawSize with changedOnly when no base copy was taken yet.
	ErrNoBase = errors.New("embedding: no base copy to compare against")
	// ErrFull is returned when a shard of the table cannot hold another row: it has
	// MaxRowsPerShard rows (use more shards), or the system has no memory for another slab.
	ErrFull = errors.New("embedding: table shard full")
	// ErrClosed is returned by the methods of a Tracker after Close.
	ErrClosed = errors.New("embedding: tracker closed")
)

// SchemaError describes a row-layout mismatch; it matches ErrSchema with errors.Is.
type SchemaError struct {
	Want, Got Layout
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("embedding: schema mismatch: table has %v, input has %v", e.Want, e.Got)
}

// Is reports whether target is ErrSchema.
func (e *SchemaError) Is(target error) bool { return target == ErrSchema }
