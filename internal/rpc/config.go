package rpc

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/elasticps/elasticps/internal/transport"
	"github.com/elasticps/elasticps/internal/wire"
)

// Defaults for zero Config fields.
const (
	DefaultMaxConcurrent     = 256
	DefaultConnsPerAddr      = 2
	DefaultCompressThreshold = 32 << 10
	DefaultHandshakeTimeout  = 5 * time.Second
	DefaultMaxHandshakes     = 128
	DefaultMaxHandshakesHost = 32
	DefaultMaxConnInFlight   = 256 << 20
	DefaultDialTimeout       = 5 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	// MaxConnsPerAddr bounds ClientConfig.ConnsPerAddr.
	MaxConnsPerAddr = 64
	// MinSecretSize is the shortest cluster secret accepted, in bytes. The
	// secret should be that many random bytes: anyone who records a
	// genuine handshake can test guesses of it offline, so it must not be
	// guessable.
	MinSecretSize = 32
)

// Protection is what a connection does to every frame after the
// handshake. The zero value, ProtectIntegrity, is the default. A connection
// is encrypted if either end asks for ProtectEncrypt, unprotected only if
// both ends ask for ProtectNone, and integrity-protected otherwise; the
// choice is authenticated by the handshake, so nobody in between can
// weaken it.
type Protection uint8

const (
	// ProtectIntegrity authenticates every frame with a 16-byte AES-256-GCM
	// tag over its counter, header and payload, under a per-connection,
	// per-direction key: a frame injected, altered, replayed, reordered or
	// dropped closes the connection. Payloads travel in clear. The default.
	ProtectIntegrity Protection = iota
	// ProtectEncrypt also encrypts payloads (AES-256-GCM), at roughly twice
	// the CPU cost of integrity alone. Headers (sizes, method numbers,
	// request ids) stay in clear.
	ProtectEncrypt
	// ProtectNone sends frames without tags: anyone on the path can inject
	// or alter them once a connection is authenticated. It exists to
	// measure what protection costs, and takes effect only when both ends
	// ask for it. Never use it on a network you do not control entirely.
	ProtectNone
)

// String returns "integrity", "encrypt" or "none".
func (p Protection) String() string {
	switch p {
	case ProtectIntegrity:
		return "integrity"
	case ProtectEncrypt:
		return "encrypt"
	case ProtectNone:
		return "none"
	default:
		return fmt.Sprintf("protection(%d)", uint8(p))
	}
}

