package rpc

import (
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
	DefaultDialTimeout       = 5 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	// MaxConnsPerAddr bounds ClientConfig.ConnsPerAddr.
	MaxConnsPerAddr = 64
)

// ServerConfig configures a Server. The zero value of every field but
// Secret means its default.
type ServerConfig struct {
	// Secret is the cluster secret every connecting client must prove it
	// knows. Required. It never crosses the wire; 32 random bytes are a good
	// choice.
	Secret []byte
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
	// HandshakeTimeout bounds the authentication of a new connection.
	// Default 5 s. Connections that have not authenticated in time are
	// closed without any request being read.
	HandshakeTimeout time.Duration
	// WriteTimeout bounds one write on a connection: a write still blocked
	// after between WriteTimeout and twice that (a peer that stopped
	// reading) closes the connection. Default 30 s. It is checked by a timer,
	// not by per-write deadlines, which would cost a clock read per frame.
	WriteTimeout time.Duration
}

// ClientConfig configures a Client. The zero value of every field but
// Secret means its default.
type ClientConfig struct {
	// Secret is the cluster secret. Required. The client proves it knows it
	// and requires the server to prove the same.
	Secret []byte
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
}

func validateCommon(secret []byte, maxFrame, threshold int, writeTimeout time.Duration) []error {
	var errs []error
	if len(secret) == 0 {
		errs = append(errs, errors.New("rpc: Secret is required"))
	}
	if maxFrame < 0 || maxFrame > wire.MaxFrameSizeLimit {
		errs = append(errs, fmt.Errorf("rpc: MaxFrameSize %d out of range [0, %d]", maxFrame, wire.MaxFrameSizeLimit))
	}
	if threshold < 0 {
		errs = append(errs, fmt.Errorf("rpc: CompressThreshold %d is negative", threshold))
	}
	if writeTimeout < 0 {
		errs = append(errs, fmt.Errorf("rpc: WriteTimeout %v is negative", writeTimeout))
	}
	return errs
}

func newCommon(secret []byte, log *slog.Logger, maxFrame int, compression bool, threshold int, writeTimeout time.Duration) common {
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
	}
}

// Validate reports every problem with c at once.
func (c ServerConfig) Validate() error {
	errs := validateCommon(c.Secret, c.MaxFrameSize, c.CompressThreshold, c.WriteTimeout)
	if c.MaxConcurrent < 0 {
		errs = append(errs, fmt.Errorf("rpc: MaxConcurrent %d is negative", c.MaxConcurrent))
	}
	if c.HandshakeTimeout < 0 {
		errs = append(errs, fmt.Errorf("rpc: HandshakeTimeout %v is negative", c.HandshakeTimeout))
	}
	return errors.Join(errs...)
}

// Validate reports every problem with c at once.
func (c ClientConfig) Validate() error {
	errs := validateCommon(c.Secret, c.MaxFrameSize, c.CompressThreshold, c.WriteTimeout)
	if c.ConnsPerAddr < 0 || c.ConnsPerAddr > MaxConnsPerAddr {
		errs = append(errs, fmt.Errorf("rpc: ConnsPerAddr %d out of range [0, %d]", c.ConnsPerAddr, MaxConnsPerAddr))
	}
	if c.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("rpc: DialTimeout %v is negative", c.DialTimeout))
	}
	return errors.Join(errs...)
}
