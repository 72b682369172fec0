package ps

import (
	"errors"
	"fmt"
)

var (
	// ErrBadConfig is returned by constructors and Validate for an invalid configuration; the
	// wrapped error lists every problem.
	ErrBadConfig = errors.New("ps: bad config")
	// ErrWrongOwner is matched by a *WrongOwnerError: a server was asked for a slot it does not
	// own. The client refreshes its owner table and retries; callers see it only when retries run
	// out.
	ErrWrongOwner = errors.New("ps: wrong owner")
	// ErrUnknownTable is returned when a request names a table the server does not host.
	ErrUnknownTable = errors.New("ps: unknown table")
	// ErrBadRequest is returned for a request that is malformed or does not fit the table (wrong
	// dimension, slice lengths that do not match).
	ErrBadRequest = errors.New("ps: bad request")
	// ErrNonFinite is returned when a push holds a NaN or infinite gradient; nothing is applied.
	ErrNonFinite = errors.New("ps: non-finite gradient")
	// ErrCorrupt is returned by decoders for malformed input.
	ErrCorrupt = errors.New("ps: corrupt encoding")
	// ErrNoTable is returned by a client that has no owner table and cannot get one.
	ErrNoTable = errors.New("ps: no owner table")
	// ErrClosed is returned by a closed Server or Client.
	ErrClosed = errors.New("ps: closed")
	// ErrFenced is returned for a push whose fence epoch a server refuses: the worker was
	// failed or replaced by the coordinator (Server.Fence, Server.SetEpochFloor). Nothing of the
	// push was applied by that server; resending it is pointless: the worker must join again.
	ErrFenced = errors.New("ps: fenced epoch")
	// ErrPartialPush is returned when a push reached some servers but failed at another: the
	// parts named in the error were not confirmed. It is never reported as success.
	ErrPartialPush = errors.New("ps: push partly applied")
	// ErrMoved is matched by a *MovedError: a slot is being handed to another server and its
	// old owner holds it fenced until the next owner table is out. The client waits for that
	// table (ClientConfig.FenceWait) and goes to the new owner; callers see it only when the
	// wait runs out.
	ErrMoved = errors.New("ps: slot moved")
	// ErrMigration is returned when a slot migration cannot start or fails: a slot not owned by
	// the source or already owned by the destination, tables that differ between the two, an
	// unknown migration, or a transfer that broke off. The slots then stay with their source.
	ErrMigration = errors.New("ps: migration failed")
	// ErrNotPublished is returned by a Publish (see Migrator) that installed its owner table
	// nowhere, typically because the job's table changed meanwhile (a recovery): the Migrator
	// then calls the group off, as if its copy had failed, and stops.
	ErrNotPublished = errors.New("ps: owner table not published")
)

// MovedError is a server's refusal of a slot it is handing over. It matches ErrMoved.
type MovedError struct {
	Server  string // the refusing server's address
	Slot    int    // the first fenced slot of the request
	To      string // the ID of the server the slot goes to
	Version uint64 // the refusing server's owner-table version; the move is published above it
}

func (e *MovedError) Error() string {
	return fmt.Sprintf("ps: server %s is handing slot %d to %s (its owner table is version %d)", e.Server, e.Slot, e.To, e.Version)
}

// Is reports whether target is ErrMoved.
func (e *MovedError) Is(target error) bool { return target == ErrMoved }

// WrongOwnerError is a server's refusal of a slot it does not own, or of a synchronous push
// routed by another owner table than the one its step runs by (Slot -1). It matches
// ErrWrongOwner.
type WrongOwnerError struct {
	Server  string // the refusing server's address
	Slot    int    // the first slot it refused; -1: the whole synchronous push
	Version uint64 // the server's owner-table version
}

func (e *WrongOwnerError) Error() string {
	if e.Slot < 0 {
		return fmt.Sprintf("ps: server %s runs synchronous steps by owner table version %d", e.Server, e.Version)
	}
	return fmt.Sprintf("ps: server %s does not own slot %d (its owner table is version %d)", e.Server, e.Slot, e.Version)
}

// Is reports whether target is ErrWrongOwner.
func (e *WrongOwnerError) Is(target error) bool { return target == ErrWrongOwner }

// ServerError names the server a call failed at.
type ServerError struct {
	Server string
	Err    error
}

func (e *ServerError) Error() string { return fmt.Sprintf("ps: server %s: %v", e.Server, e.Err) }
func (e *ServerError) Unwrap() error { return e.Err }