// ServerConfig configures a Server. The zero value of every field but
// Secret means its default.
type ServerConfig struct {
	// Secret is the cluster secret every connecting client must prove it
	// knows. Required: at least MinSecretSize (32) bytes, which should be
	// random. It never crosses the wire; the keys of every connection are
	// derived from it.
	Secret []byte
	// Protection is what every frame carries: see Protection. Default
	// ProtectIntegrity. ProtectEncrypt here encrypts every connection to
	// this server, whatever the client asks. Ignored on TLS connections.
	Protection Protection
	// TLS, when set, makes every connection mutual TLS (1.3) before the
	// secret handshake: ClientAuth must be tls.RequireAndVerifyClientCert,
	// and a client is refused unless its certificate was verified.
	// TLSFiles.LoadTLS makes one from PEM files. A connection that is
	// TLS already (from a listener that wraps) is treated the same way.
	// See the package documentation for what TLS changes. Default nil:
	// the secret-based protocol alone.
	TLS *tls.Config
	// Logger receives refused connections, protocol violations (with the
	// reason the connection was closed) and handler panics. Nil discards.
	Logger *slog.Logger
	// MaxFrameSize is the largest request payload accepted, in bytes, before
	// and after decompression. Default 64 MiB, at most 1 GiB. It is announced
	// to clients, which refuse larger requests locally. Larger limits let a
	// peer make the server allocate more per request.
	MaxFrameSize int
	// MaxConcurrent bounds handlers running at once across all connections.
	// Default 256. When reached, connections stop reading requests until a
	// handler returns, which pushes back on clients through TCP.
	MaxConcurrent int
	// Compression offers s2 compression of large payloads. It is used on a
	// connection only if the client offers it too. It costs CPU and helps on
	// slow links with compressible data; float embeddings compress poorly.
	Compression bool
	// CompressThreshold is the smallest response, in bytes, that is
	// compressed on connections that negotiated compression. Default 32 KiB.
	// Responses that do not shrink by at least 1/8 are sent as they are.
	CompressThreshold int
	// HandshakeTimeout bounds the authentication of a new connection (the
	// TLS handshake included). Default 5 s. Connections that have not
	// authenticated in time are closed without any request being read.
	// Together with MaxHandshakes it bounds how long a flood of silent
	// connections can keep legitimate ones out.
	HandshakeTimeout time.Duration
	// MaxHandshakes bounds the connections accepted but not yet
	// authenticated, across the server. Default 128. A connection accepted
	// beyond it is closed at once, counted in Stats.RefusedConns and logged
	// (at a limited rate), so that a flood of connections that never
	// authenticate holds at most this many descriptors, each for at most
	// HandshakeTimeout; keep it well below the process's descriptor limit.
	// Too low a value refuses legitimate bursts of new connections, which
	// fail with ErrUnavailable on their clients.
	MaxHandshakes int
	// MaxHandshakesPerHost bounds the connections not yet authenticated
	// from one source host (IP address, port ignored). Default 32, at most
	// MaxHandshakes. It keeps a single flooding host from taking every
	// handshake slot. Every process on a host shares it: raise it when many
	// clients on one machine connect at once.
	MaxHandshakesPerHost int
	// MaxConnInFlight bounds the bytes one connection holds in the server:
	// payloads of its requests that are read and not yet answered, and
	// responses not yet written to it. Default 256 MiB. At the limit the
	// server stops reading that connection (TCP pushes back on the client)
	// until handlers finish and responses leave, so a client that sends
	// without reading, or sends more than handlers consume, pins at most
	// MaxConnInFlight plus one request. It must hold every request that
	// handlers keep waiting for other requests of the same connection.
	MaxConnInFlight int
	// WriteTimeout bounds one write on a connection: a write still blocked
	// after between WriteTimeout and twice that (a peer that stopped
	// reading) closes the connection. Default 30 s. It is checked by a timer,
	// not by per-write deadlines, which would cost a clock read per frame.
	WriteTimeout time.Duration
}

// ClientConfig configures a Client. The zero value of every field but
// Secret means its default.
type ClientConfig struct {
	// Secret is the cluster secret. Required: at least MinSecretSize (32)
	// bytes, which should be random. The client proves it knows it, then
	// requires the server to prove the same.
	Secret []byte
	// Protection is what every frame carries: see Protection. Default
	// ProtectIntegrity. ProtectEncrypt here encrypts this client's
	// connections, whatever the server asks. Ignored on TLS connections.
	Protection Protection
	// TLS, when set, makes every connection mutual TLS (1.3) before the
	// secret handshake: it must hold a client certificate, and the server's
	// certificate is verified for ServerName, or for the host of the
	// address dialed if ServerName is empty. Servers must use TLS too.
	// TLSFiles.LoadTLS makes one from PEM files. A connection that is TLS
	// already (from a Transport that wraps) is treated the same way.
	// Default nil.
	TLS *tls.Config
	// Transport dials servers. Nil means TCP.
	Transport transport.Transport
	// Logger receives connection failures. Nil discards.
	Logger *slog.Logger
	// ConnsPerAddr is how many persistent connections the client keeps to
	// each address; calls are spread over them round-robin. Default 2, at
	// most 64. More connections spread large transfers over more streams at
	// the cost of more sockets and handshakes.
	ConnsPerAddr int
	// DialTimeout bounds dialing and authenticating a connection. Default 5 s.
	DialTimeout time.Duration
	// MaxFrameSize is the largest response payload accepted, in bytes,
	// before and after decompression, and the largest request sent. Default
	// 64 MiB, at most 1 GiB. It is announced to servers, which answer larger
	// responses with a CodeTooLarge error.
	MaxFrameSize int
	// Compression offers s2 compression; see ServerConfig.Compression.
	Compression bool
	// CompressThreshold is the smallest request compressed on connections
	// that negotiated compression. Default 32 KiB.
	CompressThreshold int
	// WriteTimeout bounds one write, as ServerConfig.WriteTimeout. Default
	// 30 s. A call's own context interrupts a write it is blocked in sooner.
	WriteTimeout time.Duration
}

