package shard

import "context"

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
type Service interface {
	// Acquire leases the next shard to worker.
	Acquire(ctx context.Context, worker string) (Lease, error)
	// Report says worker has trained the lease's shard up to (excluding) record offset; done
	// asserts offset is the shard's record count. It renews the lease.
	Report(ctx context.Context, worker string, lease LeaseID, offset int64, done bool) error
	// Leave hands every shard of worker back without penalty.
	Leave(ctx context.Context, worker string) error
}
