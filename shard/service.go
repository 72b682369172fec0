package shard

import (
	"context"
	"errors"
	"fmt"
)

// Service is the worker-facing face of a dispatcher. *Dispatcher implements it in process;
// shardnet.Client implements it over the network against a dispatcher served by
// shardnet.Server (package shardwire encodes every request and response).
//
// Every method may be retried: Acquire by a worker at its lease limit revokes its oldest lease
// (so a retried Acquire whose first answer was lost frees the orphaned shard), Report is
// idempotent for an offset already accepted, and Leave of an unknown worker is a no-op.
//
// Errors: Acquire returns ErrNoMoreWork, a *WaitError (ErrWait) or ErrBadWorker; Report returns
// ErrStaleLease, ErrBadOffset or ErrBadWorker; a network implementation adds its own transport
// errors, which the Reader retries with backoff, and errors matching ErrPermanent, which it
// does not.
//
// A Service may also implement ReportAcquirer, which finishes a shard and leases the next one
// in a single call; the Reader uses it when it is there.
type Service interface {
	// Acquire leases the next shard to worker.
	Acquire(ctx context.Context, worker string) (Lease, error)
	// Report says worker has trained the lease's shard up to (excluding) record offset; done
	// asserts offset is the shard's record count. It renews the lease.
	Report(ctx context.Context, worker string, lease LeaseID, offset int64, done bool) error
	// Leave hands every shard of worker back without penalty.
	Leave(ctx context.Context, worker string) error
}

// ReportAcquirer is the optional combined call of a Service: a worker that has trained a shard
// to its end reports it done and gets its next shard in one round trip instead of two. Detect
// it with a type assertion; *Dispatcher and shardnet.Client implement it, and wrappers of a
// Service pass it on with the function ReportAndAcquire.
//
// ReportAndAcquire(ctx, worker, lease, offset) is Report(ctx, worker, lease, offset, true)
// followed, if the dispatcher accepts that report, by Acquire(ctx, worker), with nothing in
// between. The error says which parts took effect:
//
//   - nil: the report was accepted and the returned lease is granted.
//   - ErrNoMoreWork, or a *WaitError (ErrWait): the report was accepted; the acquire part found
//     no shard, exactly as Acquire would have. A caller must count the shard as reported.
//   - ErrStaleLease, ErrBadOffset, ErrBadWorker: the report was rejected as Report would have
//     rejected it, and nothing else happened: no lease was granted, nothing was revoked. The
//     caller drops the shard (ErrStaleLease) and calls Acquire when it wants another.
//   - an error matching errors.ErrUnsupported: the implementation cannot combine the calls
//     (a wrapper around a Service without them, a server of an older protocol); nothing
//     happened. Call Report and Acquire instead, and do not try the combined call again.
//   - any other error (a transport error): the outcome is unknown. Retry the same call.
//
// A retry is safe: the dispatcher remembers, per worker, the last lease the worker itself
// finished (by ReportAndAcquire, or by a Report reaching the shard's end) and the lease the
// combined call that finished it granted. A ReportAndAcquire on that last finished lease, at the
// shard's record count, is a repeat: its report part counts nothing again and is answered as
// accepted, and its acquire part returns the lease the first call granted, renewed for another
// TTL, while the worker still holds it. Only when the first call granted nothing, or its lease
// has since ended (expired, revoked), does a repeat acquire afresh. So an answer lost on the way
// back neither counts records twice nor leaves behind a lease the worker does not know about.
// The memory ends when the worker finishes another shard, leaves, is evicted or forgotten
// (Progress forgets idle workers), or the dispatcher is restored; a repeat after that is
// answered ErrStaleLease, which counts nothing either.
type ReportAcquirer interface {
	// ReportAndAcquire reports the lease's shard trained through offset, its record count,
	// and leases the worker's next shard.
	ReportAndAcquire(ctx context.Context, worker string, lease LeaseID, offset int64) (Lease, error)
}

// ShardAwaiter is the optional call of a Service that wakes a worker told to wait (a
// *WaitError) as soon as a shard can be leased or the work is finished, so that a worker at an
// epoch's end asks again when the next epoch begins rather than when its wait is over. Detect
// it with a type assertion; *Dispatcher implements it, and wrappers of a Service pass it on with
// the function AwaitShard. shardnet.Client does not: over the network a worker waits as
// WaitError.RetryAfter says.
//
// AwaitShard(ctx) returns nil once asking may help (at once if it may now), ctx's error when
// ctx ends first, and an error matching errors.ErrUnsupported, at once, when the
// implementation cannot wait (a wrapper around a Service without it): the caller then waits
// as WaitError.RetryAfter says, and need not try again.
type ShardAwaiter interface {
	AwaitShard(ctx context.Context) error
}

// AwaitShard waits on svc if svc implements ShardAwaiter, and otherwise returns an error
// matching errors.ErrUnsupported at once.
func AwaitShard(ctx context.Context, svc Service) error {
	if a, ok := svc.(ShardAwaiter); ok {
		return a.AwaitShard(ctx)
	}
	return fmt.Errorf("shard: %T cannot wait for a shard: %w", svc, errors.ErrUnsupported)
}

// ReportAndAcquire makes the combined call on svc if svc implements ReportAcquirer, and
// otherwise returns an error matching errors.ErrUnsupported without calling svc. A wrapper of
// a Service implements ReportAcquirer by passing the call on with it, so the wrapper combines
// exactly when what it wraps does.
func ReportAndAcquire(ctx context.Context, svc Service, worker string, lease LeaseID, offset int64) (Lease, error) {
	if ra, ok := svc.(ReportAcquirer); ok {
		return ra.ReportAndAcquire(ctx, worker, lease, offset)
	}
	return Lease{}, fmt.Errorf("shard: %T cannot report and acquire in one call: %w", svc, errors.ErrUnsupported)
}

// reportAccepted reports whether an error of ReportAndAcquire still means its report part was
// accepted.
func reportAccepted(err error) bool {
	return err == nil || errors.Is(err, ErrNoMoreWork) || errors.Is(err, ErrWait)
}
