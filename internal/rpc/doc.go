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
// leave in completion order. A frame that is oversized, truncated,
// malformed or fails its tag closes that connection only, with the reason
// logged. Shutdown stops reading, sends a goaway frame naming the last
// request it read (the client fails later ones with ErrUnavailable: they
// were never processed), waits for running handlers, and closes. Close does
// the same at once, cancelling handler contexts.
//
// The frame format is specified in package wire. Request and response
// payloads are opaque bytes, moved without per-element encoding: float rows
// travel as their raw little-endian bytes. Payloads at least
// CompressThreshold long are s2-compressed (and flagged per frame) on
// connections where both ends enabled Compression, if that makes them at
// least 1/8 smaller.
//
// # Authentication and session keys
//
// Every connection proves knowledge of the cluster secret both ways before
// any request is read, without sending it, the client first (message
// layouts in package wire; || is concatenation of the messages' raw bytes,
// HMAC is HMAC-SHA256 keyed with the secret):
//
//  1. client -> server  ClientHello CH: version, flags, maxFrame, 32-byte random nonce Nc
//  2. server -> client  ServerHello SH: version, flags, maxFrame, 32-byte random nonce Ns
//  3. client -> server  ClientProof CP: proofC = HMAC("elasticps rpc v2 client proof" || CH || SH)
//  4. server: checks proofC; if wrong it sends Verdict AuthFailed, logs the
//     reason, counts it (Stats.AuthFailures) and closes: the client's Call
//     fails with ErrAuth. Otherwise:
//     server -> client  ServerProof: proofS = HMAC("elasticps rpc v2 server proof" || CH || SH || CP)
//  5. client: checks proofS, else ErrAuth (the server does not know the
//     secret) and closes without sending anything more.
//
// Both sides then derive one AES-256 key per direction,
//
//	K(c->s) = HKDF-SHA256(secret, salt = Nc || Ns, info = "elasticps rpc v2 client to server key " + protection)
//	K(s->c) = HKDF-SHA256(secret, salt = Nc || Ns, info = "elasticps rpc v2 server to client key " + protection)
//
// (protection is "integrity" or "encrypt"), and frames follow, each
// protected with its direction's key and frame counter as package wire
// specifies: a 16-byte AES-GCM tag over the counter, the header and the
// payload, the payload encrypted too under ProtectEncrypt.
//
// Why this shape:
//   - The server sends nothing that depends on the secret before the client
//     has proved it knows it: anyone who can reach a port gets a hello and,
//     after a wrong proof, a bare refusal, so probing a server yields
//     nothing to test guesses of the secret against. (Someone who records a
//     genuine exchange, or impersonates a server to a client, can test
//     guesses offline, as with any protocol built on a shared secret without
//     a PAKE; that is why the secret must be at least MinSecretSize random
//     bytes, and why Validate refuses shorter ones.)
//   - Nonces are fresh from crypto/rand on both sides. proofC covers Ns, so
//     a recorded client handshake replayed to a server fails; proofS covers
//     Nc and proofC, so a recorded server handshake replayed to a client
//     fails; the keys depend on both nonces, so even a frame recorded on one
//     connection is worthless on another.
//   - The labels keep a proof or key of one role or direction useless in
//     the other; the proofs cover both hellos, so flags (compression, the
//     protection asked for) and limits cannot be altered in transit.
//   - Proofs and tags are compared in full and in constant time.
//   - Frame counters are implicit: a frame injected, altered, replayed,
//     dropped or reordered fails its tag. The receiver then closes the
//     connection (calls in flight fail with ErrConnClosed wrapping
//     wire.ErrIntegrity), logs it and counts it (Stats.ForgedFrames); no
//     handler runs for the frame and nothing answers it.
//   - Integrity is GMAC (AES-GCM's tag) rather than HMAC-SHA256: on CPUs
//     with AES and carry-less multiply instructions it costs several times
//     less per byte, which matters on 1 MiB pulls.
//
// Compression is used iff both hellos offer it; protection is negotiated
// as Protection describes (encrypted if either side asks, unprotected only
// if both do). Payloads are compressed before they are protected, and
// checked before they are decompressed. Each side refuses to send a
// payload larger than the other's maxFrame. A server gives a connection
// HandshakeTimeout to finish. An unsupported version is refused with
// Verdict Version (ErrHandshake); version 1 peers (server proves first, no
// frame protection) are refused.
//
// # TLS
//
// Where operators require TLS, ServerConfig.TLS and ClientConfig.TLS (made
// from PEM files by TLSFiles.LoadTLS) run every connection over mutual TLS
// 1.3: each end presents a certificate that must chain to the cluster's
// CA, the server's valid for the name dialed (or TLSFiles.ServerName). A
// connection that is already TLS, because the listener or Transport wraps
// its connections, is handled the same way. Whatever made the TLS
// configuration, a peer whose certificate was not verified is refused
// (ErrAuth; Verdict AuthFailed when TLS let it that far).
//
// The secret handshake above still runs, inside TLS: its hellos negotiate
// limits and compression, and its proofs keep out a node that holds a
// certificate from the CA but not the cluster secret, so one CA can serve
// several clusters. Each hello says whether its end runs TLS (HelloTLS);
// if both do, frames carry no tags of this package, TLS authenticating,
// ordering and encrypting them, and Protection is ignored. If only one end
// does (TLS terminated by something in between), the handshake fails with
// ErrHandshake (Verdict TLS) rather than run with one leg unprotected. The
// TLS handshake counts against HandshakeTimeout and the handshake limits.
// Connections are closed without a TLS close-notify, which would wait for
// a peer that stopped reading.
//
// What this does not do: anyone holding the cluster secret is trusted
// completely (there are no per-node identities or roles); headers (sizes,
// method numbers, request ids) and, without ProtectEncrypt, payloads
// travel in clear; and it does not hide traffic patterns.
//
// # Resource limits
//
// A server bounds what a hostile or broken peer can make it hold:
//
//   - Connections not yet authenticated: at most MaxHandshakes in all and
//     MaxHandshakesPerHost from one source host, each for at most
//     HandshakeTimeout. A connection beyond either limit is closed as soon
//     as it is accepted, so a flood of silent connections holds a bounded
//     number of descriptors and cannot starve established connections of
//     them; one flooding host cannot take every slot.
//   - Memory per connection: request payloads read and not yet answered
//     plus responses not yet written count against MaxConnInFlight; at the
//     limit the server stops reading the connection until they drop, so a
//     client that sends without reading its answers pins a bounded amount.
//     Frames are capped by MaxFrameSize before anything is allocated, and
//     buffers above wire.MaxPooledSize are not kept for reuse once a
//     connection is done with them.
//   - Logs: refusals and protocol violations are logged at a limited rate
//     (a burst of 10 lines, then one a second, the next line saying how
//     many were left out), and counted in Stats: RefusedConns,
//     FailedHandshakes, AuthFailures, ForgedFrames, ThrottledReads.
//
// An authenticated client is trusted with the rest: it can keep
// MaxConcurrent handlers busy, and many connections each hold up to
// MaxConnInFlight.
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
