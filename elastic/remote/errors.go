package remote

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/shard"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/ps"
)

// Errors of the control protocol. A handler's error crosses the wire as an rpc.RemoteError: its
// Code is the code of the first sentinel of errorCodes the error matches (codeFailed: none), and
// its Data the codes of every sentinel it matches, each a little-endian uint32, so that an error
// wrapping several (checkpoint.ErrPartialRestore and checkpoint.ErrCorrupt, say) keeps them all.
// The caller's error matches (errors.Is) the same sentinels and names the address called. A peer
// that sends no Data is read by its Code alone.
//
// Every sentinel a caller may branch on must be in errorCodes: a damaged commit that comes back
// from a remote server as a plain failure is not skipped, where the same failure in process is.
// TestEverySentinelCrossesTheWire checks each exported sentinel of checkpoint, elastic, ps,
// shard and server. A code is never renumbered or reused: peers of other releases read it.
const (
	codeMalformed    = rpc.MinAppCode + 0x450
	codeNotMember    = codeMalformed + 1
	codeStopped      = codeMalformed + 2
	codeHeld         = codeMalformed + 3 // Begin: still held at the barrier; call again
	codeBusy         = codeMalformed + 4
	codeNoCheckpoint = codeMalformed + 5
	codeFailed       = codeMalformed + 6 // none of the sentinels
	codeClosed       = codeMalformed + 7
	codeNotFresh     = codeMalformed + 8
	codeReplaced     = codeMalformed + 9
	codeSuperseded   = codeMalformed + 10
	codeNoScaler     = codeMalformed + 11
	codeUnsupported  = codeMalformed + 12
	codeInvalid      = codeMalformed + 13

	codeCkCorrupt        = codeMalformed + 14
	codeCkNotFound       = codeMalformed + 15
	codeCkNotCommitted   = codeMalformed + 16
	codeCkVersion        = codeMalformed + 17
	codeCkClosed         = codeMalformed + 18
	codeCkStepOrder      = codeMalformed + 19
	codeCkSchema         = codeMalformed + 20
	codeCkTableSet       = codeMalformed + 21
	codeCkRegionLocked   = codeMalformed + 22
	codeCkIncomplete     = codeMalformed + 23
	codeCkPartialRestore = codeMalformed + 24
	codeCkUnknownStep    = codeMalformed + 25
	codeCkAbandoned      = codeMalformed + 26
	codeCkInjected       = codeMalformed + 27
	codeCkSuperseded     = codeMalformed + 28

	codeCommitsBehind = codeMalformed + 29
	codeNeedsResume   = codeMalformed + 30
	// 31 to 34 are retired: they were the process scaler's own errors and gossip's, which are
	// a local caller's and never cross the wire.
	codePushedTwice   = codeMalformed + 35
	codeBatchFailed   = codeMalformed + 36
	codeNoCheckpoints = codeMalformed + 37

	codePsBadConfig      = codeMalformed + 38
	codePsWrongOwner     = codeMalformed + 39
	codePsUnknownTable   = codeMalformed + 40
	codePsBadRequest     = codeMalformed + 41
	codePsNonFinite      = codeMalformed + 42
	codePsCorrupt        = codeMalformed + 43
	codePsNoTable        = codeMalformed + 44
	codePsClosed         = codeMalformed + 45
	codePsFenced         = codeMalformed + 46
	codePsPartialPush    = codeMalformed + 47
	codePsMoved          = codeMalformed + 48
	codePsMigration      = codeMalformed + 49
	codePsNotPublished   = codeMalformed + 50
	codePsCorruptApplied = codeMalformed + 51

	codeDuplicateWorker = codeMalformed + 52
	codeExistingCommits = codeMalformed + 53

	codeShardNoMoreWork       = codeMalformed + 54
	codeShardWait             = codeMalformed + 55
	codeShardStaleLease       = codeMalformed + 56
	codeShardBadOffset        = codeMalformed + 57
	codeShardBadWorker        = codeMalformed + 58
	codeShardInvalidConfig    = codeMalformed + 59
	codeShardSnapshotCorrupt  = codeMalformed + 60
	codeShardSnapshotVersion  = codeMalformed + 61
	codeShardSnapshotMismatch = codeMalformed + 62
	codeShardNotStream        = codeMalformed + 63
	codeShardStreamSealed     = codeMalformed + 64
	codeShardBadPartition     = codeMalformed + 65
	codeShardPermanent        = codeMalformed + 66
	codeShardMalformed        = codeMalformed + 67
	codeShardShardMismatch    = codeMalformed + 68
	codeShardSchema           = codeMalformed + 69
	codeShardClosed           = codeMalformed + 70
	codeShardTooManyBadLines  = codeMalformed + 71
	codeShardFieldMap         = codeMalformed + 72
	codeCkDigestMismatch      = codeMalformed + 73
)

// errHeld is a remote Begin's answer when the coordinator held it for beginHold.
var errHeld = errors.New("remote: held at the barrier")