// common holds the settings shared by both ends, defaults applied.
type common struct {
	secret            []byte
	log               *slog.Logger
	maxFrame          int
	compression       bool
	compressThreshold int
	writeTimeout      time.Duration
	protection        Protection
}

// ValidateSecret returns an error if secret is too short to be a cluster
// secret, nil otherwise. Packages that take a Secret call it from their own
// Validate.
func ValidateSecret(secret []byte) error {
	switch {
	case len(secret) == 0:
		return errors.New("Secret is required")
	case len(secret) < MinSecretSize:
		return fmt.Errorf("Secret is %d bytes; at least %d random bytes are required", len(secret), MinSecretSize)
	}
	return nil
}

func validateCommon(secret []byte, protection Protection, maxFrame, threshold int, writeTimeout time.Duration) []error {
	var errs []error
	if err := ValidateSecret(secret); err != nil {
		errs = append(errs, err)
	}
	if protection > ProtectNone {
		errs = append(errs, fmt.Errorf("Protection %d is unknown", protection))
	}
	if maxFrame < 0 || maxFrame > wire.MaxFrameSizeLimit {
		errs = append(errs, fmt.Errorf("MaxFrameSize %d out of range [0, %d]", maxFrame, wire.MaxFrameSizeLimit))
	}
	if threshold < 0 {
		errs = append(errs, fmt.Errorf("CompressThreshold %d is negative", threshold))
	}
	if writeTimeout < 0 {
		errs = append(errs, fmt.Errorf("WriteTimeout %v is negative", writeTimeout))
	}
	return errs
}

func joinProblems(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
}

func newCommon(secret []byte, protection Protection, log *slog.Logger, maxFrame int, compression bool, threshold int, writeTimeout time.Duration) common {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if threshold == 0 {
		threshold = DefaultCompressThreshold
	}
	if writeTimeout == 0 {
		writeTimeout = DefaultWriteTimeout
	}
	return common{
		secret:            append([]byte(nil), secret...),
		log:               log,
		maxFrame:          wire.EffectiveMax(maxFrame),
		compression:       compression,
		compressThreshold: threshold,
		writeTimeout:      writeTimeout,
		protection:        protection,
	}
}

// Validate reports every problem with c at once, in one error wrapping
// ErrInvalidConfig.
func (c ServerConfig) Validate() error {
	errs := validateCommon(c.Secret, c.Protection, c.MaxFrameSize, c.CompressThreshold, c.WriteTimeout)
	errs = append(errs, validateServerTLS(c.TLS)...)
	if c.MaxConcurrent < 0 {
		errs = append(errs, fmt.Errorf("MaxConcurrent %d is negative", c.MaxConcurrent))
	}
	if c.HandshakeTimeout < 0 {
		errs = append(errs, fmt.Errorf("HandshakeTimeout %v is negative", c.HandshakeTimeout))
	}
	if c.MaxHandshakes < 0 {
		errs = append(errs, fmt.Errorf("MaxHandshakes %d is negative", c.MaxHandshakes))
	}
	if c.MaxHandshakesPerHost < 0 {
		errs = append(errs, fmt.Errorf("MaxHandshakesPerHost %d is negative", c.MaxHandshakesPerHost))
	} else if c.MaxHandshakes > 0 && c.MaxHandshakesPerHost > c.MaxHandshakes {
		errs = append(errs, fmt.Errorf("MaxHandshakesPerHost %d is above MaxHandshakes %d", c.MaxHandshakesPerHost, c.MaxHandshakes))
	}
	if c.MaxConnInFlight < 0 {
		errs = append(errs, fmt.Errorf("MaxConnInFlight %d is negative", c.MaxConnInFlight))
	}
	return joinProblems(errs)
}

// Validate reports every problem with c at once, in one error wrapping
// ErrInvalidConfig.
func (c ClientConfig) Validate() error {
	errs := validateCommon(c.Secret, c.Protection, c.MaxFrameSize, c.CompressThreshold, c.WriteTimeout)
	errs = append(errs, validateClientTLS(c.TLS)...)
	if c.ConnsPerAddr < 0 || c.ConnsPerAddr > MaxConnsPerAddr {
		errs = append(errs, fmt.Errorf("ConnsPerAddr %d out of range [0, %d]", c.ConnsPerAddr, MaxConnsPerAddr))
	}
	if c.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("DialTimeout %v is negative", c.DialTimeout))
	}
	return joinProblems(errs)
}
