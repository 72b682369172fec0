package rpc

import (
	"errors"
	"fmt"
	"sync/atomic"
)

var (
	// ErrAuth is returned when authentication fails in either direction: the
	// server refused this client's proof of the cluster secret, or the server
	// could not prove it knows the secret. Retrying will not help.
	ErrAuth = errors.New("rpc: authentication failed")
	// ErrHandshake is returned when the peer does not speak this protocol or
	// this version of it.
	ErrHandshake = errors.New("rpc: handshake failed")
	// ErrUnavailable is returned when a call could not be delivered and the
	// server certainly did not process it: the address could not be dialed
	// or the handshake did not complete (timeout, refused, reset), the
	// request could not be written completely, or the server announced it
	// was shutting down before reading it. Retrying later or elsewhere is
	// safe. The cause is wrapped too.
	ErrUnavailable = errors.New("rpc: unavailable")
	// ErrConnClosed is returned when the connection carrying a call failed
	// after the request was sent: the server may or may not have processed
	// it. The error names the address and wraps the cause.
	ErrConnClosed = errors.New("rpc: connection closed")
	// ErrClosed is returned by calls on a closed Client, by Serve on a
	// Server that is shutting down or closed, and (wrapped in
	// ErrConnClosed) to calls in flight when their Client is closed.
	ErrClosed = errors.New("rpc: closed")
	// ErrTooLarge is returned when a request is larger than the client's
	// MaxFrameSize or than the server's limit announced in the handshake; it
	// is never sent.
	ErrTooLarge = errors.New("rpc: payload too large")
	// ErrInvalidConfig is returned (wrapped, with every problem) by
	// ServerConfig.Validate, ClientConfig.Validate, NewServer and NewClient
	// when a configuration is unusable, for example a Secret shorter than
	// MinSecretSize.
	ErrInvalidConfig = errors.New("rpc: invalid config")
)

// Error codes used by the rpc package itself. Applications use codes from
// MinAppCode up.
const (
	// CodeInternal: the handler returned an error that is not a
	// *RemoteError, or panicked. Message holds the error text.
	CodeInternal uint32 = 1
	// CodeUnknownMethod: no handler is registered for the method.
	CodeUnknownMethod uint32 = 2
	// CodeTooLarge: the handler's response is larger than the client
	// accepts (its MaxFrameSize, announced in the handshake).
	CodeTooLarge uint32 = 3
	// MinAppCode is the first code free for applications; codes below it
	// are reserved for this package.
	MinAppCode uint32 = 100
)

// RemoteError is an error returned by a handler and carried to the caller.
// Handlers return one (or an error wrapping one) to send a code, a message
// and optional data, for example a "wrong owner" code with the server's
// table version encoded in Data. On the client, test for it with
// errors.As(err, &remoteErr). Any other handler error arrives as a
// RemoteError with Code CodeInternal.
type RemoteError struct {
	Code    uint32
	Message string
	// Data is opaque to this package. On the client it is a fresh slice
	// owned by the caller.
	Data []byte
}

// Error returns "rpc: remote error <code>: <message>".
func (e *RemoteError) Error() string {
	return fmt.Sprintf("rpc: remote error %d: %s", e.Code, e.Message)
}

// Stats are the security and resource counters of a Server or a Client
// since it was made. The last three are counted by a Server only.
type Stats struct {
	// AuthFailures counts handshakes that failed a proof of the cluster
	// secret: on a server, clients whose proof was wrong; on a client,
	// servers that refused its proof or whose own proof was wrong.
	AuthFailures uint64
	// ForgedFrames counts connections closed because a frame failed
	// authentication (injected, altered, replayed, reordered or dropped
	// by something between the two ends). Each is also logged.
	ForgedFrames uint64
	// RefusedConns counts connections closed as soon as they were accepted
	// because ServerConfig.MaxHandshakes or MaxHandshakesPerHost
	// connections were already authenticating.
	RefusedConns uint64
	// FailedHandshakes counts connections closed because their handshake
	// failed other than by a wrong proof (those are AuthFailures): it timed
	// out, the peer does not speak this protocol or version, or TLS failed.
	// Connections cut by the server's own shutdown are not counted.
	FailedHandshakes uint64
	// ThrottledReads counts the times a connection stopped being read
	// because it held ServerConfig.MaxConnInFlight bytes.
	ThrottledReads uint64
}

type counters struct {
	authFailures     atomic.Uint64
	forgedFrames     atomic.Uint64
	refusedConns     atomic.Uint64
	failedHandshakes atomic.Uint64
	throttledReads   atomic.Uint64
}

func (c *counters) load() Stats {
	return Stats{
		AuthFailures:     c.authFailures.Load(),
		ForgedFrames:     c.forgedFrames.Load(),
		RefusedConns:     c.refusedConns.Load(),
		FailedHandshakes: c.failedHandshakes.Load(),
		ThrottledReads:   c.throttledReads.Load(),
	}
}