// errorCodes is the table of the errors that cross the control protocol. The first entries
// come first as they did when they were the only ones (a peer of that release reads Code
// alone). ErrUnavailable is not among them: it says that a call did not reach the process
// called, which an answer from that process never means.
var errorCodes = []struct {
	code uint32
	err  error
}{
	{codeMalformed, errMalformed},
	{codeNotMember, elastic.ErrNotMember},
	{codeStopped, elastic.ErrStopped},
	{codeClosed, elastic.ErrClosed},
	{codeBusy, checkpoint.ErrBusy},
	{codeNoCheckpoint, checkpoint.ErrNoCheckpoint},
	{codeNotFresh, elastic.ErrNotFresh},
	{codeReplaced, elastic.ErrReplaced},
	{codeSuperseded, elastic.ErrSuperseded},
	{codeNoScaler, elastic.ErrNoScaler},
	{codeUnsupported, errors.ErrUnsupported},
	{codeInvalid, elastic.ErrInvalidConfig},
	{codeHeld, errHeld},

	{codeCkCorrupt, checkpoint.ErrCorrupt},
	{codeCkNotFound, checkpoint.ErrNotFound},
	{codeCkNotCommitted, checkpoint.ErrNotCommitted},
	{codeCkVersion, checkpoint.ErrUnsupportedVersion},
	{codeCkClosed, checkpoint.ErrClosed},
	{codeCkStepOrder, checkpoint.ErrStepOrder},
	{codeCkSchema, checkpoint.ErrSchemaMismatch},
	{codeCkTableSet, checkpoint.ErrTableSet},
	{codeCkRegionLocked, checkpoint.ErrRegionLocked},
	{codeCkIncomplete, checkpoint.ErrIncomplete},
	{codeCkPartialRestore, checkpoint.ErrPartialRestore},
	{codeCkUnknownStep, checkpoint.ErrUnknownStep},
	{codeCkAbandoned, checkpoint.ErrAbandoned},
	{codeCkInjected, checkpoint.ErrInjected},
	{codeCkSuperseded, checkpoint.ErrSuperseded},

	{codeCommitsBehind, elastic.ErrCommitsBehind},
	{codeNeedsResume, elastic.ErrNeedsResume},
	{codePushedTwice, elastic.ErrPushedTwice},
	{codeBatchFailed, elastic.ErrBatchFailed},
	{codeNoCheckpoints, server.ErrNoCheckpoints},
	{codeDuplicateWorker, elastic.ErrDuplicateWorker},
	{codeExistingCommits, checkpoint.ErrExistingCommits},

	{codeShardNoMoreWork, shard.ErrNoMoreWork},
	{codeShardWait, shard.ErrWait},
	{codeShardStaleLease, shard.ErrStaleLease},
	{codeShardBadOffset, shard.ErrBadOffset},
	{codeShardBadWorker, shard.ErrBadWorker},
	{codeShardInvalidConfig, shard.ErrInvalidConfig},
	{codeShardSnapshotCorrupt, shard.ErrSnapshotCorrupt},
	{codeShardSnapshotVersion, shard.ErrSnapshotVersion},
	{codeShardSnapshotMismatch, shard.ErrSnapshotMismatch},
	{codeShardNotStream, shard.ErrNotStream},
	{codeShardStreamSealed, shard.ErrStreamSealed},
	{codeShardBadPartition, shard.ErrBadPartition},
	{codeShardPermanent, shard.ErrPermanent},
	{codeShardMalformed, shard.ErrMalformed},
	{codeShardShardMismatch, shard.ErrShardMismatch},
	{codeShardSchema, shard.ErrSchema},
	{codeShardClosed, shard.ErrClosed},
	{codeShardTooManyBadLines, shard.ErrTooManyBadLines},
	{codeShardFieldMap, shard.ErrFieldMap},

	{codePsBadConfig, ps.ErrBadConfig},
	{codePsWrongOwner, ps.ErrWrongOwner},
	{codePsUnknownTable, ps.ErrUnknownTable},
	{codePsBadRequest, ps.ErrBadRequest},
	{codePsNonFinite, ps.ErrNonFinite},
	{codePsCorrupt, ps.ErrCorrupt},
	{codePsNoTable, ps.ErrNoTable},
	{codePsClosed, ps.ErrClosed},
	{codePsFenced, ps.ErrFenced},
	{codePsPartialPush, ps.ErrPartialPush},
	{codePsMoved, ps.ErrMoved},
	{codePsMigration, ps.ErrMigration},
	{codePsNotPublished, ps.ErrNotPublished},
	{codePsCorruptApplied, ps.ErrCorruptApplied},

	{codeCkDigestMismatch, checkpoint.ErrDigestMismatch},
}

// remoteErr turns a handler's error into the answer the caller maps back to its sentinels.
func remoteErr(err error) error {
	if err == nil {
		return nil
	}
	re := &rpc.RemoteError{Code: codeFailed, Message: err.Error()}
	for _, e := range errorCodes {
		if errors.Is(err, e.err) {
			if re.Data == nil {
				re.Code = e.code
			}
			re.Data = binary.LittleEndian.AppendUint32(re.Data, e.code)
		}
	}
	return re
}

// localErr maps a remote error back to the sentinels of errorCodes; other errors (the call did
// not get an answer) are returned as they are.
func localErr(addr string, err error) error {
	var re *rpc.RemoteError
	if !errors.As(err, &re) {
		return err
	}
	codes := []uint32{re.Code}
	if len(re.Data) > 0 && len(re.Data)%4 == 0 {
		codes = codes[:0]
		for b := re.Data; len(b) > 0; b = b[4:] {
			codes = append(codes, binary.LittleEndian.Uint32(b))
		}
	}
	out := &remoteError{addr: addr, msg: re.Message}
	for _, c := range codes {
		for _, e := range errorCodes {
			if e.code == c {
				out.sentinels = append(out.sentinels, e.err)
				break
			}
		}
	}
	return out
}

// remoteError is a remote handler's error as the caller sees it: it matches every sentinel
// the handler's error matched.
type remoteError struct {
	addr, msg string
	sentinels []error
}

func (e *remoteError) Error() string   { return fmt.Sprintf("remote: %s: %s", e.addr, e.msg) }
func (e *remoteError) Unwrap() []error { return e.sentinels }
