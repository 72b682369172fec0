package checkpoint

import (
	"errors"
	"fmt"
)

var (
	// ErrCorrupt is returned when stored or shared-memory data fails a magic, length or checksum check,
	// or does not decode. Restore skips a commit whose data is corrupt.
	ErrCorrupt = errors.New("checkpoint: corrupt data")
	// ErrUnsupportedVersion is returned for a file in a format version newer than this release
	// reads: a later release wrote it. It is not corruption: Restore, Choose and Prune stop on it
	// rather than skip the commit or delete what the file refers to.
	ErrUnsupportedVersion = errors.New("checkpoint: format version newer than this release reads")
	// ErrNotFound is returned by a Storage when the named object does not exist.
	ErrNotFound = errors.New("checkpoint: not found")
	// ErrNotCommitted is returned when a step has no valid commit record. Nothing without a commit
	// record is ever restored.
	ErrNotCommitted = errors.New("checkpoint: step not committed")
	// ErrNoCheckpoint is returned by Restore and Choose when no committed checkpoint can be restored.
	ErrNoCheckpoint = errors.New("checkpoint: no restorable checkpoint")
	// ErrBusy is returned by Snapshot when the generation it needs still holds data the persister has
	// not finished with; the caller may skip this checkpoint or try again later.
	ErrBusy = errors.New("checkpoint: both generations busy")
	// ErrExistingCommits is returned by Committer.PrepareFresh, and by a coordinator that would
	// train a job afresh, when the job's storage holds commits of an earlier run that nobody
	// chose to resume or overwrite: training afresh would void those commits and retention
	// delete them. The error is an *ExistingCommitsError.
	ErrExistingCommits = errors.New("checkpoint: the storage holds commits of an earlier run of the job")
	// ErrClosed is returned by calls on a closed Checkpointer.
	ErrClosed = errors.New("checkpoint: closed")
	// ErrStepOrder is returned by Snapshot when the step is not greater than the previous snapshot's.
	ErrStepOrder = errors.New("checkpoint: step not increasing")
	// ErrSchemaMismatch is returned by Load when a table's Schema differs from the saved one.
	ErrSchemaMismatch = errors.New("checkpoint: table schema differs")
	// ErrTableSet is returned by Load when the checkpoint's table names differ from the Checkpointer's.
	ErrTableSet = errors.New("checkpoint: table set differs")
	// ErrRegionLocked is returned by New when another live process holds the node's shared-memory region.
	ErrRegionLocked = errors.New("checkpoint: shared-memory region in use")
	// ErrIncomplete is returned by Commit when the manifests do not form a whole checkpoint: one is
	// missing or unreadable, their slot sets overlap or leave a slot uncovered, or a delta's chain is broken.
	ErrIncomplete = errors.New("checkpoint: incomplete checkpoint")
	// ErrPartialRestore is returned by Load when data that verified failed while being applied; the
	// tables hold part of the checkpoint and must be recreated before another attempt.
	ErrPartialRestore = errors.New("checkpoint: restore failed after tables were modified")
	// ErrUnknownStep is returned by WaitPersisted for a step this Checkpointer did not snapshot, or whose
	// result is no longer remembered.
	ErrUnknownStep = errors.New("checkpoint: unknown step")
	// ErrAbandoned is returned, wrapped in a *PersistError, by WaitPersisted for a snapshot that a Load
	// or Restore superseded: its persist had not been reported when the tables were loaded, or its
	// step lies after the step loaded (that step may be snapshotted again, and only the new snapshot's
	// manifest may be committed).
	ErrAbandoned = errors.New("checkpoint: snapshot abandoned by a restore")
	// ErrInjected is the default error of a FaultStorage fault.
	ErrInjected = errors.New("checkpoint: injected fault")
)

// PersistError reports a persist that failed. The shared-memory copy of the step stays, and the next
// persist of the same generation also carries the rows of this one.
type PersistError struct {
	Step uint64
	Err  error
}

func (e *PersistError) Error() string {
	return fmt.Sprintf("checkpoint: persist step %d: %v", e.Step, e.Err)
}
func (e *PersistError) Unwrap() error { return e.Err }

// corruptf returns an error wrapping ErrCorrupt.
func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}
