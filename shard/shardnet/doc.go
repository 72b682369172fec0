// Package shardnet serves a data-shard dispatcher over the network: a Server exposes a
// shard.Service (the coordinator's *shard.Dispatcher) on a listener, and a Client implements
// shard.Service against it, so that a shard.Reader on a worker uses the dispatcher of a remote
// coordinator exactly as it uses one in process.
//
// # Use
//
// On the coordinator:
//
//	d, _ := shard.New(shard.Config{Dataset: shard.IndexedDataset(n)})
//	srv, _ := shardnet.NewServer(shardnet.ServerConfig{Service: d, Secret: secret})
//	l, _ := net.Listen("tcp", ":7070")
//	go srv.Serve(l)
//	defer srv.Close()
//
// On each worker:
//
//	cli, _ := shardnet.NewClient(shardnet.ClientConfig{Addr: "coord:7070", Secret: secret})
//	defer cli.Close()
//	r, _ := shard.NewReader(shard.ReaderConfig{Service: cli, Worker: name, Source: src})
//
// # Protocol
//
// Calls travel over the project's RPC layer: a few persistent connections per client, each
// authenticated both ways by the cluster secret before any request is read (the secret never
// crosses the wire; every frame is then authenticated with per-connection keys, in clear), with
// many calls multiplexed on a connection. The four methods carry the encodings of package shardwire
// (AcquireRequest -> AcquireResponse, ReportRequest -> Status, LeaveRequest -> Status, and the
// combined call ReportAcquireRequest -> AcquireResponse), so the dispatcher's errors arrive as
// the same sentinels: errors.Is(err, shard.ErrStaleLease) holds on either side of the wire.
//
// The combined call (shard.ReportAcquirer) reports a shard done and leases the next in one round
// trip, so a worker pays one round trip per shard rather than two; shard.Reader uses it on a
// Client by itself. A server whose Service lacks it (or a server of the protocol before it,
// which does not know the method) answers it with an error matching errors.ErrUnsupported, which
// is not permanent: the Reader makes the two calls instead. Frames are capped at 64 KiB. A request that cannot be decoded is
// refused with an error (and counted in ServerStats.Malformed); bytes that are not the protocol
// at all close that one connection. Neither affects other clients.
//
// # Failures
//
// Every shard.Service call may be retried (see shard.Service), so the client reports any call
// without an answer as ErrUnavailable and leaves retrying to its caller; a shard.Reader retries
// with backoff until its context ends (or ReaderConfig.MaxRetries). A call waits at most
// ClientConfig.CallTimeout, so a partition costs a worker time but never hangs it. Errors that
// retrying cannot cure (ErrAuth for a wrong secret, ErrProtocol for a peer that is not a
// dispatcher of this version, ErrClosed) match shard.ErrPermanent, and a Reader returns them at
// once.
//
// A coordinator restart is survived like this: the new process restores the last committed
// snapshot into a new Dispatcher (with a new incarnation) and serves it on the same address
// (or clients are pointed at the new one with SetAddr). Meanwhile workers' calls fail with
// ErrUnavailable and are retried. Afterwards, reports on leases of the old incarnation return
// shard.ErrStaleLease: the Reader drops those shards and acquires again, and the shards resume
// at the offsets recorded in the snapshot. Exactly-once holds across the restart as described
// in package shard.
//
// An Acquire that times out keeps its request outstanding; the worker's next Acquire returns
// its answer rather than asking again (see Client), so retries during a partition do not make
// the dispatcher grant, then revoke, a shard per retry once the partition heals. A combined call
// that times out is simply repeated: the dispatcher answers a repeat with the lease the first
// call granted (see shard.ReportAcquirer), whichever of the requests reaches it first, so no
// lease is left behind either. The package's tests hold back combined answers past the call
// timeout and across a partition and a coordinator crash, and check that no lease is revoked
// for the lease limit and every record counts once.
//
// # Concurrency and ownership
//
// Server and Client are safe for concurrent use. Close on either is idempotent and returns only
// after every goroutine it started has exited. The Service behind a Server is called from many
// goroutines at once. Leases returned by a Client belong to the caller.
package shardnet
