package shardnet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/shard"
)

// Transport opens connections between clients and a server. Real deployments leave it nil for
// TCP; tests pass an in-memory network with fault injection. Listen's listener must return an
// error wrapping net.ErrClosed from Accept once closed; Dial honours ctx during set-up only.
// Implementations must be safe for concurrent use.
type Transport interface {
	Listen(addr string) (net.Listener, error)
	Dial(ctx context.Context, addr string) (net.Conn, error)
}

// Defaults of zero config fields.
const (
	DefaultMaxConcurrent    = 64
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultCallTimeout      = 5 * time.Second
	DefaultDialTimeout      = 5 * time.Second
	DefaultConns            = 1
)

// maxFrame bounds every request and response of the protocol: the largest, an acquire answer
// naming a text shard, stays under 5 KiB.
const maxFrame = 64 << 10

// ServerConfig configures a Server. The zero value of every field but Service and Secret means
// its default.
type ServerConfig struct {
	// Service answers the calls: the coordinator's *shard.Dispatcher, or any shard.Service (a
	// wrapper that counts or checks calls). Required. Its methods are called concurrently.
	Service shard.Service
	// Secret is the cluster secret every client must prove it knows (and the server proves it
	// knows to them). Required: at least 32 random bytes. It never crosses the wire; every frame
	// is authenticated with keys derived from it.
	Secret []byte
	// MaxConcurrent bounds calls served at once across all connections. Default 64. A dispatcher
	// call is a short critical section, so a few dozen keep two cores busy; beyond the bound,
	// connections stop reading until a call finishes, which pushes back on clients.
	MaxConcurrent int
	// HandshakeTimeout bounds the authentication of a new connection. Default 5s. Shorter frees
	// the slots of silent connections sooner; longer tolerates slow networks.
	HandshakeTimeout time.Duration
	// Logger receives refused connections, malformed requests and protocol violations. Nil
	// discards.
	Logger *slog.Logger
}

func (c ServerConfig) withDefaults() ServerConfig {
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = DefaultMaxConcurrent
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem of the configuration at once, joined with ErrInvalidConfig.
func (c ServerConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Service == nil {
		errs = append(errs, errors.New("Service is required"))
	}
	if err := rpc.ValidateSecret(c.Secret); err != nil {
		errs = append(errs, err)
	}
	if c.MaxConcurrent < 0 || c.MaxConcurrent > 1<<16 {
		errs = append(errs, fmt.Errorf("MaxConcurrent %d out of range [1, %d]", c.MaxConcurrent, 1<<16))
	}
	if c.HandshakeTimeout < 0 {
		errs = append(errs, fmt.Errorf("HandshakeTimeout %v is negative", c.HandshakeTimeout))
	}
	return joinProblems(errs)
}

// ClientConfig configures a Client. The zero value of every field but Addr and Secret means its
// default.
type ClientConfig struct {
	// Addr is the dispatcher's address ("host:port" for TCP). Required. SetAddr changes it when
	// the coordinator moves.
	Addr string
	// Secret is the cluster secret. Required: at least 32 random bytes. The client proves it
	// knows it and requires the server to prove the same.
	Secret []byte
	// Transport dials the dispatcher. Nil means TCP.
	Transport Transport
	// CallTimeout bounds how long one call waits for its answer, in wall time, on top of the
	// caller's context. Default 5s. A call that times out returns ErrUnavailable (a Reader
	// retries it), so a partitioned or hung dispatcher costs a worker at most this long per
	// attempt. It must stay well below the dispatcher's LeaseTTL, and above its worst answer
	// time, or healthy calls fail.
	CallTimeout time.Duration
	// DialTimeout bounds dialing and authenticating a connection. Default 5s.
	DialTimeout time.Duration
	// Conns is the number of persistent connections to the dispatcher; calls are spread over
	// them. Default 1: dispatcher traffic is small, and concurrent calls share a connection.
	Conns int
	// Logger receives connection failures. Nil discards.
	Logger *slog.Logger
}

func (c ClientConfig) withDefaults() ClientConfig {
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.Conns == 0 {
		c.Conns = DefaultConns
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem of the configuration at once, joined with ErrInvalidConfig.
func (c ClientConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("Addr is required"))
	}
	if err := rpc.ValidateSecret(c.Secret); err != nil {
		errs = append(errs, err)
	}
	if c.CallTimeout < 0 {
		errs = append(errs, fmt.Errorf("CallTimeout %v is negative", c.CallTimeout))
	}
	if c.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("DialTimeout %v is negative", c.DialTimeout))
	}
	if c.Conns < 0 || c.Conns > 64 {
		errs = append(errs, fmt.Errorf("Conns %d out of range [1, 64]", c.Conns))
	}
	return joinProblems(errs)
}

func joinProblems(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return errors.Join(append([]error{ErrInvalidConfig}, errs...)...)
}
