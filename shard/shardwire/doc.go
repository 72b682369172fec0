// Package shardwire encodes the requests and responses of shard.Service (and of its optional
// combined call, shard.ReportAcquirer) so that a network adapter can serve a *shard.Dispatcher
// and a client can implement shard.Service with a few lines each (package shardnet is that
// adapter): the server decodes a request, calls the dispatcher and encodes
// NewAcquireResponse(lease, err) or NewStatus(err); the client encodes the request, decodes the
// response and returns its Result or Err, which match the same sentinel errors
// (shard.ErrStaleLease, shard.ErrWait via *shard.WaitError, errors.ErrUnsupported, ...) as the
// in-process call.
//
// The messages: AcquireRequest and ReportAcquireRequest are answered by an AcquireResponse,
// ReportRequest and LeaveRequest by a Status.
//
// Codecs are append-style: AppendX(dst, v) appends the encoding of v to dst and returns the
// extended slice; DecodeX(src) returns the value, the bytes after it and an error matching
// ErrMalformed for truncated or invalid input. Decoded strings are copies: nothing returned
// aliases src. Every message starts with a version byte (currently 1). All functions are safe
// for concurrent use.
package shardwire
