// Package wire is the byte format of elasticps connections: frames, the
// authentication handshake messages, the application-error payload, s2
// payload compression and a size-classed buffer pool. It does no network
// I/O of its own and knows nothing about connections; package rpc drives it.
//
// # Frames
//
// After the handshake both directions carry a stream of frames. Every frame
// is a 16-byte header followed by Size payload bytes; all integers are
// little-endian:
//
//	offset size field
//	0      4    Size    payload bytes after the header, as sent (compressed size if compressed)
//	4      1    Kind    1 request, 2 response, 3 error, 4 goaway
//	5      1    Flags   bit 0: payload is one s2 block; other bits must be zero
//	6      2    Method  handler number of a request; must be zero on other kinds
//	8      8    ID      request id, echoed by its response or error; for goaway the
//	                    last request id the sender read (see below)
//	16     Size payload
//
// Payloads are opaque bytes: float vectors travel as their raw little-endian
// bytes, with no per-element encoding. A decoder checks every header before
// reading or allocating its payload: an unknown kind or flag, a method on a
// non-request, a flag on an error or goaway, a goaway with a payload
// (ErrMalformed) or a size over the limit (ErrTooLarge) is reported without
// touching the payload. The limit is configurable up to MaxFrameSizeLimit
// (1 GiB) and defaults to DefaultMaxFrameSize (64 MiB); it bounds the size on
// the wire and, for compressed payloads, the decompressed size. Input that
// ends inside a frame is ErrTruncated.
//
// A compressed payload (FlagCompressed, only on requests and responses and
// only on connections that negotiated it) is a single s2 block as produced by
// github.com/klauspost/compress/s2.Encode; its decoded length is checked
// against the limit before anything is allocated.
//
// The payload of an error frame (see AppendError) is:
//
//	0      4    code     application or rpc error code
//	4      4    m        message length
//	8      m    message  UTF-8 text
//	8+m    ...  data     opaque bytes for the application (may be empty)
//
// A goaway frame's ID is the highest request id its sender read and
// dispatched. Requests are sent with increasing ids on a connection, so the
// receiver knows that every outstanding request with a larger id was never
// processed and is safe to retry elsewhere.
//
// # Protected frames
//
// On a protected connection (every connection, unless both ends asked for
// none; see package rpc) each frame's payload is followed by a TagSize
// (16-byte) tag, and on an encrypted connection the payload is AES-GCM
// ciphertext of the same length:
//
//	offset      size field
//	0           16   header   as above, in clear; Size is the payload length
//	16          Size payload  as sent (plaintext), or its ciphertext when encrypting
//	16+Size     16   tag
//
// Each direction of a connection has its own AES-256 key (derived by the
// handshake) and its own frame counter c, starting at 0 and advanced by
// every frame; it is never sent. The 12-byte nonce of frame c is 4 zero
// bytes followed by c as a big-endian uint64. With K the direction key and
// N the nonce, AES-256-GCM sealing gives
//
//	integrity:  tag = the GCM tag of Seal(K, N, plaintext = header, additional data = payload)
//	            (the ciphertext of the header is discarded; the header travels in clear)
//	encryption: ciphertext || tag = Seal(K, N, plaintext = payload, additional data = header)
//
// so the tag covers the counter, the header and the payload in both modes.
// Protector does both sides; a Reader with ReaderOptions.Protector checks
// every tag, in full and in constant time, after the header's own checks
// and the limit (nothing of a frame over the limit is allocated or read)
// and before decompressing; a mismatch is ErrIntegrity. A frame injected,
// altered, replayed, dropped or reordered by anyone without the key fails,
// because its counter or content differs from what the tag was made for.
// The integrity mode (GMAC) is used rather than HMAC-SHA256 because it is
// several times cheaper on CPUs with AES and carry-less multiply
// instructions, and nonces never repeat: keys are fresh per connection and
// the counter is 64 bits.
//
// # Handshake messages
//
// Each handshake message starts with the 4-byte Magic "ePSw" and a 1-byte
// type, followed by a fixed-size body (HandshakeSize gives the totals: 45,
// 45, 37, 9 and 37 bytes):
//
//	ClientHello (1)  version(1) flags(1) reserved(2)=0 maxFrame(4) nonce(32)
//	ServerHello (2)  version(1) flags(1) reserved(2)=0 maxFrame(4) nonce(32)
//	ClientProof (3)  proof(32)
//	Verdict     (4)  verdict(1) reserved(3)=0      verdict: 1 auth failed, 2 bad version, 3 TLS on one end only
//	ServerProof (5)  proof(32)
//
// Hello flags: bit 0 (HelloCompress) offers s2 compression, used on a
// connection only if both hellos set it; bit 1 (HelloEncrypt) asks for
// encrypted frames, used if either hello sets it; bit 2 (HelloUnprotected)
// accepts frames without tags, used only if both hellos set it and neither
// asks for encryption (a hello with both bits is malformed); bit 3
// (HelloTLS) says the sender's end runs mutual TLS: if both hellos set it
// frames carry no tags, TLS protecting them, and a hello with it and bit 1
// or 2 is malformed. maxFrame is the
// largest payload the sender accepts, so a peer can refuse an oversized call
// locally instead of having the connection closed. The exchange, its proofs,
// the key derivation and the rules that use them are described in package
// rpc; this package only encodes and decodes the messages.
//
// # Ownership and concurrency
//
// Append functions append to dst and return the extended slice; they never
// keep dst or their inputs. DecodeFrame and DecodeError return payload and
// data slices that alias their input. Reader.ReadFrame returns payloads from
// the Reader's Pool owned by the caller. A Reader is owned by one goroutine;
// a Pool is safe for concurrent use; everything else is a pure function.
package wire
