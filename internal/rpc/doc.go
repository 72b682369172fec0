// Package rpc is the request/response layer shared by the parameter servers
// (package ps) and the data-shard dispatcher (package shard): a Server runs
// handlers registered by method number, a Client calls them by address over
// a few persistent, authenticated, multiplexed connections.
//
// # Use
//
//	srv, _ := rpc.NewServer(rpc.ServerConfig{Secret: secret})
//	_ = srv.Register(methodPull, func(ctx context.Context, req []byte, resp *rpc.Buffer) error {
//		out := resp.Extend(rows * rowBytes) // fill in place, no allocation
//		...
//		return nil // or &rpc.RemoteError{Code: codeWrongOwner, Data: version}
//	})
//	l, _ := tr.Listen(addr)
//	go srv.Serve(l)
//
//	cli, _ := rpc.NewClient(rpc.ClientConfig{Secret: secret, Transport: tr})
//	resp, err := cli.Call(ctx, addr, methodPull, req)
//	var re *rpc.RemoteError
//	switch {
//	case err == nil:
//		use(resp); cli.Release(resp)
//	case errors.As(err, &re):           // the handler's error: re.Code, re.Message, re.Data
//	case errors.Is(err, rpc.ErrUnavailable): // not processed: safe to retry
//	case errors.Is(err, rpc.ErrConnClosed):  // connection died in flight: outcome unknown
//	}
//
// # Connections
//
// A Client keeps ClientConfig.ConnsPerAddr connections to each address,
// opened on first use and reopened on demand after one dies; calls go to
// them round-robin and many calls share a connection, matched to their
// answers by request id. When a connection dies every call in flight on it
// fails at once with an error naming the address and wrapping
// ErrConnClosed and the cause, so a server that crashes mid-call gives a
// prompt error, never a hang. A call whose context ends returns ctx.Err()
// immediately; its late answer is read and dropped.
//
// Frames sent concurrently on a connection are combined into one vectored
// write: small payloads (up to 8 KiB) are copied into a batch, larger ones
// are written straight from the caller's slice, so Call with a large request
// returns only once the request is on the connection. The sender that finds
// the connection idle writes the batch; if its context ends while that
// write is blocked (a peer that stopped reading), or a write makes no
// progress for WriteTimeout, the connection is closed and every call on it
// fails with ErrConnClosed. A healthy connection never blocks a small write.
//
// A Server reads each connection in one goroutine and runs each request in
// its own goroutine, at most ServerConfig.MaxConcurrent at once; responses
// leave in completion order. A frame that is oversized, truncated or
// malformed closes that connection only, with the reason logged. Shutdown
// stops reading, sends a goaway frame naming the last request it read (the
// client fails later ones with ErrUnavailable: they were never processed),
// waits for running handlers, and closes. Close does the same at once,
// cancelling handler contexts.
//
// The frame format is specified in package wire. Request and response
// payloads are opaque bytes, moved without per-element encoding: float rows
// travel as their raw little-endian bytes. Payloads at least
// CompressThreshold long are s2-compressed (and flagged per frame) on
// connections where both ends enabled Compression, if that makes them at
// least 1/8 smaller.
//
// # Authentication
//
// Every connection proves knowledge of the cluster secret both ways before
// any request is read, without sending it (wire messages in package wire):
//
//  1. client -> server  ClientHello: version, flags, maxFrame, 32-byte random nonce Nc
//  2. server -> client  ServerHello: version, flags, maxFrame, nonce Ns,
//     proofS = HMAC-SHA256(secret, "elasticps rpc v1 server proof" || ClientHello || ServerHello without proofS)
//  3. client: checks proofS, else ErrAuth (the server does not know the secret)
//     client -> server  ClientProof: proofC = HMAC-SHA256(secret, "elasticps rpc v1 client proof" || ClientHello || ServerHello)
//  4. server: checks proofC; on mismatch it sends Verdict AuthFailed, logs the
//     reason and closes: the client's Call fails with ErrAuth.
//     server -> client  Verdict OK; frames follow.
//
// Nonces come from crypto/rand, so proofs are never reused; the labels keep
// a proof from one role useless in the other; the proofs cover both hellos,
// so flags and limits cannot be altered in transit. Compression is used iff
// both hellos offer it; each side refuses to send a payload larger than the
// other's maxFrame. A server gives a connection HandshakeTimeout to finish.
// An unsupported version is refused with Verdict Version (ErrHandshake). The
// handshake authenticates; it does not encrypt.
//
// # Ownership of slices
//
//   - Call's req is read until Call returns and never kept.
//   - Call's response belongs to the caller; Release gives it back to the
//     client's pool (optional).
//   - A handler's req belongs to the server and is valid until the handler
//     returns; its *Buffer and every slice from it likewise.
//   - RemoteError.Data on the client is a fresh slice owned by the caller;
//     a handler's RemoteError.Data is read after the handler returns and not
//     kept.
//
// # Concurrency
//
// Client and Server are safe for concurrent use. Close on either is
// idempotent and returns only after every goroutine it started has exited.
// A Buffer belongs to one handler invocation.
package rpc
